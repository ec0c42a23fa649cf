/* A file a writer would write, as a plan: the bytes it builds (a header)
 * and an ordered list of segments saying where every byte of the file comes
 * from. One plan serves both a write (bs_layout_emit streams it into a
 * sink) and a computed file (bs_layout_read serves any range of it, by a
 * binary search over the segments: the mount's -o view=). Format-agnostic:
 * a writer in src/formats builds it with the append calls, in file order.
 *
 * A segment is {file offset, length, what: built bytes at `at`, a source's
 * bytes at `at`, or a tensor's bytes (as bs_tensor_read gives them)}; the
 * bytes between one segment's end and the next one's start (and after the
 * last up to the size) are zeros, the padding and alignment of the format.
 * 32 bytes a segment: a plan is O(tensors) plus its built bytes. */
#ifndef BURNSTORE_LAYOUT_H
#define BURNSTORE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "core/sink.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

enum bs_seg_kind { BS_SEG_BYTES, BS_SEG_SRC, BS_SEG_TENSOR };

struct bs_seg {
  uint64_t off; /* in the file */
  uint64_t len;
  uint64_t at;  /* BYTES: offset in the plan's bytes; SRC: offset in the source */
  uint32_t idx; /* SRC: cat->srcs index; TENSOR: cat->tensors index */
  uint32_t kind;
};

struct bs_layout {
  struct bs_buf bytes; /* the bytes the writer built */
  struct bs_seg *seg;  /* in file order, not overlapping */
  size_t n, cap;
  uint64_t size;    /* the file's size (bytes appended so far) */
  uint64_t biggest; /* the longest tensor or source segment (a write's chunk) */
  bool oom;         /* sticky: an append ran out of memory (bs_layout_done reports it) */
  bool big;         /* sticky: the file would pass 2^62 bytes */
};

void bs_layout_init(struct bs_layout *l);
void bs_layout_destroy(struct bs_layout *l); /* safe on a zeroed or destroyed one */

/* Appends, in file order. Out of memory is sticky (bs_layout_done); a size
 * past 2^63 is EFBIG there too. */
void bs_layout_bytes(struct bs_layout *l, const void *d, size_t n);
/* The same for the n bytes of b, taking b's buffer over when the plan has
 * built few bytes yet (a header built elsewhere is then not copied); b is
 * left empty or as it was, and is still the caller's to destroy. */
void bs_layout_take(struct bs_layout *l, struct bs_buf *b);
void bs_layout_src(struct bs_layout *l, uint32_t src, uint64_t off, uint64_t len);
void bs_layout_tensor(struct bs_layout *l, const struct bs_catalog *cat, size_t tensor);
void bs_layout_zeros(struct bs_layout *l, uint64_t n);
/* Zeros up to the next multiple of align (a power of two). */
void bs_layout_align(struct bs_layout *l, uint64_t align);
/* 0, or -1 with err (ENOMEM, EFBIG) when an append failed. Also trims the
 * segment array to its length. */
BS_NODISCARD int bs_layout_done(struct bs_layout *l, bs_err *err);

/* The segment holding byte `off` of the file, or the last one starting at
 * or before it (off may be in the zeros after it); SIZE_MAX when off is
 * before the first segment or the plan has none. */
size_t bs_layout_find(const struct bs_layout *l, uint64_t off);

/* Up to n bytes of the file at off into buf (cat: the catalog the plan was
 * made of): bytes read (short only at the end of the file), or -errno as
 * bs_tensor_read and bs_src_pread give it (EIO: a source changed since it
 * was opened, checked after each read of it). Thread-safe. */
long bs_layout_read(const struct bs_layout *l, const struct bs_catalog *cat, uint64_t off,
                    void *buf, size_t n);

/* The whole file into k: built bytes, sources' and tensors' bytes in chunks
 * (the chunk sized by the longest segment, at most BS_SINK_CHUNK), zeros. A
 * failed read is an error naming the tensor (bs_sink_put_tensor). */
BS_NODISCARD int bs_layout_emit(const struct bs_layout *l, const struct bs_catalog *cat,
                                struct bs_sink *k, bs_err *err);

#pragma GCC visibility pop

#endif
