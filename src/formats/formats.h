/* The format registry: one table of the checkpoint formats burnstore reads
 * (name, file name endings, sniff, read), detection from the bytes, and the
 * readers. Each reader turns the bytes of cat->srcs[src] into catalog
 * entries, validating the whole file once; after that the catalog is
 * trusted. Adding a format: one reader file (its sniff and read functions),
 * one enum value below and one row in src/formats/registry.c. */
#ifndef BURNSTORE_FORMATS_H
#define BURNSTORE_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"   /* enum bs_format (one value per row) */
#include "core/sink.h"      /* struct bs_buf */
#include "formats/limits.h" /* the formats' hard caps */

#pragma GCC visibility push(hidden) /* internal (err.h) */

/* The formats: one value per row of the format registry (registry.c), in
 * detection order; a catalog's `format` and a bs_meta_ref's hold one. NONE
 * (0) is a catalog that was not read from a file (a new, empty mount). */
enum bs_format {
  BS_FMT_NONE,
  BS_FMT_BURNPACK,
  BS_FMT_SAFETENSORS,
  BS_FMT_GGUF, /* llama.cpp / ggml; before PyTorch, whose detection is structural */
  BS_FMT_PYTORCH,
  BS_FMT_ST_SHARDED, /* NAME.safetensors.index.json and its shards */
  BS_FMT_COUNT
};

/* "burnpack", "safetensors", "pytorch" (the registry's names); "none" for
 * BS_FMT_NONE, "?" out of range. */
const char *bs_format_name(enum bs_format f);

struct bs_open_opts {
  bool strict; /* PyTorch: refuse unknown pickle GLOBALs instead of skipping them */
};

/* How sure a sniff is. YES: the layout is verified (a magic number of 4 or
 * more bytes, or a structure checked against the file size). MAYBE: it looks
 * like this format but something is off; chosen only when no format says YES,
 * so that its reader can say exactly what is wrong. */
enum bs_sniff { BS_SNIFF_NO, BS_SNIFF_MAYBE, BS_SNIFF_YES };

/* Sniffs see the first min(size, BS_SNIFF_HEAD) bytes and the file size; they
 * do no I/O and never look at the file name. */
#define BS_SNIFF_HEAD 512u
typedef enum bs_sniff (*bs_sniff_fn)(const uint8_t *head, size_t n, uint64_t size);
/* Every reader has this signature. opts may be NULL (defaults). On failure
 * the reader leaves the catalog's tensors and metadata as it found them. */
typedef int (*bs_read_fn)(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts,
                          bs_err *err);

/* One detail of a catalog, as its format tells it: key ("version") and value
 * ("1"), both borrowed for the call only. */
typedef void (*bs_detail_fn)(void *ctx, const char *key, const char *value);
/* Every describe has this signature: the details a format knows about a
 * catalog it read (from cat->srcs[0]) beyond the catalog's common fields,
 * one call of `detail` each, in a fixed order. Reads at most a header; a
 * detail that cannot be read is left out. */
typedef void (*bs_describe_fn)(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx);
/* The text of a metadata value the format's reader left in its source
 * (a struct bs_meta_ref it made): at most max bytes of it appended to out,
 * *cut when there was more. */
typedef int (*bs_meta_text_fn)(const struct bs_src *s, const struct bs_meta_ref *r, uint64_t max,
                               struct bs_buf *out, bool *cut, bs_err *err);

/* The checkpoint of this format that directory `dir` holds (a shard set:
 * its index): *path gets "dir/NAME" (bs_malloc'd). ENOENT when there is
 * none; another error (more than one, an unreadable directory) names it. */
typedef int (*bs_find_in_dir_fn)(const char *dir, char **path, bs_err *err);

#define BS_FORMAT_MAX_EXTS 6
struct bs_format_desc {
  const char *name;                     /* "burnpack": user.burnstore.format, messages */
  const char *exts[BS_FORMAT_MAX_EXTS]; /* usual endings (".bpk"), NULL-terminated; hints only */
  bs_sniff_fn sniff;
  bs_read_fn read;
  bs_describe_fn describe;       /* NULL: nothing beyond the common fields */
  bs_meta_text_fn meta_text;     /* NULL: its metadata is text in the catalog */
  bs_find_in_dir_fn find_in_dir; /* NULL: a directory is never one of this format */
};

/* A directory given as a checkpoint: the file it stands for, from the rows'
 * find_in_dir (a shard set's index). 0 and *path (bs_malloc'd), or -1 with
 * err (ENOENT: no row finds one; else the row's error). */
BS_NODISCARD int bs_format_in_dir(const char *dir, char **path, bs_err *err);

