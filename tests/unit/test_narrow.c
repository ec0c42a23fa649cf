/* decode.c's narrowing (convert --as F16|BF16): hand-picked F32 values
 * (ties at normal and subnormal scale, the largest finite values and the
 * first that overflow, -0, infinities, NaNs) against the IEEE 754 result
 * written out here, then a property over a sweep of every 4099th F32 bit
 * pattern: the result is a neighbour of the input, the nearer one, ties to
 * the even one (computed in double, not with the code under test), and,
 * where the compiler has _Float16, equal to its conversion. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "bs_test.h"
#include "core/decode.h"

static float fbits(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static float bf16_to_f32(uint16_t h)
{
  return fbits((uint32_t)h << 16);
}

struct pair {
  uint32_t in;
  uint16_t want;
};

Test(narrow, f16_hand_picked)
{
  static const struct pair p[] = {
      {0x3f800000, 0x3c00},                       /* 1 */
      {0x00000000, 0x0000},                       /* 0 */
      {0x80000000, 0x8000},                       /* -0 */
      {0x3f801000, 0x3c00},                       /* 1 + 2^-11: the tie, to even */
      {0x3f803000, 0x3c02},                       /* 1 + 3 * 2^-11: the tie, to even (up) */
      {0x3f801001, 0x3c01},                       /* just past the tie */
      {0x3f800fff, 0x3c00},                       /* just before it */
      {0x477fe000, 0x7bff},                       /* 65504, the largest finite */
      {0x477fefff, 0x7bff},                       /* below 65520 */
      {0x477ff000, 0x7c00},                       /* 65520: the tie with 65536, to even: infinity */
      {0xc77ff000, 0xfc00}, {0x7f7fffff, 0x7c00}, /* FLT_MAX */
      {0x7f800000, 0x7c00},                       /* inf */
      {0xff800000, 0xfc00},                       /* -inf */
      {0x38800000, 0x0400},                       /* 2^-14, the least normal */
      {0x387fffff, 0x0400},                       /* just below it: rounds up into the normals */
      {0x387fc000, 0x03ff},                       /* 1023 * 2^-24, the largest subnormal */
      {0x33800000, 0x0001},                       /* 2^-24, the least subnormal */
      {0xb3800000, 0x8001}, {0x33000000, 0x0000}, /* 2^-25: the tie between 0 and 2^-24, to even */
      {0xb3000000, 0x8000}, {0x33000001, 0x0001}, /* just past it */
      {0x33c00000, 0x0002}, /* 3 * 2^-25: the tie between 1 and 2 units, to even */
      {0x34200000, 0x0002}, /* 5 * 2^-25: the tie between 2 and 3 units, to even */
      {0x2edbe6ff, 0x0000}, /* 1e-10 */
      {0x00000001, 0x0000}, /* the least F32 subnormal */
      {0x7fc00000, 0x7e00}, /* NaN */
      {0xffc00000, 0xfe00}, /* -NaN */
      {0x7f800001, 0x7e00}, /* signalling NaN: quiet, still NaN */
      {0x7fa00000, 0x7f00}, /* payload's top bits kept */
  };
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
    cr_expect_eq(bs_f32_to_f16(fbits(p[i].in)), p[i].want, "%08x: %04x, want %04x", p[i].in,
                 bs_f32_to_f16(fbits(p[i].in)), p[i].want);
}

Test(narrow, bf16_hand_picked)
{
  static const struct pair p[] = {
      {0x3f800000, 0x3f80}, /* 1 */
      {0x80000000, 0x8000}, /* -0 */
      {0x3f808000, 0x3f80}, /* the tie, to even */
      {0x3f818000, 0x3f82}, /* the tie, to even (up) */
      {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80},
      {0x7f7f7fff, 0x7f7f}, /* below the tie with infinity */
      {0x7f7f8000, 0x7f80}, /* the tie: 0x7f7f is odd, so infinity */
      {0x7f7fffff, 0x7f80}, /* FLT_MAX */
      {0xff7fffff, 0xff80}, {0x7f800000, 0x7f80},
      {0xff800000, 0xff80}, {0x00008000, 0x0000}, /* subnormal tie, to even */
      {0x00018000, 0x0002}, {0x00000001, 0x0000},
      {0x807fffff, 0x8080}, /* the largest subnormal rounds up to the least normal */
      {0x7fc00000, 0x7fc0}, /* NaN */
      {0xffc00000, 0xffc0}, {0xff800001, 0xffc0}, /* signalling NaN: quiet, sign kept */
      {0x7f810000, 0x7fc1},                       /* payload's top bits kept */
      {0x7fffffff, 0x7fff},                       /* rounding must not carry a NaN into the sign */
  };
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
    cr_expect_eq(bs_f32_to_bf16(fbits(p[i].in)), p[i].want, "%08x: %04x, want %04x", p[i].in,
                 bs_f32_to_bf16(fbits(p[i].in)), p[i].want);
}

