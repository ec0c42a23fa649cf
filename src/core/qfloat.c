/* A QFloat tensor's values and scales, read through its layout (qfloat.h).
 * Our own code from burn-std's byte layout
 * (crates/burn-std/src/tensor/quantization.rs: PackedOrder::pack,
 * unpack_q_to_i8s, BlockLayout::block_of). */
#include "core/qfloat.h"

#include <string.h>

#include "core/checked.h"
#include "core/decode.h"

void bs_qfloat_span(const struct bs_qfloat *q, uint64_t e0, uint64_t e1, uint64_t *b0, uint64_t *b1)
{
  const uint64_t pw = 32 / q->bits, last = e1 - 1;
  switch (q->layout) {
  case BS_QF_BYTES:
    *b0 = e0;
    *b1 = e1;
    break;
  case BS_QF_FLAT:
    *b0 = e0 / pw * 4;
    *b1 = last / pw * 4 + 4;
    break;
  default:
    *b0 = (e0 / q->inner * q->words_per_row + e0 % q->inner / pw) * 4;
    *b1 = (last / q->inner * q->words_per_row + last % q->inner / pw) * 4 + 4;
  }
}

float bs_qfloat_value(const struct bs_qfloat *q, const uint8_t *bytes, uint64_t b0, uint64_t e)
{
  float f;
  if (q->layout == BS_QF_BYTES) {
    uint8_t b = bytes[e - b0];
    if (q->fdt != BS_DT_I8) {
      bs_decode(q->fdt, &b, 1, &f);
      return f;
    }
    return (float)(int8_t)b; /* an i8 per value, Q4/Q2 ones too */
  }
  const uint64_t pw = 32 / q->bits;
  uint64_t word, pos;
  if (q->layout == BS_QF_FLAT) {
    word = e / pw;
    pos = e % pw;
  } else {
    word = e / q->inner * q->words_per_row + e % q->inner / pw;
    pos = e % q->inner % pw;
  }
  uint32_t w = bs_le32(bytes + (word * 4 - b0));
  uint32_t raw = (w >> (pos * q->bits)) & ((1u << q->bits) - 1);
  /* unpack_q_to_i8s: sign-extend the field */
  int v = (int)raw >= (1 << (q->bits - 1)) ? (int)raw - (1 << q->bits) : (int)raw;
  return (float)v;
}

uint64_t bs_qfloat_scale_index(const struct bs_qfloat *q, uint64_t e)
{
  /* BlockLayout::block_of: the row-major index in the block grid */
  uint64_t block = 0, stride = 1;
  for (uint32_t d = q->rank; d-- > 0;) {
    uint64_t c = e % q->shape[d];
    e /= q->shape[d];
    block += c / q->block[d] * stride;
    stride *= q->grid[d];
  }
  return block;
}

float bs_qfloat_scale(const struct bs_qfloat *q, const uint8_t *b)
{
  float f;
  uint32_t u;
  switch (q->scale_dt) {
  case BS_DT_F32:
    u = bs_le32(b);
    memcpy(&f, &u, sizeof f);
    return f;
  case BS_DT_BF16:
    u = (uint32_t)bs_le16(b) << 16;
    memcpy(&f, &u, sizeof f);
    return f;
  case BS_DT_F16: return bs_f16_to_f32(bs_le16(b));
  default: bs_decode(q->scale_dt, b, 1, &f); return f; /* UE8M0, UE4M3 */
  }
}
