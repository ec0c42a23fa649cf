/* The format-agnostic tensor catalog: readers fill it, the writers drain
 * it, the FUSE layer and the CLI query it. Bytes stay in their source; a tensor
 * is a key, a dtype, a shape and where its bytes are. */
#ifndef BURNSTORE_CATALOG_H
#define BURNSTORE_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/err.h"
#include "core/source.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

/* A metadata value left where it is in a source (typed values a format
 * keeps in its file): its text is made when asked for (formats/formats.h:
 * bs_meta_text), never kept, so a large block (a tokenizer) costs what its
 * entries take, not its text. The core copies it, never reads it. */
struct bs_meta_ref { /* 40 bytes (a file may hold a million small values) */
  uint64_t off, len; /* the value's bytes in that source */
  uint64_t text_len; /* the length of its text */
  uint32_t src;      /* the catalog's source holding the bytes */
  uint8_t format;    /* whose encoding: an enum bs_format (formats/formats.h) */
  uint8_t types[10]; /* the value's type and its arrays' element types */
};

struct bs_kv {
  char *key;               /* owned */
  char *value;             /* owned text; NULL when ref is set */
  struct bs_meta_ref *ref; /* owned, or NULL: the value left in its source */
  bool borrowed;           /* key, value and ref are another entry's, which outlives this
                              one (bs_kv_destroy leaves them): the edit layer's view of its
                              source's metadata until it changes */
};

/* What few tensors have (strided views, a raw dtype, a reason they cannot
 * be read, a param id): behind bs_tensor.x, shared and all zero
 * for the rest (bs_tensor_x gives a tensor its own). */
struct bs_tensor_x {
  int64_t *strides;       /* owned; NULL: contiguous. Else rank entries, in elements */
  uint64_t storage_off;   /* strided only: element offset into the storage */
  uint64_t storage_bytes; /* strided only: bytes of the storage from off; a decoded
                             QFloat tensor (never strided): its stored length */
  uint64_t param_id;      /* when has_param_id */
  uint8_t *dtype_raw;     /* owned, may be NULL: the dtype exactly as the file
                             encoded it (a QFloat's scheme), for round trips;
                             a torch quantizer (decode.h); a decoded QFloat tensor:
                             its scheme parsed once (qfloat.h's struct bs_qfloat) */
  size_t dtype_raw_len;
  char *unsupported; /* owned, may be NULL: the tensor cannot be read, and why */
};

/* 64 bytes a tensor (issue 34: a million tensors in 150 bytes each, the
 * tree's node and the key included). */
struct bs_tensor {
  char *key;             /* the key in the source file: in the catalog's key arena */
  char *name;            /* the presented key after options: key itself (the same string) until
                            key options rename it, then owned */
  uint64_t *shape;       /* in the catalog's arena; rank entries, NULL when rank == 0 */
  uint64_t nbytes;       /* byte length of the contiguous row-major data */
  uint64_t off;          /* absolute offset in the source: of the data when
                            x->strides == NULL, else of the storage's first byte */
  struct bs_tensor_x *x; /* never NULL: the shared empty one, or the tensor's own
                            (in the catalog's arena; bs_tensor_x) */
  enum bs_dtype dtype;
  uint8_t rank;         /* <= BS_MAX_RANK */
  bool hidden;          /* filtered out by key options; not presented */
  bool decoded;         /* presented as dtype (F32) by bs_catalog_decode_as (policy/
                           decode_as.h): reads decode
                           the stored bytes; nbytes is the decoded length */
  uint8_t stored_dtype; /* decoded only: the enum bs_dtype the bytes are stored in */
  uint32_t src;         /* index into bs_catalog.srcs */
  bool has_param_id;    /* x->param_id is set */
};

