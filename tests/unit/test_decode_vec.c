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
  /* SSE2 is always there; F16C on every x86-64 CPU since 2013 (if the
   * machine has none, bs_decode below still checks the scalar path). */
  if (dt == BS_DT_BF16 || __builtin_cpu_supports("f16c"))
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
