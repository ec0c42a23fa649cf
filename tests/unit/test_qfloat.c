/* Burn's QFloat under as=F32, on hand-built CBOR schemes and bytes laid
 * out as burn-std's QuantizedBytes lays them out (values: an i8 or float
 * code a byte, or u32 words along the innermost dimension, low bits first,
 * rows padded to whole words; then the scales, row-major over the block
 * grid), the expected floats computed here from that description: the
 * integer and float values, per-tensor and block scales of every scale
 * dtype, both packings; any other scheme, or a length that is not values +
 * scales, stays as stored with a note. */
#include <criterion/criterion.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/catalog.h"
#include "core/decode.h"
#include "core/qfloat.h"
#include "formats/formats.h"
#include "policy/decode_as.h"

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

/* The current 5-entry map with a free store and levels: store_cbor and
 * tensor_cbor / block_cbor are raw CBOR (NULL: null). */
static size_t scheme2(uint8_t *p, const char *value, const uint8_t *store, size_t store_len,
                      const char *mode, const char *tensor, const uint8_t *block, size_t block_len)
{
  size_t n = 0;
  p[n++] = 0xa1;
  n += text(p + n, "QFloat");
  p[n++] = 0xa5;
  n += text(p + n, "value");
  n += text(p + n, value);
  n += text(p + n, "store");
  memcpy(p + n, store, store_len);
  n += store_len;
  n += text(p + n, "mode");
  n += text(p + n, mode);
  n += text(p + n, "tensor");
  if (tensor)
    n += text(p + n, tensor);
  else
    p[n++] = 0xf6;
  n += text(p + n, "block");
  if (block) {
    memcpy(p + n, block, block_len);
    n += block_len;
  } else {
    p[n++] = 0xf6;
  }
  return n;
}

static const uint8_t NATIVE[] = {0x66, 'N', 'a', 't', 'i', 'v', 'e'};
/* {"PackedU32": 0} and {"PackedU32": 1} */
static const uint8_t PACKED0[] = {0xa1, 0x69, 'P', 'a', 'c', 'k', 'e', 'd', 'U', '3', '2', 0x00};
static const uint8_t PACKED1[] = {0xa1, 0x69, 'P', 'a', 'c', 'k', 'e', 'd', 'U', '3', '2', 0x01};

/* {"size": {"storage": [d0..d4], "len": len}, "dtype": dt} */
static size_t block(uint8_t *p, const uint8_t dims[5], unsigned len, const char *dt)
{
  size_t n = 0;
  p[n++] = 0xa2;
  n += text(p + n, "size");
  p[n++] = 0xa2;
  n += text(p + n, "storage");
  p[n++] = 0x85;
  for (int i = 0; i < 5; i++) {
    if (dims[i] < 24) {
      p[n++] = dims[i];
    } else {
      p[n++] = 0x18;
      p[n++] = dims[i];
    }
  }
  n += text(p + n, "len");
  p[n++] = (uint8_t)len;
  n += text(p + n, "dtype");
  n += text(p + n, dt);
  return n;
}

static bool ok(const uint8_t *raw, size_t len, uint32_t rank, const uint64_t *shape,
               uint64_t nbytes, struct bs_qfloat *q)
{
  const char *why = NULL;
  bool r = bs_qfloat_layout(raw, len, rank, shape, nbytes, q, &why);
  cr_assert(r || why);
  return r;
}

/* v0.20-0.21: {value, param, store, level: {"Block": BlockSize}, mode} */
static size_t old_block(uint8_t *p, const uint8_t dims[5], unsigned len)
{
  size_t n = 0;
  p[n++] = 0xa1;
  n += text(p + n, "QFloat");
  p[n++] = 0xa5;
  n += text(p + n, "value");
  n += text(p + n, "Q8S");
  n += text(p + n, "param");
  n += text(p + n, "F32");
  n += text(p + n, "store");
  n += text(p + n, "Native");
  n += text(p + n, "level");
  p[n++] = 0xa1;
  n += text(p + n, "Block");
  p[n++] = 0xa2;
  n += text(p + n, "storage");
  p[n++] = 0x85;
  for (int i = 0; i < 5; i++)
    p[n++] = dims[i];
  n += text(p + n, "len");
  p[n++] = (uint8_t)len;
  n += text(p + n, "mode");
  n += text(p + n, "Symmetric");
  return n;
}

