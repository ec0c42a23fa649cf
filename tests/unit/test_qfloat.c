/* Burn's QFloat under as=F32, on hand-built CBOR schemes and bytes: Q8S,
 * Native store, symmetric, one per-tensor scale (F32, F16, BF16; the
 * current 5-entry scheme map and the v0.20-0.21 one) decode to q * scale;
 * any other scheme, or a length that is not values + scale, stays as
 * stored with a note. */
#include <criterion/criterion.h>
#include <string.h>

#include "bs_test.h"
#include "burnstore/catalog.h"
#include "core/alloc.h"
#include "core/qfloat.h"

static bs_err err;

/* CBOR text of up to 23 bytes */
static size_t text(uint8_t *p, const char *s)
{
  size_t n = strlen(s);
  p[0] = (uint8_t)(0x60 + n);
  memcpy(p + 1, s, n);
  return n + 1;
}

/* {"QFloat": {value, store, mode, tensor, block: null}} (current), or with
 * old: {value, param, store, level: "Tensor", mode} */
static size_t scheme(uint8_t *p, const char *value, const char *store, const char *scale, bool old,
                     bool block)
{
  size_t n = 0;
  p[n++] = 0xa1;
  n += text(p + n, "QFloat");
  p[n++] = 0xa5;
  n += text(p + n, "value");
  n += text(p + n, value);
  if (old) {
    n += text(p + n, "param");
    n += text(p + n, scale);
  }
  n += text(p + n, "store");
  n += text(p + n, store);
  if (old) {
    n += text(p + n, "level");
    n += text(p + n, "Tensor");
  }
  n += text(p + n, "mode");
  n += text(p + n, "Symmetric");
  if (!old) {
    n += text(p + n, "tensor");
    n += text(p + n, scale);
    n += text(p + n, "block");
    if (block) { /* {"size": ..., "dtype": "F32"}: any map stands for a block scheme */
      p[n++] = 0xa1;
      n += text(p + n, "dtype");
      n += text(p + n, "F32");
    } else {
      p[n++] = 0xf6;
    }
  }
  return n;
}

Test(qfloat, schemes)
{
  uint8_t b[128];
  cr_expect_eq(bs_qfloat_q8s_scale(b, scheme(b, "Q8S", "Native", "F32", false, false)), BS_DT_F32);
  cr_expect_eq(bs_qfloat_q8s_scale(b, scheme(b, "Q8S", "Native", "BF16", false, false)),
               BS_DT_BF16);
  cr_expect_eq(bs_qfloat_q8s_scale(b, scheme(b, "Q8S", "Native", "F16", true, false)), BS_DT_F16);
  cr_expect_eq(bs_qfloat_q8s_scale(b, scheme(b, "Q4S", "Native", "F32", false, false)),
               BS_DT_COUNT);
  cr_expect_eq(bs_qfloat_q8s_scale(b, scheme(b, "Q8S", "PackedU32", "F32", false, false)),
               BS_DT_COUNT);
  cr_expect_eq(bs_qfloat_q8s_scale(b, scheme(b, "Q8S", "Native", "UE8M0", false, false)),
               BS_DT_COUNT);
  cr_expect_eq(bs_qfloat_q8s_scale(b, scheme(b, "Q8S", "Native", "F32", false, true)), BS_DT_COUNT,
               "a block scheme");
  size_t n = scheme(b, "Q8S", "Native", "F32", false, false);
  for (size_t cut = 0; cut < n; cut++)
    cr_expect_eq(bs_qfloat_q8s_scale(b, cut), BS_DT_COUNT, "cut at %zu", cut);
  b[n] = 0;
  cr_expect_eq(bs_qfloat_q8s_scale(b, n + 1), BS_DT_COUNT, "trailing bytes");
  cr_expect_eq(bs_qfloat_q8s_scale(NULL, 0), BS_DT_COUNT);
}

