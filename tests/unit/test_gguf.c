/* GGUF reader and writer on in-memory files built here from the spec
 * (ggml docs/gguf.md): every metadata type, nested arrays, float and
 * quantized tensors, alignment; hostile headers; the writer's round trip
 * and typed write-back of changed metadata. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "formats/burnpack_write.h"
#include "formats/formats.h"
#include "formats/gguf_private.h"
#include "formats/safetensors_write.h"
#include "formats/writers.h"

/* ---- A GGUF builder --------------------------------------------------------------------- */

struct gb {
  uint8_t d[1 << 16];
  size_t n;
};

static void raw(struct gb *b, const void *p, size_t n)
{
  cr_assert_leq(b->n + n, sizeof b->d);
  memcpy(b->d + b->n, p, n);
  b->n += n;
}
static void u8(struct gb *b, uint8_t v)
{
  raw(b, &v, 1);
}
static void u16(struct gb *b, uint16_t v)
{
  uint8_t x[2];
  bs_put_le16(x, v);
  raw(b, x, 2);
}
static void u32(struct gb *b, uint32_t v)
{
  uint8_t x[4];
  bs_put_le32(x, v);
  raw(b, x, 4);
}
static void u64(struct gb *b, uint64_t v)
{
  uint8_t x[8];
  bs_put_le64(x, v);
  raw(b, x, 8);
}
static void str(struct gb *b, const char *s)
{
  u64(b, strlen(s));
  raw(b, s, strlen(s));
}
static void f32(struct gb *b, float f)
{
  uint32_t u;
  memcpy(&u, &f, 4);
  u32(b, u);
}
static void f64(struct gb *b, double f)
{
  uint64_t u;
  memcpy(&u, &f, 8);
  u64(b, u);
}
static void head(struct gb *b, uint32_t version, uint64_t nt, uint64_t nkv)
{
  b->n = 0;
  raw(b, "GGUF", 4);
  u32(b, version);
  u64(b, nt);
  u64(b, nkv);
}
static void key(struct gb *b, const char *k, uint32_t type)
{
  str(b, k);
  u32(b, type);
}
static void tinfo(struct gb *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type,
                  uint64_t off)
{
  str(b, name);
  u32(b, nd);
  for (uint32_t i = 0; i < nd; i++)
    u64(b, ne[i]);
  u32(b, type);
  u64(b, off);
}
static void pad(struct gb *b, size_t align)
{
  while (b->n % align)
    u8(b, 0);
}

/* The reference file: every metadata type, four tensors (F32 [2,3], F16
 * [4], Q8_0 [2,32], Q4_0 [64]) packed and padded as ggml writes them. */
static size_t data_at;
static void build_ref(struct gb *b)
{
  head(b, 3, 4, 19);
  key(b, "general.architecture", BS_GG_STRING), str(b, "llama");
  key(b, "general.name", BS_GG_STRING), str(b, "tiny \"model\"");
  key(b, "k.u8", BS_GG_U8), u8(b, 200);
  key(b, "k.i8", BS_GG_I8), u8(b, (uint8_t)-5);
  key(b, "k.u16", BS_GG_U16), u16(b, 65535);
  key(b, "k.i16", BS_GG_I16), u16(b, (uint16_t)-300);
  key(b, "k.u32", BS_GG_U32), u32(b, 4000000000u);
  key(b, "k.i32", BS_GG_I32), u32(b, (uint32_t)-7);
  key(b, "k.f32", BS_GG_F32), f32(b, 0.1f);
  key(b, "k.bool", BS_GG_BOOL), u8(b, 1);
  key(b, "k.u64", BS_GG_U64), u64(b, UINT64_MAX);
  key(b, "k.i64", BS_GG_I64), u64(b, (uint64_t)INT64_MIN);
  key(b, "k.f64", BS_GG_F64), f64(b, -2.5);
  key(b, "k.arr_i32", BS_GG_ARRAY), u32(b, BS_GG_I32), u64(b, 3), u32(b, 1), u32(b, (uint32_t)-2),
      u32(b, 3);
  key(b, "k.arr_str", BS_GG_ARRAY), u32(b, BS_GG_STRING), u64(b, 2), str(b, "a\"b"), str(b, "c\n");
  key(b, "k.arr_bool", BS_GG_ARRAY), u32(b, BS_GG_BOOL), u64(b, 2), u8(b, 0), u8(b, 1);
  key(b, "k.arr_f32", BS_GG_ARRAY), u32(b, BS_GG_F32), u64(b, 2), f32(b, 1.5f), f32(b, NAN);
  key(b, "k.nested", BS_GG_ARRAY), u32(b, BS_GG_ARRAY), u64(b, 2), u32(b, BS_GG_U16), u64(b, 2),
      u16(b, 1), u16(b, 2), u32(b, BS_GG_U16), u64(b, 0);
  key(b, "k.empty", BS_GG_ARRAY), u32(b, BS_GG_U64), u64(b, 0);
  tinfo(b, "blk.0.w", 2, (uint64_t[]){3, 2}, 0, 0);    /* 24 bytes */
  tinfo(b, "blk.0.h", 1, (uint64_t[]){4}, 1, 32);      /* 8 bytes */
  tinfo(b, "blk.0.q8", 2, (uint64_t[]){32, 2}, 8, 64); /* 68 bytes */
  tinfo(b, "blk.0.q4", 1, (uint64_t[]){64}, 2, 160);   /* 36 bytes */
  pad(b, 32);
  data_at = b->n;
  for (int i = 0; i < 6; i++)
    f32(b, (float)i);
  pad(b, 32);
  for (int i = 0; i < 4; i++)
    u16(b, (uint16_t)(0x3c00 + i));
  pad(b, 32);
  for (int i = 0; i < 68; i++)
    u8(b, (uint8_t)i);
  pad(b, 32);
  for (int i = 0; i < 36; i++)
    u8(b, (uint8_t)(100 + i));
  pad(b, 32);
}

static int open_mem(struct bs_catalog *cat, const void *buf, size_t n, bs_err *err)
{
  struct bs_src s;
  bs_catalog_init(cat);
  bs_err_clear(err);
  if (bs_src_init_mem(&s, buf, n, "mem", err) != 0)
    return -1; /* out of memory (the allocation test) */
  return bs_open_any(cat, &s, NULL, err);
}

