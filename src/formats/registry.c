/* The format registry: the one table of formats, detection and bs_open_any.
 *
 * Detection (docs/formats.md) is structural and in two passes over the table,
 * in its order:
 *  1. the first row whose sniff says YES: its layout is verified (Burnpack's
 *     "NRUB"; SafeTensors' 8-byte header length, at least 2 and within the
 *     file, then '{'; PyTorch's zip magic, its legacy pickled magic number,
 *     or a ustar header with a valid checksum);
 *  2. else the first row that says MAYBE (the file looks like the format but
 *     something is off: a truncated SafeTensors header, a pickle without
 *     torch's magic), so that the reader names what is wrong;
 *  3. else "unknown format", naming what the file looks like when we know.
 * Order matters only where two layouts can both hold: Burnpack before
 * SafeTensors (a >1 GiB SafeTensors header cannot start with "NRUB"),
 * SafeTensors before PyTorch (a SafeTensors header of 640 bytes starts with
 * 80 02 like a pickle, and its JSON may hold "ustar" at byte 257), GGUF's
 * magic "GGUF" before PyTorch's structural checks. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "core/checked.h"
#include "formats/formats.h"
#include "formats/safetensors_sharded.h"

static const struct bs_format_desc formats[] = {
    [BS_FMT_NONE] = {.name = "none"},
    [BS_FMT_BURNPACK] = {.name = "burnpack",
                         .exts = {".bpk"},
                         .sniff = bs_bpk_sniff,
                         .read = bs_bpk_read,
                         .describe = bs_bpk_describe},
    [BS_FMT_SAFETENSORS] = {.name = "safetensors",
                            .exts = {".safetensors"},
                            .sniff = bs_st_sniff,
                            .read = bs_st_read},
    [BS_FMT_GGUF] = {.name = "gguf",
                     .exts = {".gguf"},
                     .sniff = bs_gguf_sniff,
                     .read = bs_gguf_read,
                     .meta_text = bs_gguf_render},
    [BS_FMT_PYTORCH] = {.name = "pytorch",
                        .exts = {".pt", ".pth", ".bin", ".ckpt", ".tar"},
                        .sniff = bs_pth_sniff,
                        .read = bs_pth_read,
                        .describe = bs_pth_describe},
    [BS_FMT_ST_SHARDED] = {.name = "safetensors-sharded",
                           .exts = {".safetensors.index.json"},
                           .sniff = bs_st_index_sniff,
                           .read = bs_st_index_read,
                           .describe = bs_st_index_describe,
                           .find_in_dir = bs_st_index_find},
};
_Static_assert(sizeof formats / sizeof formats[0] == BS_FMT_COUNT,
               "the format table has one row per enum bs_format value");

int bs_format_in_dir(const char *dir, char **path, bs_err *err)
{
  *path = NULL;
  bs_err first;
  bs_err_clear(&first);
  for (size_t f = 0; f < BS_FMT_COUNT; f++) {
    if (!formats[f].find_in_dir)
      continue;
    bs_err sub;
    bs_err_clear(&sub);
    if (formats[f].find_in_dir(dir, path, &sub) == 0)
      return 0;
    if (sub.code != ENOENT)
      return bs_fail(err, sub.code, sub.off, NULL, "%s", sub.msg);
    if (!first.code)
      first = sub;
  }
  return bs_fail(err, ENOENT, BS_OFF_NONE, NULL, "%s",
                 first.code ? first.msg : "a directory, which holds no checkpoint burnstore reads");
}

const struct bs_format_desc *bs_format_desc(enum bs_format f)
{
  return f > BS_FMT_NONE && f < BS_FMT_COUNT ? &formats[f] : NULL;
}

void bs_format_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx)
{
  const struct bs_format_desc *d = bs_format_desc(cat->format);
  if (d && d->describe && cat->nsrcs > 0)
    d->describe(cat, detail, ctx);
}

int bs_meta_text(const struct bs_catalog *cat, const struct bs_kv *kv, uint64_t max,
                 struct bs_buf *out, bool *cut, bs_err *err)
{
  *cut = false;
  const struct bs_meta_ref *r = kv->ref;
  if (!r) {
    size_t n = strlen(kv->value);
    if (n > max) {
      n = (size_t)max;
      *cut = true;
    }
    return bs_buf_put(out, kv->value, n) ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory")
                                         : 0;
  }
  const struct bs_format_desc *d = bs_format_desc(r->format);
  if (!d || !d->meta_text || r->src >= cat->nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "metadata '%.100s': a value in a source burnstore cannot read it from", kv->key);
  return d->meta_text(&cat->srcs[r->src], r, max, out, cut, err);
}

const char *bs_format_name(enum bs_format f)
{
  return f < BS_FMT_COUNT ? formats[f].name : "?";
}

enum bs_format bs_format_by_ext(const char *path)
{
  for (int f = BS_FMT_NONE + 1; f < BS_FMT_COUNT; f++)
    for (int i = 0; i < BS_FORMAT_MAX_EXTS && formats[f].exts[i]; i++)
      if (bs_ends_with(path, strlen(path), formats[f].exts[i], true))
        return (enum bs_format)f;
  return BS_FMT_NONE;
}

/* ---- Process-wide setup --------------------------------------------------- */

