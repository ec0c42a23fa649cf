/* decode.c: every decoder on hand-built bytes (scale extremes, -0, NaN,
 * subnormals, infinities, rounding ties), against the expected F32 bit
 * patterns written out here from the format descriptions (IEEE 754, OCP
 * 8-bit floats, PyTorch's FNUZ types, ggml's block layouts and reference
 * dequantize_row_* formulas). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "bs_test.h"
#include "core/decode.h"
#include "core/decode_grids.h"

static uint32_t bits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Decode `n` units of dt from `in` and compare with `want` (F32 bits;
 * NAN_ANY: any NaN of either sign). */
#define NAN_ANY 0xffffffffu
static void check(enum bs_dtype dt, const uint8_t *in, size_t n, const uint32_t *want, size_t nwant)
{
  uint32_t elems, bytes;
  cr_assert(bs_decode_unit(dt, &elems, &bytes), "%s", bs_dtype_name(dt));
  cr_assert_eq(n * elems, nwant);
  float out[256];
  memset(out, 0xa5, sizeof out);
  bs_decode(dt, in, n, out);
  for (size_t i = 0; i < nwant; i++) {
    if (want[i] == NAN_ANY)
      cr_expect(isnan(out[i]), "%s [%zu]: %08x, want NaN", bs_dtype_name(dt), i, bits(out[i]));
    else
      cr_expect_eq(bits(out[i]), want[i], "%s [%zu]: %08x (%g), want %08x", bs_dtype_name(dt), i,
                   bits(out[i]), (double)out[i], want[i]);
  }
  cr_expect_eq(bits(out[nwant]), 0xa5a5a5a5u, "%s wrote past its output", bs_dtype_name(dt));
}
#define CHECK(dt, in, n, ...)                                                                      \
  do {                                                                                             \
    const uint32_t want_[] = {__VA_ARGS__};                                                        \
    check(dt, in, n, want_, sizeof want_ / sizeof want_[0]);                                       \
  } while (0)

Test(decode, units)
{
  uint32_t e, b;
  cr_assert(bs_decode_unit(BS_DT_BF16, &e, &b) && e == 1 && b == 2);
  cr_assert(bs_decode_unit(BS_DT_F64, &e, &b) && e == 1 && b == 8);
  cr_assert(bs_decode_unit(BS_DT_Q8_0, &e, &b) && e == 32 && b == 34);
  cr_assert(bs_decode_unit(BS_DT_Q5_1, &e, &b) && e == 32 && b == 24);
  cr_assert(bs_decode_unit(BS_DT_F4, &e, &b) && e == 2 && b == 1);
  /* not decoded: F32 itself, integers, bool, complex, unspecified packing,
   * out of range */
  enum bs_dtype no[] = {BS_DT_F32,     BS_DT_I32,     BS_DT_U8,     BS_DT_BOOL, BS_DT_C64,
                        BS_DT_F6_E2M3, BS_DT_F6_E3M2, BS_DT_QFLOAT, BS_DT_QI8,  BS_DT_COUNT};
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
    cr_expect(!bs_decode_unit(no[i], &e, &b), "%d", (int)no[i]);
  /* every unit fits the callers' bounds and agrees with the dtype table */
  for (int dt = 0; dt < BS_DT_COUNT; dt++) {
    if (!bs_decode_unit((enum bs_dtype)dt, &e, &b))
      continue;
    cr_expect(e <= BS_DECODE_MAX_UNIT_ELEMS && b <= BS_DECODE_MAX_UNIT_BYTES);
    uint32_t be, bb;
    if (bs_dtype_block((enum bs_dtype)dt, &be, &bb))
      cr_expect(be == e && bb == b, "%s", bs_dtype_name((enum bs_dtype)dt));
    else
      cr_expect(b * 8 == e * bs_dtype_bits((enum bs_dtype)dt), "%s",
                bs_dtype_name((enum bs_dtype)dt));
  }
}

Test(decode, bf16)
{
  /* 1.0, -0, a NaN payload, the smallest subnormal, -inf, largest finite */
  const uint8_t in[] = {0x80, 0x3f, 0x00, 0x80, 0xc1, 0x7f, 0x01, 0x00, 0x80, 0xff, 0x7f, 0x7f};
  CHECK(BS_DT_BF16, in, 6, 0x3f800000, 0x80000000, 0x7fc10000, 0x00010000, 0xff800000, 0x7f7f0000);
}

Test(decode, f16)
{
  /* 1.0, 2^-24 (smallest subnormal), 1023 * 2^-24 (largest subnormal),
   * 2^-14 (smallest normal), -0, +inf, a NaN payload, 65504, -inf, -2^-24 */
  const uint8_t in[] = {0x00, 0x3c, 0x01, 0x00, 0xff, 0x03, 0x00, 0x04, 0x00, 0x80,
                        0x00, 0x7c, 0x01, 0x7e, 0xff, 0x7b, 0x00, 0xfc, 0x01, 0x80};
  CHECK(BS_DT_F16, in, 10, 0x3f800000, 0x33800000, 0x387fc000, 0x38800000, 0x80000000, 0x7f800000,
        0x7fc02000, 0x477fe000, 0xff800000, 0xb3800000);
}

Test(decode, f64_narrows_to_nearest_even)
{
  const double v[] = {1.0 / 3.0,         /* rounds up: 0x3eaaaaab */
                      1.0 + 0x1p-24,     /* tie between 1 and 1+2^-23: even is 1 */
                      1.0 + 3 * 0x1p-24, /* tie between 1+2^-23 and 1+2^-22: even is the upper */
                      -0.0,              /* sign kept */
                      1e300,             /* overflow: inf */
                      0x1.ffffffp127,    /* tie between FLT_MAX (odd) and 2^128: inf */
                      0x1.fffffefffffffp127, /* just below that tie: FLT_MAX */
                      0x1p-149,              /* smallest F32 subnormal, exact */
                      0x1p-150,              /* tie between 0 and 2^-149: even is 0 */
                      0x1.8p-149,            /* tie between 2^-149 and 2^-148: even is the upper */
                      -INFINITY,
                      NAN};
  uint8_t in[sizeof v];
  memcpy(in, v, sizeof v); /* x86-64 and the format are both little endian */
  CHECK(BS_DT_F64, in, 12, 0x3eaaaaab, 0x3f800000, 0x3f800002, 0x80000000, 0x7f800000, 0x7f800000,
        0x7f7fffff, 0x00000001, 0x00000000, 0x00000002, 0xff800000, NAN_ANY);
}

Test(decode, flex32_is_f32)
{
  const uint8_t in[] = {0x00, 0x00, 0x80, 0x3f, 0x01, 0x00, 0xc0, 0xff};
  CHECK(BS_DT_FLEX32, in, 2, 0x3f800000, 0xffc00001);
}

Test(decode, f8_e4m3fn)
{
  /* bias 7, no infinities, S.1111.111 is NaN: 448 (max), 0x7f NaN, 0xff NaN,
   * 2^-9 (smallest subnormal), 7 * 2^-9 (largest), -0, 1.0, 2^-6 (smallest normal),
   * -1.75 * 2^7 (0xf6), 0x78 = 256 (exponent 15 is finite here) */
  const uint8_t in[] = {0x7e, 0x7f, 0xff, 0x01, 0x07, 0x80, 0x38, 0x08, 0xf6, 0x78};
  CHECK(BS_DT_F8_E4M3, in, 10, 0x43e00000, NAN_ANY, NAN_ANY, 0x3b000000, 0x3c600000, 0x80000000,
        0x3f800000, 0x3c800000, 0xc3600000, 0x43800000);
}