Test(qfloat, old_blocks_along_the_last_dimension_only)
{
  uint8_t b[160];
  struct bs_qfloat q;
  const uint64_t s48[2] = {4, 8};
  const char *why = NULL;
  size_t n = old_block(b, (const uint8_t[5]){4, 1, 1, 1, 1}, 1);
  cr_expect(bs_qfloat_layout(b, n, 2, s48, 32 + 8 * 4, &q, &why), "%s", why);
  cr_expect(q.nscales == 8 && q.block[0] == 1 && q.block[1] == 4);
  n = old_block(b, (const uint8_t[5]){2, 4, 1, 1, 1}, 2);
  cr_expect(!bs_qfloat_layout(b, n, 2, s48, 32 + 4 * 4, &q, &why));
  cr_expect(strstr(why, "last dimension") != NULL, "%s", why);
}

Test(qfloat, schemes)
{
  uint8_t b[160], blk[64];
  struct bs_qfloat q;
  const uint64_t s8[1] = {8}, s33[2] = {3, 3}, s25[2] = {2, 5};
  cr_expect(ok(b, scheme(b, "Q8S", "Native", "F32", false, false), 1, s8, 12, &q));
  cr_expect(q.layout == BS_QF_BYTES && q.scale_dt == BS_DT_F32 && q.nscales == 1);
  cr_expect(ok(b, scheme(b, "Q8S", "Native", "BF16", true, false), 1, s8, 10, &q), "v0.20-0.21");
  cr_expect(!ok(b, scheme(b, "Q8S", "Native", "F32", false, false), 1, s8, 13, &q), "a byte more");
  /* Q4S Native: an i8 a value (QuantizedBytes' Bytes layout) */
  cr_expect(ok(b, scheme(b, "Q4S", "Native", "F32", false, false), 1, s8, 12, &q));
  cr_expect(ok(b, scheme(b, "Q8S", "Native", "UE8M0", false, false), 1, s8, 9, &q));
  cr_expect(q.scale_dt == BS_DT_F8_E8M0);
  /* no level at all: per tensor, F32 (QuantScheme::tensor_scale) */
  cr_expect(
      ok(b, scheme2(b, "Q8F", NATIVE, sizeof NATIVE, "Symmetric", NULL, NULL, 0), 1, s8, 12, &q));
  /* packed: [3, 3] Q4: rows padded, 3 words (flattened would be 2) */
  size_t n = scheme2(b, "Q4S", PACKED0, sizeof PACKED0, "Symmetric", "F32", NULL, 0);
  cr_expect(ok(b, n, 2, s33, 12 + 4, &q) && q.layout == BS_QF_ROWS && q.words_per_row == 1);
  cr_expect(ok(b, n, 2, s33, 8 + 4, &q) && q.layout == BS_QF_FLAT, "older burn: flattened");
  cr_expect(!ok(b, n, 2, s25, 8 + 4, &q), "[2, 5]: 2 words either way, packed differently");
  cr_expect(!ok(b, scheme2(b, "Q4S", PACKED1, sizeof PACKED1, "Symmetric", "F32", NULL, 0), 2, s33,
                16, &q),
            "packed along an outer dimension");
  cr_expect(!ok(b, scheme2(b, "E2M1", NATIVE, sizeof NATIVE, "Symmetric", "F32", NULL, 0), 1, s8,
                12, &q));
  cr_expect(
      !ok(b, scheme2(b, "Q8S", NATIVE, sizeof NATIVE, "Lookup", "F32", NULL, 0), 1, s8, 12, &q));
  cr_expect(!ok(b, scheme2(b, "E4M3", PACKED0, sizeof PACKED0, "Symmetric", "F32", NULL, 0), 1, s8,
                12, &q),
            "float codes in u32 words");
  /* blocks: [32] of F16 over [2, 64] is a grid [2, 2]; two-level refused */
  const uint64_t s264[2] = {2, 64};
  size_t bl = block(blk, (const uint8_t[5]){32, 1, 1, 1, 1}, 1, "F16");
  cr_expect(ok(b, scheme2(b, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl), 2, s264,
               128 + 8, &q));
  cr_expect(q.nscales == 4 && q.block[0] == 1 && q.block[1] == 32 && q.grid[1] == 2);
  cr_expect(!ok(b, scheme2(b, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", "F32", blk, bl), 2, s264,
                128 + 8 + 4, &q),
            "two-level");
  const uint64_t s270[2] = {2, 70};
  cr_expect(!ok(b, scheme2(b, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl), 2, s270,
                140 + 12, &q),
            "a partial block");
  bl = block(blk, (const uint8_t[5]){0, 1, 1, 1, 1}, 1, "F16");
  cr_expect(!ok(b, scheme2(b, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl), 2, s264,
                128 + 8, &q),
            "a block of 0");
  bl = block(blk, (const uint8_t[5]){32, 1, 1, 1, 1}, 6, "F16");
  cr_expect(!ok(b, scheme2(b, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl), 2, s264,
                128 + 8, &q),
            "len 6 of 5 dims");
  bl = block(blk, (const uint8_t[5]){32, 1, 1, 1, 1}, 1, "F64");
  cr_expect(!ok(b, scheme2(b, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl), 2, s264,
                128 + 16, &q),
            "an unknown scale dtype");
  n = scheme(b, "Q8S", "Native", "F32", false, false);
  for (size_t cut = 0; cut < n; cut++)
    cr_expect(!ok(b, cut, 1, s8, 12, &q), "cut at %zu", cut);
  cr_expect(!ok(b, n + 1, 1, s8, 12, &q), "trailing bytes");
  cr_expect(!ok(NULL, 0, 1, s8, 12, &q));
}

static void add(struct bs_catalog *cat, const char *key, const uint8_t *raw, size_t rawlen,
                uint64_t numel, uint64_t off, uint64_t nbytes)
{
  struct bs_tensor *t = bs_catalog_add(cat, key, BS_DT_QFLOAT, 1, (uint64_t[]){numel}, 0, &err);
  cr_assert_not_null(t);
  t->off = off;
  t->nbytes = nbytes;
  cr_assert_not_null(bs_tensor_x(cat, t));
  t->x->dtype_raw = bs_malloc(rawlen);
  memcpy(t->x->dtype_raw, raw, rawlen);
  t->x->dtype_raw_len = rawlen;
}

Test(qfloat, decoded_as_f32)
{
  /* "a": 8 values, F32 scale 0.5; "h": 4 values, F16 scale 0.25 (0x3400);
   * "odd": 3 values (padding unclear): kept; "q4": Q4S, an i8 a value */
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
  cr_assert(cat.tensors[3].decoded);
  cr_assert(!bs_tensor_decodable(&cat.tensors[2]));
  cr_assert_str_eq(cat.notes, "as=F32: 1 QFLOAT tensor shown as stored (burnstore does not decode "
                              "this QFloat layout: values whose length needs padding before the "
                              "scales)\n");
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
  cr_assert_not_null(bs_tensor_x(&cat, t));
  t->x->strides = bs_malloc(sizeof *t->x->strides);
  t->x->strides[0] = 1;
  t->x->storage_off = 0;
  t->x->storage_bytes = 12;
  cr_assert(!bs_tensor_decodable(t));
  cr_assert_eq(bs_catalog_decode_as(&cat, BS_DT_F32, &err), 0, "%s", err.msg);
  cr_assert(!t->decoded && t->dtype == BS_DT_QFLOAT);
  bs_catalog_destroy(&cat);
}

static uint32_t fbits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float fl(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* A catalog of one tensor of `shape` over the bytes st (kept alive by the
 * caller), decoded as `as`. */
static void one(struct bs_catalog *cat, struct bs_src *s, const uint8_t *st, size_t len,
                const uint8_t *raw, size_t rawlen, uint32_t rank, const uint64_t *shape,
                enum bs_dtype as)
{
  uint32_t idx;
  bs_catalog_init(cat);
  bs_err_clear(&err);
  cr_assert_eq(bs_src_init_mem(s, st, len, "mem", &err), 0);
  cr_assert_eq(bs_catalog_add_src(cat, s, &idx, &err), 0);
  struct bs_tensor *t = bs_catalog_add(cat, "t", BS_DT_QFLOAT, rank, shape, 0, &err);
  cr_assert_not_null(t);
  t->nbytes = len;
  cr_assert_not_null(bs_tensor_x(cat, t));
  t->x->dtype_raw = bs_malloc(rawlen);
  memcpy(t->x->dtype_raw, raw, rawlen);
  t->x->dtype_raw_len = rawlen;
  cr_assert_eq(bs_catalog_decode_as(cat, as, &err), 0, "%s", err.msg);
  cr_assert(cat->tensors[0].decoded, "%s", cat->notes ? cat->notes : "");
}

/* Q4S packed along the innermost dimension of [3, 3]: each row is one u32
 * (values in bits 0-3, 4-7, 8-11, sign-extended), then an F32 scale. */
Test(qfloat, packed_q4_rows)
{
  const int8_t v[9] = {-8, 7, -1, 0, 3, -5, 6, -7, 1};
  uint8_t st[12 + 4], raw[128];
  for (int r = 0; r < 3; r++) {
    uint32_t w = 0;
    for (int k = 0; k < 3; k++)
      w |= (uint32_t)(v[3 * r + k] & 0xf) << (4 * k);
    w |= 0xfff000u; /* padding: never read as values */
    for (int i = 0; i < 4; i++)
      st[4 * r + i] = (uint8_t)(w >> (8 * i));
  }
  const float scale = 0.1f;
  memcpy(st + 12, &scale, 4);
  size_t n = scheme2(raw, "Q4S", PACKED0, sizeof PACKED0, "Symmetric", "F32", NULL, 0);
  struct bs_catalog cat;
  struct bs_src s;
  one(&cat, &s, st, sizeof st, raw, n, 2, (const uint64_t[]){3, 3}, BS_DT_F32);
  float got[9];
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 36), 36);
  for (int i = 0; i < 9; i++)
    cr_expect_eq(fbits(got[i]), fbits((float)v[i] * scale), "[%d] %g", i, got[i]);
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 14, got, 10), 10, "a range: from element 3");
  float w2;
  memcpy(&w2, (uint8_t *)got + 2, 4);
  cr_expect_eq(fbits(w2), fbits((float)v[4] * scale));
  bs_catalog_destroy(&cat);
}