/* jansson allocates through bs_malloc, so OOM tests reach it. Set once, on
 * first use (no constructor: linking the core must not change jansson for
 * the whole process). bs_malloc is plain malloc underneath, so memory
 * jansson handed out before this ran is still freed correctly. */
static _Thread_local unsigned long json_failures;

static void *json_alloc(size_t n)
{
  void *p = bs_malloc(n);
  if (!p)
    json_failures++;
  return p;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init(void)
{
  json_set_alloc_funcs(json_alloc, bs_free);
}

void bs_formats_init(void)
{
  pthread_once(&init_once, init);
}

unsigned long bs_json_alloc_failures(void)
{
  return json_failures;
}

/* ---- Unknown formats: say what the file looks like ------------------------ */

static const struct {
  const char *magic;
  size_t len;
  const char *what;
} lookalikes[] = {
    {"\x1f\x8b", 2,
     "gzip data (1f 8b), as Burn's NamedMpkGzFileRecorder writes (.mpk.gz); gunzip a "
     "gzipped checkpoint"},
    {"PK\x05\x06", 4, "an empty zip archive"},
    {"\x93NUMPY", 6, "a NumPy .npy array"},
    {"\x89HDF\r\n\x1a\n", 8, "an HDF5 file (Keras .h5)"},
    {"\xfd"
     "7zXZ",
     5, "xz-compressed data"},
    {"BZh", 3, "bzip2-compressed data"},
    {"\x28\xb5\x2f\xfd", 4, "zstd-compressed data"},
};

/* Endings that tell what a file we cannot read probably is (never used to
 * detect anything: only to word the message). */
static const struct {
  const char *ext, *what;
} ext_hints[] = {
    {".mpk.gz", "Burn's NamedMpkGzFileRecorder files (gzip-compressed MessagePack)"},
    {".mpk", "Burn's NamedMpkFileRecorder files (MessagePack)"},
    {".bin.gz", "Burn's BinGzFileRecorder files (gzip-compressed bincode)"},
    {".bin", "Burn's BinFileRecorder files (bincode)"},
    {".json", "Burn's PrettyJsonFileRecorder files (JSON)"},
    {".onnx", "ONNX models"},
};

static const char *const not_read =
    "burnstore reads Burnpack, SafeTensors, GGUF and PyTorch files (Burn: save with burn-store's "
    "BurnpackStore)";

static int unknown(const uint8_t *h, size_t n, uint64_t size, const char *name, bs_err *err)
{
  if (size < 4)
    return bs_fail(err, EINVAL, 0, NULL,
                   "not a checkpoint: the file is only %llu bytes (Burnpack, SafeTensors and "
                   "PyTorch files are longer)",
                   (unsigned long long)size);
  /* Burn's named MessagePack records: a map whose first key is "metadata". */
  if (n >= 10 && (h[0] & 0xf0) == 0x80 && h[1] == 0xa8 && memcmp(h + 2, "metadata", 8) == 0)
    return bs_fail(err, EINVAL, 0, NULL,
                   "unknown format: MessagePack of a Burn record, as Burn's NamedMpkFileRecorder "
                   "writes (.mpk); %s",
                   not_read);
  /* JSON text (Burn's PrettyJsonFileRecorder writes {"metadata": ..., "item": ...}). */
  size_t ws = 0;
  while (ws < n && (h[ws] == ' ' || h[ws] == '\t' || h[ws] == '\n' || h[ws] == '\r'))
    ws++;
  if (ws < n && h[ws] == '{')
    return bs_fail(err, EINVAL, 0, NULL, "unknown format: JSON text%s; %s",
                   memmem(h, n, "\"metadata\"", 10)
                       ? ", as Burn's PrettyJsonFileRecorder writes (.json)"
                       : " (a SafeTensors file starts with an 8-byte header length)",
                   not_read);
  for (size_t i = 0; i < sizeof lookalikes / sizeof lookalikes[0]; i++)
    if (n >= lookalikes[i].len && memcmp(h, lookalikes[i].magic, lookalikes[i].len) == 0)
      return bs_fail(err, EINVAL, 0, NULL, "unknown format: %s; %s", lookalikes[i].what, not_read);
  char first[3 * 8] = ""; /* "12 34 56 78 9a bc de f0" */
  for (size_t i = 0, used = 0; i < n && i < 8; i++, used = strlen(first))
    snprintf(first + used, sizeof first - used, "%s%02x", i ? " " : "", h[i]);
  const char *hint = NULL;
  for (size_t i = 0; name && !hint && i < sizeof ext_hints / sizeof ext_hints[0]; i++)
    if (bs_ends_with(name, strlen(name), ext_hints[i].ext, true))
      hint = ext_hints[i].what;
  if (hint)
    return bs_fail(err, EINVAL, 0, NULL,
                   "unknown format: first bytes %s are no Burnpack, SafeTensors or PyTorch header; "
                   "the name suggests %s, which burnstore does not read",
                   first, hint);
  enum bs_format by_name = name ? bs_format_by_ext(name) : BS_FMT_NONE;
  return bs_fail(err, EINVAL, 0, NULL,
                 "unknown format: first bytes %s match no Burnpack ('NRUB'), SafeTensors (u64 "
                 "header length, '{') or PyTorch (zip, pickle, tar) header%s%s%s",
                 first, by_name ? " (the name says " : "", by_name ? formats[by_name].name : "",
                 by_name ? ")" : "");
}

/* ---- Detection and opening ------------------------------------------------ */

int bs_sniff(const struct bs_src *src, enum bs_format *fmt, bs_err *err)
{
  uint8_t head[BS_SNIFF_HEAD];
  *fmt = BS_FMT_NONE;
  size_t n = src->size < sizeof head ? (size_t)src->size : sizeof head;
  if (n && bs_src_read(src, 0, head, n, err) != 0)
    return -1;
  enum bs_format maybe = BS_FMT_NONE;
  for (int f = BS_FMT_NONE + 1; f < BS_FMT_COUNT; f++) {
    enum bs_sniff s = formats[f].sniff(head, n, src->size);
    if (s == BS_SNIFF_YES) {
      *fmt = (enum bs_format)f;
      return 0;
    }
    if (s == BS_SNIFF_MAYBE && maybe == BS_FMT_NONE)
      maybe = (enum bs_format)f;
  }
  if (maybe != BS_FMT_NONE) {
    *fmt = maybe;
    return 0;
  }
  return unknown(head, n, src->size, src->name, err);
}

int bs_open_any(struct bs_catalog *cat, struct bs_src *src, const struct bs_open_opts *opts,
                bs_err *err)
{
  bs_formats_init();
  enum bs_format fmt;
  if (bs_sniff(src, &fmt, err) != 0) {
    bs_src_destroy(src);
    return -1;
  }
  uint32_t idx;
  if (bs_catalog_add_src(cat, src, &idx, err) != 0)
    return -1;
  cat->format = fmt;
  int rc = formats[fmt].read(cat, idx, opts, err);
  if (rc != 0) {
    bs_catalog_destroy(cat);
    bs_catalog_init(cat);
  }
  return rc;
}
