/* decode_vec.h on x86-64 (this file's platform code; elsewhere the vector
 * paths do nothing and the scalar loops do all). */
#include "core/decode_vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdatomic.h>
#include <stdbool.h>

static atomic_int have_f16c = -1; /* -1: not checked yet (checking twice is harmless) */

static bool f16c(void)
{
  int h = atomic_load_explicit(&have_f16c, memory_order_relaxed);
  if (h < 0) {
    __builtin_cpu_init();
    h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    atomic_store_explicit(&have_f16c, h, memory_order_relaxed);
  }
  return h;
}

/* 8 halves at a time. VCVTPH2PS is exact for every non-NaN value; for a
 * NaN it sets the quiet bit, which the scalar path (and the guide) does
 * not: NaN lanes are rebuilt as the scalar path builds them, sign |
 * 0x7f800000 | fraction << 13. */
__attribute__((target("avx2,f16c"))) static size_t f16_avx2(const uint8_t *in, size_t n, float *out)
{
  const __m256i abs_mask = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
  const __m256i frac = _mm256_set1_epi32(0x3ff), f32_inf = _mm256_set1_epi32(0x7f800000);
  const __m256i sign = _mm256_set1_epi32(0x8000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(in + 2 * i));
    __m256 f = _mm256_cvtph_ps(h);
    __m256i w = _mm256_cvtepu16_epi32(h);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, abs_mask), inf);
    if (!_mm256_testz_si256(nan, nan)) {
      __m256i s = _mm256_slli_epi32(_mm256_and_si256(w, sign), 16);
      __m256i m = _mm256_slli_epi32(_mm256_and_si256(w, frac), 13);
      __m256i exact = _mm256_or_si256(_mm256_or_si256(s, f32_inf), m);
      f = _mm256_blendv_ps(f, _mm256_castsi256_ps(exact), _mm256_castsi256_ps(nan));
    }
    _mm256_storeu_ps(out + i, f);
  }
  return i;
}

size_t bs_vec_f16_to_f32(const uint8_t *in, size_t n, float *out)
{
  return n >= 8 && f16c() ? f16_avx2(in, n, out) : 0;
}

/* 8 floats at a time; VCVTPS2PH under round-to-nearest-even is IEEE's
 * narrowing, and for a NaN gives sign | 0x7e00 | the fraction's top 10
 * bits, as bs_f32_to_f16 does. */
__attribute__((target("avx2,f16c"))) static size_t to_f16_avx2(const float *in, size_t n,
                                                               uint8_t *out)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128((__m128i *)(out + 2 * i), h);
  }
  return i;
}

size_t bs_vec_f32_to_f16(const float *in, size_t n, uint8_t *out)
{
  return n >= 8 && f16c() ? to_f16_avx2(in, n, out) : 0;
}

/* 16 floats at a time: x + 0x7fff + (bit 16 of x), the upper halves; a
 * NaN lane becomes its upper half with the quiet bit (0x40) set. */
__attribute__((target("avx2"))) static size_t to_bf16_avx2(const float *in, size_t n, uint8_t *out)
{
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i r[2];
    for (int k = 0; k < 2; k++) {
      __m256i x = _mm256_loadu_si256((const __m256i *)(in + i + 8 * k));
      __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
      __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, odd)), 16);
      __m256i nanv = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
      __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
      r[k] = _mm256_blendv_epi8(rounded, nanv, nan);
    }
    /* every lane is in [0, 0xffff]: packus keeps it; it interleaves the
     * 128-bit halves, which the permute puts back in order */
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
    _mm256_storeu_si256((__m256i *)(out + 2 * i), p);
  }
  return i;
}

size_t bs_vec_f32_to_bf16(const float *in, size_t n, uint8_t *out)
{
  return n >= 16 && f16c() ? to_bf16_avx2(in, n, out) : 0;
}

/* SSE2 is part of x86-64: no check. Interleaving zeros below each value
 * puts it in the upper half of a 32-bit lane. */
size_t bs_vec_bf16_to_f32(const uint8_t *in, size_t n, float *out)
{
  const __m128i zero = _mm_setzero_si128();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(in + 2 * i));
    _mm_storeu_ps(out + i, _mm_castsi128_ps(_mm_unpacklo_epi16(zero, h)));
    _mm_storeu_ps(out + i + 4, _mm_castsi128_ps(_mm_unpackhi_epi16(zero, h)));
  }
  return i;
}

#else

size_t bs_vec_f16_to_f32(const uint8_t *in, size_t n, float *out)
{
  (void)in, (void)n, (void)out;
  return 0;
}

size_t bs_vec_bf16_to_f32(const uint8_t *in, size_t n, float *out)
{
  (void)in, (void)n, (void)out;
  return 0;
}

size_t bs_vec_f32_to_f16(const float *in, size_t n, uint8_t *out)
{
  (void)in, (void)n, (void)out;
  return 0;
}

size_t bs_vec_f32_to_bf16(const float *in, size_t n, uint8_t *out)
{
  (void)in, (void)n, (void)out;
  return 0;
}

#endif
