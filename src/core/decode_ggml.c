/* ggml's quantized block types to F32 (decode_ggml.h). Our own code from
 * ggml's published block layouts (ggml/src/ggml-common.h: the block_* structs,
 * fields in declaration order, no padding, little endian) and the formulas of
 * its reference dequantize_row_* (ggml/src/ggml-quants.c). "fp16" is an IEEE
 * half widened exactly (bs_f16_to_f32, ggml's GGML_FP16_TO_FP32); an integer
 * times a float is the integer converted to float, then one rounded product,
 * evaluated left to right as the reference writes it. A product that a
 * sum or difference follows is its own statement, so that no compiler
 * contracts the two into a fused multiply-add (ISO C mode, which this
 * build uses, keeps GCC from contracting across statements; clang's
 * default contracts within one expression only). */
#include "core/decode_ggml.h"

#include <string.h>

#include "core/checked.h"
#include "core/decode.h"
#include "core/decode_grids.h"

static float f16_at(const uint8_t *p)
{
  return bs_f16_to_f32(bs_le16(p));
}

/* --- K-quants: super-blocks of 256 elements (QK_K) ------------------------ */

/* Q2_K, 84 bytes: scales[16], qs[64], fp16 d, fp16 dmin. Sixteen groups of
 * 16 elements; group g has scale d * (scales[g] & 15) and minimum
 * dmin * (scales[g] >> 4). The 2-bit quants of elements 128h + 32s + l
 * (l < 32) are bits 2s..2s+1 of qs[32h + l]. y = dl * q - ml. */
void bs_dec_q2_k(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 84) {
    const float d = f16_at(in + 80), min = f16_at(in + 82);
    const uint8_t *sc = in, *q = in + 16;
    for (int h = 0; h < 2; h++, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int g = 0; g < 2; g++) {
          const uint8_t s = *sc++;
          const float dl = d * (float)(s & 0xf), ml = min * (float)(s >> 4);
          for (int l = 0; l < 16; l++) {
            const float p = dl * (float)((q[16 * g + l] >> shift) & 3);
            *out++ = p - ml;
          }
        }
      }
    }
  }
}

/* Q3_K, 110 bytes: hmask[32], qs[64], scales[12], fp16 d. Sixteen 6-bit
 * signed scales (stored + 32): scale i's low 4 bits are nibble i of
 * scales[0..7] (low nibbles for i < 8, high ones for i >= 8), its high 2
 * bits are bits 2(i/4)..+1 of scales[8 + i%4]. Element 128h + 32s + l:
 * 2 low bits at bits 2s of qs[32h + l], third bit at bit 4h + s of
 * hmask[l] (clear: subtract 4). y = (d * (scale - 32)) * q. */
void bs_dec_q3_k(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 110) {
    const float d_all = f16_at(in + 108);
    const uint8_t *hm = in, *q = in + 32, *s = in + 96;
    int8_t scales[16];
    for (int i = 0; i < 16; i++) {
      unsigned lo = i < 8 ? s[i] & 0xfu : s[i - 8] >> 4;
      unsigned hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3u;
      scales[i] = (int8_t)(lo | (hi << 4));
    }
    int is = 0;
    uint8_t m = 1;
    for (int h = 0; h < 2; h++, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int g = 0; g < 2; g++) {
          const float dl = d_all * (float)(scales[is++] - 32);
          for (int l = 16 * g; l < 16 * g + 16; l++)
            *out++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        }
      }
    }
  }
}

/* Q4_K/Q5_K's eight 6-bit scales and mins in 12 bytes (ggml's
 * get_scale_min_k4): j < 4: scale = s[j] & 63, min = s[j + 4] & 63; else
 * scale = low nibble of s[j + 4] | top 2 bits of s[j - 4] << 4, min = high
 * nibble of s[j + 4] | top 2 bits of s[j] << 4. */
static void scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
    *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

/* Q4_K, 144 bytes: fp16 d, fp16 dmin, scales[12], qs[128]. Eight groups of
 * 32; elements 64k + l are the low nibbles of qs[32k + l] (group 2k),
 * 64k + 32 + l the high ones (group 2k + 1). y = (d * sc) * q - dmin * m. */
void bs_dec_q4_k(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 144) {
    const float d = f16_at(in), min = f16_at(in + 2);
    const uint8_t *s = in + 4, *q = in + 16;
    for (int k = 0; k < 4; k++, q += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * k, s, &sc, &m);
      const float d1 = d * (float)sc, m1 = min * (float)m;
      scale_min_k4(2 * k + 1, s, &sc, &m);
      const float d2 = d * (float)sc, m2 = min * (float)m;
      for (int l = 0; l < 32; l++) {
        const float p = d1 * (float)(q[l] & 0xf);
        out[l] = p - m1;
      }
      for (int l = 0; l < 32; l++) {
        const float p = d2 * (float)(q[l] >> 4);
        out[32 + l] = p - m2;
      }
      out += 64;
    }
  }
}