/* Every F16 and BF16 value widens and narrows back to itself (NaNs: to a
 * quiet NaN of the same sign). */
Test(narrow, round_trips)
{
  for (uint32_t h = 0; h < 0x10000; h++) {
    uint16_t back = bs_f32_to_f16(bs_f16_to_f32((uint16_t)h));
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
      cr_assert_eq(back, h | 0x200, "f16 %04x: %04x", h, back);
    else
      cr_assert_eq(back, h, "f16 %04x: %04x", h, back);
    back = bs_f32_to_bf16(bf16_to_f32((uint16_t)h));
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
      cr_assert_eq(back, h | 0x40, "bf16 %04x: %04x", h, back);
    else
      cr_assert_eq(back, h, "bf16 %04x: %04x", h, back);
  }
}

/* The result r of narrowing finite x: no representable value is nearer
 * (its neighbours r - 1 and r + 1 in magnitude are no nearer), and a tie
 * went to the even one. wide: r widened; lo/hi: the neighbours widened
 * (infinity beyond the largest finite stands for the overflow threshold,
 * which the hand-picked cases check). */
static void check_nearest(uint32_t in, uint16_t r, double wide, double lo, double hi, bool lo_ok,
                          bool hi_ok)
{
  double x = fabs((double)fbits(in)), d = fabs(wide - x);
  if (lo_ok) {
    double dl = fabs(lo - x);
    cr_assert(d < dl || (d == dl && !(r & 1)), "%08x -> %04x: its lower neighbour is nearer", in,
              r);
  }
  if (hi_ok && !isinf(hi)) {
    double dh = fabs(hi - x);
    cr_assert(d < dh || (d == dh && !(r & 1)), "%08x -> %04x: its upper neighbour is nearer", in,
              r);
  }
}

Test(narrow, nearest_even_sweep)
{
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
    uint32_t in = (uint32_t)u;
    float f = fbits(in);
    if (isnan(f)) {
      cr_assert(isnan(bs_f16_to_f32(bs_f32_to_f16(f))), "%08x", in);
      cr_assert(isnan(bf16_to_f32(bs_f32_to_bf16(f))), "%08x", in);
      continue;
    }
    uint16_t h = bs_f32_to_f16(f), m = h & 0x7fff;
    cr_assert_eq(h >> 15, in >> 31, "%08x: sign", in);
    if (m < 0x7c00)
      check_nearest(in, h, fabs((double)bs_f16_to_f32(h)), m ? fabs(bs_f16_to_f32(m - 1)) : 0,
                    fabs((double)bs_f16_to_f32(m + 1)), m > 0, true);
    else
      cr_assert(fabs((double)f) >= 65520.0, "%08x overflowed to %04x", in, h);
#ifdef __FLT16_MAX__
    _Float16 ref = (_Float16)f;
    uint16_t rb;
    memcpy(&rb, &ref, sizeof rb);
    cr_assert_eq(h, rb, "%08x: %04x, the compiler's _Float16 says %04x", in, h, rb);
#endif
    uint16_t b = bs_f32_to_bf16(f), mb = b & 0x7fff;
    cr_assert_eq(b >> 15, in >> 31, "%08x: sign", in);
    if (mb < 0x7f80)
      check_nearest(in, b, fabs((double)bf16_to_f32(b)), mb ? fabs(bf16_to_f32(mb - 1)) : 0,
                    fabs((double)bf16_to_f32(mb + 1)), mb > 0, true);
    else
      cr_assert(fabs((double)f) >= (double)fbits(0x7f7f8000), "%08x overflowed to %04x", in, b);
  }
}