Test(decode, f8_e5m2)
{
  /* the upper byte of a binary16: inf, 57344 (max), 2^-16 (smallest
   * subnormal), 1.0, NaN, -0, -inf, 3 * 2^-16 */
  const uint8_t in[] = {0x7c, 0x7b, 0x01, 0x3c, 0x7d, 0x80, 0xfc, 0x03};
  CHECK(BS_DT_F8_E5M2, in, 8, 0x7f800000, 0x47600000, 0x37800000, 0x3f800000, NAN_ANY, 0x80000000,
        0xff800000, 0x38400000);
}

Test(decode, f8_fnuz)
{
  /* E4M3FNUZ, bias 8: 0x80 is the only NaN (no -0), 0x7f = 240, 0x40 = 1.0,
   * 0x01 = 2^-10, 0x00 = +0, 0xff = -240 */
  const uint8_t a[] = {0x80, 0x7f, 0x40, 0x01, 0x00, 0xff};
  CHECK(BS_DT_F8_E4M3FNUZ, a, 6, NAN_ANY, 0x43700000, 0x3f800000, 0x3a800000, 0x00000000,
        0xc3700000);
  /* E5M2FNUZ, bias 16: 0x80 NaN, 0x7f = 57344 (exponent 31 is finite),
   * 0x40 = 1.0, 0x01 = 2^-17, 0x83 = -3 * 2^-17 */
  const uint8_t b[] = {0x80, 0x7f, 0x40, 0x01, 0x83};
  CHECK(BS_DT_F8_E5M2FNUZ, b, 5, NAN_ANY, 0x47600000, 0x3f800000, 0x37000000, 0xb7c00000);
}

Test(decode, f8_e8m0)
{
  /* 2^(e-127): 1.0, 2^-127 (an F32 subnormal), 2^127, 0xff NaN, 2^-126 */
  const uint8_t in[] = {0x7f, 0x00, 0xfe, 0xff, 0x01};
  CHECK(BS_DT_F8_E8M0, in, 5, 0x3f800000, 0x00400000, 0x7f000000, NAN_ANY, 0x00800000);
}

/* A Q8_0/Q8_1 block: scale, (Q8_1: s), then q[0..31] = fill except the
 * first four. */
static void q8_block(uint8_t *blk, size_t qoff, uint16_t d, const int8_t q4[4], int8_t fill)
{
  blk[0] = (uint8_t)d;
  blk[1] = (uint8_t)(d >> 8);
  for (int j = 0; j < 32; j++)
    blk[qoff + j] = (uint8_t)(j < 4 ? q4[j] : fill);
}

Test(decode, q8_0)
{
  uint8_t in[34 * 5];
  /* d = 65504 (largest fp16): q = 127, -128, 1, 0 */
  q8_block(in, 2, 0x7bff, (const int8_t[]){127, -128, 1, 0}, 2);
  /* d = -1: q = 0 gives -0 (0 * -1 in float), -128 gives 128 */
  q8_block(in + 34, 2, 0xbc00, (const int8_t[]){0, -128, 5, -5}, 0);
  /* d = 2^-24 (smallest fp16 subnormal) */
  q8_block(in + 68, 2, 0x0001, (const int8_t[]){-1, 127, 0, 3}, 1);
  /* d = NaN: every element NaN; d = inf: q = 0 gives NaN, others inf */
  q8_block(in + 102, 2, 0x7e00, (const int8_t[]){0, 1, -1, 2}, 1);
  q8_block(in + 136, 2, 0x7c00, (const int8_t[]){0, 1, -1, 0}, 0);
  float out[160];
  bs_decode(BS_DT_Q8_0, in, 5, out);
  const uint32_t want[][5] = {
      /* [0..3], then the fill element [4] */
      {0x4afde040 /* 8319008 */, 0xcaffe000 /* -8384512 */, 0x477fe000, 0x00000000,
       0x47ffe000 /* 131008 */},
      {0x80000000, 0x43000000, 0xc0a00000, 0x40a00000, 0x80000000},
      {0xb3800000, 0x36fe0000 /* 127 * 2^-24 */, 0x00000000, 0x34400000, 0x33800000},
      {NAN_ANY, NAN_ANY, NAN_ANY, NAN_ANY, NAN_ANY},
      {NAN_ANY, 0x7f800000, 0xff800000, NAN_ANY, NAN_ANY},
  };
  for (int b = 0; b < 5; b++)
    for (int j = 0; j < 32; j++) {
      uint32_t w = want[b][j < 4 ? j : 4], got = bits(out[b * 32 + j]);
      if (w == NAN_ANY)
        cr_expect(isnan(out[b * 32 + j]), "block %d [%d]: %08x", b, j, got);
      else
        cr_expect_eq(got, w, "block %d [%d]: %08x, want %08x", b, j, got, w);
    }
}

Test(decode, q8_1)
{
  /* d = 0.5, s = NaN (only for dot products: ignored), q = -3, 4, 0, 127 */
  uint8_t in[36];
  q8_block(in, 4, 0x3800, (const int8_t[]){-3, 4, 0, 127}, -128);
  in[2] = 0x00;
  in[3] = 0x7e;
  float out[32];
  bs_decode(BS_DT_Q8_1, in, 1, out);
  cr_expect_eq(bits(out[0]), 0xbfc00000);  /* -1.5 */
  cr_expect_eq(bits(out[1]), 0x40000000);  /* 2 */
  cr_expect_eq(bits(out[2]), 0x00000000);  /* +0 */
  cr_expect_eq(bits(out[3]), 0x427e0000);  /* 63.5 */
  cr_expect_eq(bits(out[31]), 0xc2800000); /* -64 */
}

Test(decode, q4_0)
{
  /* Element j < 16: low nibble of qs[j] - 8; element j + 16: high nibble - 8. */
  uint8_t in[18 * 2] = {0};
  in[0] = 0x00; /* d = 2.0 */
  in[1] = 0x40;
  in[2 + 0] = 0x0f;  /* [0] = 7 * 2 = 14, [16] = -8 * 2 = -16 */
  in[2 + 1] = 0x88;  /* [1] = [17] = 0 * 2 = +0 */
  in[2 + 15] = 0xf3; /* [15] = -5 * 2 = -10, [31] = 7 * 2 = 14 */
  in[18] = 0x00;     /* d = -0.5 */
  in[19] = 0xb8;
  in[20] = 0x80; /* [32] = -8 * -0.5 = 4, [48] = 0 * -0.5 = -0 */
  float out[64];
  bs_decode(BS_DT_Q4_0, in, 2, out);
  cr_expect_eq(bits(out[0]), 0x41600000);
  cr_expect_eq(bits(out[16]), 0xc1800000);
  cr_expect_eq(bits(out[1]), 0x00000000);
  cr_expect_eq(bits(out[17]), 0x00000000);
  cr_expect_eq(bits(out[15]), 0xc1200000);
  cr_expect_eq(bits(out[31]), 0x41600000);
  cr_expect_eq(bits(out[2]), 0xc1800000); /* qs[2] = 0: -8 * 2 */
  cr_expect_eq(bits(out[32]), 0x40800000);
  cr_expect_eq(bits(out[48]), 0x80000000);
  cr_expect_eq(bits(out[33]), 0x40800000); /* qs = 0: -8 * -0.5 */
}