/* Q5_K, 176 bytes: fp16 d, fp16 dmin, scales[12], qh[32], qs[128]. As Q4_K,
 * with a fifth bit (16) for element 64k + l from bit 2k of qh[l], for
 * 64k + 32 + l from bit 2k + 1. */
void bs_dec_q5_k(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 176) {
    const float d = f16_at(in), min = f16_at(in + 2);
    const uint8_t *s = in + 4, *qh = in + 16, *ql = in + 48;
    for (int k = 0; k < 4; k++, ql += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * k, s, &sc, &m);
      const float d1 = d * (float)sc, m1 = min * (float)m;
      scale_min_k4(2 * k + 1, s, &sc, &m);
      const float d2 = d * (float)sc, m2 = min * (float)m;
      const uint8_t u1 = (uint8_t)(1u << (2 * k)), u2 = (uint8_t)(2u << (2 * k));
      for (int l = 0; l < 32; l++) {
        const float p = d1 * (float)((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0));
        out[l] = p - m1;
      }
      for (int l = 0; l < 32; l++) {
        const float p = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0));
        out[32 + l] = p - m2;
      }
      out += 64;
    }
  }
}

/* Q6_K, 210 bytes: ql[128], qh[64], int8 scales[16], fp16 d. In each half h
 * (128 elements; ql + 64h, qh + 32h, scales + 8h), for l < 32: element l
 * is low nibble of ql[l] | bits 0-1 of qh[l] << 4, l + 32 low nibble of
 * ql[l + 32] | bits 2-3, l + 64 high nibble of ql[l] | bits 4-5, l + 96
 * high nibble of ql[l + 32] | bits 6-7; each minus 32. Element e of the
 * half uses scale e / 16. y = (d * scale) * q. */
void bs_dec_q6_k(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 210) {
    const float d = f16_at(in + 208);
    const uint8_t *ql = in, *qh = in + 128;
    const int8_t *sc = (const int8_t *)(in + 192);
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, out += 128) {
      for (int l = 0; l < 32; l++) {
        const int is = l / 16;
        const int q1 = (int)((ql[l] & 0xfu) | (((qh[l] >> 0) & 3u) << 4)) - 32;
        const int q2 = (int)((ql[l + 32] & 0xfu) | (((qh[l] >> 2) & 3u) << 4)) - 32;
        const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3u) << 4)) - 32;
        const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3u) << 4)) - 32;
        out[l] = d * (float)sc[is] * (float)q1;
        out[l + 32] = d * (float)sc[is + 2] * (float)q2;
        out[l + 64] = d * (float)sc[is + 4] * (float)q3;
        out[l + 96] = d * (float)sc[is + 6] * (float)q4;
      }
    }
  }
}

/* Q8_K, 292 bytes: an F32 d (not fp16), int8 qs[256], int16 bsums[16]
 * (sums for dot products, not needed for the values). y = d * q. */
void bs_dec_q8_k(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 292, out += 256) {
    const uint32_t u = bs_le32(in);
    float d;
    memcpy(&d, &u, sizeof d);
    for (int j = 0; j < 256; j++)
      out[j] = d * (float)(int8_t)in[4 + j];
  }
}

/* --- Ternary, MXFP4 and the non-linear 4-bit types ----------------------- */

/* TQ1_0, 54 bytes: qs[48], qh[4], fp16 d. A byte holds 5 trits (qs) or 4
 * (qh) as a fixed-point fraction of 3^5: trit n of byte x is
 * ((uint8_t)(x * 3^n) * 3) >> 8, in 0..2. Elements: qs[0..31] give 160
 * (for each n, the 32 bytes), qs[32..47] 80 (for each n, the 16 bytes),
 * then qh 16 (for each n < 4, the 4 bytes). y = (trit - 1) * d. */
static float tq1_value(uint8_t x, unsigned n, float d)
{
  static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = (uint8_t)(x * pow3[n]);
  return (float)((int)(((unsigned)q * 3) >> 8) - 1) * d;
}