struct bs_catalog {
  int format; /* the reader's row: an enum bs_format (formats/formats.h); 0 (BS_FMT_NONE):
                 not read from a file. The core never looks at it */
  struct bs_tensor *tensors; /* owned array */
  size_t count, cap;
  struct bs_src *srcs; /* owned array; srcs[0] is the checkpoint file */
  size_t nsrcs, srccap;
  struct bs_kv *meta; /* the file's metadata, key to text (or to a value left in the file) */
  size_t nmeta, metacap;
  char *values_json;           /* owned, may be NULL: non-tensor values of the file, JSON object */
  char *notes;                 /* owned, may be NULL: what a reader skipped, one line each */
  size_t notes_len, notes_cap; /* of notes (bs_catalog_note), while notes is not NULL */
  struct bs_key_block *keys;   /* owned: the arena of the tensors' keys, one allocation
                                  per many tensors (freed with the catalog) */
  struct bs_key_block *words;  /* owned: the same of their shapes and x blocks (8-aligned) */
};

void bs_catalog_init(struct bs_catalog *cat);
void bs_catalog_destroy(struct bs_catalog *cat); /* safe on a half-built catalog */

/* Take ownership of *src (it is zeroed); *idx gets its index. */
BS_NODISCARD int bs_catalog_add_src(struct bs_catalog *cat, struct bs_src *src, uint32_t *idx,
                                    bs_err *err);

/* Room for `more` tensors beyond count, exactly (no doubling): a reader
 * that knows its count calls it before adding. 0, or -1 out of memory. */
BS_NODISCARD int bs_catalog_reserve(struct bs_catalog *cat, size_t more);
/* Append a tensor; computes nbytes from dtype and shape (except QFLOAT,
 * where nbytes is 0 and the reader sets it). The returned pointer is
 * borrowed and valid only until the next bs_catalog_add. `off` is used in
 * error messages only. */
struct bs_tensor *bs_catalog_add(struct bs_catalog *cat, const char *key, enum bs_dtype dtype,
                                 uint32_t rank, const uint64_t *shape, uint64_t off, bs_err *err);
/* t's own rarely-used fields, made on first use (zero) in cat's arena, to
 * set: t->x is shared and read-only until then. NULL out of memory. */
struct bs_tensor_x *bs_tensor_x(struct bs_catalog *cat, struct bs_tensor *t);
/* Give t (of cat) a copy of s's rarely-used fields but unsupported: its
 * storage range, param id, strides (s->rank of them) and raw dtype. 0, or
 * -1 out of memory. */
BS_NODISCARD int bs_tensor_copy_x(struct bs_catalog *cat, struct bs_tensor *t,
                                  const struct bs_tensor *s);

BS_NODISCARD int bs_catalog_add_meta(struct bs_catalog *cat, const char *key, const char *value,
                                     bs_err *err);
/* The same, taking ownership of key and value (bs_malloc'd; freed when it
 * fails): a reader hands over a long value without a copy. */
BS_NODISCARD int bs_catalog_take_meta(struct bs_catalog *cat, char *key, char *value, bs_err *err);
/* Append key (taken: bs_malloc'd, freed when it fails) = the value r
 * (copied) left in a source: a reader hands over its keys without a copy. */
BS_NODISCARD int bs_catalog_take_meta_ref(struct bs_catalog *cat, char *key,
                                          const struct bs_meta_ref *r, bs_err *err);
/* Append a copy of kv: its key and its text or its ref. */
BS_NODISCARD int bs_catalog_add_meta_kv(struct bs_catalog *cat, const struct bs_kv *kv,
                                        bs_err *err);
/* The length of kv's text (a ref's, without making it). */
uint64_t bs_kv_text_len(const struct bs_kv *kv);
/* Free kv's key and value or ref (the entry itself is the caller's). */
void bs_kv_destroy(struct bs_kv *kv);
/* Give kv the text value (taken: bs_malloc'd; freed when it fails), its
 * own (a borrowed entry's key copied, the other's untouched). 0, or -1 out
 * of memory. */
BS_NODISCARD int bs_kv_set_value(struct bs_kv *kv, char *value);
/* *dst = a copy of *src (key, text or ref); -1 out of memory (dst empty). */
BS_NODISCARD int bs_kv_copy(struct bs_kv *dst, const struct bs_kv *src);
/* Append one line to cat->notes (amortized: in time linear in the line). */
BS_NODISCARD int bs_catalog_note(struct bs_catalog *cat, const char *line, bs_err *err);
/* Cut cat->notes back to its first len bytes (a reader's rollback); 0 frees them. */
void bs_catalog_notes_truncate(struct bs_catalog *cat, size_t len);

