/* Element types: their names (as user.burnstore.dtype shows them: "F32",
 * "BF16", "Q4_0"; documented names for the types of torch, Burn and ggml)
 * and their sizes in bits. A file's own spelling of them is its reader's. */
#ifndef BURNSTORE_DTYPE_H
#define BURNSTORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

enum bs_dtype {
  BS_DT_F64,
  BS_DT_F32,
  BS_DT_F16,
  BS_DT_BF16,
  BS_DT_I64,
  BS_DT_I32,
  BS_DT_I16,
  BS_DT_I8,
  BS_DT_U64,
  BS_DT_U32,
  BS_DT_U16,
  BS_DT_U8,
  BS_DT_BOOL, /* 1 byte per element, 0/1 (Burn Bool(Native), torch.bool) */
  BS_DT_F8_E4M3,
  BS_DT_F8_E5M2,
  BS_DT_F8_E8M0,
  BS_DT_F8_E4M3FNUZ,
  BS_DT_F8_E5M2FNUZ,
  BS_DT_F6_E2M3, /* 6 bits */
  BS_DT_F6_E3M2, /* 6 bits */
  BS_DT_F4,      /* 4 bits */
  BS_DT_C64,
  BS_DT_C128,     /* torch complex128 */
  BS_DT_FLEX32,   /* Burn Flex32: stored as f32 */
  BS_DT_BOOL_U8,  /* Burn Bool(U8): u8 0/1 */
  BS_DT_BOOL_U32, /* Burn Bool(U32): u32 LE 0/1 */
  BS_DT_QFLOAT,   /* Burn quantized: opaque bytes, size from the file */
  BS_DT_QI8,      /* torch qint8 (raw int8, quantizer params not kept) */
  BS_DT_QU8,      /* torch quint8 */
  BS_DT_QI32,     /* torch qint32 */
  /* ggml's quantized block types: raw blocks of a fixed number of
   * elements and bytes each (bs_dtype_block); no per-element size. */
  BS_DT_Q4_0,
  BS_DT_Q4_1,
  BS_DT_Q5_0,
  BS_DT_Q5_1,
  BS_DT_Q8_0,
  BS_DT_Q8_1,
  BS_DT_Q2_K,
  BS_DT_Q3_K,
  BS_DT_Q4_K,
  BS_DT_Q5_K,
  BS_DT_Q6_K,
  BS_DT_Q8_K,
  BS_DT_IQ2_XXS,
  BS_DT_IQ2_XS,
  BS_DT_IQ3_XXS,
  BS_DT_IQ1_S,
  BS_DT_IQ4_NL,
  BS_DT_IQ3_S,
  BS_DT_IQ2_S,
  BS_DT_IQ4_XS,
  BS_DT_IQ1_M,
  BS_DT_TQ1_0,
  BS_DT_TQ2_0,
  BS_DT_MXFP4,
  BS_DT_COUNT
};

/* Bits per element; 0 for BS_DT_QFLOAT (opaque, no per-element size) and
 * for the block types (Q4_0 ... MXFP4: see bs_dtype_block). */
unsigned bs_dtype_bits(enum bs_dtype dt);
/* A block type (ggml's quantized types): *elems elements per block of
 * *bytes bytes (Q8_0: 32 in 34), and true; false for every other dtype. */
bool bs_dtype_block(enum bs_dtype dt, uint32_t *elems, uint32_t *bytes);
/* The name shown in user.burnstore.dtype, e.g. "F32". */
const char *bs_dtype_name(enum bs_dtype dt);
/* Parse a name as bs_dtype_name spells it. Returns 0, or -1 if unknown. */
int bs_dtype_from_name(const char *name, enum bs_dtype *out);

/* "[64,1,3,3]" ("[]" for rank 0), as user.burnstore.shape shows it and as
 * messages print it. snprintf's contract: writes at most n bytes including
 * the NUL (buf may be NULL when n is 0) and returns the full length. */
size_t bs_shape_format(char *buf, size_t n, uint32_t rank, const uint64_t *shape);

/* Byte size of a dense tensor: product(shape) * bits / 8, every step checked.
 * Sub-byte types need a whole number of bytes (else EINVAL "misaligned").
 * A block type: the last (fastest) dimension must be a multiple of its block
 * elements (else EINVAL), and the size is numel / elems * bytes.
 * Fails for QFLOAT (its size comes from the file). `key` names the tensor
 * in the error. */
BS_NODISCARD int bs_dtype_nbytes(enum bs_dtype dt, uint32_t rank, const uint64_t *shape,
                                 uint64_t *out, const char *key, uint64_t off, bs_err *err);
/* numel = product(shape), checked (1 for rank 0). */
BS_NODISCARD int bs_shape_numel(uint32_t rank, const uint64_t *shape, uint64_t *out);

/* The shape as user.burnstore.shape shows it: "[2,3]", "[]" for a scalar.
 * Returns a bs_malloc'd string (bs_free, mem.h), or NULL (out of memory). */
char *bs_shape_json(uint32_t rank, const uint64_t *shape);

#pragma GCC visibility pop

#endif