Test(decode, q4_1)
{
  /* d = 0.5, m = -1: q * d + m; then d = 0, m = 2^-24 (a subnormal minimum) */
  uint8_t in[20 * 2] = {0x00, 0x38, 0x00, 0xbc};
  in[4 + 0] = 0xf2; /* [0] = 2 * 0.5 - 1 = +0, [16] = 15 * 0.5 - 1 = 6.5 */
  in[4 + 7] = 0x01; /* [7] = -0.5, [23] = 0 * 0.5 - 1 = -1 */
  in[20] = 0x00;
  in[21] = 0x00;
  in[22] = 0x01;
  in[23] = 0x00;
  in[24] = 0xff;
  float out[64];
  bs_decode(BS_DT_Q4_1, in, 2, out);
  cr_expect_eq(bits(out[0]), 0x00000000);
  cr_expect_eq(bits(out[16]), 0x40d00000);
  cr_expect_eq(bits(out[7]), 0xbf000000);
  cr_expect_eq(bits(out[23]), 0xbf800000);
  cr_expect_eq(bits(out[32]), 0x33800000);
  cr_expect_eq(bits(out[48]), 0x33800000);
}

Test(decode, q5_0)
{
  /* d = 1.0; qh little endian: bit j is element j's fifth bit, bit j + 16
   * element j + 16's. x = (nibble | fifth << 4) - 16. */
  uint8_t in[22] = {0x00, 0x3c, 0x01, 0x00, 0x01, 0x80};
  in[6 + 0] = 0x0f;  /* [0] = 31 - 16 = 15, [16] = 16 - 16 = 0 */
  in[6 + 15] = 0xf0; /* [15] = 0 - 16 (bit 15 clear), [31] = 31 - 16 = 15 */
  in[6 + 1] = 0x1a;  /* [1] = 10 - 16 = -6, [17] = 1 - 16 = -15 */
  float out[32];
  bs_decode(BS_DT_Q5_0, in, 1, out);
  cr_expect_eq(bits(out[0]), 0x41700000);
  cr_expect_eq(bits(out[16]), 0x00000000);
  cr_expect_eq(bits(out[15]), 0xc1800000);
  cr_expect_eq(bits(out[31]), 0x41700000);
  cr_expect_eq(bits(out[1]), 0xc0c00000);
  cr_expect_eq(bits(out[17]), 0xc1700000);
  cr_expect_eq(bits(out[2]), 0xc1800000);
}

Test(decode, q5_1)
{
  /* d = 0.25, m = 1.0; qh bits 0 and 31; x = nibble | fifth << 4 */
  uint8_t in[24] = {0x00, 0x34, 0x00, 0x3c, 0x01, 0x00, 0x00, 0x80};
  in[8 + 0] = 0xff;  /* [0] = 31 * 0.25 + 1 = 8.75, [16] = 15 * 0.25 + 1 = 4.75 */
  in[8 + 15] = 0xf0; /* [31] = 31 * 0.25 + 1 = 8.75, [15] = 1 */
  float out[32];
  bs_decode(BS_DT_Q5_1, in, 1, out);
  cr_expect_eq(bits(out[0]), 0x410c0000);
  cr_expect_eq(bits(out[16]), 0x40980000);
  cr_expect_eq(bits(out[31]), 0x410c0000);
  cr_expect_eq(bits(out[15]), 0x3f800000);
  cr_expect_eq(bits(out[5]), 0x3f800000);
}

/* ---- ggml's K-quants (decode_ggml.c): super-blocks of 256 ---------------------------------- */

static void put16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

/* Element i of out has F32 bits want (NAN_ANY: a NaN). */
static void expect_at(const char *what, const float *out, size_t i, uint32_t want)
{
  if (want == NAN_ANY)
    cr_expect(isnan(out[i]), "%s [%zu]: %08x, want NaN", what, i, bits(out[i]));
  else
    cr_expect_eq(bits(out[i]), want, "%s [%zu]: %08x (%g), want %08x", what, i, bits(out[i]),
                 (double)out[i], want);
}

Test(decode, q2_k)
{
  /* scales[16] | qs[64] | d | dmin; group g: d * (sc & 15), dmin * (sc >> 4);
   * element 128h + 32s + l: bits 2s of qs[32h + l]; y = dl * q - ml */
  uint8_t in[84 * 4] = {0};
  uint8_t *b = in;
  put16(b + 80, 0x3c00); /* d = 1 */
  put16(b + 82, 0x3800); /* dmin = 0.5 */
  b[0] = 0x21;           /* group 0: dl 1, ml 1 */
  b[2] = 0xf0;           /* group 2: dl 0, ml 7.5 */
  b[15] = 0x13;          /* group 15: dl 3, ml 0.5 */
  b[16 + 0] = 0x03;      /* [0] = 3 - 1 = 2; [32] (bits 2-3: 0) = 0 - 7.5 */
  b[16 + 63] = 0x80;     /* [255] (bits 6-7 of qs[63]: 2) = 6 - 0.5 */
  b = in + 84;           /* d = -1, dmin = 0, scales 0: -0 * q - 0 = -0 */
  put16(b + 80, 0xbc00);
  b = in + 168; /* d = 2^-24 (subnormal), dmin = 65504 */
  put16(b + 80, 0x0001);
  put16(b + 82, 0x7bff);
  b[0] = 0x0f;
  b[1] = 0x1f;
  b[16] = 0x03; /* [0] = 15 * 2^-24 * 3; [16] (group 1) = 0 - 65504 */
  b = in + 252; /* d = inf: q = 1 gives inf, q = 0 gives NaN */
  put16(b + 80, 0x7c00);
  b[0] = 0x01;
  b[16] = 0x01;
  float out[1024];
  bs_decode(BS_DT_Q2_K, in, 4, out);
  expect_at("q2_k", out, 0, 0x40000000);
  expect_at("q2_k", out, 1, 0xbf800000);
  expect_at("q2_k", out, 16, 0x00000000);
  expect_at("q2_k", out, 32, 0xc0f00000);
  expect_at("q2_k", out, 255, 0x40b00000);
  expect_at("q2_k", out, 256, 0x80000000);
  expect_at("q2_k", out, 511, 0x80000000);
  expect_at("q2_k", out, 512, 0x36340000);
  expect_at("q2_k", out, 528, 0xc77fe000);
  expect_at("q2_k", out, 768, 0x7f800000);
  expect_at("q2_k", out, 769, NAN_ANY);
}

Test(decode, q3_k)
{
  /* hmask[32] | qs[64] | scales[12] | d. Scale i: nibble i of bytes 0-7, bits
   * 2(i/4) of byte 8 + i%4 above, minus 32. Element 128h + 32s + l: bits 2s of
   * qs[32h + l], minus 4 unless bit 4h + s of hmask[l]. */
  uint8_t in[110 * 2] = {0};
  uint8_t *b = in;
  put16(b + 108, 0x3800); /* d = 0.5 */
  b[96 + 5] = 0x71;       /* scale 5: low 1, scale 13: low 7 */
  b[96 + 9] = 0xc8;       /* scale 5: high 2 (33 - 32 = 1), scale 13: high 3 (55 - 32 = 23) */
  b[19] = 0x04;           /* hmask[19] bit 2: [83] has its third bit */
  b[32 + 19] = 0x30;      /* [83] = bits 4-5 of qs[19] = 3 */
  put16(in + 110 + 108, 0x8000); /* second block: d = -0 */
  float out[512];
  bs_decode(BS_DT_Q3_K, in, 2, out);
  expect_at("q3_k", out, 0, 0x42800000);   /* (0.5 * -32) * (0 - 4) = 64 */
  expect_at("q3_k", out, 80, 0xc0000000);  /* 0.5 * (0 - 4) */
  expect_at("q3_k", out, 83, 0x3fc00000);  /* 0.5 * 3 */
  expect_at("q3_k", out, 211, 0xc2380000); /* (0.5 * 23) * (0 - 4) */
  /* d = -0: (-0 * -32) * (0 - 4) = +0 * -4 = -0 */
  expect_at("q3_k", out, 256, 0x80000000);
}