/* Q2F in u32 words over the flattened [3, 3] (older burn): 16 values a
 * word, one word, then the F32 scale; read as BF16. */
Test(qfloat, packed_flat_q2)
{
  const int8_t v[9] = {-2, 1, 0, -1, 1, 1, -2, 0, -1};
  uint8_t st[8], raw[128];
  uint32_t w = 0;
  for (int k = 0; k < 9; k++)
    w |= (uint32_t)(v[k] & 3) << (2 * k);
  memset(st, 0, sizeof st);
  for (int i = 0; i < 4; i++)
    st[i] = (uint8_t)(w >> (8 * i));
  /* [3, 3] in rows would take 3 words, flattened 1: the length (4 + 4) picks flattened */
  const float scale = 3.0f;
  memcpy(st + 4, &scale, 4);
  size_t n = scheme2(raw, "Q2F", PACKED0, sizeof PACKED0, "Symmetric", "F32", NULL, 0);
  struct bs_catalog cat;
  struct bs_src s;
  one(&cat, &s, st, 8, raw, n, 2, (const uint64_t[]){3, 3}, BS_DT_BF16);
  uint16_t got[9];
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 18), 18);
  for (int i = 0; i < 9; i++) /* small integers times 3: exact in BF16 */
    cr_expect_eq(got[i], (uint16_t)(fbits((float)v[i] * scale) >> 16), "[%d]", i);
  bs_catalog_destroy(&cat);
}