void bs_dec_tq1_0(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 54) {
    const float d = f16_at(in + 52);
    for (unsigned k = 0; k < 5; k++)
      for (int m = 0; m < 32; m++)
        *out++ = tq1_value(in[m], k, d);
    for (unsigned k = 0; k < 5; k++)
      for (int m = 0; m < 16; m++)
        *out++ = tq1_value(in[32 + m], k, d);
    for (unsigned k = 0; k < 4; k++)
      for (int m = 0; m < 4; m++)
        *out++ = tq1_value(in[48 + m], k, d);
  }
}

/* TQ2_0, 66 bytes: qs[64], fp16 d. Element 128j + 32l + m is bits 2l of
 * qs[32j + m] (0..3); y = (q - 1) * d. */
void bs_dec_tq2_0(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 66) {
    const float d = f16_at(in + 64);
    for (int j = 0; j < 64; j += 32)
      for (int l = 0; l < 4; l++)
        for (int m = 0; m < 32; m++)
          *out++ = (float)((int)((in[j + m] >> (2 * l)) & 3) - 1) * d;
  }
}

/* MXFP4, 17 bytes: an E8M0 exponent e, qs[16]. Element j < 16 is the low
 * nibble of qs[j], j + 16 the high one; a nibble is an E2M1 value, taken
 * doubled from ggml's table (0, 1, 2, 3, 4, 6, 8, 12, then negated; code
 * 8 is +0) and the scale halved: ggml's GGML_E8M0_TO_FP32_HALF, 2^(e - 128)
 * (e < 2: the subnormals 2^-128, 2^-127; e = 255 is 2^127, not NaN).
 * y = value * scale. */
void bs_dec_mxfp4(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 17, out += 32) {
    const uint32_t u = in[0] < 2 ? 0x00200000u << in[0] : (uint32_t)(in[0] - 1) << 23;
    float d;
    memcpy(&d, &u, sizeof d);
    for (int j = 0; j < 16; j++) {
      out[j] = (float)bs_kvalues_mxfp4[in[1 + j] & 0xf] * d;
      out[j + 16] = (float)bs_kvalues_mxfp4[in[1 + j] >> 4] * d;
    }
  }
}

/* IQ4_NL, 18 bytes: fp16 d, qs[16]; nibbles as Q4_0's, each an index into
 * ggml's 16 non-linear values kvalues_iq4nl (-127 ... 113). y = d * value. */
void bs_dec_iq4_nl(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 18, out += 32) {
    const float d = f16_at(in);
    for (int j = 0; j < 16; j++) {
      out[j] = d * (float)bs_kvalues_iq4nl[in[2 + j] & 0xf];
      out[j + 16] = d * (float)bs_kvalues_iq4nl[in[2 + j] >> 4];
    }
  }
}

/* IQ4_XS, 136 bytes: fp16 d, u16 scales_h, scales_l[4], qs[128]. Eight
 * groups of 32 as IQ4_NL blocks; group i's 6-bit scale is nibble i of
 * scales_l (low nibble for even i) | bits 2i..2i+1 of scales_h << 4, minus
 * 32. y = (d * (scale - 32)) * value. */
void bs_dec_iq4_xs(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 136) {
    const float d = f16_at(in);
    const unsigned sh = bs_le16(in + 2);
    const uint8_t *q = in + 8;
    for (int i = 0; i < 8; i++, q += 16, out += 32) {
      const int ls =
          (int)(((in[4 + i / 2] >> (4 * (i % 2))) & 0xfu) | (((sh >> (2 * i)) & 3u) << 4));
      const float dl = d * (float)(ls - 32);
      for (int j = 0; j < 16; j++) {
        out[j] = dl * (float)bs_kvalues_iq4nl[q[j] & 0xf];
        out[j + 16] = dl * (float)bs_kvalues_iq4nl[q[j] >> 4];
      }
    }
  }
}

/* --- The grid types: 8 (or 4) values at a time from a lookup grid ------- */

/* ggml's ksigns_iq2xs: 7 stored sign bits, the eighth making the count of
 * set bits even (entry i of the table is i | parity(i) << 7). */
static unsigned ksigns(unsigned i)
{
  return i | (unsigned)__builtin_parity(i) << 7;
}

/* Byte j of a grid entry (bs_*_grid: the first value in the lowest byte). */
static unsigned grid_u8(uint64_t g, int j)
{
  return (unsigned)(g >> (8 * j)) & 0xffu;
}

/* v, negated if bit j of signs is set. ggml multiplies by -1.f or 1.f: the
 * same value for every v but a NaN, whose sign IEEE 754 leaves open there
 * (and compilers turn the product into a negation); a negation flips the
 * sign bit always, so a NaN's sign is defined here. */
static float sign_at(float v, unsigned signs, int j)
{
  return (signs >> j) & 1 ? -v : v;
}

