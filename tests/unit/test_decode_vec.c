/* decode_vec.h: the vector paths give the scalar path's bits for every F16
 * and every BF16 value (NaNs, signalling ones included, infinities,
 * subnormals, -0), also from unaligned input and for lengths that leave a
 * scalar tail, and through bs_decode. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/decode.h"
#include "core/decode_vec.h"

static uint32_t fbits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Every 16-bit pattern, little-endian, at in + 1 (unaligned). */
static uint8_t *all_values(void)
{
  uint8_t *buf = bs_malloc(2 * 65536 + 1);
  cr_assert_not_null(buf);
  for (uint32_t h = 0; h < 65536; h++) {
    buf[1 + 2 * h] = (uint8_t)h;
    buf[2 + 2 * h] = (uint8_t)(h >> 8);
  }
  return buf;
}

static uint32_t scalar(enum bs_dtype dt, uint32_t h)
{
  return dt == BS_DT_F16 ? fbits(bs_f16_to_f32((uint16_t)h)) : h << 16;
}

static void check_all(enum bs_dtype dt)
{
  uint8_t *in = all_values();
  float *out = bs_malloc(65536 * sizeof(float));
  cr_assert_not_null(out);
  size_t done = dt == BS_DT_F16 ? bs_vec_f16_to_f32(in + 1, 65536, out)
                                : bs_vec_bf16_to_f32(in + 1, 65536, out);
#if defined(__x86_64__)
  /* SSE2 is always there; the F16 path wants AVX2 and F16C, as its
   * runtime check does (an Ivy Bridge has F16C without AVX2: the scalar
   * path, which bs_decode below still checks). */
  if (dt == BS_DT_BF16 || (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2")))
    cr_assert_eq(done, 65536, "%s: the vector path ran (%zu)", bs_dtype_name(dt), done);
#endif
  for (uint32_t h = 0; h < done; h++)
    cr_assert_eq(fbits(out[h]), scalar(dt, h), "%s %04x: vector %08x, scalar %08x",
                 bs_dtype_name(dt), h, fbits(out[h]), scalar(dt, h));
  /* bs_decode (vector, then scalar tail) from an odd element and length */
  for (size_t start = 0; start < 3; start++)
    for (size_t n = 65536 - start; n > 65536 - start - 12; n -= 5) {
      memset(out, 0xa5, 65536 * sizeof(float));
      bs_decode(dt, in + 1 + 2 * start, n, out);
      for (size_t i = 0; i < n; i++)
        cr_assert_eq(fbits(out[i]), scalar(dt, (uint32_t)(start + i)), "%s %04zx (n %zu)",
                     bs_dtype_name(dt), start + i, n);
      if (n < 65536)
        cr_assert_eq(fbits(out[n]), 0xa5a5a5a5u, "wrote past its output");
    }
  bs_free(in);
  bs_free(out);
}

Test(decode_vec, f16_every_value)
{
  check_all(BS_DT_F16);
}

Test(decode_vec, bf16_every_value)
{
  check_all(BS_DT_BF16);
}

Test(decode_vec, short_inputs_are_left_to_the_scalar_loop)
{
  uint8_t in[14] = {0};
  float out[7];
  cr_assert_eq(bs_vec_f16_to_f32(in, 7, out), 0);
  cr_assert_eq(bs_vec_bf16_to_f32(in, 7, out), 0);
}

/* Narrowing: the vector paths give bs_f32_to_f16 / bs_f32_to_bf16's bits
 * for a sweep of every 4099th F32 bit pattern (NaNs, infinities,
 * subnormals, both signs), every F32 whose upper half is one F16 /
 * BF16 neighbourhood (the ties), and through bs_encode with a tail. */
static void check_narrow(const float *in, size_t n)
{
  uint8_t *vh = bs_malloc(2 * n), *vb = bs_malloc(2 * n);
  cr_assert(vh && vb);
  size_t dh = bs_vec_f32_to_f16(in, n, vh), db = bs_vec_f32_to_bf16(in, n, vb);
#if defined(__x86_64__)
  if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2"))
    cr_assert(dh == n - n % 8 && db == n - n % 16, "the vector paths ran (%zu, %zu of %zu)", dh, db,
              n);
#endif
  for (size_t i = 0; i < dh; i++) {
    uint16_t got = (uint16_t)(vh[2 * i] | vh[2 * i + 1] << 8), want = bs_f32_to_f16(in[i]);
    cr_assert_eq(got, want, "f16 of %08x: vector %04x, scalar %04x", fbits(in[i]), got, want);
  }
  for (size_t i = 0; i < db; i++) {
    uint16_t got = (uint16_t)(vb[2 * i] | vb[2 * i + 1] << 8), want = bs_f32_to_bf16(in[i]);
    cr_assert_eq(got, want, "bf16 of %08x: vector %04x, scalar %04x", fbits(in[i]), got, want);
  }
  bs_free(vh);
  bs_free(vb);
}

Test(decode_vec, narrowing_matches_the_scalar_path)
{
  enum { N = (1u << 20) + 7 };
  float *in = bs_malloc(N * sizeof(float));
  cr_assert_not_null(in);
  size_t n = 0;
  for (uint64_t u = 0; u <= 0xffffffffu && n < N; u += 4099) {
    uint32_t b = (uint32_t)u;
    memcpy(&in[n++], &b, 4);
  }
  check_narrow(in, n);
  /* around F16's rounding points: 1 + k * 2^-11 +- 1 ulp, subnormal ties,
   * the overflow threshold; BF16's: the low 16 bits 0x7fff, 0x8000, 0x8001 */
  n = 0;
  const uint32_t bases[] = {0x3f800000, 0x33000000, 0x33c00000, 0x387fc000, 0x477fe000,
                            0x477ff000, 0x7f7f0000, 0x00010000, 0x7f800000, 0xff800000};
  for (size_t k = 0; k < sizeof bases / sizeof bases[0]; k++)
    for (uint32_t d = 0; d < 0x10000 && n < N; d += 0x7ff) {
      const uint32_t around[] = {bases[k] + d - 1, bases[k] + d, bases[k] + d + 1,
                                 (bases[k] | 0x8000u) + d};
      for (int j = 0; j < 4; j++)
        memcpy(&in[n++], &around[j], 4);
    }
  check_narrow(in, n);
  /* through bs_encode: the vector part and the scalar tail agree */
  uint8_t out[2 * 37];
  for (int dt = 0; dt < 2; dt++) {
    enum bs_dtype t = dt ? BS_DT_BF16 : BS_DT_F16;
    bs_encode(t, in, 37, out);
    for (int i = 0; i < 37; i++) {
      uint16_t got = (uint16_t)(out[2 * i] | out[2 * i + 1] << 8);
      cr_assert_eq(got, dt ? bs_f32_to_bf16(in[i]) : bs_f32_to_f16(in[i]), "%s [%d]",
                   bs_dtype_name(t), i);
    }
  }
  bs_free(in);
}