/* Q8S a byte a value, [4, 8] in blocks [2, 4] with F16 scales: a grid
 * [2, 2], scales row-major; element (r, c) uses scale (r / 2) * 2 + c / 4. */
Test(qfloat, blocks_f16)
{
  uint8_t st[32 + 8], raw[160], blk[64];
  int8_t v[32];
  for (int i = 0; i < 32; i++)
    v[i] = (int8_t)(i * 9 - 127);
  memcpy(st, v, 32);
  const uint16_t h[4] = {0x3c00, 0x3800, 0x0001, 0xfc00}; /* 1, 0.5, 2^-24, -inf */
  const float hf[4] = {1.0f, 0.5f, 0x1p-24f, -INFINITY};
  for (int i = 0; i < 4; i++) {
    st[32 + 2 * i] = (uint8_t)h[i];
    st[33 + 2 * i] = (uint8_t)(h[i] >> 8);
  }
  size_t bl = block(blk, (const uint8_t[5]){2, 4, 1, 1, 1}, 2, "F16");
  size_t n = scheme2(raw, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl);
  struct bs_catalog cat;
  struct bs_src s;
  one(&cat, &s, st, sizeof st, raw, n, 2, (const uint64_t[]){4, 8}, BS_DT_F32);
  float got[32];
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 128), 128);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 8; c++) {
      float want = (float)v[8 * r + c] * hf[(r / 2) * 2 + c / 4];
      cr_expect_eq(fbits(got[8 * r + c]), fbits(want), "(%d, %d): %g", r, c, got[8 * r + c]);
    }
  bs_catalog_destroy(&cat);
}

