/* CRC-32 (zip's, zlib's crc32) at memory speed: carry-less multiplication
 * folding (Intel's "Fast CRC Computation Using PCLMULQDQ", the form zlib's
 * SIMD ports use) on x86-64 CPUs that have it, zlib elsewhere. */
#ifndef BURNSTORE_CRC32_H
#define BURNSTORE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* zlib's crc32(crc, p, n): start with 0, feed the result back. Thread-safe. */
uint32_t bs_crc32(uint32_t crc, const uint8_t *p, size_t n);

#endif
