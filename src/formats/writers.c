/* The writers table: one row per output format (see writers.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/target.h"
#include "core/utf8.h"
#include "formats/burnpack_write.h"
#include "formats/formats.h"
#include "formats/pth_write.h"
#include "formats/safetensors_sharded.h"
#include "formats/safetensors_write.h"
#include "formats/writers.h"
#include "gguf_private.h"

static int bpk_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err)
{
  return bs_bpk_write(cat, NULL, k, err);
}

/* Burnpack (CBOR text) and SafeTensors (JSON strings): keys and values are
 * UTF-8 text, which their readers (and Burn's, and the safetensors crate's)
 * refuse otherwise. */
static int utf8_meta(const struct bs_meta_rules *rules, const char *key, const char *value,
                     size_t len, bs_err *err)
{
  (void)rules;
  size_t at;
  if (!bs_utf8_valid(key, strlen(key), &at))
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "metadata key '%.100s' is not UTF-8 (byte %zu): keys are UTF-8 text", key, at);
  if (!bs_utf8_valid(value, len, &at))
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "metadata '%.100s': the value is not UTF-8 (byte %zu): values are UTF-8 text",
                   key, at);
  return 0;
}

static int bpk_layout(const struct bs_catalog *cat, struct bs_layout *l, bs_err *err)
{
  return bs_bpk_layout(cat, NULL, l, err);
}

static int st_layout(const struct bs_catalog *cat, struct bs_layout *l, bs_err *err)
{
  return bs_st_layout(cat, NULL, 0, l, err);
}

static const char *const bpk_ext[] = {".bpk", NULL};
static const char *const st_ext[] = {".safetensors", NULL};
static const char *const st_sharded_ext[] = {".safetensors.index.json", NULL};
static const char *const gguf_ext[] = {".gguf", NULL};
static const char *const pth_ext[] = {".pth", ".pt", ".bin", NULL};

/* A .pth rewritten in place keeps what the writer re-pickles; refused when
 * something else would be lost at the write-back. Its items of a list are
 * fixed: the pickle has no key to leave one out by. */
static int pth_in_place_ok(const struct bs_catalog *cat, bool *fixed, bs_err *err)
{
  if (cat->format != BS_FMT_PYTORCH || !cat->nsrcs)
    return 0;
  struct bs_pth_keep keep;
  int rc = bs_pth_keep_check(&cat->srcs[0], &keep, err);
  if (rc == 0 && fixed)
    rc = bs_pth_keep_fixed(&keep, cat, fixed, err);
  bs_pth_keep_destroy(&keep);
  return rc;
}

/* A NAME.safetensors target may have been written as a shard set
 * (rw,max_shard_size=): both SafeTensors rows recover a set's journal. */
const struct bs_writer bs_writers[] = {
    {
        .name = "burnpack",
        .format = BS_FMT_BURNPACK,
        .extensions = bpk_ext,
        .can_write = bs_bpk_can_write,
        .name_ok = bs_bpk_name_ok,
        .default_meta = bs_bpk_default_meta,
        .write = bpk_write,
        .layout = bpk_layout,
        .param_ids = true,
        .check_meta = utf8_meta,
    },
    {
        .name = "safetensors",
        .format = BS_FMT_SAFETENSORS,
        .extensions = st_ext,
        .can_write = bs_st_can_write,
        .name_ok = bs_st_name_ok,
        .default_meta = bs_st_default_meta,
        .write = bs_st_write,
        .layout = st_layout,
        .check_meta = utf8_meta,
        .recover = bs_st_set_recover,
    },
    {
        .name = "safetensors-sharded",
        .format = BS_FMT_ST_SHARDED,
        .extensions = st_sharded_ext,
        .can_write = bs_st_can_write,
        .name_ok = bs_st_name_ok,
        .default_meta = bs_st_default_meta,
        .write = bs_st_write,
        .write_set = bs_st_write_set,
        .check_meta = utf8_meta,
        .recover = bs_st_set_recover,
        .set_name = bs_st_set_name,
    },
    {
        .name = "gguf",
        .format = BS_FMT_GGUF,
        .extensions = gguf_ext,
        .can_write = bs_gguf_can_write,
        .name_ok = bs_gguf_name_ok,
        .write = bs_gguf_write,
        .layout = bs_gguf_layout,
        .check_meta = bs_gguf_check_meta,
        .meta_rules = bs_gguf_meta_rules,
        .meta_rules_free = bs_gguf_meta_rules_free,
        .meta_refs = true,
    },
    {
        .name = "pytorch",
        .format = BS_FMT_PYTORCH,
        .extensions = pth_ext,
        .can_write = bs_pth_can_write,
        .name_ok = bs_pth_name_ok,
        .write = bs_pth_write,
        .in_place_ok = pth_in_place_ok,
        .drops_meta = true,
    },
};
const size_t bs_nwriters = sizeof bs_writers / sizeof bs_writers[0];

