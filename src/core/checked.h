/* Checked arithmetic on untrusted numbers, little-endian field decoding and
 * the hard caps that bound every allocation driven by file contents. */
#ifndef BURNSTORE_CHECKED_H
#define BURNSTORE_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Hard caps of the catalog and of the core's own parsers (npy.h keeps
 * BS_NPY_*); the formats' are in src/formats/limits.h (and a parser's
 * private header). */
#define BS_MAX_RANK 64                   /* dimensions of one tensor */
#define BS_MAX_KEY_LEN 4096              /* bytes of one tensor key */
#define BS_MAX_TENSORS 10000000u         /* tensors in one catalog */
#define BS_MAX_TENSOR_BYTES (1ull << 46) /* 64 TiB: bigger is surely corrupt */
#define BS_SHARD_FDS 64u /* shards open at once: at most this, and at most RLIMIT_NOFILE / 8 */
#define BS_MAX_XATTR_VALUE 65536u
#define BS_SET_JOURNAL_MAX (128u << 20) /* bytes of a shard set's commit journal */

static inline bool bs_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
  return !__builtin_mul_overflow(a, b, out);
}

static inline bool bs_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
  return !__builtin_add_overflow(a, b, out);
}

/* Round x up to a multiple of align (a non-zero power of two). */
static inline bool bs_align_up(uint64_t x, uint64_t align, uint64_t *out)
{
  if (align == 0 || (align & (align - 1)) != 0)
    return false;
  if (x > UINT64_MAX - (align - 1))
    return false;
  *out = (x + align - 1) & ~(align - 1);
  return true;
}

/* Is [off, off+len) inside [0, size)? No addition that can overflow. */
static inline bool bs_range_ok(uint64_t off, uint64_t len, uint64_t size)
{
  return off <= size && len <= size - off;
}

/* The value of one hex digit, or -1. */
static inline int bs_hex_digit(char c)
{
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* Four hex digits at s (a JSON \uXXXX) into *v: 0, or -1 when one is not a digit. */
static inline int bs_hex4(const char *s, uint32_t *v)
{
  *v = 0;
  for (int k = 0; k < 4; k++) {
    int d = bs_hex_digit(s[k]);
    if (d < 0)
      return -1;
    *v = *v << 4 | (uint32_t)d;
  }
  return 0;
}

static inline uint16_t bs_le16(const uint8_t *p)
{
  return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t bs_le32(const uint8_t *p)
{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t bs_le64(const uint8_t *p)
{
  return (uint64_t)bs_le32(p) | ((uint64_t)bs_le32(p + 4) << 32);
}
static inline void bs_put_le16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void bs_put_le32(uint8_t *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline void bs_put_le64(uint8_t *p, uint64_t v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* FNV-1a, 64-bit: the one string hash (hash tables, lock and status file
 * names, shortened names). Continue from h; start from BS_FNV1A_INIT. */
#define BS_FNV1A_INIT 1469598103934665603ull
static inline uint64_t bs_fnv1a(uint64_t h, const void *p, size_t n)
{
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static inline uint64_t bs_fnv1a_str(uint64_t h, const char *s)
{
  for (const unsigned char *b = (const unsigned char *)s; *b; b++)
    h = (h ^ *b) * 1099511628211ull;
  return h;
}

#endif
