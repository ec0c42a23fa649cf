/* bs_crc32 equals zlib's crc32 for every length and alignment, in one call
 * and fed in pieces (the folding path takes 64 bytes and more). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <zlib.h>

#include "core/crc32.h"

Test(crc32, equals_zlib_for_every_length_alignment_and_seed)
{
  enum { N = 1 << 16 };
  static uint8_t b[N];
  srand(7);
  for (size_t i = 0; i < N; i++)
    b[i] = (uint8_t)rand();
  for (size_t n = 0; n < 600; n++)
    for (size_t off = 0; off < 17; off++) {
      uint32_t seed = n % 3 == 0 ? 0 : (uint32_t)rand();
      cr_assert_eq(bs_crc32(seed, b + off, n), (uint32_t)crc32(seed, b + off, (uInt)n),
                   "n=%zu off=%zu", n, off);
    }
  for (int t = 0; t < 200; t++) {
    size_t off = (size_t)rand() % 64, n = (size_t)rand() % (N - 64);
    cr_assert_eq(bs_crc32(0, b + off, n), (uint32_t)crc32(0, b + off, (uInt)n), "n=%zu", n);
  }
}

Test(crc32, pieces_chain_like_zlib)
{
  static uint8_t b[10000];
  for (size_t i = 0; i < sizeof b; i++)
    b[i] = (uint8_t)(i * 31 + 7);
  uint32_t whole = (uint32_t)crc32(0, b, sizeof b), c = 0;
  for (size_t at = 0, step = 1; at < sizeof b; at += step, step = step * 3 + 1) {
    size_t n = at + step > sizeof b ? sizeof b - at : step;
    c = bs_crc32(c, b + at, n);
  }
  cr_assert_eq(c, whole);
  cr_assert_eq(bs_crc32(0, b, 0), 0);
}