/* Drop the tensors from index `count` on and the metadata from `nmeta` on. */
void bs_catalog_truncate(struct bs_catalog *cat, size_t count, size_t nmeta);

/* How every reader takes back what it added when it fails half way: a mark
 * taken before it adds anything, rolled back on failure. It covers all a
 * reader may add: tensors, metadata, sources (shards, decompressed copies),
 * notes, and values_json when the catalog had none (a reader sets values
 * only as its last step, on success). */
struct bs_catalog_mark {
  size_t count, nmeta, nsrcs, notes_len;
  bool had_values;
};
struct bs_catalog_mark bs_catalog_mark(const struct bs_catalog *cat);
void bs_catalog_rollback(struct bs_catalog *cat, const struct bs_catalog_mark *m);

/* Index of the tensor whose key is `key`, or -1. O(n). */
long bs_catalog_find(const struct bs_catalog *cat, const char *key);

/* Read up to n bytes of the tensor's contiguous data starting at off (clamped
 * to nbytes). Strided tensors are gathered element run by element run, never
 * whole; a decoded tensor (policy/decode_as.h) decodes the units that
 * cover the range. Returns bytes read, or -errno: -EIO also when the source file
 * changed since it was opened (bs_src_changed). Thread-safe.
 * The one exception to bs_err in the core (with bs_src_pread under it): this
 * is the data path, pread(2)-shaped, run for every FUSE read; its failures
 * (EIO: the source shrank, changed or failed, ENOTSUP: t->unsupported says why)
 * have no offset or message to add, and its callers are the FUSE edge, which
 * replies with the errno, or add their own context (the writer names key and
 * offset). */
long bs_tensor_read(const struct bs_catalog *cat, const struct bs_tensor *t, uint64_t off,
                    void *buf, size_t n);
/* Why bs_tensor_read just failed with -code on this thread, for the
 * caller's one-line message (bs_src_why of the tensor's source): the
 * reason its source logged, what changed, else strerror(code). Returns buf. */
const char *bs_tensor_why(const struct bs_catalog *cat, const struct bs_tensor *t, int code,
                          char *buf, size_t n);

/* The unit tensor t's bytes are decoded in when stored as dt: bs_decode_unit's;
 * for F32 (as F16 or BF16: narrowed only) one element of 4 bytes; for
 * torch's quantized types with a quantizer in dtype_raw, one element. False:
 * no decoder (a QFloat is read through its layout instead, qfloat.h). A
 * decoded view (policy/decode_as.h) marks a tensor decoded only if it has one. */
bool bs_tensor_stored_unit(const struct bs_tensor *t, enum bs_dtype dt, uint32_t *elems,
                           uint32_t *bytes);

/* If the tensor's bytes are one range of a source that has an fd now, give
 * the fd and the absolute offset of byte 0 (for splicing reads) and return
 * true; the fd stays open until bs_tensor_fd_put. False: read with
 * bs_tensor_read (a memory or network source, a strided view). */
bool bs_tensor_fd_range(const struct bs_catalog *cat, const struct bs_tensor *t, int *fd,
                        uint64_t *abs_off);
void bs_tensor_fd_put(const struct bs_catalog *cat, const struct bs_tensor *t, int fd);

/* Bytes [off, off + n) of the tensor (clamped to nbytes; off < nbytes, n >
 * 0), lent from its source's memory without a copy (bs_src_view): 0 with v
 * filled (release with bs_tensor_view_put), -EAGAIN or -ENOTSUP (read with
 * bs_tensor_read: a source that holds no bytes in memory, a strided or
 * decoded tensor), or -errno (-EIO also when the source changed). */
int bs_tensor_view(const struct bs_catalog *cat, const struct bs_tensor *t, uint64_t off, size_t n,
                   struct bs_src_view *v);
void bs_tensor_view_put(const struct bs_catalog *cat, const struct bs_tensor *t,
                        struct bs_src_view *v);

/* Validate a strided view against its storage (strides >= 0, max element
 * within storage_bytes). Called by readers that set strides. */
BS_NODISCARD int bs_tensor_check_view(const struct bs_tensor *t, uint64_t off, bs_err *err);

#pragma GCC visibility pop

#endif