/* E4M3 codes a byte a value, blocks of 4 along [8], UE8M0 scales: code 128
 * is 2, code 0 is 2^-127 (an F32 subnormal), 0xff NaN. */
Test(qfloat, e4m3_ue8m0)
{
  /* 0x38 = 1.0, 0x7e = 448, 0xb8 = -1.0, 0x01 = 2^-9, 0x7f = NaN, 0x00 = 0, 0x80 = -0, 0x40 = 2 */
  const uint8_t codes[8] = {0x38, 0x7e, 0xb8, 0x01, 0x7f, 0x00, 0x80, 0x40};
  const float vals[8] = {1.0f, 448.0f, -1.0f, 0x1p-9f, NAN, 0.0f, -0.0f, 2.0f};
  uint8_t st[8 + 2], raw[160], blk[64];
  memcpy(st, codes, 8);
  st[8] = 128;
  st[9] = 0;
  size_t bl = block(blk, (const uint8_t[5]){4, 1, 1, 1, 1}, 1, "UE8M0");
  size_t n = scheme2(raw, "E4M3", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl);
  struct bs_catalog cat;
  struct bs_src s;
  one(&cat, &s, st, sizeof st, raw, n, 1, (const uint64_t[]){8}, BS_DT_F32);
  float got[8];
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 32), 32);
  for (int i = 0; i < 8; i++) {
    float want = vals[i] * (i < 4 ? 2.0f : fl(0x00400000u));
    if (isnan(want))
      cr_expect(isnan(got[i]), "[%d]", i);
    else
      cr_expect_eq(fbits(got[i]), fbits(want), "[%d] %a vs %a", i, got[i], want);
  }
  bs_catalog_destroy(&cat);
}

