/* The writers table: one row per output format (see writers.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "burnstore/writers.h"
#include "formats/bpk_write.h"
#include "formats/pth_write.h"
#include "formats/st_write.h"
#include "gguf_private.h"

static int bpk_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err)
{
  return bs_bpk_write(cat, NULL, k, err);
}

static const char *const bpk_ext[] = {".bpk", NULL};
static const char *const st_ext[] = {".safetensors", NULL};
static const char *const st_sharded_ext[] = {".safetensors.index.json", NULL};
static const char *const gguf_ext[] = {".gguf", NULL};
static const char *const pth_ext[] = {".pth", ".pt", ".bin", NULL};

const struct bs_writer bs_writers[] = {
    {"burnpack", BS_FMT_BURNPACK, bpk_ext, bs_bpk_can_write, bs_bpk_default_meta, bpk_write, NULL},
    {"safetensors", BS_FMT_SAFETENSORS, st_ext, bs_st_can_write, bs_st_default_meta, bs_st_write,
     NULL},
    {"safetensors-sharded", BS_FMT_ST_SHARDED, st_sharded_ext, bs_st_can_write, bs_st_default_meta,
     bs_st_write, bs_st_write_set},
    {"gguf", BS_FMT_GGUF, gguf_ext, bs_gguf_can_write, NULL, bs_gguf_write, NULL},
    {"pytorch", BS_FMT_PYTORCH, pth_ext, bs_pth_can_write, NULL, bs_pth_write, NULL},
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

const char *bs_writer_alias_hint(enum bs_dtype dt)
{
  switch (dt) {
  case BS_DT_FLEX32: return "; its bytes are F32: set user.burnstore.dtype to F32 to write them";
  case BS_DT_BOOL_U8: return "; its bytes are BOOL: set user.burnstore.dtype to BOOL to write them";
  default: return "";
  }
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
      return bs_fail(err, sub.code, BS_OFF_NONE, t->name,
                     "cannot be written as %s: %s (leave it out with -o exclude=REGEX)", w->name,
                     sub.msg);
  }
  return 0;
}

int bs_writer_write_file(const struct bs_writer *w, const struct bs_catalog *cat, const char *path,
                         bs_err *err)
{
  return bs_writer_write_file_opts(w, cat, path, NULL, err);
}

int bs_writer_write_file_opts(const struct bs_writer *w, const struct bs_catalog *cat,
                              const char *path, const struct bs_write_opts *o, bs_err *err)
{
  static const struct bs_write_opts none = {0};
  if (w->write_set)
    return w->write_set(cat, path, o ? o : &none, err);
  struct bs_atomic a;
  if (bs_atomic_open(&a, path, err) != 0)
    return -1;
  if (w->write(cat, &a.sink, err) != 0)
    return bs_atomic_fail(&a, err);
  return bs_atomic_commit(&a, err);
}
