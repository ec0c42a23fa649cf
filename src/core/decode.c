/* Stored dtypes to F32 (decode.h). Our own code from the public format
 * descriptions: IEEE 754 binary16/binary64, Google's bfloat16, the OCP 8-bit
 * floating point spec (E4M3FN, E5M2, E8M0), the OCP MX spec's E2M1 (F4) with
 * torch's nibble order, the FNUZ variants as torch and ml_dtypes define
 * them, and ggml's block layouts (ggml-common.h) with the formulas of its
 * reference dequantize_row_* (ggml-quants.c). */
#include "core/decode.h"

#include <math.h>
#include <string.h>

#include "core/checked.h"
#include "core/decode_ggml.h"
#include "core/decode_vec.h"

static float f32_from_bits(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* 2^e exactly, for -149 <= e <= 127 (the subnormal powers included). */
static float pow2f(int e)
{
  return f32_from_bits(e >= -126 ? (uint32_t)(e + 127) << 23 : 1u << (e + 149));
}

float bs_f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) /* infinity, NaN (payload kept: F32's is wider) */
    return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  if (exp != 0)
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  /* zero and subnormals: mant * 2^-24, exact in F32 */
  float v = (float)mant * pow2f(-24);
  return sign ? -v : v;
}

/* An 8-bit float without infinities: 1 sign, `ebits` exponent, `mbits`
 * mantissa bits, exponent bias `bias`. `fnuz`: 0x80 is the only NaN and
 * there is no -0 (torch's float8_*_fnuz); else all-ones exponent and
 * mantissa is NaN (OCP E4M3FN). */
static float f8_finite(uint8_t b, unsigned ebits, unsigned mbits, int bias, bool fnuz)
{
  unsigned mmask = (1u << mbits) - 1, emask = (1u << ebits) - 1;
  unsigned exp = (b >> mbits) & emask, mant = b & mmask;
  bool neg = b & 0x80;
  if (fnuz ? b == 0x80 : (exp == emask && mant == mmask))
    return neg ? -NAN : NAN;
  float v = exp == 0 ? (float)mant * pow2f(1 - bias - (int)mbits)
                     : (float)(mant | (1u << mbits)) * pow2f((int)exp - bias - (int)mbits);
  return neg ? -v : v;
}

static void dec_f64(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++) {
    uint64_t u = bs_le64(in + 8 * i);
    double d;
    memcpy(&d, &u, sizeof d);
    out[i] = (float)d; /* the default rounding mode: nearest, ties to even */
  }
}

/* F16 and BF16: the vector path (decode_vec.h) for what it can, the
 * scalar loop for the rest; both give the same bits. */
static void dec_f16(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = bs_vec_f16_to_f32(in, n, out); i < n; i++)
    out[i] = bs_f16_to_f32(bs_le16(in + 2 * i));
}

static void dec_bf16(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = bs_vec_bf16_to_f32(in, n, out); i < n; i++)
    out[i] = f32_from_bits((uint32_t)bs_le16(in + 2 * i) << 16);
}

static void dec_f32(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++)
    out[i] = f32_from_bits(bs_le32(in + 4 * i));
}

static void dec_e4m3(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++)
    out[i] = f8_finite(in[i], 4, 3, 7, false);
}

static void dec_e4m3fnuz(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++)
    out[i] = f8_finite(in[i], 4, 3, 8, true);
}

static void dec_e5m2fnuz(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++)
    out[i] = f8_finite(in[i], 5, 2, 16, true);
}

/* E5M2 is the upper byte of a binary16 (same exponent, infinities, NaNs). */
static void dec_e5m2(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++)
    out[i] = bs_f16_to_f32((uint16_t)(in[i] << 8));
}

/* E8M0: an unsigned power of two 2^(e-127); 0xff is NaN. */
static void dec_e8m0(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++)
    out[i] = in[i] == 0xff ? NAN : pow2f((int)in[i] - 127);
}

/* F4: E2M1 (OCP Microscaling Formats 1.0, section 5.3.3): a sign, 2
 * exponent bits (bias 1) and 1 mantissa bit; codes 0-7 are 0, 0.5, 1, 1.5,
 * 2, 3, 4, 6 (code 1 the one subnormal), 8-15 their negatives (8 is -0); no
 * infinity or NaN. Two a byte, element 2j in the low nibble and 2j + 1 in
 * the high one: torch's float4_e2m1fn_x2 (c10/util/Float4_e2m1fn_x2.h,
 * "val1 : val0" in bits "7654 : 3210"), whose storage bytes are what an F4
 * tensor holds in every file that has the dtype (torch's own, and those its
 * bindings write with the last dimension doubled). */
static const float e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static void dec_f4(const uint8_t *in, size_t n, float *out)
{
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = e2m1[in[i] & 0x0f];
    out[2 * i + 1] = e2m1[in[i] >> 4];
  }
}