/* Q4S packed in rows of [3, 20001] (rows padded to words), blocks [1, 3]
 * with F32 scales: 20001 scales (more than one window of them) and more
 * elements than a decode step. Every range, read as F16 from a byte that
 * may fall mid-element and mid-word, is the same bytes as that range of
 * the whole read, and the whole read is each value times its block's
 * scale. */
Test(qfloat, ranges_of_packed_blocks)
{
  enum { R = 3, C = 20001, WPR = (C + 7) / 8, NS = R * (C / 3) };
  const size_t vb = (size_t)R * WPR * 4, len = vb + (size_t)NS * 4;
  uint8_t *st = calloc(1, len), raw[256], blk[64];
  int8_t *v = malloc((size_t)R * C);
  uint32_t seed = 12345;
  for (size_t i = 0; i < (size_t)R * C; i++) {
    seed = seed * 1103515245u + 12345u;
    v[i] = (int8_t)((int)(seed >> 16) % 16 - 8);
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      size_t word = (size_t)r * WPR + (size_t)c / 8;
      uint32_t nib = (uint32_t)(v[(size_t)r * C + c] & 0xf) << (4 * (c % 8));
      st[4 * word + (size_t)(c % 8) / 2] |= (uint8_t)(nib >> (8 * ((c % 8) / 2)));
    }
  for (int i = 0; i < NS; i++) {
    float f = 0.5f + (float)(i % 7);
    memcpy(st + vb + 4 * (size_t)i, &f, 4);
  }
  size_t bl = block(blk, (const uint8_t[5]){1, 3, 1, 1, 1}, 2, "F32");
  size_t n = scheme2(raw, "Q4S", PACKED0, sizeof PACKED0, "Symmetric", NULL, blk, bl);
  struct bs_catalog cat;
  struct bs_src s;
  one(&cat, &s, st, len, raw, n, 2, (const uint64_t[]){R, C}, BS_DT_F16);
  const size_t total = (size_t)R * C * 2;
  uint8_t *all = malloc(total), *part = malloc(total);
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, all, total), (long)total);
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      size_t i = (size_t)r * C + c;
      float want = (float)v[i] * (0.5f + (float)((r * (C / 3) + c / 3) % 7));
      uint16_t h = (uint16_t)(all[2 * i] | all[2 * i + 1] << 8);
      cr_assert_eq(bs_f16_to_f32(h), want, "(%d, %d)", r, c);
    }
  for (int k = 0; k < 300; k++) {
    seed = seed * 1103515245u + 12345u;
    size_t off = (seed >> 3) % total;
    seed = seed * 1103515245u + 12345u;
    size_t m = 1 + (seed >> 3) % (k % 3 == 0 ? total - off : 41);
    if (m > total - off)
      m = total - off;
    cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], off, part, m), (long)m, "%zu+%zu", off, m);
    cr_assert(memcmp(part, all + off, m) == 0, "bytes %zu+%zu differ", off, m);
  }
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], total - 1, part, 5), 1);
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], total, part, 5), 0);
  bs_catalog_destroy(&cat);
  free(all);
  free(part);
  free(v);
  free(st);
}

/* A decoded QFloat tensor over one of bs_test_fault_catalog's sources. */
static const struct bs_tensor *on_fault(struct bs_catalog *cat, const uint8_t *st, size_t len,
                                        uint64_t bad0, const uint8_t *raw, size_t rawlen,
                                        uint32_t rank, const uint64_t *shape)
{
  bs_err_clear(&err);
  bs_test_fault_catalog(cat, st, len, bad0, bad0 + 1, false);
  struct bs_tensor *t = bs_test_add(cat, "t", BS_DT_QFLOAT, rank, shape, 0);
  t->nbytes = len;
  cr_assert_not_null(bs_tensor_x(cat, t));
  t->x->dtype_raw = bs_malloc(rawlen);
  memcpy(t->x->dtype_raw, raw, rawlen);
  t->x->dtype_raw_len = rawlen;
  cr_assert_eq(bs_catalog_decode_as(cat, BS_DT_F32, &err), 0, "%s", err.msg);
  cr_assert(cat->tensors[0].decoded, "%s", cat->notes ? cat->notes : "");
  return &cat->tensors[0];
}