/* The row of format f (borrowed, static), or NULL for NONE and out of range. */
const struct bs_format_desc *bs_format_desc(enum bs_format f);
/* The details of `cat` from its format's row (`burnstore info` prints them
 * as "key: value" lines): Burnpack's version, PyTorch's container, the
 * number of shards. Nothing for a format without a describe, or NONE. */
void bs_format_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx);
/* The text of cat's metadata entry kv: its value, or the text its format
 * makes of a value left in its source (GGUF's: made now, never kept), at
 * most max bytes of it appended to out; *cut when there was more. 0, or -1
 * with err (the source unreadable or changed). */
BS_NODISCARD int bs_meta_text(const struct bs_catalog *cat, const struct bs_kv *kv, uint64_t max,
                              struct bs_buf *out, bool *cut, bs_err *err);
/* The format whose usual ending `path` has (".pth" -> PYTORCH), or NONE. For
 * messages and for choosing an output format; never for detection. */
enum bs_format bs_format_by_ext(const char *path);

/* Tell the format from the bytes (never from the file name): the first row
 * whose sniff says YES, in table order (Burnpack, SafeTensors, GGUF, PyTorch), else
 * the first that says MAYBE. An unknown file fails with EINVAL and a message
 * naming what it looks like when that is known (gzip, Burn's MessagePack
 * recorder files, ...). */
BS_NODISCARD int bs_sniff(const struct bs_src *src, enum bs_format *fmt, bs_err *err);

/* Sniff and read `src` (ownership moves into the catalog, *src is zeroed,
 * also on failure). On failure the catalog is left empty. */
BS_NODISCARD int bs_open_any(struct bs_catalog *cat, struct bs_src *src,
                             const struct bs_open_opts *opts, bs_err *err);

/* Process-wide setup of the format libraries (jansson allocates through
 * bs_malloc). Idempotent and thread-safe; bs_open_any and every reader call
 * it, so callers never need to. */
void bs_formats_init(void);
/* Failed jansson allocations on this thread so far (jansson does not report
 * every one as such; a parse failure after one is ENOMEM). */
unsigned long bs_json_alloc_failures(void);

/* ---- The readers (one file each) ------------------------------------------ */

BS_NODISCARD int bs_bpk_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts,
                             bs_err *err);
enum bs_sniff bs_bpk_sniff(const uint8_t *head, size_t n, uint64_t size);
/* "version": the header's version field. */
void bs_bpk_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx);
/* The layout (core/qfloat.h) of a QFLOAT tensor of `shape` stored in
 * `nbytes`, from the scheme its file describes it by (raw, len: its
 * dtype_raw, the {"QFloat": {...}} CBOR map a Burnpack holds, the current
 * 5-entry scheme or the v0.19-0.21 one): true and *q filled if burnstore
 * decodes it; else false and, if why is not NULL, a short reason. */
struct bs_qfloat;
bool bs_qfloat_layout(const uint8_t *raw, size_t len, uint32_t rank, const uint64_t *shape,
                      uint64_t nbytes, struct bs_qfloat *q, const char **why);

BS_NODISCARD int bs_st_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts,
                            bs_err *err);
enum bs_sniff bs_st_sniff(const uint8_t *head, size_t n, uint64_t size);

/* GGUF (llama.cpp): gguf.c; the writer is gguf_write.c. */
BS_NODISCARD int bs_gguf_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts,
                              bs_err *err);
enum bs_sniff bs_gguf_sniff(const uint8_t *head, size_t n, uint64_t size);
/* Its metadata stays in the file (struct bs_meta_ref): the text of one value. */
BS_NODISCARD int bs_gguf_render(const struct bs_src *s, const struct bs_meta_ref *r, uint64_t max,
                                struct bs_buf *out, bool *cut, bs_err *err);
/* PyTorch: one format, three containers. Which container a file is, is the
 * PyTorch reader's own business: it asks bs_pth_container. */
BS_NODISCARD int bs_pth_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts,
                             bs_err *err);
enum bs_sniff bs_pth_sniff(const uint8_t *head, size_t n, uint64_t size);
/* "version": the container, "zip (torch >= 1.6)", "legacy pickle (torch < 1.6)"
 * or "tar (torch < 0.4)". */
void bs_pth_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx);
enum bs_pth_container { BS_PTH_ZIP, BS_PTH_LEGACY, BS_PTH_TAR };
BS_NODISCARD int bs_pth_container(const struct bs_src *s, enum bs_pth_container *out, bs_err *err);
/* torch's legacy magic number 0x1950a86a20f9469cfc6c, little-endian: the
 * first pickle of a legacy (< 1.6) checkpoint. */
extern const uint8_t bs_pth_legacy_magic[10];

#pragma GCC visibility pop

#endif