/* Eight values: db * grid byte j, signed by bit j of signs (ggml:
 * db * grid[j] * (signs & kmask_iq2xs[j] ? -1.f : 1.f)). */
static void put8_signed(float *y, float db, uint64_t g, unsigned signs)
{
  for (int j = 0; j < 8; j++)
    y[j] = sign_at(db * (float)grid_u8(g, j), signs, j);
}

/* IQ2_XXS, 66 bytes: fp16 d, then per group of 32 two u32 (little endian):
 * the first's bytes are 4 indexes into iq2xxs_grid (8 values each), the
 * second holds 4 x 7 sign bits (ksigns) and, in its top 4 bits, the scale
 * s. db = d * (0.5 + s) * 0.25. */
void bs_dec_iq2_xxs(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 66) {
    const float d = f16_at(in);
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t *p = in + 2 + 8 * ib;
      const uint32_t a1 = bs_le32(p + 4);
      const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
      for (int l = 0; l < 4; l++, out += 8)
        put8_signed(out, db, bs_iq2xxs_grid[p[l]], ksigns((a1 >> (7 * l)) & 127));
    }
  }
}

/* IQ2_XS, 74 bytes: fp16 d, qs u16[32], scales[8]. Each u16: a 9-bit index
 * into iq2xs_grid, 7 sign bits (ksigns) above it. Group ib's scale byte
 * gives 4 bits for its first 16 values (low nibble) and 4 for the last 16;
 * db = d * (0.5 + nibble) * 0.25. */
void bs_dec_iq2_xs(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 74) {
    const float d = f16_at(in);
    for (int ib = 0; ib < 8; ib++) {
      const uint8_t sc = in[66 + ib];
      const float db[2] = {d * (0.5f + (float)(sc & 0xf)) * 0.25f,
                           d * (0.5f + (float)(sc >> 4)) * 0.25f};
      for (int l = 0; l < 4; l++, out += 8) {
        const unsigned q = bs_le16(in + 2 + 2 * (4 * ib + l));
        put8_signed(out, db[l / 2], bs_iq2xs_grid[q & 511], ksigns(q >> 9));
      }
    }
  }
}

/* IQ2_S, 82 bytes: fp16 d, qs[64] (32 index bytes, then 32 sign bytes),
 * qh[8], scales[8]. Value group l of group ib: index qs[4ib + l] | bits
 * 2l..2l+1 of qh[ib] << 8 into iq2s_grid, signs byte 32 + 4ib + l (8 bits,
 * no parity); scales as IQ2_XS. */
void bs_dec_iq2_s(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 82) {
    const float d = f16_at(in);
    const uint8_t *qs = in + 2, *signs = in + 34, *qh = in + 66, *sc = in + 74;
    for (int ib = 0; ib < 8; ib++, qs += 4, signs += 4) {
      const float db[2] = {d * (0.5f + (float)(sc[ib] & 0xf)) * 0.25f,
                           d * (0.5f + (float)(sc[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; l++, out += 8) {
        const unsigned idx = qs[l] | (((unsigned)qh[ib] << (8 - 2 * l)) & 0x300u);
        put8_signed(out, db[l / 2], bs_iq2s_grid[idx], signs[l]);
      }
    }
  }
}

/* Four values each from two iq3 grid entries, signs bits 0-3 and 4-7. */
static void put8_iq3(float *y, float db, uint32_t g1, uint32_t g2, unsigned signs)
{
  for (int j = 0; j < 4; j++) {
    y[j] = sign_at(db * (float)grid_u8(g1, j), signs, j);
    y[j + 4] = sign_at(db * (float)grid_u8(g2, j), signs, j + 4);
  }
}

/* IQ3_XXS, 98 bytes: fp16 d, qs[64] (indexes into iq3xxs_grid, 4 values
 * each), then per group of 32 a u32: 4 x 7 sign bits (ksigns) and the scale
 * s in the top 4 bits; db = d * (0.5 + s) * 0.5. */
void bs_dec_iq3_xxs(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 98) {
    const float d = f16_at(in);
    const uint8_t *qs = in + 2;
    for (int ib = 0; ib < 8; ib++, qs += 8) {
      const uint32_t a = bs_le32(in + 66 + 4 * ib);
      const float db = d * (0.5f + (float)(a >> 28)) * 0.5f;
      for (int l = 0; l < 4; l++, out += 8)
        put8_iq3(out, db, bs_iq3xxs_grid[qs[2 * l]], bs_iq3xxs_grid[qs[2 * l + 1]],
                 ksigns((a >> (7 * l)) & 127));
    }
  }
}

/* IQ3_S, 110 bytes: fp16 d, qs[64], qh[8], signs[32], scales[4]. Group ib
 * of 32: 8 index bytes qs[8ib..], each with a ninth bit from qh[ib] (bit
 * k for index k), into iq3s_grid (4 values each); sign bytes
 * signs[4ib..4ib+3]; scale nibble ib of scales (low for even ib):
 * db = d * (1 + 2 * nibble). */
void bs_dec_iq3_s(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 110) {
    const float d = f16_at(in);
    const uint8_t *qs = in + 2, *qh = in + 66, *signs = in + 74, *sc = in + 106;
    for (int ib = 0; ib < 8; ib++, qs += 8, signs += 4) {
      const unsigned nib = (sc[ib / 2] >> (4 * (ib % 2))) & 0xfu;
      const float db = d * (float)(1 + 2 * (int)nib);
      for (int l = 0; l < 4; l++, out += 8) {
        const unsigned i1 = qs[2 * l] | (((unsigned)qh[ib] << (8 - 2 * l)) & 256u);
        const unsigned i2 = qs[2 * l + 1] | (((unsigned)qh[ib] << (7 - 2 * l)) & 256u);
        put8_iq3(out, db, bs_iq3s_grid[i1], bs_iq3s_grid[i2], signs[l]);
      }
    }
  }
}