Test(narrow, encode)
{
  const float in[] = {1.0f, -2.0f, fbits(0x3f801000)};
  uint8_t out[12];
  cr_assert(bs_encode_ok(BS_DT_F32) && bs_encode_ok(BS_DT_F16) && bs_encode_ok(BS_DT_BF16));
  cr_assert(!bs_encode_ok(BS_DT_F64) && !bs_encode_ok(BS_DT_I32) && !bs_encode_ok(BS_DT_Q8_0));
  bs_encode(BS_DT_F16, in, 3, out);
  const uint8_t f16[] = {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x3c};
  cr_assert_arr_eq(out, f16, 6);
  bs_encode(BS_DT_BF16, in, 3, out);
  const uint8_t bf16[] = {0x80, 0x3f, 0x00, 0xc0, 0x80, 0x3f};
  cr_assert_arr_eq(out, bf16, 6);
  bs_encode(BS_DT_F32, in, 3, out);
  const uint8_t f32[] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 0, 0x10, 0x80, 0x3f};
  cr_assert_arr_eq(out, f32, 12);
}

/* ---- bs_catalog_decode_as to F16 and BF16 ---- */

#include <errno.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "policy/decode_as.h"

Test(narrow_as, f32_bf16_q8_0_to_f16_and_bf16)
{
  /* "a": F32 [4]: 1 + 2^-11 (a tie for F16), 65520 (F16 overflow), -0, NaN;
   * "b": BF16 [3]: 1, -2, 2^-24 (the least F16 subnormal);
   * "q": Q8_0 [32]: d = 0.5, q[j] = j - 16;
   * "i": I32 [2], kept. */
  uint8_t st[16 + 6 + 34 + 8];
  const uint32_t a[] = {0x3f801000, 0x477ff000, 0x80000000, 0x7fc00000};
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 4; k++)
      st[4 * i + k] = (uint8_t)(a[i] >> (8 * k));
  const uint8_t b[] = {0x80, 0x3f, 0x00, 0xc0, 0x80, 0x33};
  memcpy(st + 16, b, sizeof b);
  st[22] = 0x00;
  st[23] = 0x38; /* 0.5 as F16 */
  for (int j = 0; j < 32; j++)
    st[24 + j] = (uint8_t)(int8_t)(j - 16);
  memset(st + 56, 7, 8);
  struct bs_catalog cat;
  bs_err err;
  for (int pass = 0; pass < 2; pass++) {
    enum bs_dtype as = pass ? BS_DT_BF16 : BS_DT_F16;
    bs_test_mem_catalog(&cat, st, sizeof st);
    bs_err_clear(&err);
    cr_assert_not_null(bs_catalog_add(&cat, "a", BS_DT_F32, 1, (uint64_t[]){4}, 0, &err));
    cr_assert_not_null(bs_catalog_add(&cat, "b", BS_DT_BF16, 1, (uint64_t[]){3}, 16, &err));
    cat.tensors[cat.count - 1].off = 16;
    cr_assert_not_null(bs_catalog_add(&cat, "q", BS_DT_Q8_0, 1, (uint64_t[]){32}, 22, &err));
    cat.tensors[cat.count - 1].off = 22;
    cr_assert_not_null(bs_catalog_add(&cat, "i", BS_DT_I32, 1, (uint64_t[]){2}, 56, &err));
    cat.tensors[cat.count - 1].off = 56;
    cr_assert_eq(bs_catalog_decode_as(&cat, as, &err), 0, "%s", err.msg);
    const struct bs_tensor *ta = &cat.tensors[0], *tb = &cat.tensors[1], *tq = &cat.tensors[2];
    cr_assert(ta->decoded && ta->dtype == as && ta->stored_dtype == BS_DT_F32 && ta->nbytes == 8);
    cr_assert_eq(tb->decoded, !pass, "BF16 as BF16 stays as stored");
    cr_assert(tq->decoded && tq->dtype == as && tq->nbytes == 64);
    cr_assert(!cat.tensors[3].decoded && cat.tensors[3].nbytes == 8);
    uint16_t wa[4], wq[32];
    if (!pass) {
      const uint16_t f16a[] = {0x3c00, 0x7c00, 0x8000, 0x7e00};
      memcpy(wa, f16a, sizeof wa);
      const uint16_t wb[] = {0x3c00, 0xc000, 0x0001};
      bs_test_check_slices(&cat, tb, (const uint8_t *)wb, 3);
    } else {
      const uint16_t bf16a[] = {0x3f80, 0x4780, 0x8000, 0x7fc0};
      memcpy(wa, bf16a, sizeof wa);
    }
    for (int j = 0; j < 32; j++)
      wq[j] = pass ? bs_f32_to_bf16((float)(j - 16) * 0.5f) : bs_f32_to_f16((float)(j - 16) * 0.5f);
    bs_test_check_slices(&cat, ta, (const uint8_t *)wa, 3);
    bs_test_check_slices(&cat, tq, (const uint8_t *)wq, 3);
    bs_catalog_destroy(&cat);
  }
}