Test(decode, q4_k_q5_k)
{
  /* d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128]. Scale/min j < 4: bytes j
   * and j + 4 (6 bits); j >= 4: nibbles of byte j + 4 and the top bits of
   * bytes j - 4 and j. Element 64k + 32t + l: nibble t of qs[32k + l]. */
  uint8_t in[144 * 3] = {0};
  uint8_t *b = in;
  put16(b, 0x4000);     /* d = 2 */
  put16(b + 2, 0x3c00); /* dmin = 1 */
  b[4 + 0] = 0x03;      /* scale 0 = 3 */
  b[4 + 4] = 0x02;      /* min 0 = 2 */
  b[4 + 11] = 0x21;     /* scale 7: 1 | (top of byte 3) << 4; min 7: 2 | (top of byte 7) << 4 */
  b[4 + 3] = 0xc0;
  b[4 + 7] = 0x40;
  b[16 + 0] = 0x5a;   /* [0] = (2 * 3) * 10 - 2; [32] = 0 * 5 - 0 */
  b[16 + 127] = 0xf0; /* [255] = (2 * 49) * 15 - 18 */
  b = in + 144;       /* d = dmin = 65504, scale 0 = min 0 = 63, [256] = q 15 */
  put16(b, 0x7bff);
  put16(b + 2, 0x7bff);
  b[4] = 63;
  b[8] = 63;
  b[16] = 0x0f;
  put16(in + 288, 0x7e00); /* d = NaN */
  float out[768];
  bs_decode(BS_DT_Q4_K, in, 3, out);
  expect_at("q4_k", out, 0, 0x42680000);
  expect_at("q4_k", out, 32, 0x00000000);
  expect_at("q4_k", out, 255, 0x44b58000);
  expect_at("q4_k", out, 256, 0x4c5c6470); /* 4126752 * 15 - 4126752, exact */
  expect_at("q4_k", out, 512, NAN_ANY);

  uint8_t in5[176 * 2] = {0};
  b = in5;
  put16(b, 0x3c00);         /* d = 1 */
  put16(b + 2, 0x3800);     /* dmin = 0.5 */
  b[4 + 0] = 1;             /* scale 0 */
  b[4 + 4] = 4;             /* min 0: 4 * 0.5 = 2 */
  b[4 + 1] = 2;             /* scale 1 */
  b[4 + 11] = 0x01;         /* scale 7 */
  b[16 + 0] = 0x01;         /* qh[0] bit 0: [0] gets 16 */
  b[16 + 31] = 0x80;        /* qh[31] bit 7: [255] gets 16 */
  b[48 + 0] = 0x3f;         /* [0] = 1 * (15 + 16) - 2; [32] = 2 * 3 - 0 */
  put16(in5 + 176, 0x8000); /* second block: d = -0, dmin = +0: -0 * q - 0 = -0 */
  float out5[512];
  bs_decode(BS_DT_Q5_K, in5, 2, out5);
  expect_at("q5_k", out5, 0, 0x41e80000);
  expect_at("q5_k", out5, 32, 0x40c00000);
  expect_at("q5_k", out5, 255, 0x41800000);
  expect_at("q5_k", out5, 223, 0x00000000);
  expect_at("q5_k", out5, 256, 0x80000000);
}

Test(decode, q6_k)
{
  /* ql[128] | qh[64] | int8 scales[16] | d. In each half, element 32c + l:
   * nibble c / 2 of ql[l + 32 (c % 2)] | bits 2c of qh[l] << 4, minus 32;
   * scale e / 16 of the element's index e. */
  uint8_t in[210] = {0};
  int8_t *sc = (int8_t *)(in + 192);
  put16(in + 208, 0x3800); /* d = 0.5 */
  sc[0] = -3;
  sc[2] = 127;
  sc[4] = -128;
  sc[6] = 1;
  sc[15] = 2;
  in[0] = 0x4f;
  in[128] = 0xe4; /* qh[0]: 0, 1, 2, 3 for c = 0..3 */
  in[127] = 0xf0;
  in[128 + 63] = 0xc0;
  float out[256];
  bs_decode(BS_DT_Q6_K, in, 1, out);
  expect_at("q6_k", out, 0, 0x41cc0000);   /* (0.5 * -3) * (15 - 32) */
  expect_at("q6_k", out, 32, 0xc47e0000);  /* (0.5 * 127) * (16 - 32) */
  expect_at("q6_k", out, 64, 0xc3800000);  /* (0.5 * -128) * (36 - 32) */
  expect_at("q6_k", out, 96, 0x41000000);  /* (0.5 * 1) * (48 - 32) */
  expect_at("q6_k", out, 16, 0x80000000);  /* (0.5 * 0) * -32 = -0 */
  expect_at("q6_k", out, 255, 0x41f80000); /* (0.5 * 2) * (63 - 32) */
}

Test(decode, q8_k)
{
  /* an F32 d (not fp16) | int8 qs[256] | bsums (unused); y = d * q */
  uint8_t in[292 * 3] = {0};
  const uint32_t d[3] = {0xc0200000 /* -2.5 */, 0x00000001 /* 2^-149 */, 0x7f800000 /* inf */};
  for (int b = 0; b < 3; b++)
    for (int k = 0; k < 4; k++)
      in[292 * b + k] = (uint8_t)(d[b] >> 8 * k);
  in[4] = 0x80;             /* -128 * -2.5 */
  in[292 + 4] = 127;        /* 127 * 2^-149 */
  in[292 + 5] = 0xff;       /* -1 * 2^-149 */
  in[584 + 4] = 1;          /* inf */
  in[292 + 4 + 255] = 0x7f; /* bsums follow qs: not read as values */
  float out[768];
  bs_decode(BS_DT_Q8_K, in, 3, out);
  expect_at("q8_k", out, 0, 0x43a00000);
  expect_at("q8_k", out, 255, 0x80000000); /* 0 * -2.5 */
  expect_at("q8_k", out, 256, 0x0000007f);
  expect_at("q8_k", out, 257, 0x80000001);
  expect_at("q8_k", out, 511, 0x0000007f);
  expect_at("q8_k", out, 512, 0x7f800000);
  expect_at("q8_k", out, 513, NAN_ANY); /* inf * 0 */
}

/* ---- ternary, MXFP4, IQ4 and the grid types (decode_ggml.c) ---------------------------------- */

Test(decode, tq1_0)
{
  /* qs[48] | qh[4] | d. 205 packs the trits 2, 1, 0, 1, 2 (ggml's fixed-point
   * base 3: ceil(194 * 256 / 243)); trit n of x is ((x * 3^n mod 256) * 3) >> 8.
   * qs[0..31] give elements 32n + m, qs[32..47] 160 + 16n + m, qh 240 + 4n + m. */
  uint8_t in[54] = {0};
  in[0] = in[32] = in[48] = 205;
  put16(in + 52, 0xc000); /* d = -2: (t - 1) * -2 */
  float out[256];
  bs_decode(BS_DT_TQ1_0, in, 1, out);
  const size_t at[] = {0, 32, 64, 96, 128, 160, 176, 192, 240, 244, 248, 252, 1, 255};
  const uint32_t want[] = {0xc0000000, 0x80000000, 0x40000000, 0x80000000, 0xc0000000,
                           0xc0000000, 0x80000000, 0x40000000, 0xc0000000, 0x80000000,
                           0x40000000, 0x80000000, 0x40000000, 0x40000000};
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
    expect_at("tq1_0", out, at[i], want[i]);
}

