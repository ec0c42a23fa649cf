#include "core/dtype.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

#include "core/checked.h"

static const struct {
  const char *name;
  unsigned bits;
  uint16_t blck, bsize; /* block types: elements and bytes per block (ggml's type traits) */
} table[] = {
    [BS_DT_F64] = {"F64", 64},
    [BS_DT_F32] = {"F32", 32},
    [BS_DT_F16] = {"F16", 16},
    [BS_DT_BF16] = {"BF16", 16},
    [BS_DT_I64] = {"I64", 64},
    [BS_DT_I32] = {"I32", 32},
    [BS_DT_I16] = {"I16", 16},
    [BS_DT_I8] = {"I8", 8},
    [BS_DT_U64] = {"U64", 64},
    [BS_DT_U32] = {"U32", 32},
    [BS_DT_U16] = {"U16", 16},
    [BS_DT_U8] = {"U8", 8},
    [BS_DT_BOOL] = {"BOOL", 8},
    [BS_DT_F8_E4M3] = {"F8_E4M3", 8},
    [BS_DT_F8_E5M2] = {"F8_E5M2", 8},
    [BS_DT_F8_E8M0] = {"F8_E8M0", 8},
    [BS_DT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [BS_DT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [BS_DT_F6_E2M3] = {"F6_E2M3", 6},
    [BS_DT_F6_E3M2] = {"F6_E3M2", 6},
    [BS_DT_F4] = {"F4", 4},
    [BS_DT_C64] = {"C64", 64},
    [BS_DT_C128] = {"C128", 128},
    [BS_DT_FLEX32] = {"FLEX32", 32},
    [BS_DT_BOOL_U8] = {"BOOL_U8", 8},
    [BS_DT_BOOL_U32] = {"BOOL_U32", 32},
    [BS_DT_QFLOAT] = {"QFLOAT", 0}, /* described by dtype_raw */
    [BS_DT_QI8] = {"QI8", 8},
    [BS_DT_QU8] = {"QU8", 8},
    [BS_DT_QI32] = {"QI32", 32},
    [BS_DT_Q4_0] = {"Q4_0", 0, 32, 18},
    [BS_DT_Q4_1] = {"Q4_1", 0, 32, 20},
    [BS_DT_Q5_0] = {"Q5_0", 0, 32, 22},
    [BS_DT_Q5_1] = {"Q5_1", 0, 32, 24},
    [BS_DT_Q8_0] = {"Q8_0", 0, 32, 34},
    [BS_DT_Q8_1] = {"Q8_1", 0, 32, 36},
    [BS_DT_Q2_K] = {"Q2_K", 0, 256, 84},
    [BS_DT_Q3_K] = {"Q3_K", 0, 256, 110},
    [BS_DT_Q4_K] = {"Q4_K", 0, 256, 144},
    [BS_DT_Q5_K] = {"Q5_K", 0, 256, 176},
    [BS_DT_Q6_K] = {"Q6_K", 0, 256, 210},
    [BS_DT_Q8_K] = {"Q8_K", 0, 256, 292},
    [BS_DT_IQ2_XXS] = {"IQ2_XXS", 0, 256, 66},
    [BS_DT_IQ2_XS] = {"IQ2_XS", 0, 256, 74},
    [BS_DT_IQ3_XXS] = {"IQ3_XXS", 0, 256, 98},
    [BS_DT_IQ1_S] = {"IQ1_S", 0, 256, 50},
    [BS_DT_IQ4_NL] = {"IQ4_NL", 0, 32, 18},
    [BS_DT_IQ3_S] = {"IQ3_S", 0, 256, 110},
    [BS_DT_IQ2_S] = {"IQ2_S", 0, 256, 82},
    [BS_DT_IQ4_XS] = {"IQ4_XS", 0, 256, 136},
    [BS_DT_IQ1_M] = {"IQ1_M", 0, 256, 56},
    [BS_DT_TQ1_0] = {"TQ1_0", 0, 256, 54},
    [BS_DT_TQ2_0] = {"TQ2_0", 0, 256, 66},
    [BS_DT_MXFP4] = {"MXFP4", 0, 32, 17},
};
_Static_assert(sizeof table / sizeof table[0] == BS_DT_COUNT, "dtype table incomplete");

unsigned bs_dtype_bits(enum bs_dtype dt)
{
  return dt < BS_DT_COUNT ? table[dt].bits : 0;
}

bool bs_dtype_block(enum bs_dtype dt, uint32_t *elems, uint32_t *bytes)
{
  if (dt >= BS_DT_COUNT || table[dt].blck == 0)
    return false;
  *elems = table[dt].blck;
  *bytes = table[dt].bsize;
  return true;
}

const char *bs_dtype_name(enum bs_dtype dt)
{
  return dt < BS_DT_COUNT ? table[dt].name : "?";
}

int bs_dtype_from_name(const char *name, enum bs_dtype *out)
{
  for (int i = 0; i < BS_DT_COUNT; i++) {
    if (strcmp(table[i].name, name) == 0) {
      *out = (enum bs_dtype)i;
      return 0;
    }
  }
  return -1;
}

size_t bs_shape_format(char *buf, size_t n, uint32_t rank, const uint64_t *shape)
{
  size_t used = 0;
#define PUT(...)                                                                                   \
  do {                                                                                             \
    int w = snprintf(used < n ? buf + used : NULL, used < n ? n - used : 0, __VA_ARGS__);          \
    if (w > 0)                                                                                     \
      used += (size_t)w;                                                                           \
  } while (0)
  if (n)
    buf[0] = '\0';
  PUT("[");
  for (uint32_t i = 0; i < rank; i++)
    PUT(i ? ",%" PRIu64 : "%" PRIu64, shape[i]);
  PUT("]");
#undef PUT
  return used;
}

int bs_shape_numel(uint32_t rank, const uint64_t *shape, uint64_t *out)
{
  uint64_t n = 1;
  for (uint32_t i = 0; i < rank; i++)
    if (!bs_mul_u64(n, shape[i], &n))
      return -1;
  *out = n;
  return 0;
}

static int block_nbytes(enum bs_dtype dt, uint32_t rank, const uint64_t *shape, uint64_t *out,
                        const char *key, uint64_t off, bs_err *err)
{
  const unsigned blck = table[dt].blck, bsize = table[dt].bsize;
  if (rank > BS_MAX_RANK)
    return bs_fail(err, EINVAL, off, key, "rank %u exceeds the limit of %u", rank, BS_MAX_RANK);
  if (rank == 0 || shape[rank - 1] % blck != 0)
    return bs_fail(err, EINVAL, off, key,
                   "%s stores blocks of %u elements: the last dimension (%llu) must be a multiple "
                   "of %u",
                   table[dt].name, blck, rank ? (unsigned long long)shape[rank - 1] : 1ull, blck);
  uint64_t numel, bytes;
  if (bs_shape_numel(rank, shape, &numel) != 0 || !bs_mul_u64(numel / blck, bsize, &bytes))
    return bs_fail(err, EINVAL, off, key, "shape overflows: element count times size exceeds 2^64");
  *out = bytes;
  return 0;
}

int bs_dtype_nbytes(enum bs_dtype dt, uint32_t rank, const uint64_t *shape, uint64_t *out,
                    const char *key, uint64_t off, bs_err *err)
{
  *out = 0;
  if (dt < BS_DT_COUNT && table[dt].blck)
    return block_nbytes(dt, rank, shape, out, key, off, err);
  if (dt >= BS_DT_COUNT || table[dt].bits == 0)
    return bs_fail(err, EINVAL, off, key, "dtype %s has no fixed element size", bs_dtype_name(dt));
  if (rank > BS_MAX_RANK)
    return bs_fail(err, EINVAL, off, key, "rank %u exceeds the limit of %u", rank, BS_MAX_RANK);
  uint64_t numel, bits;
  if (bs_shape_numel(rank, shape, &numel) != 0 || !bs_mul_u64(numel, table[dt].bits, &bits))
    return bs_fail(err, EINVAL, off, key, "shape overflows: element count times size exceeds 2^64");
  if (bits % 8 != 0)
    return bs_fail(err, EINVAL, off, key,
                   "misaligned: %llu elements of %u-bit %s are not a whole number of bytes",
                   (unsigned long long)numel, table[dt].bits, table[dt].name);
  *out = bits / 8;
  return 0;
}

char *bs_shape_json(uint32_t rank, const uint64_t *shape)
{
  if (rank > BS_MAX_RANK)
    return NULL;
  size_t len = bs_shape_format(NULL, 0, rank, shape);
  char *s = bs_malloc(len + 1);
  if (s)
    bs_shape_format(s, len + 1, rank, shape);
  return s;
}
