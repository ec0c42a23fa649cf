/* Burnpack reader: open from memory, read every tensor, write the catalog
 * back with the writer and re-read it: names, dtypes, shapes and bytes must
 * survive the round trip. */
#include "fuzz_common.h"

#include "formats/burnpack_write.h"

static uint8_t buf_a[64 * 1024], buf_b[64 * 1024];

static void same_bytes(const struct bs_catalog *a, const struct bs_tensor *ta,
                       const struct bs_catalog *b, const struct bs_tensor *tb)
{
  uint64_t len = ta->nbytes < 2 * FUZZ_READ_CAP ? ta->nbytes : 2 * FUZZ_READ_CAP;
  for (uint64_t off = 0; off < len;) {
    size_t n = len - off < sizeof buf_a ? (size_t)(len - off) : sizeof buf_a;
    FUZZ_CHECK(bs_tensor_read(a, ta, off, buf_a, n) == (long)n);
    FUZZ_CHECK(bs_tensor_read(b, tb, off, buf_b, n) == (long)n);
    FUZZ_CHECK(memcmp(buf_a, buf_b, n) == 0);
    off += n;
  }
}

static void round_trip(const struct bs_catalog *cat)
{
  struct bs_buf out = {0};
  bs_err err = {0};
  if (bs_bpk_write_mem(cat, NULL, &out, &err) != 0) {
    /* A catalog the reader accepted must be writable, short of memory. */
    FUZZ_CHECK(err.code == ENOMEM || err.code == EFBIG);
    bs_buf_destroy(&out);
    return;
  }
  struct bs_catalog again;
  FUZZ_CHECK(fuzz_open(&again, out.data, out.len, false) == 0);
  FUZZ_CHECK(again.format == BS_FMT_BURNPACK);
  FUZZ_CHECK(again.count == cat->count);
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    long j = bs_catalog_find(&again, t->name);
    FUZZ_CHECK(j >= 0);
    const struct bs_tensor *u = &again.tensors[j];
    FUZZ_CHECK(u->dtype == t->dtype && u->rank == t->rank && u->nbytes == t->nbytes);
    FUZZ_CHECK(t->rank == 0 || memcmp(u->shape, t->shape, t->rank * sizeof *t->shape) == 0);
    FUZZ_CHECK(u->has_param_id == t->has_param_id);
    FUZZ_CHECK(!t->has_param_id || u->x->param_id == t->x->param_id);
    same_bytes(cat, t, &again, u);
  }
  bs_catalog_destroy(&again);
  bs_buf_destroy(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct bs_catalog cat;
  if (fuzz_open(&cat, data, size, false) == 0) {
    fuzz_check_catalog(&cat);
    if (cat.format == BS_FMT_BURNPACK)
      round_trip(&cat);
  }
  bs_catalog_destroy(&cat);
  return 0;
}