/* Eight values of an iq1s_grid entry (signed bytes -1, 0, 1) shifted by
 * delta: y = dl * (value + delta). */
static void put8_iq1(float *y, float dl, uint64_t g, float delta)
{
  for (int j = 0; j < 8; j++)
    y[j] = dl * ((float)(int8_t)grid_u8(g, j) + delta);
}

/* IQ1_S, 50 bytes: fp16 d, qs[32], qh u16[8]. Group ib of 32: 4 indexes
 * qs[4ib + l] | bits 3l..3l+2 of qh[ib] << 8 into iq1s_grid; bits 12-14 of
 * qh[ib] the scale s, dl = d * (2s + 1); bit 15 the sign of delta = 0.125. */
void bs_dec_iq1_s(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 50) {
    const float d = f16_at(in);
    const uint8_t *qs = in + 2;
    for (int ib = 0; ib < 8; ib++, qs += 4) {
      const unsigned qh = bs_le16(in + 34 + 2 * ib);
      const float dl = d * (float)(2 * (int)((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -0.125f : 0.125f;
      for (int l = 0; l < 4; l++, out += 8)
        put8_iq1(out, dl, bs_iq1s_grid[qs[l] | (((qh >> (3 * l)) & 7u) << 8)], delta);
    }
  }
}

/* IQ1_M, 56 bytes: qs[32], qh[16], scales[8] (four u16, little endian), no
 * separate d: the fp16 d is the top nibbles of the four u16 (first in the
 * low nibble). Group ib of 32: two 3-bit scales in u16 ib/2 at bits
 * 6(ib%2) and 6(ib%2) + 3 (dl = d * (2s + 1), the first for its first 16
 * values); 4 indexes qs[4ib + l] | 3 bits of qh[2ib + l/2] (bits 0-2 for
 * even l, 4-6 for odd) << 8 into iq1s_grid; bit 3 (even l) or 7 (odd l)
 * of that qh byte the sign of delta = 0.125. */
void bs_dec_iq1_m(const uint8_t *in, size_t n, float *out)
{
  for (size_t b = 0; b < n; b++, in += 56) {
    unsigned sc[4];
    for (int k = 0; k < 4; k++)
      sc[k] = bs_le16(in + 48 + 2 * k);
    const uint16_t dh = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0u) |
                                   ((sc[2] >> 4) & 0x0f00u) | (sc[3] & 0xf000u));
    const float d = bs_f16_to_f32(dh);
    const uint8_t *qs = in, *qh = in + 32;
    for (int ib = 0; ib < 8; ib++, qs += 4, qh += 2) {
      const unsigned s = sc[ib / 2] >> (6 * (ib % 2));
      const float dl1 = d * (float)(2 * (int)(s & 7) + 1);
      const float dl2 = d * (float)(2 * (int)((s >> 3) & 7) + 1);
      for (int l = 0; l < 4; l++, out += 8) {
        const unsigned h = qh[l / 2] >> (4 * (l % 2));
        const float delta = h & 0x08 ? -0.125f : 0.125f;
        put8_iq1(out, l < 2 ? dl1 : dl2, bs_iq1s_grid[qs[l] | ((h & 7u) << 8)], delta);
      }
    }
  }
}