Test(decode, tq2_0)
{
  /* qs[64] | d; element 128j + 32l + m: bits 2l of qs[32j + m]; (q - 1) * d */
  uint8_t in[66] = {0};
  in[0] = 0xe4; /* 0, 1, 2, 3 */
  in[33] = 0x02;
  put16(in + 64, 0x3800); /* d = 0.5 */
  float out[256];
  bs_decode(BS_DT_TQ2_0, in, 1, out);
  expect_at("tq2_0", out, 0, 0xbf000000);
  expect_at("tq2_0", out, 32, 0x00000000);
  expect_at("tq2_0", out, 64, 0x3f000000);
  expect_at("tq2_0", out, 96, 0x3f800000);
  expect_at("tq2_0", out, 129, 0x3f000000);
  expect_at("tq2_0", out, 255, 0xbf000000);
}

Test(decode, mxfp4)
{
  /* e (E8M0) | qs[16]; the doubled E2M1 value times 2^(e - 128) */
  uint8_t in[17 * 4] = {0};
  in[0] = 127;  /* 0.5 */
  in[1] = 0x9f; /* [0] = -12 * 0.5, [16] = -1 * 0.5 */
  in[2] = 0x08; /* [1] = code 8 (E2M1 -0): ggml's table has 0, so +0 */
  in[17] = 0;   /* 2^-128, an F32 subnormal */
  in[18] = 0x07;
  in[34] = 255; /* 2^127 (ggml has no NaN here) */
  in[35] = 0x01;
  in[36] = 0x02;
  in[51] = 1; /* 2^-127 */
  in[52] = 0x0d;
  float out[128];
  bs_decode(BS_DT_MXFP4, in, 4, out);
  expect_at("mxfp4", out, 0, 0xc0c00000);
  expect_at("mxfp4", out, 16, 0xbf000000);
  expect_at("mxfp4", out, 1, 0x00000000);
  expect_at("mxfp4", out, 17, 0x00000000);
  expect_at("mxfp4", out, 32, 0x01400000); /* 12 * 2^-128 */
  expect_at("mxfp4", out, 64, 0x7f000000);
  expect_at("mxfp4", out, 65, 0x7f800000); /* 2 * 2^127 overflows */
  expect_at("mxfp4", out, 96, 0x81400000); /* -6 * 2^-127 */
}

Test(decode, iq4_nl_xs)
{
  /* IQ4_NL: d | qs[16]; nibbles index kvalues_iq4nl (-127 ... 113) */
  uint8_t nl[36] = {0x00, 0x3c, 0xf0};
  put16(nl + 18, 0x8000); /* d = -0 */
  nl[20] = 0x88;          /* value 1: -0 * 1 */
  float out[256];
  bs_decode(BS_DT_IQ4_NL, nl, 2, out);
  expect_at("iq4_nl", out, 0, 0xc2fe0000);
  expect_at("iq4_nl", out, 16, 0x42e20000);
  expect_at("iq4_nl", out, 32, 0x80000000);

  /* IQ4_XS: d | u16 scales_h | scales_l[4] | qs[128]; group i: (nibble i of
   * scales_l | 2 bits of scales_h << 4) - 32 */
  uint8_t xs[136] = {0};
  put16(xs, 0x3400);     /* d = 0.25 */
  put16(xs + 2, 0xc000); /* group 7: high bits 3 */
  xs[4] = 0x21;          /* group 0: 1 - 32, group 1: 2 - 32 */
  xs[7] = 0xf0;          /* group 7: 15 | 48 = 63 - 32 = 31 */
  xs[8] = 0x98;          /* [0] = 1 * -7.75, [16] = 13 * -7.75 */
  xs[8 + 112] = 0x0f;    /* [224] = 113 * 7.75, [240] = -127 * 7.75 */
  bs_decode(BS_DT_IQ4_XS, xs, 1, out);
  expect_at("iq4_xs", out, 0, 0xc0f80000);
  expect_at("iq4_xs", out, 16, 0xc2c98000);
  expect_at("iq4_xs", out, 32, 0x446e2000); /* -127 * -7.5 */
  expect_at("iq4_xs", out, 224, 0x445af000);
  expect_at("iq4_xs", out, 240, 0xc4761000);
}

Test(decode, iq2)
{
  /* grid entry 0 of the IQ2 grids is eight 8s, entry 1 43 then seven 8s;
   * ksigns(1) = 129 (bits 0 and 7: the parity bit) */
  float out[512];
  uint8_t xxs[66 * 2] = {0};
  put16(xxs, 0x3c00);
  xxs[2 + 1] = 1;                 /* group 0, second 8: entry 1 */
  const uint32_t a1 = 0xf0000001; /* scale 15: (0.5 + 15) * 0.25 = 3.875; first 8: ksigns(1) */
  for (int k = 0; k < 4; k++)
    xxs[6 + k] = (uint8_t)(a1 >> 8 * k);
  put16(xxs + 66, 0x0001); /* d = 2^-24: (2^-24 * 0.5) * 0.25 * 8 */
  bs_decode(BS_DT_IQ2_XXS, xxs, 2, out);
  expect_at("iq2_xxs", out, 0, 0xc1f80000);
  expect_at("iq2_xxs", out, 1, 0x41f80000);
  expect_at("iq2_xxs", out, 7, 0xc1f80000);
  expect_at("iq2_xxs", out, 8, 0x4326a000);
  expect_at("iq2_xxs", out, 256, 0x33800000);

  uint8_t xs[74] = {0};
  put16(xs, 0x3c00);
  put16(xs + 2, 0x0201); /* entry 1, ksigns(1) */
  xs[66] = 0x0f;         /* first 16 of group 0: 3.875 */
  bs_decode(BS_DT_IQ2_XS, xs, 1, out);
  expect_at("iq2_xs", out, 0, 0xc326a000);
  expect_at("iq2_xs", out, 1, 0x41f80000);
  expect_at("iq2_xs", out, 7, 0xc1f80000);

  uint8_t s2[82] = {0};
  put16(s2, 0x3c00);
  s2[2] = 1;     /* index 1 (qh bits 0 and 1 clear) */
  s2[34] = 0x80; /* sign bits as stored: only [7] negative */
  s2[74] = 0x01; /* (0.5 + 1) * 0.25 = 0.375 */
  bs_decode(BS_DT_IQ2_S, s2, 1, out);
  expect_at("iq2_s", out, 0, 0x41810000);
  expect_at("iq2_s", out, 7, 0xc0400000);
}

Test(decode, iq3)
{
  /* IQ3_XXS: d | qs[64] | per group a u32 of 4 x 7 sign bits and the scale;
   * entry 255 of iq3xxs_grid is 0x3e341c04 (4, 28, 52, 62) */
  float out[256];
  uint8_t xxs[98] = {0};
  put16(xxs, 0x3c00);
  xxs[2 + 1] = 255;
  xxs[66] = 0x7f; /* ksigns(127) = 255: all negative */
  xxs[69] = 0x10; /* scale 1: (0.5 + 1) * 0.5 = 0.75 */
  bs_decode(BS_DT_IQ3_XXS, xxs, 1, out);
  expect_at("iq3_xxs", out, 0, 0xc0400000); /* entry 0: 4s */
  expect_at("iq3_xxs", out, 4, 0xc0400000);
  expect_at("iq3_xxs", out, 7, 0xc23a0000);

  /* IQ3_S: d | qs[64] | qh[8] | signs[32] | scales[4]; entry 511 of
   * iq3s_grid is 0x0f0f0101 (1, 1, 15, 15), entry 0 four 1s */
  uint8_t s3[110] = {0};
  put16(s3, 0x3c00);
  s3[2] = 0xff;   /* with qh[0] bit 0: index 511 */
  s3[66] = 0x01;  /* the second index of the pair takes bit 1: clear */
  s3[74] = 0x01;  /* [0] negative */
  s3[106] = 0x02; /* 1 + 2 * 2 = 5 */
  bs_decode(BS_DT_IQ3_S, s3, 1, out);
  expect_at("iq3_s", out, 0, 0xc0a00000);
  expect_at("iq3_s", out, 2, 0x42960000);
  expect_at("iq3_s", out, 4, 0x40a00000);
}

