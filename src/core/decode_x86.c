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

#endif