/* The text of metadata k (made from the file: the catalog keeps a GGUF
 * value where it is), or NULL; valid for the next 7 calls. */
static const char *meta(const struct bs_catalog *cat, const char *k)
{
  static char texts[8][8192];
  static unsigned next;
  for (size_t i = 0; i < cat->nmeta; i++) {
    if (strcmp(cat->meta[i].key, k) != 0)
      continue;
    struct bs_buf b = {0};
    bool cut;
    bs_err e;
    bs_err_clear(&e);
    cr_assert_eq(bs_meta_text(cat, &cat->meta[i], sizeof texts[0] - 1, &b, &cut, &e), 0, "%s",
                 e.msg);
    cr_assert(!cut && bs_kv_text_len(&cat->meta[i]) == b.len, "%s: %zu bytes of text", k, b.len);
    char *t = texts[next++ % 8];
    memcpy(t, b.data ? (const char *)b.data : "", b.len);
    t[b.len] = '\0';
    bs_buf_destroy(&b);
    return t;
  }
  return NULL;
}

static const struct bs_tensor *tensor(const struct bs_catalog *cat, const char *k)
{
  long i = bs_catalog_find(cat, k);
  cr_assert_geq(i, 0, "no tensor %s", k);
  return &cat->tensors[i];
}

static struct gb B;

Test(gguf, reads_every_metadata_type_and_tensor)
{
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_expect_eq(cat.format, BS_FMT_GGUF);
  cr_expect_eq(cat.nmeta, 19);
  cr_expect_str_eq(cat.meta[0].key, "general.architecture"); /* file order */
  cr_expect_str_eq(meta(&cat, "general.name"), "tiny \"model\"");
  cr_expect_str_eq(meta(&cat, "k.u8"), "200");
  cr_expect_str_eq(meta(&cat, "k.i8"), "-5");
  cr_expect_str_eq(meta(&cat, "k.u16"), "65535");
  cr_expect_str_eq(meta(&cat, "k.i16"), "-300");
  cr_expect_str_eq(meta(&cat, "k.u32"), "4000000000");
  cr_expect_str_eq(meta(&cat, "k.i32"), "-7");
  cr_expect_str_eq(meta(&cat, "k.f32"), "0.100000001");
  cr_expect_str_eq(meta(&cat, "k.bool"), "true");
  cr_expect_str_eq(meta(&cat, "k.u64"), "18446744073709551615");
  cr_expect_str_eq(meta(&cat, "k.i64"), "-9223372036854775808");
  cr_expect_str_eq(meta(&cat, "k.f64"), "-2.5");
  cr_expect_str_eq(meta(&cat, "k.arr_i32"), "[1,-2,3]");
  cr_expect_str_eq(meta(&cat, "k.arr_str"), "[\"a\\\"b\",\"c\\n\"]");
  cr_expect_str_eq(meta(&cat, "k.arr_bool"), "[false,true]");
  cr_expect_str_eq(meta(&cat, "k.arr_f32"), "[1.5,NaN]");
  cr_expect_str_eq(meta(&cat, "k.nested"), "[[1,2],[]]");
  cr_expect_str_eq(meta(&cat, "k.empty"), "[]");
  cr_assert_eq(cat.count, 4);
  const struct bs_tensor *w = tensor(&cat, "blk.0.w");
  cr_expect_eq(w->dtype, BS_DT_F32);
  cr_expect_eq(w->rank, 2);
  cr_expect_eq(w->shape[0], 2); /* ne [3,2] reversed */
  cr_expect_eq(w->shape[1], 3);
  cr_expect_eq(w->nbytes, 24);
  cr_expect_eq(w->off, data_at);
  float got[6];
  cr_assert_eq(bs_tensor_read(&cat, w, 0, got, 24), 24);
  cr_expect_eq(got[5], 5.0f);
  const struct bs_tensor *q8 = tensor(&cat, "blk.0.q8");
  cr_expect_eq(q8->dtype, BS_DT_Q8_0);
  cr_expect_str_eq(bs_dtype_name(q8->dtype), "Q8_0");
  cr_expect_eq(q8->shape[0], 2);
  cr_expect_eq(q8->shape[1], 32);
  cr_expect_eq(q8->nbytes, 68);
  cr_expect_eq(q8->off, data_at + 64);
  uint8_t b[68];
  cr_assert_eq(bs_tensor_read(&cat, q8, 0, b, 68), 68);
  cr_expect_eq(b[67], 67);
  const struct bs_tensor *q4 = tensor(&cat, "blk.0.q4");
  cr_expect_eq(q4->dtype, BS_DT_Q4_0);
  cr_expect_eq(q4->nbytes, 36);
  cr_expect_eq(tensor(&cat, "blk.0.h")->dtype, BS_DT_F16);
  bs_catalog_destroy(&cat);
}

