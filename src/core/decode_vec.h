/* Vector paths of decode.c's widenings, behind a runtime CPU check: each
 * converts a prefix of its input (a multiple of its width; 0 when the CPU
 * or the build has no such path) and returns how many elements it did, so
 * the caller finishes with its scalar loop. They give the scalar path's
 * bits for every input, NaN payloads included (tests/unit/test_decode_vec.c
 * checks all 65,536 values of each type). */
#ifndef BURNSTORE_CORE_DECODE_VEC_H
#define BURNSTORE_CORE_DECODE_VEC_H

#include <stddef.h>
#include <stdint.h>

/* IEEE binary16 to F32: AVX2 + F16C (VCVTPH2PS, with its quieting of
 * signalling NaNs undone, so a NaN keeps its payload bit for bit). */
size_t bs_vec_f16_to_f32(const uint8_t *in, size_t n, float *out);

/* bfloat16 to F32 (each value shifted into the upper half): SSE2. */
size_t bs_vec_bf16_to_f32(const uint8_t *in, size_t n, float *out);

/* F32 to IEEE binary16 and to bfloat16, round to nearest even, the bits
 * of bs_f32_to_f16 / bs_f32_to_bf16 for every input (NaNs included):
 * AVX2 + F16C (VCVTPS2PH) and AVX2 integer rounding. */
size_t bs_vec_f32_to_f16(const float *in, size_t n, uint8_t *out);
size_t bs_vec_f32_to_bf16(const float *in, size_t n, uint8_t *out);

#endif
