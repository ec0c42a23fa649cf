/* GGUF reader: open from memory (bs_gguf_read directly, so every input
 * reaches the parser rather than the sniffer), read every tensor; on success
 * write the catalog back with bs_gguf_write and read that: same names,
 * dtypes, shapes, bytes and metadata text; the writer's metadata rules
 * (types-only parse) take the same file. */
#include "formats/gguf_private.h"
#include "fuzz_common.h"

/* The text of metadata entry i of cat (made from its file), or NULL when
 * it cannot be made (out of memory). Freed by the caller. */
static char *text(const struct bs_catalog *cat, size_t i)
{
  struct bs_buf b = {0};
  bool cut;
  bs_err err = {0};
  if (bs_meta_text(cat, &cat->meta[i], UINT64_MAX, &b, &cut, &err) != 0 || bs_buf_put(&b, "", 1)) {
    FUZZ_CHECK(err.code == ENOMEM || err.code == 0);
    bs_buf_destroy(&b);
    return NULL;
  }
  FUZZ_CHECK(!cut && b.len - 1 == bs_kv_text_len(&cat->meta[i]));
  return (char *)b.data;
}

static void check_round_trip(const struct bs_catalog *cat)
{
  struct bs_buf out = {0};
  struct bs_sink k;
  bs_err err = {0};
  bs_sink_init_mem(&k, &out, "fuzz-out");
  if (bs_gguf_write(cat, &k, &err) != 0) {
    /* only refusals the writer documents: tensor names llama.cpp cannot
     * read, or running out of memory */
    FUZZ_CHECK(err.code == ENOTSUP || err.code == ENOMEM || err.code == EFBIG);
    bs_buf_destroy(&out);
    return;
  }
  struct bs_catalog back;
  struct bs_src src;
  uint32_t idx;
  bs_catalog_init(&back);
  if (bs_src_init_mem(&src, out.data, out.len, "fuzz-out", &err) != 0 ||
      bs_catalog_add_src(&back, &src, &idx, &err) != 0)
    __builtin_trap();
  back.format = BS_FMT_GGUF;
  FUZZ_CHECK(bs_gguf_read(&back, idx, NULL, &err) == 0);
  FUZZ_CHECK(back.count == cat->count && back.nmeta == cat->nmeta);
  for (size_t i = 0; i < cat->nmeta; i++) {
    FUZZ_CHECK(strcmp(back.meta[i].key, cat->meta[i].key) == 0);
    char *a = text(&back, i), *b = text(cat, i);
    FUZZ_CHECK(!a || !b || strcmp(a, b) == 0);
    bs_free(a);
    bs_free(b);
  }
  static uint8_t a[4096], b[4096];
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    long j = bs_catalog_find(&back, t->name);
    FUZZ_CHECK(j >= 0);
    const struct bs_tensor *u = &back.tensors[j];
    FUZZ_CHECK(u->dtype == t->dtype && u->rank == t->rank && u->nbytes == t->nbytes);
    for (uint32_t d = 0; d < t->rank; d++)
      FUZZ_CHECK(u->shape[d] == t->shape[d]);
    size_t n = t->nbytes < sizeof a ? (size_t)t->nbytes : sizeof a;
    FUZZ_CHECK(bs_tensor_read(cat, t, 0, a, n) == (long)n);
    FUZZ_CHECK(bs_tensor_read(&back, u, 0, b, n) == (long)n);
    FUZZ_CHECK(memcmp(a, b, n) == 0);
  }
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
}

/* The metadata rules of a writable mount (bs_gguf_parse_types) take every
 * file the reader takes, and checking a key's own text never crashes. */
static void check_rules(const struct bs_catalog *cat)
{
  struct bs_meta_rules *r = NULL;
  bs_err err = {0};
  if (bs_gguf_meta_rules(cat, &r, &err) != 0) {
    FUZZ_CHECK(err.code == ENOMEM);
    return;
  }
  FUZZ_CHECK(r != NULL);
  for (size_t i = 0; i < cat->nmeta; i++) {
    bs_err e = {0};
    char *v = text(cat, i);
    if (v && bs_gguf_check_meta(r, cat->meta[i].key, v, strlen(v), &e) != 0)
      FUZZ_CHECK(e.code == EINVAL || e.code == ENOMEM);
    bs_free(v);
  }
  bs_gguf_meta_rules_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct bs_catalog cat;
  struct bs_src src;
  bs_err err = {0};
  uint32_t idx;
  bs_catalog_init(&cat);
  if (bs_src_init_mem(&src, data, size, "fuzz", &err) != 0 ||
      bs_catalog_add_src(&cat, &src, &idx, &err) != 0)
    __builtin_trap();
  cat.format = BS_FMT_GGUF;
  if (bs_gguf_read(&cat, idx, NULL, &err) == 0) {
    FUZZ_CHECK(err.code == 0);
    fuzz_check_catalog(&cat);
    check_round_trip(&cat);
    check_rules(&cat);
  } else {
    FUZZ_CHECK(err.code != 0 && err.msg[0] != '\0');
    FUZZ_CHECK(cat.count == 0 && cat.nmeta == 0);
  }
  bs_catalog_destroy(&cat);
  return 0;
}