Test(decode, iq1)
{
  /* iq1s_grid entry 0 is eight -1s, entry 2047 eight 1s; y = dl * (g + delta) */
  float out[256];
  uint8_t s1[50] = {0};
  put16(s1, 0x3c00);
  s1[2] = 0xff;           /* with qh bits 0-2 = 7: entry 2047 */
  put16(s1 + 34, 0xb007); /* delta -0.125 (bit 15), scale 3: dl = 7 */
  bs_decode(BS_DT_IQ1_S, s1, 1, out);
  expect_at("iq1_s", out, 0, 0x40c40000); /* 7 * 0.875 */
  expect_at("iq1_s", out, 8, 0xc0fc0000); /* 7 * -1.125 */

  /* IQ1_M: qs[32] | qh[16] | scales (4 x u16): d = 1.0 (0x3c00) from the
   * top nibbles (0, 0, 0xc, 3); group 0: dl1 = 2 * 5 + 1, dl2 = 2 * 2 + 1 */
  uint8_t m1[56] = {0};
  m1[0] = 0xff;
  m1[32] = 0x0f; /* first 8: index bits 7, delta -0.125; second 8: 0, +0.125 */
  put16(m1 + 48, 0x0015);
  put16(m1 + 52, 0xc000);
  put16(m1 + 54, 0x3000);
  bs_decode(BS_DT_IQ1_M, m1, 1, out);
  expect_at("iq1_m", out, 0, 0x411a0000);  /* 11 * 0.875 */
  expect_at("iq1_m", out, 8, 0xc11a0000);  /* 11 * -0.875 */
  expect_at("iq1_m", out, 16, 0xc08c0000); /* 5 * -0.875 */
}

Test(decode, grid_tables)
{
  /* Spot checks against ggml-common.h: first and last entries, and one
   * between, of every grid. */
  cr_expect_eq(bs_iq2xxs_grid[0], 0x0808080808080808u);
  cr_expect_eq(bs_iq2xxs_grid[255], 0x2b2b2b1908081908u);
  cr_expect_eq(bs_iq2xs_grid[511], 0x2b2b2b2b2b2b2b2bu);
  cr_expect_eq(bs_iq2s_grid[1023], 0x2b2b2b2b2b2b2b2bu);
  cr_expect_eq(bs_iq3xxs_grid[255], 0x3e341c04u);
  cr_expect_eq(bs_iq3s_grid[511], 0x0f0f0101u);
  cr_expect_eq(bs_iq3s_grid[300], 0x07030503u);
  cr_expect_eq(bs_iq1s_grid[0], 0xffffffffffffffffu);
  cr_expect_eq(bs_iq1s_grid[1000], 0x00000000ffff00ffu);
  cr_expect_eq(bs_iq1s_grid[2047], 0x0101010101010101u);
  /* every IQ1 value is -1, 0 or 1; every IQ2 value 8, 25 or 43 */
  for (int i = 0; i < 2048; i++)
    for (int j = 0; j < 8; j++) {
      uint8_t v = (uint8_t)(bs_iq1s_grid[i] >> 8 * j);
      cr_assert(v == 0xff || v == 0 || v == 1, "iq1s_grid[%d]", i);
    }
  const uint64_t *g2[] = {bs_iq2xxs_grid, bs_iq2xs_grid, bs_iq2s_grid};
  const int n2[] = {256, 512, 1024};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < n2[k]; i++)
      for (int j = 0; j < 8; j++) {
        uint8_t v = (uint8_t)(g2[k][i] >> 8 * j);
        cr_assert(v == 0x08 || v == 0x19 || v == 0x2b, "grid %d [%d]", k, i);
      }
}

/* ---- bs_catalog_decode_as and the decoded read path ------------------------------------------ */

#include "core/alloc.h"
#include "core/catalog.h"
#include "policy/decode_as.h"

/* E2M1 (OCP MX 1.0): code c is sign (bit 3), exponent (bits 1-2, bias
 * 1), mantissa (bit 0); exponent 0 is subnormal (mantissa x 0.5). Here as
 * F32 bit patterns, written out: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then -0 ... -6. */
static const uint32_t e2m1_bits[16] = {
    0x00000000, 0x3f000000, 0x3f800000, 0x3fc00000, 0x40000000, 0x40400000, 0x40800000, 0x40c00000,
    0x80000000, 0xbf000000, 0xbf800000, 0xbfc00000, 0xc0000000, 0xc0400000, 0xc0800000, 0xc0c00000};

Test(decode, f4_every_code_in_both_nibbles)
{
  /* byte c holds code c in its low nibble (element 2c) and code 15 - c in
   * its high one (element 2c + 1): every code in both positions */
  uint8_t in[16];
  uint32_t want[32];
  for (unsigned c = 0; c < 16; c++) {
    in[c] = (uint8_t)(c | (15u - c) << 4);
    want[2 * c] = e2m1_bits[c];
    want[2 * c + 1] = e2m1_bits[15 - c];
  }
  check(BS_DT_F4, in, 16, want, 32);
  /* the same codes one byte at a time, from an odd start */
  check(BS_DT_F4, in + 5, 1, want + 10, 2);
}

static bs_err cerr;

static void add_mem_src(struct bs_catalog *cat, const void *mem, size_t n)
{
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&s, mem, n, "mem", &cerr), 0);
  cr_assert_eq(bs_catalog_add_src(cat, &s, &idx, &cerr), 0);
}

/* A decoded size past what a file can have (an off_t: stat's st_size and
 * every offset of a mount): an F4 tensor of 2^61 elements is 2^60 bytes
 * stored, 2^63 as F32. It stays as stored with a note naming it and the
 * reason (stat and open of it failed with a bare EIO, nothing logged);
 * as F16 (2^62 bytes) it is decoded. */
Test(decode_as, a_decoded_size_past_off_t_stays_as_stored)
{
  static const uint8_t st[16];
  for (int pass = 0; pass < 2; pass++) {
    const enum bs_dtype as = pass ? BS_DT_F16 : BS_DT_F32;
    struct bs_catalog cat;
    bs_catalog_init(&cat);
    bs_err_clear(&cerr);
    add_mem_src(&cat, st, sizeof st);
    const uint64_t big[] = {1ull << 61}, small[] = {8};
    cr_assert_not_null(bs_catalog_add(&cat, "huge", BS_DT_F4, 1, big, 0, &cerr));
    cr_assert_not_null(bs_catalog_add(&cat, "f4", BS_DT_F4, 1, small, 0, &cerr));
    cr_assert_eq(cat.tensors[0].nbytes, 1ull << 60);
    cr_assert_eq(bs_catalog_decode_as(&cat, as, &cerr), 0, "%s", cerr.msg);
    const struct bs_tensor *t = &cat.tensors[0];
    cr_assert(cat.tensors[1].decoded, "a small F4 tensor is decoded");
    char buf[400];
    if (as == BS_DT_F16) {
      cr_assert(t->decoded && t->nbytes == 1ull << 62, "as F16 it fits: decoded");
      cr_assert_null(cat.notes);
    } else {
      cr_assert(!t->decoded && t->dtype == BS_DT_F4 && t->nbytes == 1ull << 60, "as stored");
      cr_assert_str_eq(cat.notes, "as=F32: 1 F4 tensor shown as stored (its decoded size does not "
                                  "fit a file size (2^63 - 1 bytes): 'huge' is "
                                  "2305843009213693952 elements of 4 bytes)\n");
      const char *why = bs_tensor_why_stored(t, BS_DT_F32, buf, sizeof buf);
      cr_assert(why && strstr(why, "does not fit a file size"), "%s", why ? why : "(null)");
      cr_assert_null(bs_tensor_why_stored(t, BS_DT_F16, buf, sizeof buf), "F16 would fit");
      cr_assert(bs_tensor_decodable(t), "it has a decoder");
    }
    bs_catalog_destroy(&cat);
  }
}

