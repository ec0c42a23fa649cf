/* The Burnpack writer: one serializer into a bs_sink (memory, fd, or an
 * atomic file: see sink.h). It writes the current layout of Burn (256-byte
 * alignment, {"Bool":"Native"}, shortest CBOR integers, names sorted
 * byte-wise, empty optional maps left out). Its row in the writers table
 * (writers.h) is "burnpack", ".bpk". */
#ifndef BURNSTORE_BPK_WRITE_H
#define BURNSTORE_BPK_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "core/layout.h"
#include "core/sink.h"
#include "formats/limits.h"

/* Which tensors to write, in data order: indices into cat->tensors. NULL means
 * every tensor that is not hidden, in catalog order. Names written are
 * t->name; metadata written is cat->meta as it is (see bs_bpk_default_meta). */
struct bs_bpk_plan {
  const size_t *order;
  size_t n;
};

/* Serialize into any sink. */
BS_NODISCARD int bs_bpk_write(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                              struct bs_sink *k, bs_err *err);
/* The file bs_bpk_write writes, as a plan (core/layout.h) appended to l
 * (empty): what the write emits and a -o view=bpk mount serves. */
BS_NODISCARD int bs_bpk_layout(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                               struct bs_layout *l, bs_err *err);
/* Can Burnpack store this tensor (its dtype, a QFloat's scheme, a readable
 * source)? 0, or -1 with err naming the tensor and why. Sizes are not checked. */
BS_NODISCARD int bs_bpk_can_write(const struct bs_tensor *t, bs_err *err);
/* Burnpack names are CBOR text strings: UTF-8, at most BS_MAX_KEY_LEN bytes. */
BS_NODISCARD int bs_bpk_name_ok(const char *name, bs_err *err);

BS_NODISCARD int bs_bpk_write_mem(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                                  struct bs_buf *out, bs_err *err);
BS_NODISCARD int bs_bpk_write_fd(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                                 int fd, bs_err *err);
/* Atomic (bs_atomic_open/commit): on any failure an existing `path` is
 * untouched and no temp file is left. */
BS_NODISCARD int bs_bpk_write_file(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                                   const char *path, bs_err *err);

/* Add format=burnpack, producer=burnstore, version=BURNSTORE_VERSION for each
 * of those keys the catalog's metadata does not have yet. */
BS_NODISCARD int bs_bpk_default_meta(struct bs_catalog *cat, bs_err *err);

#endif
