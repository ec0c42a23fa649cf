/* decode.c: every decoder on hand-built bytes (scale extremes, -0, NaN,
 * subnormals, infinities, rounding ties), against the expected F32 bit
 * patterns written out here from the format descriptions (IEEE 754, OCP
 * 8-bit floats, PyTorch's FNUZ types, ggml's block layouts and reference
 * dequantize_row_* formulas). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "core/decode.h"

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
  /* not decoded: F32 itself, integers, bool, complex, unspecified packing,
   * not yet written (K-quants), out of range */
  enum bs_dtype no[] = {BS_DT_F32,     BS_DT_I32,    BS_DT_U8,  BS_DT_BOOL, BS_DT_C64,  BS_DT_F4,
                        BS_DT_F6_E2M3, BS_DT_QFLOAT, BS_DT_QI8, BS_DT_Q4_K, BS_DT_COUNT};
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
      cr_expect(e == 1 && b * 8 == bs_dtype_bits((enum bs_dtype)dt));
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

/* ---- bs_catalog_decode_as and the decoded read path ------------------------------------------ */

#include "burnstore/catalog.h"
#include "core/alloc.h"

static bs_err cerr;

static void add_mem_src(struct bs_catalog *cat, const void *mem, size_t n)
{
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&s, mem, n, "mem", &cerr), 0);
  cr_assert_eq(bs_catalog_add_src(cat, &s, &idx, &cerr), 0);
}

/* Reads of every offset and length of the decoded bytes equal the same
 * slice of the whole decode. */
static void check_slices(const struct bs_catalog *cat, const struct bs_tensor *t,
                         const uint8_t *whole)
{
  uint8_t got[64];
  for (uint64_t off = 0; off < t->nbytes; off += 7)
    for (size_t n = 1; n < sizeof got && off + n <= t->nbytes + 3; n += 5) {
      long r = bs_tensor_read(cat, t, off, got, n);
      size_t want = off + n > t->nbytes ? (size_t)(t->nbytes - off) : n;
      cr_assert_eq(r, (long)want, "off %llu n %zu: %ld", (unsigned long long)off, n, r);
      cr_assert_eq(memcmp(got, whole + off, want), 0, "off %llu n %zu", (unsigned long long)off, n);
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
  t->strides = bs_malloc(2 * sizeof *t->strides);
  t->strides[0] = 1;
  t->strides[1] = 3;
  t->storage_bytes = sizeof st;
  uint64_t one[] = {2};
  cr_assert_not_null(bs_catalog_add(&cat, "i", BS_DT_I32, 1, one, 0, &cerr));
  cr_assert_not_null(bs_catalog_add(&cat, "k", BS_DT_Q4_K, 1, (uint64_t[]){256}, 0, &cerr));
  cr_assert_not_null(bs_catalog_add(&cat, "k2", BS_DT_Q4_K, 1, (uint64_t[]){512}, 0, &cerr));
  cr_assert_not_null(bs_catalog_add(&cat, "f", BS_DT_F32, 1, one, 0, &cerr));
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0, "%s", cerr.msg);
  t = &cat.tensors[0];
  cr_assert(t->decoded);
  cr_assert_eq(t->dtype, BS_DT_F32);
  cr_assert_eq(t->stored_dtype, BS_DT_BF16);
  cr_assert_eq(t->nbytes, 24);
  cr_assert(!cat.tensors[1].decoded && cat.tensors[1].dtype == BS_DT_I32);
  cr_assert(!cat.tensors[2].decoded && cat.tensors[2].dtype == BS_DT_Q4_K);
  cr_assert(!cat.tensors[4].decoded && cat.tensors[4].nbytes == 8);
  cr_assert_str_eq(cat.notes, "as=F32: 2 Q4_K tensors shown as stored (no decoder for Q4_K)\n");
  int fd;
  uint64_t base;
  cr_assert(!bs_tensor_fd_range(&cat, t, &fd, &base), "a decoded tensor is never spliced");
  /* row-major of the transpose: 1, -0, 2, 0.5, 3, inf */
  const uint32_t want[] = {0x3f800000, 0x80000000, 0x40000000, 0x3f000000, 0x40400000, 0x7f800000};
  check_slices(&cat, t, (const uint8_t *)want);
  /* idempotent; other targets refused */
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &cerr), 0);
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_I32, &cerr), -1);
  cr_assert_eq(cerr.code, EINVAL);
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
