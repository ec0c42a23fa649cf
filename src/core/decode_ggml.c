/* ggml's quantized block types to F32 (decode_ggml.h). Our own code from
 * ggml's published block layouts (ggml/src/ggml-common.h: the block_* structs,
 * fields in declaration order, no padding, little endian) and the formulas of
 * its reference dequantize_row_* (ggml/src/ggml-quants.c). "fp16" is an IEEE
 * half widened exactly (bs_f16_to_f32, ggml's GGML_FP16_TO_FP32); an integer
 * times a float is the integer converted to float, then one rounded product,
 * evaluated left to right as the reference writes it (C11 here: no
 * contraction into fused multiply-adds, as in ggml's reference build). */
#include "core/decode_ggml.h"

#include <string.h>

#include "core/checked.h"
#include "core/decode.h"

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
          for (int l = 0; l < 16; l++)
            *out++ = dl * (float)((q[16 * g + l] >> shift) & 3) - ml;
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
      for (int l = 0; l < 32; l++)
        out[l] = d1 * (float)(q[l] & 0xf) - m1;
      for (int l = 0; l < 32; l++)
        out[32 + l] = d2 * (float)(q[l] >> 4) - m2;
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
      for (int l = 0; l < 32; l++)
        out[l] = d1 * (float)((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; l++)
        out[32 + l] = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
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
