/* ggml's super-block and lookup-table quantized types to F32 (decode.c's
 * table points here). Each function decodes n whole blocks of its type from
 * in (n * block bytes, bs_dtype_block) into out (n * block elements), with
 * the float operations of ggml's reference dequantize_row_* (ggml-quants.c)
 * in the same order and precision, so every value equals ggml's bit for bit.
 * Every input decodes (no input is an error). */
#ifndef BURNSTORE_CORE_DECODE_GGML_H
#define BURNSTORE_CORE_DECODE_GGML_H

#include <stddef.h>
#include <stdint.h>

void bs_dec_q2_k(const uint8_t *in, size_t n, float *out);
void bs_dec_q3_k(const uint8_t *in, size_t n, float *out);
void bs_dec_q4_k(const uint8_t *in, size_t n, float *out);
void bs_dec_q5_k(const uint8_t *in, size_t n, float *out);
void bs_dec_q6_k(const uint8_t *in, size_t n, float *out);
void bs_dec_q8_k(const uint8_t *in, size_t n, float *out);
void bs_dec_tq1_0(const uint8_t *in, size_t n, float *out);
void bs_dec_tq2_0(const uint8_t *in, size_t n, float *out);
void bs_dec_mxfp4(const uint8_t *in, size_t n, float *out);
void bs_dec_iq4_nl(const uint8_t *in, size_t n, float *out);
void bs_dec_iq4_xs(const uint8_t *in, size_t n, float *out);
void bs_dec_iq2_xxs(const uint8_t *in, size_t n, float *out);
void bs_dec_iq2_xs(const uint8_t *in, size_t n, float *out);
void bs_dec_iq2_s(const uint8_t *in, size_t n, float *out);
void bs_dec_iq3_xxs(const uint8_t *in, size_t n, float *out);
void bs_dec_iq3_s(const uint8_t *in, size_t n, float *out);
void bs_dec_iq1_s(const uint8_t *in, size_t n, float *out);
void bs_dec_iq1_m(const uint8_t *in, size_t n, float *out);

#endif