Test(decode_as, bf16_strided_and_kept_dtypes)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err_clear(&cerr);
  /* storage 2x3 BF16: 1, 2, 3 / -0, 0.5, inf; the tensor is its transpose [3,2] */
  static const uint8_t st[] = {0x80, 0x3f, 0x00, 0x40, 0x40, 0x40,
                               0x00, 0x80, 0x00, 0x3f, 0x80, 0x7f};
  add_mem_src(&cat, st, sizeof st);
  uint64_t shape[] = {3, 2};
  struct bs_tensor *t = bs_catalog_add(&cat, "w", BS_DT_BF16, 2, shape, 0, &cerr);
  cr_assert_not_null(t);
  cr_assert_not_null(bs_tensor_x(&cat, t));
  t->x->strides = bs_malloc(2 * sizeof *t->x->strides);
  t->x->strides[0] = 1;
  t->x->strides[1] = 3;
  t->x->storage_bytes = sizeof st;
  uint64_t one[] = {2};
  cr_assert_not_null(bs_catalog_add(&cat, "i", BS_DT_I32, 1, one, 0, &cerr));
  cr_assert_not_null(bs_catalog_add(&cat, "k", BS_DT_F6_E2M3, 1, (uint64_t[]){256}, 0, &cerr));
  cr_assert_not_null(bs_catalog_add(&cat, "k2", BS_DT_F6_E2M3, 1, (uint64_t[]){512}, 0, &cerr));
  cr_assert_not_null(bs_catalog_add(&cat, "f", BS_DT_F32, 1, one, 0, &cerr));
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
  t = &cat.tensors[0];
  cr_assert(t->decoded);
  cr_assert_eq(t->dtype, BS_DT_F32);
  cr_assert_eq(t->stored_dtype, BS_DT_BF16);
  cr_assert_eq(t->nbytes, 24);
  cr_assert(!cat.tensors[1].decoded && cat.tensors[1].dtype == BS_DT_I32);
  cr_assert(!cat.tensors[2].decoded && cat.tensors[2].dtype == BS_DT_F6_E2M3);
  cr_assert(cat.tensors[2].nbytes == 192, "F6 as stored: 4 values in 3 bytes");
  cr_assert(!cat.tensors[4].decoded && cat.tensors[4].nbytes == 8);
  cr_assert_str_eq(cat.notes,
                   "as=F32: 2 F6_E2M3 tensors shown as stored (no file format "
                   "defines how 4 F6 values are packed in 3 bytes, and producers differ: "
                   "decoding with a guessed order would give wrong numbers)\n");
  int fd;
  uint64_t base;
  cr_assert(!bs_tensor_fd_range(&cat, t, &fd, &base), "a decoded tensor is never spliced");
  /* row-major of the transpose: 1, -0, 2, 0.5, 3, inf */
  const uint32_t want[] = {0x3f800000, 0x80000000, 0x40000000, 0x3f000000, 0x40400000, 0x7f800000};
  bs_test_check_slices(&cat, t, (const uint8_t *)want, 7);
  /* idempotent; other targets refused */
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0);
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_I32, &cerr), -1);
  cr_assert_eq(cerr.code, EINVAL);
  bs_catalog_destroy(&cat);
}

Test(decode_as, f4_reads_from_every_offset)
{
  /* An F4 [3, 22] tensor (66 elements in 33 bytes) of pseudo-random bytes
   * after 5 bytes of something else: every read starting at every byte of
   * the output (mid-element, and on an element in the high nibble of its
   * byte), lengths 1 to 61, as F32 and narrowed to F16, gives the bytes of
   * the decode worked out here by nibble, element by element. */
  static uint8_t st[5 + 33];
  for (size_t i = 0; i < sizeof st; i++)
    st[i] = (uint8_t)((i * 2654435761u) >> 13);
  uint32_t whole[66];
  uint8_t half[132];
  for (int e = 0; e < 66; e++) {
    uint8_t b = st[5 + e / 2];
    whole[e] = e2m1_bits[e % 2 ? b >> 4 : b & 0x0f];
    float f;
    memcpy(&f, &whole[e], 4);
    uint16_t h = bs_f32_to_f16(f); /* E2M1 values are exact in F16 */
    half[2 * e] = (uint8_t)h;
    half[2 * e + 1] = (uint8_t)(h >> 8);
  }
  for (int as = 0; as < 2; as++) {
    struct bs_catalog cat;
    bs_catalog_init(&cat);
    bs_err_clear(&cerr);
    add_mem_src(&cat, st, sizeof st);
    struct bs_tensor *t = bs_catalog_add(&cat, "f", BS_DT_F4, 2, (uint64_t[]){3, 22}, 0, &cerr);
    cr_assert_not_null(t);
    t->off = 5;
    cr_assert_eq(bs_catalog_decode_as(&cat, as ? BS_DT_F16 : BS_DT_F32, &cerr), 0, "%s", cerr.msg);
    t = &cat.tensors[0];
    cr_assert(t->decoded && t->stored_dtype == BS_DT_F4);
    cr_assert_eq(t->nbytes, as ? 132u : 264u);
    cr_assert_null(cat.notes);
    bs_test_check_slices(&cat, t, as ? half : (const uint8_t *)whole, 1);
    /* a strided F4 view (no reader makes one) stays as stored */
    struct bs_tensor *v = bs_catalog_add(&cat, "v", BS_DT_F4, 1, (uint64_t[]){4}, 0, &cerr);
    cr_assert_not_null(v);
    cr_assert_not_null(bs_tensor_x(&cat, v));
    v->x->strides = bs_malloc(sizeof *v->x->strides);
    v->x->strides[0] = 2;
    v->x->storage_bytes = 4;
    cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
    cr_assert(!cat.tensors[1].decoded && cat.tensors[1].dtype == BS_DT_F4);
    bs_catalog_destroy(&cat);
  }
}

Test(decode_as, superblocks_read_mid_block)
{
  /* Two tensors of 256-element blocks (Q4_K, IQ1_M) of pseudo-random bytes:
   * reads starting and ending inside a block (every 7th offset, lengths 1
   * to 61) give the same bytes as the whole decode. */
  static uint8_t st[144 * 3 + 56 * 2];
  for (size_t i = 0; i < sizeof st; i++)
    st[i] = (uint8_t)((i * 2654435761u) >> 11);
  put16(st, 0x3c00); /* normal scales in the first block */
  put16(st + 2, 0x2c00);
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err_clear(&cerr);
  add_mem_src(&cat, st, sizeof st);
  cr_assert_not_null(bs_catalog_add(&cat, "k", BS_DT_Q4_K, 2, (uint64_t[]){3, 256}, 0, &cerr));
  struct bs_tensor *m = bs_catalog_add(&cat, "m", BS_DT_IQ1_M, 1, (uint64_t[]){512}, 0, &cerr);
  cr_assert_not_null(m);
  m->off = 144 * 3; /* the data's offset in the source (a reader sets it) */
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
  static float whole_k[768], whole_m[512];
  bs_decode(BS_DT_Q4_K, st, 3, whole_k);
  bs_decode(BS_DT_IQ1_M, st + 144 * 3, 2, whole_m);
  cr_assert(cat.tensors[0].decoded && cat.tensors[0].nbytes == sizeof whole_k);
  cr_assert(cat.tensors[1].decoded && cat.tensors[1].nbytes == sizeof whole_m);
  bs_test_check_slices(&cat, &cat.tensors[0], (const uint8_t *)whole_k, 7);
  bs_test_check_slices(&cat, &cat.tensors[1], (const uint8_t *)whole_m, 7);
  bs_catalog_destroy(&cat);
}