static const char *base_name(const char *path)
{
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

const char *bs_path_extension(const char *path)
{
  const char *base = base_name(path);
  const char *dot = strrchr(base, '.');
  return dot && dot != base ? dot : base + strlen(base);
}

const struct bs_writer *bs_writer_for_path(const char *path)
{
  const char *base = base_name(path);
  size_t blen = strlen(base);
  for (size_t i = 0; i < bs_nwriters; i++)
    for (const char *const *e = bs_writers[i].extensions; *e; e++) {
      size_t elen = strlen(*e);
      if (blen > elen && strcasecmp(base + blen - elen, *e) == 0)
        return &bs_writers[i];
    }
  return NULL;
}

const struct bs_writer *bs_writer_for_format(enum bs_format f)
{
  for (size_t i = 0; i < bs_nwriters; i++)
    if (bs_writers[i].format == f)
      return &bs_writers[i];
  return NULL;
}

const char *bs_writer_list(char *buf, size_t n)
{
  size_t used = 0;
  if (n)
    buf[0] = '\0';
  for (size_t i = 0; i < bs_nwriters; i++)
    for (const char *const *e = bs_writers[i].extensions; *e; e++) {
      int r = snprintf(buf + used, n - used, "%s%s (%s)", used ? ", " : "", *e, bs_writers[i].name);
      if (r < 0 || (size_t)r >= n - used)
        return buf;
      used += (size_t)r;
    }
  return buf;
}

int bs_writer_check(const struct bs_writer *w, const struct bs_catalog *cat, bs_err *err)
{
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    if (t->hidden)
      continue;
    bs_err sub;
    bs_err_clear(&sub);
    if (w->can_write(t, &sub) != 0)
      return bs_fail(err, sub.code, BS_OFF_NONE, sub.key[0] ? sub.key : t->name,
                     "cannot be written as %s: %s (leave it out with -o exclude=REGEX)", w->name,
                     sub.msg);
  }
  return 0;
}

int bs_writer_meta_rules(const struct bs_writer *w, const struct bs_catalog *src,
                         struct bs_meta_rules **out, bs_err *err)
{
  *out = NULL;
  return w->meta_rules ? w->meta_rules(src, out, err) : 0;
}

void bs_writer_meta_rules_free(const struct bs_writer *w, struct bs_meta_rules *rules)
{
  if (rules && w->meta_rules_free)
    w->meta_rules_free(rules);
}

int bs_writer_check_meta(const struct bs_writer *w, const struct bs_meta_rules *rules,
                         const char *key, const char *value, size_t len, bs_err *err)
{
  const char *nul = memchr(value, '\0', len);
  if (nul)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "metadata '%.100s': the value holds a NUL byte at %zu: metadata values are "
                   "text, and would be cut there",
                   key, (size_t)(nul - value));
  return w->check_meta ? w->check_meta(rules, key, value, len, err) : 0;
}

int bs_writer_write_file(const struct bs_writer *w, const struct bs_catalog *cat, const char *path,
                         bs_err *err)
{
  return bs_writer_write_file_opts(w, cat, path, NULL, err);
}

/* A shallow copy of cat whose metadata is all text (GGUF values left in
 * their source made text now), for a writer without meta_refs: what a
 * conversion holds, at most BS_META_TEXT_MAX bytes of it. The tensors and
 * sources stay cat's (out->meta alone is out's). */
static int meta_as_text(const struct bs_catalog *cat, struct bs_catalog *out, const char *path,
                        bs_err *err)
{
  *out = *cat;
  out->meta = bs_calloc(cat->nmeta ? cat->nmeta : 1, sizeof *out->meta);
  out->nmeta = out->metacap = 0;
  if (!out->meta)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  uint64_t total = 0;
  for (size_t i = 0; i < cat->nmeta; i++) /* known before any is made */
    if ((total += bs_kv_text_len(&cat->meta[i])) > BS_META_TEXT_MAX) {
      bs_free(out->meta);
      return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                     "%s: not written: the metadata as text passes %u MiB at '%.100s' (a GGUF "
                     "file's values, shown as text, can be 6 times their bytes)",
                     path, BS_META_TEXT_MAX >> 20, cat->meta[i].key);
    }
  total = 0;
  int rc = 0;
  for (size_t i = 0; i < cat->nmeta && rc == 0; i++) {
    const struct bs_kv *kv = &cat->meta[i];
    struct bs_buf b = {0};
    bool cut;
    if (bs_meta_text(cat, kv, BS_META_TEXT_MAX - total, &b, &cut, err) != 0) {
      rc = -1;
    } else if (cut) {
      rc = bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "%s: not written: the metadata as text passes %u MiB at '%.100s' (a GGUF "
                   "file's values, shown as text, can be 6 times their bytes)",
                   path, BS_META_TEXT_MAX >> 20, kv->key);
    } else if (bs_buf_put(&b, "", 1) != 0 || !(out->meta[out->nmeta].key = bs_strdup(kv->key))) {
      rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    } else {
      out->meta[out->nmeta++].value = (char *)b.data; /* taken */
      b.data = NULL;
      total += b.len - 1;
    }
    bs_buf_destroy(&b);
  }
  if (rc != 0) {
    for (size_t i = 0; i < out->nmeta; i++)
      bs_kv_destroy(&out->meta[i]);
    bs_free(out->meta);
  }
  return rc;
}