/* A bad byte in the stored values or scales: a read that reaches it gives
 * the elements before it whose value bytes and scale it read (a short
 * read; the old code stopped at the last whole step of 8192 elements), a
 * read from an element it cannot decode fails with EIO. Q8S a byte a
 * value in blocks of 32 with F32 scales (1250 scales: two windows of
 * 1024), and Q4S in u32 words along rows of 16000 with one scale. */
Test(qfloat, a_read_failing_part_way_is_short)
{
  enum { N = 40000, NS = N / 32, C = 16000 };
  static uint8_t st[N + 4 * NS];
  static float got[N];
  uint8_t raw[160], blk[64];
  for (int i = 0; i < N; i++)
    st[i] = (uint8_t)(i * 7);
  for (int b = 0; b < NS; b++) {
    float f = ldexpf(1.0f, b % 5 - 2);
    memcpy(st + N + 4 * b, &f, 4);
  }
  size_t bl = block(blk, (const uint8_t[5]){32, 1, 1, 1, 1}, 1, "F32");
  size_t rl = scheme2(raw, "Q8S", NATIVE, sizeof NATIVE, "Symmetric", NULL, blk, bl);
  struct bs_catalog cat;
  /* a bad value byte: elements 0..30000 */
  const struct bs_tensor *t = on_fault(&cat, st, sizeof st, 30001, raw, rl, 1, (uint64_t[]){N});
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, 4 * N), 4 * 30001);
  for (int i = 0; i <= 30000; i++)
    cr_assert_eq(fbits(got[i]), fbits((float)(int8_t)st[i] * ldexpf(1.0f, i / 32 % 5 - 2)), "[%d]",
                 i);
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 30001, got, 8), -EIO);
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 30002, got, 4 * N), 4 * (N - 30002), "after it");
  cr_assert_eq(fbits(got[0]), fbits((float)(int8_t)st[30002] * ldexpf(1.0f, 30002 / 32 % 5 - 2)));
  bs_catalog_destroy(&cat);
  /* a bad scale (1100, in the second window): the elements of the first window */
  t = on_fault(&cat, st, sizeof st, N + 4 * 1100, raw, rl, 1, (uint64_t[]){N});
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, 4 * N), 4 * 32768);
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 32768, got, 8), -EIO);
  bs_catalog_destroy(&cat);

  /* Q4S packed along rows of C: 8 values a word, 2000 words a row; a bad
   * byte inside word 1250 leaves the 10000 elements of words 0..1249 */
  static uint8_t pk[2 * C / 2 + 4];
  for (size_t i = 0; i < 2 * C / 2; i++)
    pk[i] = (uint8_t)(i * 37 + 11);
  const float scale = 0.25f;
  memcpy(pk + C, &scale, 4);
  rl = scheme2(raw, "Q4S", PACKED0, sizeof PACKED0, "Symmetric", "F32", NULL, 0);
  t = on_fault(&cat, pk, sizeof pk, 4 * 1250 + 1, raw, rl, 2, (uint64_t[]){2, C});
  cr_assert_eq(bs_tensor_read(&cat, t, 2, got, 4 * 2 * C), 4 * 10000 - 2);
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, 4 * 2 * C), 4 * 10000);
  for (int i = 0; i < 10000; i++) { /* nibble i % 8 of word i / 8, sign-extended */
    int nib = pk[i / 2] >> (4 * (i % 2)) & 0xf;
    cr_assert_eq(got[i], (float)(nib >= 8 ? nib - 16 : nib) * scale, "[%d]", i);
  }
  cr_assert_eq(bs_tensor_read(&cat, t, 4 * 10000, got, 8), -EIO);
  bs_catalog_destroy(&cat);
}

