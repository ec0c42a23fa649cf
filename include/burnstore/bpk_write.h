/* The Burnpack writer: one serializer, two sinks (memory and fd), and the
 * atomic file write (temp file beside the target, fsync, rename, fsync dir).
 * It writes the current layout of Burn (256-byte alignment, {"Bool":"Native"},
 * shortest CBOR integers, names sorted byte-wise, empty optional maps left out). */
#ifndef BURNSTORE_BPK_WRITE_H
#define BURNSTORE_BPK_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "burnstore/catalog.h"

struct bs_buf {
  uint8_t *data; /* owned (bs_malloc) */
  size_t len, cap;
};
void bs_buf_destroy(struct bs_buf *b);

/* Which tensors to write, in data order: indices into cat->tensors. NULL means
 * every tensor that is not hidden, in catalog order. Names written are
 * t->name; metadata written is cat->meta as it is (see bs_bpk_default_meta). */
struct bs_bpk_plan {
  const size_t *order;
  size_t n;
};

BS_NODISCARD int bs_bpk_write_mem(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                                  struct bs_buf *out, bs_err *err);
BS_NODISCARD int bs_bpk_write_fd(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                                 int fd, bs_err *err);
/* Atomic: writes `path`.<pid>-<n>.tmp beside path, fsyncs it, renames it over
 * path, fsyncs the directory. On any failure the temp file is removed and an
 * existing `path` is untouched. */
BS_NODISCARD int bs_bpk_write_file(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                                   const char *path, bs_err *err);

/* Add format=burnpack, producer=burnstore, version=BURNSTORE_VERSION for each
 * of those keys the catalog's metadata does not have yet. */
BS_NODISCARD int bs_bpk_default_meta(struct bs_catalog *cat, bs_err *err);

#endif
