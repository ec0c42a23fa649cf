/* decode.c's dequantization of torch's quantized tensors on hand-picked
 * values: per tensor in float, (float)scale * (float)(int32)(q - zp), the
 * qint32 difference wrapping as torch's int32 arithmetic does; per channel
 * in double, rounded once; the channel of an element from its index; and
 * bs_torch_q_get refusing blobs that do not hold a whole quantizer. */
#include <criterion/criterion.h>
#include <stdalign.h>
#include <string.h>

#include "core/decode.h"

static uint32_t fbits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

Test(torch_q, per_tensor)
{
  struct bs_torch_q q = {.scheme = BS_TQ_PER_TENSOR, .scale = 0.1, .zp = 3};
  const uint8_t i8[] = {0x80, 0x7f, 0x03, 0xff}; /* -128, 127, 3, -1 */
  float out[4];
  bs_decode_torch_q(BS_DT_QI8, &q, 0, i8, 4, out);
  cr_expect_eq(fbits(out[0]), fbits(0.1f * -131.0f));
  cr_expect_eq(fbits(out[1]), fbits(0.1f * 124.0f));
  cr_expect_eq(fbits(out[2]), 0, "q == zp: +0");
  cr_expect_eq(fbits(out[3]), fbits(0.1f * -4.0f));
  bs_decode_torch_q(BS_DT_QU8, &q, 0, i8, 4, out);
  cr_expect_eq(fbits(out[0]), fbits(0.1f * 125.0f), "quint8: 128 - 3");
  cr_expect_eq(fbits(out[3]), fbits(0.1f * 252.0f));
  /* qint32: INT32_MIN - 5 wraps to INT32_MAX - 4, as in torch */
  q.scale = 0.7;
  q.zp = 5;
  const uint8_t i32[] = {0x00, 0x00, 0x00, 0x80, 0xff, 0xff, 0xff, 0x7f};
  bs_decode_torch_q(BS_DT_QI32, &q, 0, i32, 2, out);
  cr_expect_eq(fbits(out[0]), fbits(0.7f * (float)2147483643), "%08x", fbits(out[0]));
  cr_expect_eq(fbits(out[1]), fbits(0.7f * (float)2147483642));
}

Test(torch_q, per_channel)
{
  /* shape [2, 3] along axis 0: inner 3; then along axis 1: inner 1 */
  alignas(struct bs_torch_q) uint8_t blob[sizeof(struct bs_torch_q) + 3 * 16];
  struct bs_torch_q h = {.scheme = BS_TQ_PER_CHANNEL, .axis = 0, .nch = 2, .inner = 3};
  const double sc[3] = {0.1, 1.0 / 3, 2.5};
  const int64_t zp[3] = {1, -2, 7};
  memcpy(blob, &h, sizeof h);
  memcpy(blob + sizeof h, sc, 2 * 8);
  memcpy(blob + sizeof h + 2 * 8, zp, 2 * 8);
  const struct bs_torch_q *q = bs_torch_q_get(blob, sizeof h + 2 * 16);
  cr_assert_not_null(q);
  const uint8_t v[] = {10, 20, 30, 40, 50, 60};
  float out[6];
  bs_decode_torch_q(BS_DT_QU8, q, 0, v, 6, out);
  for (int i = 0; i < 6; i++) {
    int c = i / 3;
    cr_expect_eq(fbits(out[i]), fbits((float)((double)(v[i] - zp[c]) * sc[c])), "[%d]", i);
  }
  /* from element 4 on: channel 1 */
  bs_decode_torch_q(BS_DT_QU8, q, 4, v + 4, 2, out);
  cr_expect_eq(fbits(out[0]), fbits((float)((double)(50 + 2) * sc[1])));
  /* axis 1 of [2, 3]: channel = index % 3 */
  h.axis = 1;
  h.nch = 3;
  h.inner = 1;
  memcpy(blob, &h, sizeof h);
  memcpy(blob + sizeof h, sc, 3 * 8);
  memcpy(blob + sizeof h + 3 * 8, zp, 3 * 8);
  q = bs_torch_q_get(blob, sizeof blob);
  cr_assert_not_null(q);
  bs_decode_torch_q(BS_DT_QU8, q, 0, v, 6, out);
  for (int i = 0; i < 6; i++)
    cr_expect_eq(fbits(out[i]), fbits((float)((double)(v[i] - zp[i % 3]) * sc[i % 3])), "[%d]", i);
  /* a hostile zero point does not overflow */
  int64_t big = INT64_MIN;
  memcpy(blob + sizeof h + 3 * 8, &big, 8);
  bs_decode_torch_q(BS_DT_QU8, q, 0, v, 1, out);
  cr_expect_eq(fbits(out[0]), fbits((float)((10.0 - (double)INT64_MIN) * sc[0])));
}