/* ggml's 32-element blocks (ggml-common.h): an fp16 scale d, then for
 * Q4_1/Q5_1 an fp16 minimum m, for Q5_* 4 bytes of fifth bits (qh, little
 * endian), then the quants. Element j < 16 is the low nibble of qs[j] (and
 * bit j of qh), element j + 16 its high nibble (and bit j + 16 of qh).
 * Formulas of dequantize_row_q4_0 ... q8_0: y = q * d, or q * d + m,
 * in float, the product rounded before the sum. */
static void dec_q4_0(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 18, out += 32) {
    float d = bs_f16_to_f32(bs_le16(in));
    for (int j = 0; j < 16; j++) {
      out[j] = (float)((in[2 + j] & 0x0f) - 8) * d;
      out[j + 16] = (float)((in[2 + j] >> 4) - 8) * d;
    }
  }
}

static void dec_q4_1(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 20, out += 32) {
    float d = bs_f16_to_f32(bs_le16(in)), m = bs_f16_to_f32(bs_le16(in + 2));
    for (int j = 0; j < 16; j++) {
      float p0 = (float)(in[4 + j] & 0x0f) * d, p1 = (float)(in[4 + j] >> 4) * d;
      out[j] = p0 + m;
      out[j + 16] = p1 + m;
    }
  }
}