Test(gguf, block_sizes_follow_the_ggml_table)
{
  static const struct {
    enum bs_dtype dt;
    uint32_t elems, bytes;
  } want[] = {
      {BS_DT_Q4_0, 32, 18},     {BS_DT_Q4_1, 32, 20},     {BS_DT_Q5_0, 32, 22},
      {BS_DT_Q5_1, 32, 24},     {BS_DT_Q8_0, 32, 34},     {BS_DT_Q8_1, 32, 36},
      {BS_DT_Q2_K, 256, 84},    {BS_DT_Q3_K, 256, 110},   {BS_DT_Q4_K, 256, 144},
      {BS_DT_Q5_K, 256, 176},   {BS_DT_Q6_K, 256, 210},   {BS_DT_Q8_K, 256, 292},
      {BS_DT_IQ2_XXS, 256, 66}, {BS_DT_IQ2_XS, 256, 74},  {BS_DT_IQ3_XXS, 256, 98},
      {BS_DT_IQ1_S, 256, 50},   {BS_DT_IQ4_NL, 32, 18},   {BS_DT_IQ3_S, 256, 110},
      {BS_DT_IQ2_S, 256, 82},   {BS_DT_IQ4_XS, 256, 136}, {BS_DT_IQ1_M, 256, 56},
      {BS_DT_TQ1_0, 256, 54},   {BS_DT_TQ2_0, 256, 66},   {BS_DT_MXFP4, 32, 17},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    uint32_t e, by;
    cr_assert(bs_dtype_block(want[i].dt, &e, &by), "%s", bs_dtype_name(want[i].dt));
    cr_expect_eq(e, want[i].elems, "%s", bs_dtype_name(want[i].dt));
    cr_expect_eq(by, want[i].bytes, "%s", bs_dtype_name(want[i].dt));
    cr_expect_eq(bs_dtype_bits(want[i].dt), 0);
    enum bs_dtype back;
    cr_expect_eq(bs_dtype_from_name(bs_dtype_name(want[i].dt), &back), 0);
    cr_expect_eq(back, want[i].dt);
    uint32_t gt;
    enum bs_dtype rt;
    cr_assert(bs_gguf_type_of(want[i].dt, &gt));
    cr_expect_eq(bs_gguf_dtype(gt, &rt), 0);
    cr_expect_eq(rt, want[i].dt);
  }
  uint32_t e, by;
  cr_expect_not(bs_dtype_block(BS_DT_F32, &e, &by));
  enum bs_dtype dt;
  for (uint32_t gt = 4; gt <= 5; gt++)
    cr_expect_eq(bs_gguf_dtype(gt, &dt), -1, "Q4_2/Q4_3 were removed");
  for (uint32_t gt = 31; gt <= 33; gt++)
    cr_expect_eq(bs_gguf_dtype(gt, &dt), -1);
  for (uint32_t gt = 36; gt <= 38; gt++)
    cr_expect_eq(bs_gguf_dtype(gt, &dt), -1);
  cr_expect_eq(bs_gguf_dtype(40, &dt), -1);
  cr_expect_eq(bs_gguf_dtype(39, &dt), 0);
  cr_expect_eq(dt, BS_DT_MXFP4);
  cr_expect_eq(bs_gguf_dtype(30, &dt), 0);
  cr_expect_eq(dt, BS_DT_BF16);
  /* sizes: whole blocks along the fastest dimension, overflow checked */
  uint64_t n;
  bs_err err;
  bs_err_clear(&err);
  cr_expect_eq(bs_dtype_nbytes(BS_DT_Q4_K, 2, (uint64_t[]){3, 512}, &n, "k", 0, &err), 0);
  cr_expect_eq(n, 3 * 2 * 144);
  cr_expect_eq(bs_dtype_nbytes(BS_DT_Q4_K, 2, (uint64_t[]){512, 3}, &n, "k", 0, &err), -1);
  cr_expect_not_null(strstr(err.msg, "multiple of 256"), "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(bs_dtype_nbytes(BS_DT_Q8_0, 0, NULL, &n, "k", 0, &err), -1);
  bs_err_clear(&err);
  cr_expect_eq(
      bs_dtype_nbytes(BS_DT_Q8_0, 2, (uint64_t[]){1ull << 62, 1ull << 10}, &n, "k", 0, &err), -1);
}

Test(gguf, sniffed_before_pytorch)
{
  enum bs_sniff s = bs_gguf_sniff((const uint8_t *)"GGUF\x03\0\0\0", 8, 8);
  cr_expect_eq(s, BS_SNIFF_YES);
  cr_expect_eq(bs_gguf_sniff((const uint8_t *)"GGU", 3, 3), BS_SNIFF_NO);
  cr_expect_eq(bs_format_by_ext("x/m.GGUF"), BS_FMT_GGUF);
}

Test(gguf, alignment_from_metadata)
{
  head(&B, 2, 2, 1);
  key(&B, "general.alignment", BS_GG_U32), u32(&B, 64);
  tinfo(&B, "a", 1, (uint64_t[]){3}, 0, 0);
  tinfo(&B, "b", 1, (uint64_t[]){2}, 26, 64);
  pad(&B, 64);
  size_t d = B.n;
  for (int i = 0; i < 16; i++)
    u32(&B, 0);
  u32(&B, 7), u32(&B, 8);
  pad(&B, 64);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_expect_eq(tensor(&cat, "b")->off, d + 64);
  cr_expect_eq(tensor(&cat, "b")->dtype, BS_DT_I32);
  bs_catalog_destroy(&cat);
}

/* ---- Hostile files ------------------------------------------------------------------------- */

static void expect_fail(const char *what, int code, const char *sub)
{
  struct bs_catalog cat;
  bs_err err;
  int rc = open_mem(&cat, B.d, B.n, &err);
  cr_assert_eq(rc, -1, "%s: accepted", what);
  if (code)
    cr_expect_eq(err.code, code, "%s: code %d (%s)", what, err.code, err.msg);
  cr_expect_not_null(strstr(err.msg, sub), "%s: message '%s' lacks '%s'", what, err.msg, sub);
  cr_expect_eq(cat.count, 0);
  cr_expect_eq(cat.nmeta, 0);
  bs_catalog_destroy(&cat);
}

/* One F32 [4] tensor "t" at `off` with `extra` data bytes. */
static void one_tensor(uint64_t nt_claim, uint64_t off, size_t data)
{
  head(&B, 3, nt_claim, 0);
  tinfo(&B, "t", 1, (uint64_t[]){4}, 0, off);
  pad(&B, 32);
  for (size_t i = 0; i < data; i++)
    u8(&B, 1);
}

Test(gguf, hostile_headers)
{
  head(&B, 3, UINT64_MAX, 0);
  expect_fail("huge tensor count", EINVAL, "tensor count");
  head(&B, 3, 0, UINT64_MAX);
  expect_fail("huge kv count", EINVAL, "metadata count");
  head(&B, 3, 0, 1);
  str(&B, "k");
  u32(&B, BS_GG_STRING);
  u64(&B, 1ull << 40);
  expect_fail("string length", EINVAL, "string length");
  head(&B, 3, 0, 1);
  key(&B, "k", BS_GG_ARRAY), u32(&B, BS_GG_U64), u64(&B, 1ull << 60);
  expect_fail("array length", EINVAL, "does not fit");
  head(&B, 3, 0, 1);
  key(&B, "k", BS_GG_ARRAY);
  for (int i = 0; i < 20; i++)
    u32(&B, BS_GG_ARRAY), u64(&B, 1);
  u32(&B, BS_GG_U8), u64(&B, 0);
  expect_fail("deep nesting", EINVAL, "nested");
  head(&B, 3, 0, 1);
  key(&B, "k", 13), u32(&B, 0);
  expect_fail("unknown value type", EINVAL, "unknown metadata value type");
  head(&B, 3, 0, 1);
  key(&B, "k", BS_GG_BOOL), u8(&B, 2), u32(&B, 0), u32(&B, 0), u32(&B, 0);
  expect_fail("bool 2", EINVAL, "bool");
  head(&B, 3, 0, 2);
  key(&B, "k", BS_GG_U8), u8(&B, 1);
  key(&B, "k", BS_GG_U8), u8(&B, 2);
  expect_fail("duplicate key", EINVAL, "twice");
  head(&B, 3, 0, 1);
  u64(&B, 3), raw(&B, "a\0b", 3), u32(&B, BS_GG_U8), u8(&B, 1);
  expect_fail("NUL in key", EINVAL, "NUL");
  head(&B, 0x03000000u, 0, 0);
  expect_fail("big-endian", ENOTSUP, "big-endian");
  head(&B, 0x01000000u, 0, 0);
  expect_fail("big-endian version 1", ENOTSUP, "big-endian");
  head(&B, 4, 0, 0);
  expect_fail("version 4", ENOTSUP, "versions 1 to 3 are");
  B.n = 0;
  raw(&B, "FUGG", 4), u32(&B, 0x03000000u), u64(&B, 0), u64(&B, 0);
  expect_fail("FUGG", ENOTSUP, "its magic reads 'FUGG'");
  head(&B, 3, 0, 1);
  key(&B, "general.alignment", BS_GG_U32), u32(&B, 48);
  expect_fail("alignment 48", EINVAL, "power of two");
  head(&B, 3, 0, 1);
  key(&B, "general.alignment", BS_GG_U32), u32(&B, 0);
  expect_fail("alignment 0", EINVAL, "power of two");
  head(&B, 3, 0, 1);
  key(&B, "general.alignment", BS_GG_U32), u32(&B, 1u << 21);
  expect_fail("alignment 2 MiB", EINVAL, "power of two from 1 to");
  head(&B, 3, 0, 1);
  key(&B, "general.alignment", BS_GG_U8), u8(&B, 32);
  expect_fail("alignment u8", EINVAL, "uint32");
  B.n = 0;
  raw(&B, "GGUF\x03\0\0", 7);
  expect_fail("truncated", EINVAL, "truncated");
}

Test(gguf, hostile_tensor_infos)
{
  one_tensor(1, 0, 16);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg); /* the control */
  bs_catalog_destroy(&cat);
  one_tensor(1, 0, 15);
  expect_fail("data past the end", EINVAL, "outside the file");
  one_tensor(1, 8, 64);
  expect_fail("misaligned", EINVAL, "multiple of the alignment");
  one_tensor(1, UINT64_MAX - 31, 64);
  expect_fail("offset overflow", EINVAL, "outside the file");
  head(&B, 3, 1, 0);
  tinfo(&B, "t", 5, (uint64_t[]){1, 1, 1, 1, 1}, 0, 0);
  expect_fail("n_dims 5", EINVAL, "n_dims");
  head(&B, 3, 1, 0);
  tinfo(&B, "t", 1, (uint64_t[]){4}, 99, 0);
  expect_fail("unknown type", EINVAL, "unknown ggml type 99");
  head(&B, 3, 1, 0);
  tinfo(&B, "t", 1, (uint64_t[]){32}, 4, 0);
  expect_fail("removed type", ENOTSUP, "Q4_2");
  head(&B, 3, 1, 0);
  tinfo(&B, "t", 1, (uint64_t[]){33}, 8, 0);
  pad(&B, 32);
  for (int i = 0; i < 64; i++)
    u8(&B, 0);
  expect_fail("block remainder", EINVAL, "multiple of 32");
  head(&B, 3, 1, 0);
  tinfo(&B, "t", 2, (uint64_t[]){1ull << 40, 1ull << 40}, 0, 0);
  pad(&B, 32);
  expect_fail("huge dims", EINVAL, "");
  head(&B, 3, 1, 0);
  tinfo(&B, "t", 1, (uint64_t[]){UINT64_MAX}, 0, 0);
  expect_fail("negative dim", EINVAL, "negative");
  head(&B, 3, 2, 0);
  tinfo(&B, "a", 1, (uint64_t[]){16}, 0, 0);
  tinfo(&B, "b", 1, (uint64_t[]){4}, 0, 32);
  pad(&B, 32);
  for (int i = 0; i < 128; i++)
    u8(&B, 0);
  expect_fail("overlap", EINVAL, "overlaps");
  head(&B, 3, 2, 0);
  tinfo(&B, "a", 1, (uint64_t[]){4}, 0, 0);
  tinfo(&B, "a", 1, (uint64_t[]){4}, 0, 32);
  pad(&B, 32);
  for (int i = 0; i < 64; i++)
    u8(&B, 0);
  expect_fail("duplicate name", EINVAL, "two tensors");
}

