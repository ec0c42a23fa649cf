/* Decoding stored element types to F32: one table, one row per dtype that
 * has a defined decoding (docs/user-guide.md "Decoded views" gives each
 * rule and its source). Used by the `-o as=F32` views and `cat --as F32`.
 *
 * A dtype decodes in units: *elems elements from *bytes bytes (BF16: 1 from
 * 2; ggml's Q8_0: 32 from 34), so a reader of a range decodes only the
 * units that cover it. Widening (BF16, F16, F8) is exact and keeps NaN
 * payloads where F32 can hold them; F64 is narrowed to nearest, ties to
 * even (NaN and infinities kept); ggml's block types follow ggml's
 * reference dequantize_row_* bit for bit (fp16 scale to float, then d * q,
 * plus m where the block has a minimum; the K-quants, TQ, MXFP4 and IQ types
 * in decode_ggml.c, their lookup grids in decode_grids.c). */
#ifndef BURNSTORE_CORE_DECODE_H
#define BURNSTORE_CORE_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

/* The largest unit: elements and bytes (the caller's bounded buffers are
 * sized in whole units of at most these). */
#define BS_DECODE_MAX_UNIT_ELEMS 256u
#define BS_DECODE_MAX_UNIT_BYTES 512u

/* True if dt decodes to F32, with its unit; false (F32 itself, integers,
 * bool, complex, and types whose decoding is not defined here: F6 (its
 * packing order is unspecified: bs_decode_why_not), QFLOAT, torch's
 * quantized types). F4's unit is a byte, 2 elements. */
bool bs_decode_unit(enum bs_dtype dt, uint32_t *elems, uint32_t *bytes);

/* Decode n units of dt from in (n * bytes bytes) into out (n * elems
 * floats). dt must be one bs_decode_unit accepts; every bit pattern of the
 * input decodes to some float (no input is an error). */
void bs_decode(enum bs_dtype dt, const uint8_t *in, size_t n, float *out);

/* Why a floating dtype has no decoder, when that is a decision and not
 * work left to do (F6: its packing is not defined), as a clause for a
 * message; NULL otherwise. A static string. */
const char *bs_decode_why_not(enum bs_dtype dt);

/* A floating type: F64, F32, F16, BF16, FLEX32, the F8/F6/F4 types, Burn's
 * QFLOAT, torch's quantized types and ggml's blocks (not complex). */
bool bs_dtype_is_float(enum bs_dtype dt);

/* One IEEE half (binary16) to float, exactly (ggml's GGML_FP16_TO_FP32). */
float bs_f16_to_f32(uint16_t h);

/* ---- Narrowing F32 (convert --as, -o output_as) ---- */

/* One float to IEEE binary16 / bfloat16, round to nearest, ties to even
 * (IEEE 754's default): a value past the largest finite one by half a unit
 * or more becomes infinity; subnormals as IEEE says; -0 stays -0. A NaN
 * stays a NaN of the same sign, quiet, with the top bits of its payload
 * (what x86's VCVTPS2PH does; F16C and torch's scalar code agree on every
 * non-NaN value). */
uint16_t bs_f32_to_f16(float f);
uint16_t bs_f32_to_bf16(float f);

/* True for the dtypes bs_encode writes: F32, F16, BF16. */
bool bs_encode_ok(enum bs_dtype dt);

/* n floats as dt (one bs_encode_ok accepts), little-endian, into out
 * (n * 4 or n * 2 bytes). */
void bs_encode(enum bs_dtype dt, const float *in, size_t n, uint8_t *out);

/* ---- torch's quantized dtypes (qint8, quint8, qint32) ---- */

/* BS_TQ_PER_CHANNEL_FQ: torch's per_channel_affine_float_qparams (float
 * zero points; embedding quantization). */
enum { BS_TQ_NONE, BS_TQ_PER_TENSOR, BS_TQ_PER_CHANNEL, BS_TQ_PER_CHANNEL_FQ };

/* A torch quantized tensor's quantizer, as a reader keeps it in the
 * tensor's dtype_raw: this header, then for BS_TQ_PER_CHANNEL nch doubles
 * (the scales) and nch int64 (the zero points), for BS_TQ_PER_CHANNEL_FQ
 * nch floats (the scales) and nch floats (the zero points), in host order. */
struct bs_torch_q {
  uint32_t scheme; /* BS_TQ_PER_TENSOR, BS_TQ_PER_CHANNEL or _FQ */
  uint32_t axis;   /* per channel: the dimension the channels run along */
  double scale;    /* per tensor */
  int64_t zp;
  uint64_t nch;   /* per channel: shape[axis] */
  uint64_t inner; /* per channel: elements per step of the axis (the product of
                     the dimensions after it) */
};

/* The quantizer in a dtype_raw blob of len bytes, checked (sizes, nch
 * against the blob); NULL if it holds none. */
const struct bs_torch_q *bs_torch_q_get(const uint8_t *raw, size_t len);

/* True if quantizer q's channels tile a tensor of numel elements: per
 * channel, nch * inner divides numel. The channel of an element is a
 * function of its flat index, so a tensor reshaped in a writable mount
 * (user.burnstore.shape) keeps its quantizer and dequantizes to the same
 * values; one whose element count no longer fits it does not (a dtype_raw
 * read back from a staging INDEX is checked so, not only its length). */
bool bs_torch_q_fits(const struct bs_torch_q *q, uint64_t numel);

/* n elements of dt (QI8, QU8, QI32) starting at element `first` of the
 * tensor, dequantized as torch's dequantize() does: per tensor,
 * (float)scale * (float)(int32)(q - zero_point); per channel, in double,
 * (q - zero_point[c]) * scale[c], rounded to float once; per channel with
 * float qparams, in float, ((float)q - zero_point[c]) * scale[c]. */
void bs_decode_torch_q(enum bs_dtype dt, const struct bs_torch_q *q, uint64_t first,
                       const uint8_t *in, size_t n, float *out);

#endif
