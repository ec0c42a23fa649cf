/* qfloat.h: the QFloat schemes burnstore decodes, and their byte layout
 * (docs/user-guide.md, "Decoded views"). The scheme map's spelling:
 * /work/shared/docs/burnpack-format.md section 4.2 (cubecl's QuantScheme
 * serialized by serde: crates/cubecl-common/src/quant/scheme.rs); the bytes:
 * burn-std's QuantizedBytes, quantized_data_len and PackedOrder
 * (crates/burn-std/src/tensor/quantization.rs).
 *
 * Decoded: mode Symmetric; values Q8F, Q8S, Q4F, Q4S, Q2F, Q2S (signed
 * integers of 8, 4 or 2 bits) and E4M3, E5M2 (OCP 8-bit float codes); store
 * Native or PackedNative (a byte per value: an i8, or the float's code) or
 * PackedU32(0) (little-endian u32 words along the innermost dimension, the
 * first value in the low bits, each row padded to whole words as current
 * burn-std writes it; or over the flattened tensor as older burn wrote it,
 * told apart by the length); one per-tensor scale or one scale per block
 * (BlockSize's dims, missing leading ones 1, every dimension a whole number
 * of blocks; the scales row-major over the block grid) in F32, F16, BF16,
 * UE8M0 or UE4M3, after the values with no padding. A value is q * scale in
 * F32. Not decoded (stay as stored): the Lookup mode (its table is not in
 * the file), E2M1 (burn-std writes no E2M1 bytes: which nibble is first is
 * not defined), PackedU32 along an outer dimension, two-level scales, blocks
 * that do not divide the shape, and lengths that need padding or that fit
 * two layouts. A dtype description, read in the core (as ggml's block
 * layouts are) because the catalog's decoded reads need it. */
#ifndef BURNSTORE_CORE_QFLOAT_H
#define BURNSTORE_CORE_QFLOAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "burnstore/dtype.h"

#define BS_QF_MAX_RANK 8

enum bs_qf_layout {
  BS_QF_BYTES, /* a byte per value */
  BS_QF_ROWS,  /* u32 words, each row (innermost dimension) padded to whole words */
  BS_QF_FLAT,  /* u32 words over the flattened tensor */
};

struct bs_qfloat {
  enum bs_dtype fdt; /* BS_DT_F8_E4M3 / F8_E5M2 for float values, else BS_DT_I8 */
  unsigned bits;     /* 8, 4 or 2 */
  enum bs_qf_layout layout;
  enum bs_dtype scale_dt; /* F32, F16, BF16, F8_E8M0 (UE8M0), F8_E4M3 (UE4M3) */
  uint32_t rank;          /* >= 1 (a scalar is [1]) */
  uint64_t shape[BS_QF_MAX_RANK], block[BS_QF_MAX_RANK], grid[BS_QF_MAX_RANK];
  uint64_t numel, inner, words_per_row;
  uint64_t value_bytes, nscales; /* the scales start at value_bytes */
};

/* The scheme in the QFloat dtype CBOR `raw` (the {"QFloat": {...}} map as
 * the Burnpack holds it: the current 5-entry scheme or the v0.19-0.21 one)
 * for a tensor of `shape` stored in `nbytes`: true and *q filled if it is
 * decoded here; else false and, if why is not NULL, a short reason. */
bool bs_qfloat_layout(const uint8_t *raw, size_t len, uint32_t rank, const uint64_t *shape,
                      uint64_t nbytes, struct bs_qfloat *q, const char **why);

/* The value bytes [*b0, *b1) that hold elements [e0, e1) (e0 < e1). */
void bs_qfloat_span(const struct bs_qfloat *q, uint64_t e0, uint64_t e1, uint64_t *b0,
                    uint64_t *b1);

/* Element e's value (before its scale), from the value bytes at `bytes`,
 * which start at value byte b0 (from bs_qfloat_span). */
float bs_qfloat_value(const struct bs_qfloat *q, const uint8_t *bytes, uint64_t b0, uint64_t e);

/* The index of element e's scale (0 for a per-tensor scale). */
uint64_t bs_qfloat_scale_index(const struct bs_qfloat *q, uint64_t e);

/* One scale from its stored bytes (bs_dtype_bits(q->scale_dt) / 8 of them). */
float bs_qfloat_scale(const struct bs_qfloat *q, const uint8_t *b);

#endif