Test(decode_as, q8_0_across_steps)
{
  /* 600 Q8_0 blocks (19200 elements: more than one 8192-element step), each
   * block b with d = 1.0 and q[j] = (b + j) % 256 - 128. */
  enum { NB = 600 };
  uint8_t *st = bs_malloc(NB * 34);
  float *whole = bs_malloc(NB * 32 * sizeof(float));
  for (int b = 0; b < NB; b++) {
    st[b * 34] = 0x00;
    st[b * 34 + 1] = 0x3c;
    for (int j = 0; j < 32; j++) {
      int q = (b + j) % 256 - 128;
      st[b * 34 + 2 + j] = (uint8_t)(int8_t)q;
      whole[b * 32 + j] = (float)q;
    }
  }
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err_clear(&cerr);
  add_mem_src(&cat, st, NB * 34);
  uint64_t shape[] = {NB, 32};
  cr_assert_not_null(bs_catalog_add(&cat, "q", BS_DT_Q8_0, 2, shape, 0, &cerr));
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
  const struct bs_tensor *t = &cat.tensors[0];
  cr_assert_eq(t->nbytes, (uint64_t)NB * 32 * 4);
  /* one read across the step boundary, from an odd offset */
  size_t n = 70001;
  uint8_t *got = bs_malloc(n);
  cr_assert_eq(bs_tensor_read(&cat, t, 3, got, n), (long)n);
  cr_assert_eq(memcmp(got, (const uint8_t *)whole + 3, n), 0);
  cr_assert_eq(bs_tensor_read(&cat, t, t->nbytes - 5, got, n), 5);
  cr_assert_eq(memcmp(got, (const uint8_t *)whole + t->nbytes - 5, 5), 0);
  cr_assert_eq(bs_tensor_read(&cat, t, t->nbytes, got, n), 0);
  bs_free(got);
  bs_catalog_destroy(&cat);
  bs_free(st);
  bs_free(whole);
}

/* A source whose bytes from fail_at on cannot be read (a bad sector): a
 * decoded read that reaches it returns the decoded bytes of the whole
 * stored units before it, a short read, as the raw read returns the stored
 * bytes it has (the old code failed the whole read with EIO); a read that
 * starts at a unit it cannot read fails with EIO; a source that changed
 * fails it with EIO (the old code returned the bytes of its partial read
 * without asking). */
Test(decode_as, a_read_failing_part_way_is_short)
{
  enum { N = 20000, NB = 600 };
  static uint8_t st[2 * N];
  static uint32_t whole[N];
  for (int i = 0; i < N; i++) { /* BF16 values i / 8 and their F32 bits */
    float f = (float)i / 8.0f;
    memcpy(&whole[i], &f, 4);
    st[2 * i] = (uint8_t)(whole[i] >> 16);
    st[2 * i + 1] = (uint8_t)(whole[i] >> 24);
    whole[i] &= 0xffff0000u; /* the BF16 is the F32 cut to its upper half */
  }
  const uint64_t fail_at = 2 * 10000 + 1; /* in element 10000's second byte */
  static uint8_t got[4 * N];
  struct bs_catalog cat;
  bs_test_fault_catalog(&cat, st, sizeof st, fail_at, sizeof st, false);
  uint64_t shape[] = {N};
  struct bs_tensor *t = bs_test_add(&cat, "b", BS_DT_BF16, 1, shape, 0);
  /* the raw read: the stored bytes it has */
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, 2 * N), (long)fail_at);
  cr_assert_eq(memcmp(got, st, fail_at), 0);
  cr_assert_eq(bs_tensor_read(&cat, t, fail_at, got, 2 * N), -EIO);
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
  t = &cat.tensors[0];
  cr_assert(t->decoded && t->nbytes == 4 * N);
  /* decoded: elements 0..9999 (more than one step of 8192) */
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, 4 * N), 4 * 10000);
  cr_assert_eq(memcmp(got, whole, 4 * 10000), 0);
  cr_assert_eq(bs_tensor_read(&cat, t, 3, got, 4 * N), 4 * 10000 - 3, "from mid-element");
  cr_assert_eq(memcmp(got, (uint8_t *)whole + 3, 4 * 10000 - 3), 0);
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 9990 + 1, got, 100), 4 * 10 - 1, "within a step");
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 10000, got, 4 * N), -EIO, "element 10000 is unread");
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 10000 + 2, got, 8), -EIO);
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 10001, got, 8), -EIO);
  bs_catalog_destroy(&cat);

  /* as=F16 (decoded, then narrowed in a scratch): the same elements, 2 bytes each */
  bs_test_fault_catalog(&cat, st, sizeof st, fail_at, sizeof st, false);
  bs_test_add(&cat, "b", BS_DT_BF16, 1, shape, 0);
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F16, &cerr), 0, "%s", cerr.msg);
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 1, got, 2 * N), 2 * 10000 - 1);
  bs_catalog_destroy(&cat);

  /* Q8_0 blocks (34 bytes for 32): a bad byte in block 400 leaves 400 blocks */
  uint8_t *q = bs_malloc(NB * 34);
  for (int b = 0; b < NB; b++) {
    q[b * 34] = 0x00;
    q[b * 34 + 1] = 0x3c; /* d = 1 */
    for (int j = 0; j < 32; j++)
      q[b * 34 + 2 + j] = (uint8_t)(b + j);
  }
  bs_test_fault_catalog(&cat, q, NB * 34, 400 * 34 + 20, 400 * 34 + 21, false);
  bs_test_add(&cat, "q", BS_DT_Q8_0, 2, (uint64_t[]){NB, 32}, 0);
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
  float *qf = (float *)(void *)got;
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 4 * 32 * 500), 4 * 32 * 400);
  for (int i = 0; i < 32 * 400; i++)
    cr_assert_eq(qf[i], (float)(int8_t)(uint8_t)(i / 32 + i % 32), "[%d]", i);
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 4 * 32 * 400, got, 64), -EIO);
  /* past the bad range the source reads again, and so does the view */
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 4 * 32 * 401, got, 64), 64);
  cr_assert_eq(qf[0], (float)(int8_t)(uint8_t)401);
  bs_catalog_destroy(&cat);

  /* a source that changed: EIO, not the bytes of the partial read (also
   * when the failure falls at the start of a step of 8192 elements, where
   * the old code returned the steps before it unchecked) */
  const uint64_t fails[] = {fail_at, 2 * 8192};
  for (int k = 0; k < 2; k++) {
    bs_test_fault_catalog(&cat, st, sizeof st, fails[k], sizeof st, true);
    bs_test_add(&cat, "b", BS_DT_BF16, 1, shape, 0);
    cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 2 * N), -EIO, "raw");
    cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
    cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 4 * N), -EIO, "decoded %d", k);
    bs_catalog_destroy(&cat);
  }
  bs_free(q);
}
