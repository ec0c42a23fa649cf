/* CRC-32, see crc32.h. The x86-64 path is this file's only platform code. */
#include "core/crc32.h"

#include <limits.h>
#include <stdbool.h>
#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdatomic.h>

/* The CRC state (not complemented) of len bytes, len >= 64 and a multiple
 * of 16: four 128-bit lanes folded 64 bytes at a time, folded into one,
 * reduced to 64 then 32 bits (Barrett). The constants are x^k mod P for the
 * bit-reflected polynomial 0xEDB88320. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t fold(const uint8_t *buf, size_t len,
                                                              uint32_t crc)
{
  static const uint64_t __attribute__((aligned(16))) k1k2[] = {0x0154442bd4, 0x01c6e41596};
  static const uint64_t __attribute__((aligned(16))) k3k4[] = {0x01751997d0, 0x00ccaa009e};
  static const uint64_t __attribute__((aligned(16))) k5k0[] = {0x0163cd6124, 0x0000000000};
  static const uint64_t __attribute__((aligned(16))) poly[] = {0x01db710641, 0x01f7011641};
  __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;
  x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
  x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
  x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
  x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
  x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
  x0 = _mm_load_si128((const __m128i *)k1k2);
  buf += 64;
  len -= 64;
  while (len >= 64) {
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
    x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
    x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
    x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
    y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
    x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
    x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
    x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
    buf += 64;
    len -= 64;
  }
  x0 = _mm_load_si128((const __m128i *)k3k4);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
  x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
  x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
  while (len >= 16) {
    x2 = _mm_loadu_si128((const __m128i *)buf);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    buf += 16;
    len -= 16;
  }
  x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
  x3 = _mm_setr_epi32(~0, 0, ~0, 0);
  x1 = _mm_srli_si128(x1, 8);
  x1 = _mm_xor_si128(x1, x2);
  x0 = _mm_loadl_epi64((const __m128i *)k5k0);
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_and_si128(x1, x3);
  x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  x0 = _mm_load_si128((const __m128i *)poly);
  x2 = _mm_and_si128(x1, x3);
  x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
  x2 = _mm_and_si128(x2, x3);
  x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  return (uint32_t)_mm_extract_epi32(x1, 1);
}

static atomic_int have_clmul = -1; /* -1: not checked yet (checking twice is harmless) */

static bool clmul(void)
{
  int h = atomic_load_explicit(&have_clmul, memory_order_relaxed);
  if (h < 0) {
    __builtin_cpu_init();
    h = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    atomic_store_explicit(&have_clmul, h, memory_order_relaxed);
  }
  return h;
}
#endif

uint32_t bs_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
#if defined(__x86_64__)
  if (n >= 64 && clmul()) {
    size_t c = n & ~(size_t)15;
    crc = ~fold(p, c, ~crc);
    p += c;
    n -= c;
  }
#endif
  while (n > UINT_MAX) { /* zlib takes unsigned int lengths */
    crc = (uint32_t)crc32(crc, p, UINT_MAX);
    p += UINT_MAX;
    n -= UINT_MAX;
  }
  return (uint32_t)crc32(crc, p, (uInt)n);
}