/* Every metadata entry checked (a value the writer copies from its source
 * was the source's already). */
static int check_all_meta(const struct bs_writer *w, const struct bs_catalog *cat, const char *path,
                          bs_err *err)
{
  for (size_t i = 0; i < cat->nmeta; i++) {
    const struct bs_kv *kv = &cat->meta[i];
    bs_err sub;
    bs_err_clear(&sub);
    if (kv->value &&
        bs_writer_check_meta(w, NULL, kv->key, kv->value, strlen(kv->value), &sub) != 0)
      return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "%s: not written: %s", path, sub.msg);
  }
  return 0;
}

/* The metadata checked, then the write. */
static int write_checked(const struct bs_writer *w, const struct bs_catalog *cat, const char *path,
                         const struct bs_write_opts *o, bs_err *err)
{
  if (check_all_meta(w, cat, path, err) != 0)
    return -1;
  if (w->write_set)
    return w->write_set(cat, path, o, err);
  struct bs_atomic a;
  if (bs_atomic_open_mode(&a, path, bs_write_new_mode(o), err) != 0)
    return -1;
  if (w->write(cat, &a.sink, err) != 0)
    return bs_atomic_fail(&a, err);
  return bs_atomic_commit(&a, err);
}

/* What every output of w gets first: the names checked (though write()
 * checks them too, through can_write, for every sink: this is the guard
 * writers.h promises, before anything is opened; O(bytes of the names),
 * once), and for a writer that wants text, *text: the same catalog with
 * its metadata made text (*use points at it; else at cat). */
static int prepare(const struct bs_writer *w, const struct bs_catalog *cat, const char *path,
                   struct bs_catalog *text, const struct bs_catalog **use, bs_err *err)
{
  *use = cat;
  for (size_t i = 0; i < cat->count; i++) {
    bs_err sub;
    bs_err_clear(&sub);
    if (!cat->tensors[i].hidden && w->name_ok(cat->tensors[i].name, &sub) != 0)
      return bs_fail(err, sub.code, BS_OFF_NONE, sub.key[0] ? sub.key : NULL,
                     "%s: not written (%s cannot hold this name): %s", path, w->name, sub.msg);
  }
  bool made = false;
  for (size_t i = 0; i < cat->nmeta && !made; i++)
    made = cat->meta[i].ref && !w->meta_refs;
  if (made) { /* the writer wants text: the same catalog, its metadata made text */
    if (meta_as_text(cat, text, path, err) != 0)
      return -1;
    *use = text;
  }
  return 0;
}

static void release(const struct bs_catalog *cat, struct bs_catalog *text,
                    const struct bs_catalog *use)
{
  if (use == cat)
    return;
  for (size_t i = 0; i < text->nmeta; i++)
    bs_kv_destroy(&text->meta[i]);
  bs_free(text->meta);
}

int bs_writer_write_file_opts(const struct bs_writer *w, const struct bs_catalog *cat,
                              const char *path, const struct bs_write_opts *o, bs_err *err)
{
  static const struct bs_write_opts none = {0};
  struct bs_catalog text;
  const struct bs_catalog *use;
  if (prepare(w, cat, path, &text, &use, err) != 0)
    return -1;
  int rc = write_checked(w, use, path, o ? o : &none, err);
  release(cat, &text, use);
  return rc;
}

int bs_writer_layout(const struct bs_writer *w, const struct bs_catalog *cat, const char *name,
                     struct bs_layout *l, bs_err *err)
{
  if (!w->layout)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "%s: %s has no one-file plan", name, w->name);
  struct bs_catalog text;
  const struct bs_catalog *use;
  if (prepare(w, cat, name, &text, &use, err) != 0)
    return -1;
  int rc = check_all_meta(w, use, name, err) == 0 ? w->layout(use, l, err) : -1;
  release(cat, &text, use);
  return rc;
}

int bs_writer_recover(const char *path, bs_err *err)
{
  const struct bs_writer *w = bs_writer_for_path(path);
  return w && w->recover ? w->recover(path, err) : 0;
}

bool bs_writer_target_name(const char *base, char *out, size_t n)
{
  for (size_t i = 0; i < bs_nwriters; i++)
    if (bs_writers[i].set_name && bs_writers[i].set_name(base, out, n))
      return true;
  return false;
}

int bs_writer_lock(const char *path, const char *holder, bs_err *err)
{
  return bs_target_lock(path, bs_writer_target_name, holder, err);
}