static void add(struct bs_catalog *cat, const char *key, const uint8_t *raw, size_t rawlen,
                uint64_t numel, uint64_t off, uint64_t nbytes)
{
  struct bs_tensor *t = bs_catalog_add(cat, key, BS_DT_QFLOAT, 1, (uint64_t[]){numel}, 0, &err);
  cr_assert_not_null(t);
  t->off = off;
  t->nbytes = nbytes;
  t->dtype_raw = bs_malloc(rawlen);
  memcpy(t->dtype_raw, raw, rawlen);
  t->dtype_raw_len = rawlen;
}

Test(qfloat, decoded_as_f32)
{
  /* "a": 8 values, F32 scale 0.5; "h": 4 values, F16 scale 0.25 (0x3400);
   * "odd": 3 values (padding unclear): kept; "q4": a Q4S scheme: kept */
  uint8_t st[8 + 4 + 4 + 2 + 3 + 4];
  const int8_t qa[8] = {-128, -1, 0, 1, 2, 3, 127, 64};
  memcpy(st, qa, 8);
  const uint8_t half[4] = {0x00, 0x00, 0x00, 0x3f};
  memcpy(st + 8, half, 4);
  const int8_t qh[4] = {4, -4, 100, -100};
  memcpy(st + 12, qh, 4);
  st[16] = 0x00;
  st[17] = 0x34;
  memset(st + 18, 1, 7);
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, st, sizeof st);
  bs_err_clear(&err);
  uint8_t b[128];
  size_t n = scheme(b, "Q8S", "Native", "F32", false, false);
  add(&cat, "a", b, n, 8, 0, 12);
  n = scheme(b, "Q8S", "Native", "F16", false, false);
  add(&cat, "h", b, n, 4, 12, 6);
  n = scheme(b, "Q8S", "Native", "F32", false, false);
  add(&cat, "odd", b, n, 3, 18, 7);
  n = scheme(b, "Q4S", "Native", "F32", false, false);
  add(&cat, "q4", b, n, 8, 0, 12);
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &err), 0, "%s", err.msg);
  const struct bs_tensor *ta = &cat.tensors[0], *th = &cat.tensors[1];
  cr_assert(ta->decoded && ta->dtype == BS_DT_F32 && ta->nbytes == 32);
  cr_assert(th->decoded && th->nbytes == 16);
  cr_assert(!cat.tensors[2].decoded && cat.tensors[2].dtype == BS_DT_QFLOAT);
  cr_assert(!cat.tensors[3].decoded);
  cr_assert(!bs_tensor_decodable(&cat.tensors[2]) && !bs_tensor_decodable(&cat.tensors[3]));
  cr_assert_str_eq(cat.notes, "as=F32: 2 QFLOAT tensors shown as stored (no decoder for QFLOAT)\n");
  float got[8], want[8];
  cr_assert_eq(bs_tensor_read(&cat, ta, 0, got, 32), 32);
  for (int i = 0; i < 8; i++)
    want[i] = (float)qa[i] * 0.5f;
  cr_assert_arr_eq(got, want, 32);
  cr_assert_eq(bs_tensor_read(&cat, th, 4, got, 12), 12);
  for (int i = 1; i < 4; i++)
    cr_expect_eq(got[i - 1], (float)qh[i] * 0.25f, "[%d]", i);
  bs_catalog_destroy(&cat);
}

/* A strided view of a QFloat tensor (only a staging INDEX can say one):
 * its scale lies after the values, not at a position of the view, and the
 * gather wrapped round to the first values' bytes for it. Kept as stored. */
Test(qfloat, a_strided_one_is_kept)
{
  uint8_t st[8 + 4] = {1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x00, 0x00, 0x3f};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, st, sizeof st);
  bs_err_clear(&err);
  uint8_t b[128];
  size_t n = scheme(b, "Q8S", "Native", "F32", false, false);
  add(&cat, "v", b, n, 8, 0, 12);
  struct bs_tensor *t = &cat.tensors[0];
  t->strides = bs_malloc(sizeof *t->strides);
  t->strides[0] = 1;
  t->storage_off = 0;
  t->storage_bytes = 12;
  cr_assert(!bs_tensor_decodable(t));
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &err), 0, "%s", err.msg);
  cr_assert(!t->decoded && t->dtype == BS_DT_QFLOAT);
  bs_catalog_destroy(&cat);
}
