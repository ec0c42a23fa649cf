/* The ggml block decoders as the library is built (decode_ggml.c with GCC's
 * dynamic vectorisation cost model, CMakeLists.txt) against a scalar copy of
 * the same source compiled here without vectorisation: on the same random
 * blocks (every fp16 bit pattern among the scales: NaN, infinities,
 * subnormals, -0) they give the same bits. In an unvectorised build (Debug)
 * both sides are scalar and the test still holds. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/decode.h"

/* The scalar copy: the same file, its exported names renamed, with loop and
 * basic-block vectorisation off for everything below. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-vectorize")
#endif
#define bs_dec_q2_k scalar_q2_k
#define bs_dec_q3_k scalar_q3_k
#define bs_dec_q4_k scalar_q4_k
#define bs_dec_q5_k scalar_q5_k
#define bs_dec_q6_k scalar_q6_k
#define bs_dec_q8_k scalar_q8_k
#define bs_dec_tq1_0 scalar_tq1_0
#define bs_dec_tq2_0 scalar_tq2_0
#define bs_dec_mxfp4 scalar_mxfp4
#define bs_dec_iq4_nl scalar_iq4_nl
#define bs_dec_iq4_xs scalar_iq4_xs
#define bs_dec_iq2_xxs scalar_iq2_xxs
#define bs_dec_iq2_xs scalar_iq2_xs
#define bs_dec_iq2_s scalar_iq2_s
#define bs_dec_iq3_xxs scalar_iq3_xxs
#define bs_dec_iq3_s scalar_iq3_s
#define bs_dec_iq1_s scalar_iq1_s
#define bs_dec_iq1_m scalar_iq1_m
#include "../../src/core/decode_ggml.c"

static const struct {
  enum bs_dtype dt;
  void (*scalar)(const uint8_t *in, size_t n, float *out);
} types[] = {
    {BS_DT_Q2_K, scalar_q2_k},     {BS_DT_Q3_K, scalar_q3_k},     {BS_DT_Q4_K, scalar_q4_k},
    {BS_DT_Q5_K, scalar_q5_k},     {BS_DT_Q6_K, scalar_q6_k},     {BS_DT_Q8_K, scalar_q8_k},
    {BS_DT_TQ1_0, scalar_tq1_0},   {BS_DT_TQ2_0, scalar_tq2_0},   {BS_DT_MXFP4, scalar_mxfp4},
    {BS_DT_IQ4_NL, scalar_iq4_nl}, {BS_DT_IQ4_XS, scalar_iq4_xs}, {BS_DT_IQ2_XXS, scalar_iq2_xxs},
    {BS_DT_IQ2_XS, scalar_iq2_xs}, {BS_DT_IQ2_S, scalar_iq2_s},   {BS_DT_IQ3_XXS, scalar_iq3_xxs},
    {BS_DT_IQ3_S, scalar_iq3_s},   {BS_DT_IQ1_S, scalar_iq1_s},   {BS_DT_IQ1_M, scalar_iq1_m},
};

Test(decode_vec, same_bits_as_scalar)
{
  enum { NB = 256 };
  static uint8_t in[NB * BS_DECODE_MAX_UNIT_BYTES];
  static float vec[NB * 256], sca[NB * 256];
  uint64_t s = 0x9e3779b97f4a7c15u;
  for (size_t i = 0; i < sizeof in; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    in[i] = (uint8_t)s;
  }
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    uint32_t e, b;
    cr_assert(bs_decode_unit(types[k].dt, &e, &b), "%s", bs_dtype_name(types[k].dt));
    memset(vec, 0, sizeof vec);
    memset(sca, 0xff, sizeof sca);
    bs_decode(types[k].dt, in, NB, vec);
    types[k].scalar(in, NB, sca);
    cr_expect_eq(memcmp(vec, sca, (size_t)NB * e * sizeof(float)), 0, "%s: vector != scalar",
                 bs_dtype_name(types[k].dt));
  }
}