static void dec_q5_0(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 22, out += 32) {
    float d = bs_f16_to_f32(bs_le16(in));
    uint32_t qh = bs_le32(in + 2);
    for (int j = 0; j < 16; j++) {
      int x0 = (int)((in[6 + j] & 0x0fu) | (((qh >> j) & 1u) << 4)) - 16;
      int x1 = (int)((in[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
      out[j] = (float)x0 * d;
      out[j + 16] = (float)x1 * d;
    }
  }
}

static void dec_q5_1(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 24, out += 32) {
    float d = bs_f16_to_f32(bs_le16(in)), m = bs_f16_to_f32(bs_le16(in + 2));
    uint32_t qh = bs_le32(in + 4);
    for (int j = 0; j < 16; j++) {
      unsigned x0 = (in[8 + j] & 0x0fu) | (((qh >> j) & 1u) << 4);
      unsigned x1 = (in[8 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
      float p0 = (float)x0 * d, p1 = (float)x1 * d;
      out[j] = p0 + m;
      out[j + 16] = p1 + m;
    }
  }
}

/* Q8_0: d, then 32 signed bytes. Q8_1 adds s = d * sum(q) after d (ggml
 * keeps it for dot products and has no dequantize_row_q8_1; the value of
 * an element is d * q as ggml's quantize_row_q8_1_ref defines it). */
static void dec_q8(const uint8_t *in, size_t n, float *out, size_t bsize, size_t qoff)
{
  for (size_t b = 0; b < n; b++, in += bsize, out += 32) {
    float d = bs_f16_to_f32(bs_le16(in));
    for (int j = 0; j < 32; j++)
      out[j] = (float)(int8_t)in[qoff + j] * d;
  }
}

static void dec_q8_0(const uint8_t *in, size_t n, float *out)
{
  dec_q8(in, n, out, 34, 2);
}

static void dec_q8_1(const uint8_t *in, size_t n, float *out)
{
  dec_q8(in, n, out, 36, 4);
}

static const struct {
  void (*fn)(const uint8_t *in, size_t n, float *out);
  uint16_t elems, bytes; /* one unit */
} rows[BS_DT_COUNT] = {
    [BS_DT_F64] = {dec_f64, 1, 8},
    [BS_DT_F16] = {dec_f16, 1, 2},
    [BS_DT_BF16] = {dec_bf16, 1, 2},
    [BS_DT_FLEX32] = {dec_f32, 1, 4}, /* Burn's Flex32 is stored as f32 */
    [BS_DT_F8_E4M3] = {dec_e4m3, 1, 1},
    [BS_DT_F8_E5M2] = {dec_e5m2, 1, 1},
    [BS_DT_F8_E8M0] = {dec_e8m0, 1, 1},
    [BS_DT_F8_E4M3FNUZ] = {dec_e4m3fnuz, 1, 1},
    [BS_DT_F8_E5M2FNUZ] = {dec_e5m2fnuz, 1, 1},
    [BS_DT_F4] = {dec_f4, 2, 1}, /* a unit is a byte: a read may start or end mid-byte */
    [BS_DT_Q4_0] = {dec_q4_0, 32, 18},
    [BS_DT_Q4_1] = {dec_q4_1, 32, 20},
    [BS_DT_Q5_0] = {dec_q5_0, 32, 22},
    [BS_DT_Q5_1] = {dec_q5_1, 32, 24},
    [BS_DT_Q8_0] = {dec_q8_0, 32, 34},
    [BS_DT_Q8_1] = {dec_q8_1, 32, 36},
    /* ggml's super-block and lookup types: decode_ggml.c */
    [BS_DT_Q2_K] = {bs_dec_q2_k, 256, 84},
    [BS_DT_Q3_K] = {bs_dec_q3_k, 256, 110},
    [BS_DT_Q4_K] = {bs_dec_q4_k, 256, 144},
    [BS_DT_Q5_K] = {bs_dec_q5_k, 256, 176},
    [BS_DT_Q6_K] = {bs_dec_q6_k, 256, 210},
    [BS_DT_Q8_K] = {bs_dec_q8_k, 256, 292},
    [BS_DT_TQ1_0] = {bs_dec_tq1_0, 256, 54},
    [BS_DT_TQ2_0] = {bs_dec_tq2_0, 256, 66},
    [BS_DT_MXFP4] = {bs_dec_mxfp4, 32, 17},
    [BS_DT_IQ4_NL] = {bs_dec_iq4_nl, 32, 18},
    [BS_DT_IQ4_XS] = {bs_dec_iq4_xs, 256, 136},
    [BS_DT_IQ2_XXS] = {bs_dec_iq2_xxs, 256, 66},
    [BS_DT_IQ2_XS] = {bs_dec_iq2_xs, 256, 74},
    [BS_DT_IQ2_S] = {bs_dec_iq2_s, 256, 82},
    [BS_DT_IQ3_XXS] = {bs_dec_iq3_xxs, 256, 98},
    [BS_DT_IQ3_S] = {bs_dec_iq3_s, 256, 110},
    [BS_DT_IQ1_S] = {bs_dec_iq1_s, 256, 50},
    [BS_DT_IQ1_M] = {bs_dec_iq1_m, 256, 56},
};

bool bs_decode_unit(enum bs_dtype dt, uint32_t *elems, uint32_t *bytes)
{
  if ((unsigned)dt >= BS_DT_COUNT || !rows[dt].fn)
    return false;
  *elems = rows[dt].elems;
  *bytes = rows[dt].bytes;
  return true;
}

void bs_decode(enum bs_dtype dt, const uint8_t *in, size_t n, float *out)
{
  rows[dt].fn(in, n, out);
}

const char *bs_decode_why_not(enum bs_dtype dt)
{
  if (dt == BS_DT_F6_E2M3 || dt == BS_DT_F6_E3M2)
    return "no file format defines how 4 F6 values are packed in 3 bytes, and "
           "producers differ: decoding with a guessed order would give wrong numbers";
  return NULL;
}

bool bs_dtype_is_float(enum bs_dtype dt)
{
  switch (dt) {
  case BS_DT_F64:
  case BS_DT_F32:
  case BS_DT_F16:
  case BS_DT_BF16:
  case BS_DT_FLEX32:
  case BS_DT_F8_E4M3:
  case BS_DT_F8_E5M2:
  case BS_DT_F8_E8M0:
  case BS_DT_F8_E4M3FNUZ:
  case BS_DT_F8_E5M2FNUZ:
  case BS_DT_F6_E2M3:
  case BS_DT_F6_E3M2:
  case BS_DT_F4:
  case BS_DT_QFLOAT:
  case BS_DT_QI8:
  case BS_DT_QU8:
  case BS_DT_QI32: return true;
  default: {
    uint32_t e, b;
    return bs_dtype_block(dt, &e, &b);
  }
  }
}

/* ---- Narrowing ---- */

static uint32_t bits_of(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

uint16_t bs_f32_to_f16(float f)
{
  uint32_t x = bits_of(f), ax = x & 0x7fffffffu;
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if (ax > 0x7f800000u) /* NaN: quiet, the payload's top 9 bits */
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) /* 65520 (half a unit past 65504) and up, infinity */
    return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x38800000u) { /* normal: rebias the exponent (127 - 15), round 13 bits off */
    uint32_t h = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
    h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
    return (uint16_t)(sign | h); /* a carry into the exponent is right */
  }
  if (ax < 0x33000000u) /* below 2^-25 (half the least subnormal): zero */
    return sign;
  /* subnormal: the value in units of 2^-24, rounded; 2^-25 itself is the
   * tie between 0 and 2^-24 and goes to 0 (even) */
  uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
  unsigned shift = 126u - e; /* 14 .. 24 */
  uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  r += rem > half || (rem == half && (r & 1u));
  return (uint16_t)(sign | r); /* r == 0x400 is the least normal, rightly */
}

uint16_t bs_f32_to_bf16(float f)
{
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, quiet */
    return (uint16_t)((x >> 16) | 0x40u);
  /* ties to even; the largest finite floats round up to infinity */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

bool bs_encode_ok(enum bs_dtype dt)
{
  return dt == BS_DT_F32 || dt == BS_DT_F16 || dt == BS_DT_BF16;
}

/* Elements [from, n) of in narrowed by `one`, little-endian, into out (the
 * vector path did the ones before `from`). */
static inline void encode16(const float *in, size_t from, size_t n, uint8_t *out,
                            uint16_t (*one)(float))
{
  for (size_t i = from; i < n; i++) {
    uint16_t h = one(in[i]);
    out[2 * i] = (uint8_t)h;
    out[2 * i + 1] = (uint8_t)(h >> 8);
  }
}

void bs_encode(enum bs_dtype dt, const float *in, size_t n, uint8_t *out)
{
  switch (dt) {
  case BS_DT_F16: encode16(in, bs_vec_f32_to_f16(in, n, out), n, out, bs_f32_to_f16); break;
  case BS_DT_BF16: encode16(in, bs_vec_f32_to_bf16(in, n, out), n, out, bs_f32_to_bf16); break;
  default:
    for (size_t i = 0; i < n; i++) {
      uint32_t u = bits_of(in[i]);
      out[4 * i] = (uint8_t)u;
      out[4 * i + 1] = (uint8_t)(u >> 8);
      out[4 * i + 2] = (uint8_t)(u >> 16);
      out[4 * i + 3] = (uint8_t)(u >> 24);
    }
  }
}

/* ---- torch's quantized dtypes ---- */

const struct bs_torch_q *bs_torch_q_get(const uint8_t *raw, size_t len)
{
  const struct bs_torch_q *q = (const void *)raw;
  if (!raw || len < sizeof *q || (uintptr_t)raw % _Alignof(struct bs_torch_q) != 0)
    return NULL;
  if (q->scheme == BS_TQ_PER_TENSOR)
    return len == sizeof *q ? q : NULL;
  const uint64_t per = q->scheme == BS_TQ_PER_CHANNEL ? 16 : 8; /* bytes per channel */
  if ((q->scheme != BS_TQ_PER_CHANNEL && q->scheme != BS_TQ_PER_CHANNEL_FQ) || q->nch == 0 ||
      q->inner == 0 || q->nch > (len - sizeof *q) / per || len != sizeof *q + q->nch * per)
    return NULL;
  return q;
}

bool bs_torch_q_fits(const struct bs_torch_q *q, uint64_t numel)
{
  uint64_t period;
  return q->scheme == BS_TQ_PER_TENSOR ||
         (bs_mul_u64(q->nch, q->inner, &period) && period && numel % period == 0);
}

static int64_t tq_int(enum bs_dtype dt, const uint8_t *in, size_t i)
{
  switch (dt) {
  case BS_DT_QI8: return (int8_t)in[i];
  case BS_DT_QU8: return in[i];
  default: return (int32_t)bs_le32(in + 4 * i);
  }
}

void bs_decode_torch_q(enum bs_dtype dt, const struct bs_torch_q *q, uint64_t first,
                       const uint8_t *in, size_t n, float *out)
{
  if (q->scheme == BS_TQ_PER_TENSOR) {
    /* torch's dequantize_val: static_cast<float>(scale) * (value.val_ -
     * static_cast<int32_t>(zero_point)), the difference an int32 (it wraps
     * as torch's does for qint32 extremes) */
    const float s = (float)q->scale;
    const uint32_t zp = (uint32_t)(int32_t)q->zp;
    for (size_t i = 0; i < n; i++) {
      int32_t d = (int32_t)((uint32_t)tq_int(dt, in, i) - zp);
      out[i] = s * (float)d;
    }
    return;
  }
  if (q->scheme == BS_TQ_PER_CHANNEL_FQ) {
    /* torch's dequantize_tensor_per_channel_float_qparams_cpu
     * (aten/src/ATen/native/quantized/cpu/kernels/QuantizedOpKernels.cpp):
     * rd[i] = (static_cast<float>(q) - zero_points_data[c]) * scales_data[c],
     * zero points and scales floats: two F32 operations */
    const float *fs = (const float *)(const void *)(q + 1), *fz = fs + q->nch;
    for (size_t i = 0; i < n; i++) {
      uint64_t c = ((first + i) / q->inner) % q->nch;
      float d = (float)tq_int(dt, in, i) - fz[c];
      out[i] = d * fs[c];
    }
    return;
  }
  const double *scales = (const double *)(const void *)(q + 1);
  const int64_t *zps = (const int64_t *)(const void *)(scales + q->nch);
  for (size_t i = 0; i < n; i++) {
    uint64_t c = ((first + i) / q->inner) % q->nch;
    int64_t d;
    double dd = __builtin_sub_overflow(tq_int(dt, in, i), zps[c], &d)
                    ? (double)tq_int(dt, in, i) - (double)zps[c] /* a hostile zero point */
                    : (double)d;
    out[i] = (float)(dd * scales[c]);
  }
}