Test(gguf, every_truncation_fails_cleanly)
{
  build_ref(&B);
  size_t full = B.n;
  for (size_t n = 0; n < data_at; n += 3) {
    struct bs_catalog cat;
    bs_err err;
    int rc = open_mem(&cat, B.d, n, &err);
    cr_assert_eq(rc, -1, "a file cut at %zu was accepted", n);
    cr_assert_eq(cat.count + cat.nmeta, 0);
    bs_catalog_destroy(&cat);
  }
  B.n = full;
}

Test(gguf, out_of_memory_anywhere_fails_cleanly)
{
  build_ref(&B);
  for (long i = 0; i < 400; i++) {
    struct bs_catalog cat;
    bs_err err;
    bs_alloc_fail_after(i);
    int rc = open_mem(&cat, B.d, B.n, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0) {
      bs_catalog_destroy(&cat);
      break;
    }
    cr_assert_eq(cat.count + cat.nmeta, 0);
    bs_catalog_destroy(&cat);
  }
}

/* ---- The writer ---------------------------------------------------------------------------- */

static struct bs_buf write_mem(const struct bs_catalog *cat, int want_rc, bs_err *err)
{
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  bs_err_clear(err);
  cr_assert_eq(bs_gguf_write(cat, &k, err), want_rc, "%s", err->msg);
  return b;
}

