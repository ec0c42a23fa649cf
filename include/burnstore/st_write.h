/* The SafeTensors writer: one serializer into a bs_sink, writing what the
 * reference writer (the `safetensors` crate, also behind safetensors.torch)
 * writes, so that a file it made comes back byte for byte:
 *  - tensors in data order sorted by dtype alignment, largest first (the
 *    crate's Dtype enum order, descending), ties by name (byte-wise), packed
 *    back to back with no gaps;
 *  - the header: compact JSON, "__metadata__" first (left out when the
 *    catalog has no metadata; its keys sorted byte-wise: the crate's order is
 *    a HashMap's, i.e. none), then the tensors in data order, each as
 *    {"dtype":..,"shape":[..],"data_offsets":[B,E]}, strings escaped as
 *    serde_json escapes them; padded with spaces to a multiple of 8.
 * Its row in the writers table (writers.h) is "safetensors", ".safetensors". */
#ifndef BURNSTORE_ST_WRITE_H
#define BURNSTORE_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "burnstore/catalog.h"
#include "burnstore/sink.h"

/* Can SafeTensors store this tensor (one of its 22 dtypes, a readable
 * source, not named __metadata__)? 0, or -1 with err naming the tensor and
 * why (with a hint where a same-bytes dtype exists: Flex32 -> F32). */
BS_NODISCARD int bs_st_can_write(const struct bs_tensor *t, bs_err *err);

/* Serialize the tensors `which` (catalog indices, any order; NULL: every
 * tensor that is not hidden) with cat->meta into k. */
BS_NODISCARD int bs_st_write_some(const struct bs_catalog *cat, const size_t *which, size_t n,
                                  struct bs_sink *k, bs_err *err);
BS_NODISCARD int bs_st_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err);
/* The bytes bs_st_write_some would write (header included), without writing. */
BS_NODISCARD int bs_st_size(const struct bs_catalog *cat, const size_t *which, size_t n,
                            uint64_t *size, bs_err *err);

/* Metadata a SafeTensors file gets: Burnpack's own marker format=burnpack
 * (which bs_bpk_default_meta adds) becomes format=pt, the value transformers
 * requires of a file with metadata. Nothing else is added or changed. */
BS_NODISCARD int bs_st_default_meta(struct bs_catalog *cat, bs_err *err);

/* A SafeTensors JSON string, escaped as serde_json does (", \, \b \f \n \r
 * \t, other controls as \u00xx, nothing else), quotes included, appended to
 * b. -1 on out of memory. Shared with the shard index writer. */
BS_NODISCARD int bs_st_json_string(struct bs_buf *b, const char *s);

#endif
