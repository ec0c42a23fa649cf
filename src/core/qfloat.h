/* qfloat.h: the byte layout of a QFloat tensor (Burn's quantized float
 * dtype) that burnstore decodes (docs/user-guide.md, "Decoded views"):
 * values (signed integers of 8, 4 or 2 bits, or OCP 8-bit float codes), a
 * byte each or packed in little-endian u32 words (each row padded to whole
 * words, or over the flattened tensor), the first value in the low bits;
 * then one scale per block (a block grid over the shape, row-major; one
 * block: a per-tensor scale) in F32, F16, BF16, UE8M0 or UE4M3, with no
 * padding. A value is q * scale in F32. The layout is made from the
 * dtype's description in the file by the format that wrote it (src/formats,
 * formats.h: bs_qfloat_layout), and kept in the tensor's dtype_raw once it
 * is decoded: the core reads through it and parses nothing. */
#ifndef BURNSTORE_CORE_QFLOAT_H
#define BURNSTORE_CORE_QFLOAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

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