Test(gguf, round_trip_is_byte_identical)
{
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_writer_check(bs_writer_for_path("x.gguf"), &cat, &err), 0, "%s", err.msg);
  struct bs_buf out = write_mem(&cat, 0, &err);
  cr_assert_eq(out.len, B.n);
  cr_assert_eq(memcmp(out.data, B.d, B.n), 0);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

static void set_meta(struct bs_catalog *cat, const char *k, const char *v)
{
  for (size_t i = 0; i < cat->nmeta; i++)
    if (strcmp(cat->meta[i].key, k) == 0) {
      bs_free(cat->meta[i].value);
      bs_free(cat->meta[i].ref);
      cat->meta[i].ref = NULL;
      cat->meta[i].value = bs_strdup(v);
      return;
    }
  bs_err err;
  cr_assert_eq(bs_catalog_add_meta(cat, k, v, &err), 0);
}

Test(gguf, changed_metadata_keeps_its_type)
{
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  set_meta(&cat, "general.name", "renamed");
  set_meta(&cat, "k.u32", "17");
  set_meta(&cat, "k.f64", "1e300");
  set_meta(&cat, "k.arr_str", "[\"x\\u00e9\", \"\\ud83d\\ude00\"]");
  set_meta(&cat, "k.nested", "[[7],[8,9],[]]");
  set_meta(&cat, "k.arr_f32", "[Infinity, -0.5]");
  set_meta(&cat, "k.bool", "false");
  set_meta(&cat, "new.key", "42");
  struct bs_buf out = write_mem(&cat, 0, &err);
  struct bs_catalog back;
  cr_assert_eq(open_mem(&back, out.data, out.len, &err), 0, "%s", err.msg);
  cr_expect_str_eq(meta(&back, "general.name"), "renamed");
  cr_expect_str_eq(meta(&back, "k.u32"), "17");
  cr_expect_str_eq(meta(&back, "k.f64"), "1.0000000000000001e+300");
  cr_expect_str_eq(meta(&back, "k.arr_str"), "[\"x\xc3\xa9\",\"\xf0\x9f\x98\x80\"]");
  cr_expect_str_eq(meta(&back, "k.nested"), "[[7],[8,9],[]]");
  cr_expect_str_eq(meta(&back, "k.arr_f32"), "[Infinity,-0.5]");
  cr_expect_str_eq(meta(&back, "k.bool"), "false");
  cr_expect_str_eq(meta(&back, "new.key"), "42");
  struct bs_gguf g;
  struct bs_src s;
  cr_assert_eq(bs_src_init_mem(&s, out.data, out.len, "out", &err), 0);
  cr_assert_eq(bs_gguf_parse(&s, &g, &err), 0, "%s", err.msg);
  for (size_t i = 0; i < g.nkv; i++) {
    if (strcmp(g.kv[i].key, "k.u32") == 0)
      cr_expect_eq(g.kv[i].types[0], BS_GG_U32);
    if (strcmp(g.kv[i].key, "new.key") == 0)
      cr_expect_eq(g.kv[i].types[0], BS_GG_STRING);
    if (strcmp(g.kv[i].key, "k.nested") == 0) {
      cr_expect_eq(g.kv[i].types[1], BS_GG_ARRAY);
      cr_expect_eq(g.kv[i].types[2], BS_GG_U16);
    }
  }
  bs_gguf_free(&g);
  bs_src_destroy(&s);
  /* tensors unchanged */
  uint8_t a[68], b2[68];
  cr_assert_eq(bs_tensor_read(&back, tensor(&back, "blk.0.q8"), 0, a, 68), 68);
  cr_assert_eq(bs_tensor_read(&cat, tensor(&cat, "blk.0.q8"), 0, b2, 68), 68);
  cr_expect_eq(memcmp(a, b2, 68), 0);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

static void expect_bad_value(const char *k, const char *v, const char *sub)
{
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  set_meta(&cat, k, v);
  struct bs_buf out = write_mem(&cat, -1, &err);
  cr_expect_eq(err.code, EINVAL, "%s=%s: %s", k, v, err.msg);
  cr_expect_not_null(strstr(err.msg, k), "%s", err.msg);
  cr_expect_not_null(strstr(err.msg, sub), "%s=%s: '%s' lacks '%s'", k, v, err.msg, sub);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(gguf, bad_values_for_typed_keys_are_refused)
{
  expect_bad_value("k.u32", "abc", "integer");
  expect_bad_value("k.u32", "-1", "integer");
  expect_bad_value("k.u8", "256", "range");
  expect_bad_value("k.i8", "-129", "range");
  expect_bad_value("k.u64", "18446744073709551616", "range");
  expect_bad_value("k.bool", "yes", "true or false");
  expect_bad_value("k.f32", "1e39", "float32");
  expect_bad_value("k.f32", "", "expected");
  expect_bad_value("k.arr_i32", "[1,2", "expected");
  expect_bad_value("k.arr_i32", "1,2", "array");
  expect_bad_value("k.arr_i32", "[1,\"x\"]", "integer");
  expect_bad_value("k.arr_str", "[\"a\" \"b\"]", "expected");
  expect_bad_value("k.arr_str", "[\"\\ud800\"]", "surrogate");
  expect_bad_value("k.nested", "[1]", "array");
  expect_bad_value("k.u16", "7 8", "after the value");
}

Test(gguf, writer_refuses_what_ggml_cannot_hold)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_not_null(bs_catalog_add(&cat, "u", BS_DT_U8, 1, (uint64_t[]){4}, 0, &err));
  cr_expect_eq(bs_gguf_can_write(&cat.tensors[0], &err), -1);
  cr_expect_not_null(strstr(err.msg, "GGUF has no type for U8"), "%s", err.msg);
  bs_err_clear(&err);
  cr_assert_not_null(
      bs_catalog_add(&cat, "r5", BS_DT_F32, 5, (uint64_t[]){1, 1, 1, 1, 1}, 0, &err));
  cr_expect_eq(bs_gguf_can_write(&cat.tensors[1], &err), -1);
  cr_expect_not_null(strstr(err.msg, "rank 5"), "%s", err.msg);
  bs_err_clear(&err);
  char longname[80];
  memset(longname, 'n', 70);
  longname[70] = '\0';
  cr_assert_not_null(bs_catalog_add(&cat, longname, BS_DT_F32, 1, (uint64_t[]){1}, 0, &err));
  cr_expect_eq(bs_gguf_can_write(&cat.tensors[2], &err), -1);
  /* and Burnpack / SafeTensors refuse the block types in one line */
  bs_err_clear(&err);
  cr_assert_not_null(bs_catalog_add(&cat, "q", BS_DT_Q4_K, 1, (uint64_t[]){256}, 0, &err));
  cr_expect_eq(cat.tensors[3].nbytes, 144);
  cr_expect_eq(bs_gguf_can_write(&cat.tensors[3], &err), 0);
  cr_expect_eq(bs_st_can_write(&cat.tensors[3], &err), -1);
  cr_expect_not_null(strstr(err.msg, "Q4_K"), "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(bs_bpk_can_write(&cat.tensors[3], &err), -1);
  cr_expect_not_null(strstr(err.msg, "Q4_K"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(gguf, new_file_from_another_catalog)
{
  /* No GGUF source: every key a string, alignment from general.alignment. */
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err err;
  bs_err_clear(&err);
  static uint8_t bytes[4 * 6 + 34];
  for (size_t i = 0; i < sizeof bytes; i++)
    bytes[i] = (uint8_t)i;
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&s, bytes, sizeof bytes, "m", &err), 0);
  cr_assert_eq(bs_catalog_add_src(&cat, &s, &idx, &err), 0);
  struct bs_tensor *t = bs_catalog_add(&cat, "w", BS_DT_F32, 2, (uint64_t[]){2, 3}, 0, &err);
  t->src = idx, t->off = 0;
  t = bs_catalog_add(&cat, "q", BS_DT_Q8_0, 1, (uint64_t[]){32}, 0, &err);
  t->src = idx, t->off = 24;
  cr_assert_eq(bs_catalog_add_meta(&cat, "general.alignment", "64", &err), 0);
  cr_assert_eq(bs_catalog_add_meta(&cat, "format", "pt", &err), 0);
  struct bs_buf out = write_mem(&cat, 0, &err);
  struct bs_catalog back;
  cr_assert_eq(open_mem(&back, out.data, out.len, &err), 0, "%s", err.msg);
  cr_expect_eq(out.len % 64, 0);
  const struct bs_tensor *q = tensor(&back, "q");
  cr_expect_eq(q->dtype, BS_DT_Q8_0);
  cr_expect_eq(q->off % 64, 0);
  uint8_t got[34];
  cr_assert_eq(bs_tensor_read(&back, q, 0, got, 34), 34);
  cr_expect_eq(memcmp(got, bytes + 24, 34), 0);
  cr_expect_eq(tensor(&back, "w")->shape[1], 3);
  cr_expect_str_eq(meta(&back, "format"), "pt");
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
  /* a bad alignment fails */
  bs_free(cat.meta[0].value);
  cat.meta[0].value = bs_strdup("48");
  out = write_mem(&cat, -1, &err);
  cr_expect_not_null(strstr(err.msg, "power of two"), "%s", err.msg);
  bs_buf_destroy(&out);
  /* nor does a key twice */
  bs_free(cat.meta[0].value);
  cat.meta[0].value = bs_strdup("32");
  cr_assert_eq(bs_catalog_add_meta(&cat, "format", "again", &err), 0);
  out = write_mem(&cat, -1, &err);
  cr_expect_not_null(strstr(err.msg, "appears twice"), "%s", err.msg);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

/* The setxattr-time check of a writable .gguf mount: the writers table's
 * metadata columns, rules prepared once from the source. */
static int check_meta(const struct bs_catalog *cat, const char *k, const char *v, size_t n,
                      bs_err *err)
{
  const struct bs_writer *w = bs_writer_for_format(BS_FMT_GGUF);
  struct bs_meta_rules *r;
  if (bs_writer_meta_rules(w, cat, &r, err) != 0)
    return -1;
  int rc = bs_writer_check_meta(w, r, k, v, n, err);
  bs_writer_meta_rules_free(w, r);
  return rc;
}

Test(gguf, check_meta_at_setxattr_time)
{
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "k.u32", "12", 2, &err), 0, "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "k.u32", "12x", 3, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  cr_expect_not_null(strstr(err.msg, "k.u32"), "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(check_meta(&cat, "k.nested", "[[1],[2,3]]", 11, &err), 0, "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "general.name", "anything", 8, &err), 0);
  cr_expect_eq(check_meta(&cat, "brand.new", "[1", 2, &err), 0, "new keys are strings");
  cr_expect_eq(check_meta(&cat, "general.alignment", "64", 2, &err), 0);
  cr_expect_eq(check_meta(&cat, "general.alignment", "48", 2, &err), -1);
  cr_expect_not_null(strstr(err.msg, "power of two"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(gguf, check_meta_keeps_types_not_the_header)
{
  /* The rules are keys and types only: they outlive the source catalog, so
   * a setxattr never parses the header again. */
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  const struct bs_writer *w = bs_writer_for_format(BS_FMT_GGUF);
  struct bs_meta_rules *r;
  cr_assert_eq(bs_writer_meta_rules(w, &cat, &r, &err), 0, "%s", err.msg);
  cr_assert_not_null(r);
  bs_catalog_destroy(&cat);
  memset(B.d, 0, B.n); /* the source is gone */
  cr_expect_eq(bs_writer_check_meta(w, r, "k.u32", "7", 1, &err), 0, "%s", err.msg);
  cr_expect_eq(bs_writer_check_meta(w, r, "k.u32", "x", 1, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  bs_writer_meta_rules_free(w, r);
}

Test(gguf, parse_types_keeps_keys_and_types_without_the_strings)
{
  build_ref(&B);
  struct bs_src s;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_src_init_mem(&s, B.d, B.n, "mem", &err), 0);
  struct bs_gguf full, types;
  cr_assert_eq(bs_gguf_parse(&s, &full, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_gguf_parse_types(&s, &types, &err), 0, "%s", err.msg);
  cr_assert_eq(types.nkv, full.nkv);
  cr_expect_eq(types.nti, 0, "no tensor infos");
  for (size_t i = 0; i < full.nkv; i++) {
    cr_expect_str_eq(types.kv[i].key, full.kv[i].key);
    cr_expect_arr_eq(types.kv[i].types, full.kv[i].types, sizeof full.kv[i].types);
    if (full.kv[i].types[0] == BS_GG_STRING)
      cr_expect_eq(types.kv[i].text_len, 0, "%s: not read", full.kv[i].key);
  }
  bs_gguf_free(&full);
  bs_gguf_free(&types);
  bs_src_destroy(&s);
  /* a string that claims more than the file holds is still refused */
  head(&B, 3, 0, 1);
  key(&B, "k", BS_GG_STRING), u64(&B, 1000);
  cr_assert_eq(bs_src_init_mem(&s, B.d, B.n, "mem", &err), 0);
  cr_expect_eq(bs_gguf_parse_types(&s, &types, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  bs_src_destroy(&s);
}

Test(gguf, check_meta_of_a_new_file_has_no_typed_keys)
{
  /* A new .gguf mount: no source, every key a string but general.alignment. */
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err err;
  bs_err_clear(&err);
  cr_expect_eq(check_meta(&cat, "general.name", "x", 1, &err), 0, "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "k.u32", "seven", 5, &err), 0, "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "general.alignment", "48", 2, &err), -1);
  cr_expect_not_null(strstr(err.msg, "power of two"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(gguf, check_meta_refuses_nul_and_non_utf8)
{
  /* "a\0b" would be cut to "a"; bytes that are not UTF-8 make a string
   * gguf-py cannot decode: both EINVAL at setxattr, with the key named. */
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "general.name", "a\0b", 3, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  cr_expect_not_null(strstr(err.msg, "NUL byte at 1"), "%s", err.msg);
  cr_expect_not_null(strstr(err.msg, "general.name"), "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(check_meta(&cat, "general.name", "caf\xe9", 4, &err), -1);
  cr_expect_not_null(strstr(err.msg, "not UTF-8 (byte 3)"), "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(check_meta(&cat, "brand.new", "\xff", 1, &err), -1, "new keys are strings too");
  bs_err_clear(&err);
  cr_expect_eq(check_meta(&cat, "caf\xe9", "x", 1, &err), -1);
  cr_expect_not_null(strstr(err.msg, "key"), "%s", err.msg);
  bs_err_clear(&err);
  /* a write (no rules) copies what a source had: our reader takes it */
  cr_expect_eq(
      bs_writer_check_meta(bs_writer_for_format(BS_FMT_GGUF), NULL, "caf\xe9", "x", 1, &err), 0,
      "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "general.name", "caf\xc3\xa9", 5, &err), 0, "%s", err.msg);
  /* In a JSON array of strings, a raw byte that is not UTF-8 is refused
   * too (by the writer as well: the check is its encoder). */
  set_meta(&cat, "k.arr_str", "[\"\xff\"]");
  struct bs_buf out = write_mem(&cat, -1, &err);
  cr_expect_eq(err.code, EINVAL, "%s", err.msg);
  cr_expect_not_null(strstr(err.msg, "not UTF-8"), "%s", err.msg);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

/* ---- Review (second pass) ------------------------------------------------------------------ */

Test(gguf, array_strings_keep_their_nul_bytes)
{
  /* A string inside an array is JSON: a NUL byte is \u0000, not the end of
   * the string. Editing another element must not cut it. */
  head(&B, 3, 0, 2);
  key(&B, "k.arr", BS_GG_ARRAY), u32(&B, BS_GG_STRING), u64(&B, 2);
  u64(&B, 3), raw(&B, "x\0y", 3);
  str(&B, "z");
  key(&B, "k.s", BS_GG_STRING), u64(&B, 5), raw(&B, "ab\0cd", 5);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_expect_str_eq(meta(&cat, "k.arr"), "[\"x\\u0000y\",\"z\"]");
  cr_expect_str_eq(meta(&cat, "k.s"), "ab"); /* documented: shown up to the NUL */
  set_meta(&cat, "k.arr", "[\"x\\u0000y\",\"w\"]");
  struct bs_buf out = write_mem(&cat, 0, &err);
  cr_expect_not_null(memmem(out.data, out.len, "\3\0\0\0\0\0\0\0x\0y", 11), "the NUL kept");
  cr_expect_not_null(memmem(out.data, out.len, "\5\0\0\0\0\0\0\0ab\0cd", 13), "k.s copied");
  struct bs_catalog back;
  cr_assert_eq(open_mem(&back, out.data, out.len, &err), 0, "%s", err.msg);
  cr_expect_str_eq(meta(&back, "k.arr"), "[\"x\\u0000y\",\"w\"]");
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(gguf, metadata_errors_name_the_key_not_a_tensor)
{
  /* a bool of 2; general.alignment as a uint8 */
  static const struct {
    uint32_t type;
    uint8_t v;
  } cases[] = {{BS_GG_BOOL, 2}, {BS_GG_U8, 0}};
  for (size_t i = 0; i < 2; i++) {
    head(&B, 3, 0, 1);
    key(&B, i ? "general.alignment" : "k.flag", cases[i].type), u8(&B, cases[i].v);
    if (i)
      u32(&B, 0), u32(&B, 0);
    struct bs_catalog cat;
    bs_err err;
    cr_assert_eq(open_mem(&cat, B.d, B.n, &err), -1);
    char line[512];
    bs_err_format(&err, "m.gguf", line, sizeof line);
    cr_expect_null(strstr(line, "tensor '"), "a metadata key called a tensor: %s", line);
    cr_expect_not_null(strstr(line, i ? "general.alignment" : "metadata 'k.flag'"), "%s", line);
    cr_expect_not_null(strstr(line, "offset 0x"), "%s", line);
    bs_catalog_destroy(&cat);
  }
}

Test(gguf, writer_refuses_an_empty_key)
{
  /* setfattr -n user.burnstore.meta. gives the key "": the reader refuses a
   * file holding it, so the writer and the setxattr check refuse it. */
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_expect_eq(check_meta(&cat, "", "x", 1, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  set_meta(&cat, "", "x");
  struct bs_buf out = write_mem(&cat, -1, &err);
  cr_expect_eq(err.code, EINVAL, "%s", err.msg);
  cr_expect_not_null(strstr(err.msg, "empty"), "%s", err.msg);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(gguf, alignment_the_setxattr_check_accepts_is_written)
{
  /* the setxattr check parses general.alignment as a uint32 (spaces
   * around it allowed); the write-back must read it the same way, not fail
   * at unmount on what setxattr accepted. */
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  cr_assert_eq(check_meta(&cat, "general.alignment", "64\n", 3, &err), 0, "%s", err.msg);
  set_meta(&cat, "general.alignment", "64\n");
  struct bs_buf out = write_mem(&cat, 0, &err);
  struct bs_catalog back;
  cr_assert_eq(open_mem(&back, out.data, out.len, &err), 0, "%s", err.msg);
  cr_expect_str_eq(meta(&back, "general.alignment"), "64");
  cr_expect_eq(tensor(&back, "blk.0.q8")->off % 64, 0);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(gguf, an_error_naming_hostile_names_is_one_line)
{
  /* Keys and tensor names come from the file: a newline in one must not
   * split the error line (or forge a second one in a log). */
  head(&B, 3, 0, 2);
  key(&B, "a\nfake: line", BS_GG_U8), u8(&B, 1);
  key(&B, "a\nfake: line", BS_GG_U8), u8(&B, 1);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), -1);
  char line[512];
  bs_err_format(&err, "m.gguf", line, sizeof line);
  cr_expect_null(strchr(line, '\n'), "two lines: %s", line);
  cr_expect_not_null(strstr(line, "appears twice"), "%s", line);
  bs_catalog_destroy(&cat);
  head(&B, 3, 2, 0);
  tinfo(&B, "x\revil", 1, (uint64_t[]){16}, 0, 0);
  tinfo(&B, "y", 1, (uint64_t[]){4}, 0, 32);
  pad(&B, 32);
  for (int i = 0; i < 128; i++)
    u8(&B, 0);
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), -1);
  bs_err_format(&err, "m.gguf", line, sizeof line);
  cr_expect_null(strpbrk(line, "\r\n"), "two lines: %s", line);
  cr_expect_not_null(strstr(line, "overlaps"), "%s", line);
  bs_catalog_destroy(&cat);
}

Test(gguf, a_failing_read_at_any_allocation_leaves_the_catalog_as_it_was)
{
  build_ref(&B);
  cr_assert_gt(bs_test_rollback_sweep_mem(B.d, B.n, "m.gguf", bs_gguf_read), 0);
}

/* The catalog keeps each GGUF value where it is (a ref to its bytes, the
 * length of its text counted): no text is made until asked for, and then
 * only as much as asked (an xattr, info's first 200 bytes). The text an
 * entry makes equals what the reader showed before (the test above), cut
 * at any length to a prefix of it. */
Test(gguf, values_stay_in_the_file_and_are_made_text_on_demand)
{
  build_ref(&B);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, B.d, B.n, &err), 0, "%s", err.msg);
  for (size_t i = 0; i < cat.nmeta; i++) {
    const struct bs_kv *kv = &cat.meta[i];
    cr_assert(!kv->value && kv->ref && kv->ref->format == BS_FMT_GGUF, "%s: a ref", kv->key);
    struct bs_buf full = {0};
    bool cut;
    cr_assert_eq(bs_meta_text(&cat, kv, UINT64_MAX, &full, &cut, &err), 0, "%s", err.msg);
    cr_assert(!cut && full.len == kv->ref->text_len, "%s: %zu bytes", kv->key, full.len);
    for (uint64_t max = 0; max <= full.len + 1; max++) {
      struct bs_buf part = {0};
      cr_assert_eq(bs_meta_text(&cat, kv, max, &part, &cut, &err), 0, "%s", err.msg);
      size_t want = max < full.len ? (size_t)max : full.len;
      cr_assert(part.len == want && cut == (max < full.len), "%s cut at %" PRIu64, kv->key, max);
      cr_assert(!want || memcmp(part.data, full.data, want) == 0, "%s: a prefix", kv->key);
      bs_buf_destroy(&part);
    }
    bs_buf_destroy(&full);
  }
  bs_catalog_destroy(&cat);
}

/* A value of control bytes is 6 times its bytes as JSON: a writer that
 * wants text (SafeTensors) gets it made, within 48 MiB in all, refused
 * past that before any is made; GGUF copies the bytes. */
Test(gguf, text_for_other_writers_is_bounded)
{
  static uint8_t big[9u << 20];
  struct gb *b = bs_malloc(sizeof *b);
  head(b, 3, 1, 1);
  key(b, "general.x", BS_GG_ARRAY), u32(b, BS_GG_STRING), u64(b, 1), u64(b, sizeof big);
  memset(big, 1, sizeof big);
  uint8_t *file = bs_malloc(b->n + sizeof big + 256);
  memcpy(file, b->d, b->n);
  size_t n = b->n;
  memcpy(file + n, big, sizeof big);
  n += sizeof big;
  b->n = 0;
  tinfo(b, "w", 1, (uint64_t[]){2}, 0, 0);
  memcpy(file + n, b->d, b->n);
  n += b->n;
  size_t data = (n + 31) / 32 * 32;
  memset(file + n, 0, data + 8 - n);
  n = data + 8;
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, file, n, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_kv_text_len(&cat.meta[0]), 6 * sizeof big + 4);
  char dir[] = "/tmp/bs-gguf-XXXXXX", path[64];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/out.safetensors", dir);
  const struct bs_writer *st = bs_writer_for_path(path);
  cr_assert_eq(bs_writer_write_file(st, &cat, path, &err), -1);
  cr_assert_eq(err.code, EFBIG);
  cr_assert(strstr(err.msg, "the metadata as text passes 48 MiB at 'general.x'"), "%s", err.msg);
  snprintf(path, sizeof path, "%s/out.gguf", dir);
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_write_file(bs_writer_for_path(path), &cat, path, &err), 0, "%s", err.msg);
  FILE *f = fopen(path, "rb"); /* the header as it was: the value copied, not made text */
  cr_assert_not_null(f);
  uint8_t *back = bs_malloc(data);
  cr_assert_eq(fread(back, 1, data, f), data);
  fclose(f);
  cr_assert_eq(memcmp(back, file, data), 0, "the GGUF header copied byte for byte");
  bs_free(back);
  unlink(path);
  rmdir(dir);
  bs_catalog_destroy(&cat);
  bs_free(file);
  bs_free(b);
}