/* The scheme's CBOR is parsed once, by bs_catalog_decode_as, and the
 * layout kept in the tensor's dtype_raw: a read parses nothing (it
 * parsed the CBOR again on every read, a FUSE request each 128 KiB). */
Test(qfloat, the_scheme_is_parsed_once)
{
  uint8_t st[8 + 4] = {1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x00, 0x00, 0x3f}, raw[128];
  size_t rl = scheme(raw, "Q8S", "Native", "F32", false, false);
  struct bs_catalog cat;
  struct bs_src s;
  one(&cat, &s, st, sizeof st, raw, rl, 1, (const uint64_t[]){8}, BS_DT_F32);
  const struct bs_tensor *t = &cat.tensors[0];
  cr_assert_eq(t->x->dtype_raw_len, sizeof(struct bs_qfloat));
  struct bs_qfloat want;
  cr_assert(bs_qfloat_layout(raw, rl, 1, (const uint64_t[]){8}, sizeof st, &want, NULL));
  const struct bs_qfloat *kept = (const struct bs_qfloat *)(const void *)t->x->dtype_raw;
  cr_assert(kept->layout == want.layout && kept->scale_dt == want.scale_dt &&
            kept->numel == want.numel && kept->value_bytes == want.value_bytes &&
            kept->nscales == want.nscales);
  float got[8];
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, 32), 32);
  for (int i = 0; i < 8; i++)
    cr_expect_eq(got[i], (float)(i + 1) * 0.5f);
  bs_catalog_destroy(&cat);
}

/* Tags are looked through without keeping a reference: qfloat.c's own
 * untag took two per tag and gave one back, so every tagged text of a
 * file's scheme leaked its item (the shared bs_cbor_untag now, as the
 * Burnpack reader's did). A leak shows as heap that parsing the scheme
 * 2000 times leaves behind (and to LeakSanitizer). */
Test(qfloat, tagged_schemes_are_read_and_leak_nothing)
{
  /* {"QFloat": {"value": 21("Q8S"), "store": 22("Native"), "mode": "Symmetric",
   *             "tensor": 23(32("F32")), "block": null}} (tags libcbor 0.8 loads) */
  uint8_t b[128];
  size_t n = 0;
  b[n++] = 0xa1;
  n += text(b + n, "QFloat");
  b[n++] = 0xa5;
  n += text(b + n, "value");
  b[n++] = 0xd5;
  n += text(b + n, "Q8S");
  n += text(b + n, "store");
  b[n++] = 0xd6;
  n += text(b + n, "Native");
  n += text(b + n, "mode");
  n += text(b + n, "Symmetric");
  n += text(b + n, "tensor");
  b[n++] = 0xd7;
  b[n++] = 0xd8;
  b[n++] = 0x20;
  n += text(b + n, "F32");
  n += text(b + n, "block");
  b[n++] = 0xf6;
  struct bs_qfloat q;
  const uint64_t s8[1] = {8};
  cr_assert(ok(b, n, 1, s8, 12, &q), "tags are looked through");
  cr_assert(q.layout == BS_QF_BYTES && q.scale_dt == BS_DT_F32 && q.nscales == 1);
  struct mallinfo2 before = mallinfo2();
  for (int i = 0; i < 2000; i++)
    cr_assert(ok(b, n, 1, s8, 12, &q));
  struct mallinfo2 after = mallinfo2();
  cr_assert(after.uordblks < before.uordblks + 4096,
            "parsing a tagged scheme 2000 times keeps %zu bytes", after.uordblks - before.uordblks);
}