Test(torch_q, get_refuses_partial_blobs)
{
  alignas(struct bs_torch_q) uint8_t blob[sizeof(struct bs_torch_q) + 32];
  struct bs_torch_q h = {.scheme = BS_TQ_PER_TENSOR, .scale = 1};
  memcpy(blob, &h, sizeof h);
  cr_expect_not_null(bs_torch_q_get(blob, sizeof h));
  cr_expect_null(bs_torch_q_get(blob, sizeof h - 1));
  cr_expect_null(bs_torch_q_get(blob, sizeof h + 8), "per tensor: nothing after it");
  cr_expect_null(bs_torch_q_get(NULL, 0));
  h.scheme = BS_TQ_PER_CHANNEL;
  h.nch = 2;
  h.inner = 1;
  memcpy(blob, &h, sizeof h);
  cr_expect_null(bs_torch_q_get(blob, sizeof h + 16), "2 channels need 32 bytes");
  cr_expect_not_null(bs_torch_q_get(blob, sizeof h + 32));
  h.nch = 0;
  memcpy(blob, &h, sizeof h);
  cr_expect_null(bs_torch_q_get(blob, sizeof h));
  h.nch = 1;
  h.inner = 0;
  memcpy(blob, &h, sizeof h);
  cr_expect_null(bs_torch_q_get(blob, sizeof h + 16));
  h.scheme = 7;
  memcpy(blob, &h, sizeof h);
  cr_expect_null(bs_torch_q_get(blob, sizeof h));
}

/* per_channel_affine_float_qparams: float scales and zero points after the
 * header (8 bytes a channel); ((float)q - zp[c]) * scale[c] in float, as
 * torch's dequantize_tensor_per_channel_float_qparams_cpu computes it. */
Test(torch_q, per_channel_float_qparams)
{
  alignas(struct bs_torch_q) uint8_t blob[sizeof(struct bs_torch_q) + 2 * 8];
  struct bs_torch_q h = {.scheme = BS_TQ_PER_CHANNEL_FQ, .axis = 0, .nch = 2, .inner = 2};
  const float sc[2] = {0.1f, 1.0f / 3}, zp[2] = {0.5f, -3.25f};
  memcpy(blob, &h, sizeof h);
  memcpy(blob + sizeof h, sc, 8);
  memcpy(blob + sizeof h + 8, zp, 8);
  cr_expect_null(bs_torch_q_get(blob, sizeof h + 32), "float qparams: 8 bytes a channel");
  const struct bs_torch_q *q = bs_torch_q_get(blob, sizeof blob);
  cr_assert_not_null(q);
  const uint8_t v[] = {0, 255, 7, 0x80};
  float out[4];
  bs_decode_torch_q(BS_DT_QU8, q, 0, v, 4, out);
  for (int i = 0; i < 4; i++) {
    volatile float d = (float)v[i] - zp[i / 2]; /* one rounding, then the product */
    cr_expect_eq(fbits(out[i]), fbits(d * sc[i / 2]), "[%d]", i);
  }
  bs_decode_torch_q(BS_DT_QI8, q, 3, v + 3, 1, out);
  volatile float d = -128.0f - zp[1];
  cr_expect_eq(fbits(out[0]), fbits(d * sc[1]), "qint8 -128 in channel 1");
}
