/* The SafeTensors writer on memory sinks: the reference crate's own byte
 * vectors, its data order, JSON escaping, every dtype read back by our
 * reader, refusals naming the tensor, and out-of-memory at every step. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/size.h"
#include "formats/formats.h"
#include "formats/safetensors_write.h"
#include "formats/writers.h"
#include "policy/open.h"
#include "st_fixture.h"

static struct bs_buf write_mem(const struct bs_catalog *cat)
{
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_st_write(cat, &k, &err), 0, "%s", err.msg);
  uint64_t size;
  cr_assert_eq(bs_st_size(cat, NULL, 0, &size, &err), 0, "%s", err.msg);
  cr_assert_eq(size, b.len, "bs_st_size agrees with what is written");
  return b;
}

static const uint8_t f32_0_to_5[24] = {0, 0, 0,  0,  0, 0, 128, 63, 0, 0, 0,   64,
                                       0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};

/* safetensors/src/tensor.rs, test_serialization: attn.0, F32 [1,2,3]. */
Test(st_write, reference_vector_serialization)
{
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, f32_0_to_5, sizeof f32_0_to_5);
  bs_test_add(&cat, "attn.0", BS_DT_F32, 3, (uint64_t[]){1, 2, 3}, 0);
  struct bs_buf b = write_mem(&cat);
  static const uint8_t want[] = {
      64, 0,  0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,
      34, 58, 123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,
      44, 34, 115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,
      44, 34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,
      91, 48, 44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
      0,  0,  0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
  cr_assert_eq(b.len, sizeof want);
  cr_assert_arr_eq(b.data, want, sizeof want);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

/* test_serialization_forced_alignement: the header is padded with spaces. */
Test(st_write, reference_vector_padding)
{
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, f32_0_to_5, sizeof f32_0_to_5);
  bs_test_add(&cat, "attn0", BS_DT_F32, 4, (uint64_t[]){1, 1, 2, 3}, 0);
  struct bs_buf b = write_mem(&cat);
  const char *hdr = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}"
                    "       ";
  cr_assert_eq(b.len, 8 + 72 + 24);
  cr_assert_eq(b.data[0], 72);
  cr_assert_arr_eq(b.data + 8, hdr, 72);
  cr_assert_arr_eq(b.data + 80, f32_0_to_5, 24);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

/* test_empty: no tensors, without and with metadata. */
Test(st_write, reference_vector_empty)
{
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, "", 0);
  struct bs_buf b = write_mem(&cat);
  static const uint8_t want[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
  cr_assert_eq(b.len, sizeof want);
  cr_assert_arr_eq(b.data, want, sizeof want);
  bs_buf_destroy(&b);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_catalog_add_meta(&cat, "framework", "pt", &err), 0);
  b = write_mem(&cat);
  const char *hdr = "{\"__metadata__\":{\"framework\":\"pt\"}}     ";
  cr_assert_eq(b.len, 8 + 40);
  cr_assert_eq(b.data[0], 40);
  cr_assert_arr_eq(b.data + 8, hdr, 40);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

/* Data order: dtype alignment descending (the crate's enum), then name;
 * metadata keys sorted; the header lists tensors in data order. */
Test(st_write, data_order_is_the_reference_writers)
{
  uint8_t mem[64];
  for (int i = 0; i < 64; i++)
    mem[i] = (uint8_t)i;
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "z8", BS_DT_U8, 1, (uint64_t[]){3}, 0);
  bs_test_add(&cat, "b32", BS_DT_F32, 1, (uint64_t[]){1}, 4);
  bs_test_add(&cat, "a32", BS_DT_F32, 1, (uint64_t[]){1}, 8);
  bs_test_add(&cat, "bool", BS_DT_BOOL, 1, (uint64_t[]){1}, 12);
  bs_test_add(&cat, "u64", BS_DT_U64, 1, (uint64_t[]){1}, 16);
  bs_test_add(&cat, "c64", BS_DT_C64, 1, (uint64_t[]){1}, 24);
  bs_test_add(&cat, "h", BS_DT_BF16, 1, (uint64_t[]){1}, 32);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_catalog_add_meta(&cat, "zz", "1", &err), 0);
  cr_assert_eq(bs_catalog_add_meta(&cat, "aa", "2", &err), 0);
  struct bs_buf b = write_mem(&cat);
  char *h = strndup((const char *)b.data + 8, (size_t)b.data[0] | (size_t)b.data[1] << 8);
  const char *order[] = {"__metadata__", "\"aa\"",  "\"zz\"", "\"u64\"", "\"c64\"",
                         "\"a32\"",      "\"b32\"", "\"h\"",  "\"z8\"",  "\"bool\""};
  const char *at = h;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    const char *p = strstr(at, order[i]);
    cr_assert_not_null(p, "%s after ...%s in %s", order[i], at, h);
    at = p;
  }
  cr_assert_eq(strlen(h) % 8, 0);
  /* The data follows that order: u64 (src 16..24) first. */
  size_t ds = 8 + strlen(h);
  cr_assert_arr_eq(b.data + ds, mem + 16, 8);
  cr_assert_arr_eq(b.data + ds + 8, mem + 24, 8);
  cr_assert_arr_eq(b.data + ds + 16, mem + 8, 4);
  free(h);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

/* Names and metadata escaped as serde_json escapes them, and read back the same. */
Test(st_write, strings_escaped_as_serde_json_and_read_back)
{
  uint8_t mem[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  const char *name = "a\"b\\c/d\x01\x1f\t\n\x7f\xc3\xa9";
  bs_test_add(&cat, name, BS_DT_U8, 1, (uint64_t[]){8}, 0);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_catalog_add_meta(&cat, "k\"", "v\r\b\f", &err), 0);
  struct bs_buf b = write_mem(&cat);
  const char *want = "\"a\\\"b\\\\c/d\\u0001\\u001f\\t\\n\x7f\xc3\xa9\"";
  cr_assert(memmem(b.data, b.len, want, strlen(want)), "escaped name");
  const char *wantm = "\"k\\\"\":\"v\\r\\b\\f\"";
  cr_assert(memmem(b.data, b.len, wantm, strlen(wantm)), "escaped metadata");
  struct bs_catalog back;
  cr_assert_eq(st_read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, 1);
  cr_assert_str_eq(back.tensors[0].key, name);
  cr_assert_eq(back.nmeta, 1);
  cr_assert_str_eq(back.meta[0].key, "k\"");
  cr_assert_str_eq(back.meta[0].value, "v\r\b\f");
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

/* Every dtype SafeTensors has: written, read back by the reader with the
 * same dtype, shape and bytes, and the reader's file written again is the
 * same file. */
Test(st_write, every_safetensors_dtype_round_trips)
{
  static const enum bs_dtype all[] = {
      BS_DT_BOOL,    BS_DT_F4,      BS_DT_F6_E2M3, BS_DT_F6_E3M2,     BS_DT_U8,          BS_DT_I8,
      BS_DT_F8_E5M2, BS_DT_F8_E4M3, BS_DT_F8_E8M0, BS_DT_F8_E4M3FNUZ, BS_DT_F8_E5M2FNUZ, BS_DT_I16,
      BS_DT_U16,     BS_DT_F16,     BS_DT_BF16,    BS_DT_I32,         BS_DT_U32,         BS_DT_F32,
      BS_DT_C64,     BS_DT_F64,     BS_DT_I64,     BS_DT_U64};
  enum { N = sizeof all / sizeof all[0] };
  uint8_t mem[N * 64];
  for (size_t i = 0; i < sizeof mem; i++)
    mem[i] = (uint8_t)(i * 13 + 5);
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  for (size_t i = 0; i < N; i++) {
    char name[32];
    snprintf(name, sizeof name, "t.%s", bs_dtype_name(all[i]));
    /* 8 elements: a whole number of bytes for F4 and F6 too. */
    bs_test_add(&cat, name, all[i], 2, (uint64_t[]){2, 4}, i * 64);
  }
  struct bs_buf b = write_mem(&cat);
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog back;
  cr_assert_eq(st_read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, N);
  for (size_t i = 0; i < N; i++) {
    const struct bs_tensor *t = &cat.tensors[i];
    long j = bs_catalog_find(&back, t->key);
    cr_assert_geq(j, 0, "%s", t->key);
    const struct bs_tensor *u = &back.tensors[j];
    cr_assert_eq(u->dtype, t->dtype, "%s", t->key);
    cr_assert_eq(u->rank, 2);
    cr_assert_eq(u->shape[0], 2);
    cr_assert_eq(u->shape[1], 4);
    cr_assert_eq(u->nbytes, t->nbytes);
    cr_assert_arr_eq(b.data + u->off, mem + t->off, t->nbytes, "%s", t->key);
  }
  struct bs_buf again = write_mem(&back);
  cr_assert_eq(again.len, b.len);
  cr_assert_arr_eq(again.data, b.data, b.len, "a file this writer made is canonical");
  bs_buf_destroy(&again);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

static void expect_refused(enum bs_dtype dt, const char *words)
{
  bs_test_writer_refuses("o.safetensors", dt, words);
}

Test(st_write, dtypes_safetensors_lacks_are_refused_naming_the_tensor)
{
  expect_refused(BS_DT_QFLOAT, "no dtype for QFLOAT");
  expect_refused(BS_DT_FLEX32, "set user.burnstore.dtype to F32");
  expect_refused(BS_DT_BOOL_U8, "to BOOL");
  expect_refused(BS_DT_BOOL_U32, "no dtype for BOOL_U32");
  expect_refused(BS_DT_C128, "no dtype for C128");
  expect_refused(BS_DT_QI8, "quantized");
  expect_refused(BS_DT_QU8, "quantized");
  expect_refused(BS_DT_QI32, "quantized");
}

Test(st_write, reserved_duplicate_and_missized_tensors_are_refused)
{
  uint8_t mem[64] = {0};
  struct bs_catalog cat;
  bs_err err;
  struct bs_buf b = {0};
  struct bs_sink k;

  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "__metadata__", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  bs_err_clear(&err);
  bs_sink_init_mem(&k, &b, "mem");
  cr_assert_eq(bs_st_write(&cat, &k, &err), -1);
  cr_assert(strstr(err.msg, "reserves"), "%s", err.msg);
  bs_catalog_destroy(&cat);

  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "x", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  bs_test_add(&cat, "y", BS_DT_F32, 1, (uint64_t[]){1}, 0);
  cat.tensors[1].name = strdup("x"); /* was the key's own string */
  bs_err_clear(&err);
  cr_assert_eq(bs_st_write(&cat, &k, &err), -1);
  cr_assert_str_eq(err.key, "x");
  cr_assert(strstr(err.msg, "unique"), "%s", err.msg);
  bs_catalog_destroy(&cat);

  bs_test_mem_catalog(&cat, mem, sizeof mem);
  struct bs_tensor *t = bs_test_add(&cat, "m", BS_DT_F32, 1, (uint64_t[]){2}, 0);
  t->nbytes = 4;
  bs_err_clear(&err);
  cr_assert_eq(bs_st_write(&cat, &k, &err), -1);
  cr_assert(strstr(err.msg, "need 8"), "%s", err.msg);
  bs_catalog_destroy(&cat);
  bs_buf_destroy(&b);
}

Test(st_write, hidden_tensors_are_left_out_and_subsets_written)
{
  uint8_t mem[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "a", BS_DT_U8, 1, (uint64_t[]){4}, 0);
  bs_test_add(&cat, "b", BS_DT_U8, 1, (uint64_t[]){4}, 4);
  bs_test_add(&cat, "c", BS_DT_U8, 1, (uint64_t[]){4}, 8);
  cat.tensors[1].hidden = true;
  struct bs_buf b = write_mem(&cat);
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog back;
  cr_assert_eq(st_read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, 2);
  cr_assert_eq(bs_catalog_find(&back, "b"), -1);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);

  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  size_t which[] = {2};
  cr_assert_eq(bs_st_write_some(&cat, which, 1, &k, &err), 0, "%s", err.msg);
  cr_assert_eq(st_read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, 1);
  cr_assert_str_eq(back.tensors[0].key, "c");
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

Test(st_write, burnpack_format_marker_becomes_pt)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_catalog_add_meta(&cat, "format", "burnpack", &err), 0);
  cr_assert_eq(bs_catalog_add_meta(&cat, "producer", "burnstore", &err), 0);
  const struct bs_writer *w = bs_writer_for_format(BS_FMT_SAFETENSORS);
  cr_assert_eq(w->default_meta(&cat, &err), 0);
  cr_assert_str_eq(cat.meta[0].value, "pt");
  cr_assert_str_eq(cat.meta[1].value, "burnstore");
  bs_catalog_destroy(&cat);
  bs_catalog_init(&cat);
  cr_assert_eq(w->default_meta(&cat, &err), 0);
  cr_assert_eq(cat.nmeta, 0, "nothing is added to a file without metadata");
  bs_catalog_destroy(&cat);
}

Test(st_write, source_read_errors_name_the_tensor)
{
  uint8_t mem[4] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "short", BS_DT_F32, 1, (uint64_t[]){4}, 0); /* 16 bytes from a 4-byte source */
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_st_write(&cat, &k, &err), -1);
  cr_assert_str_eq(err.key, "short");
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

Test(st_write, out_of_memory_at_every_allocation_fails_cleanly)
{
  uint8_t mem[32] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "a.b", BS_DT_F32, 2, (uint64_t[]){2, 2}, 0);
  bs_test_add(&cat, "c", BS_DT_U8, 1, (uint64_t[]){16}, 16);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_catalog_add_meta(&cat, "format", "pt", &err), 0);
  bs_test_write_survives_oom(bs_st_write, &cat);
  bs_catalog_destroy(&cat);
}

/* ---- Sharded output ------------------------------------------------------------------------ */

/* One size grammar (core/size.h) for max_shard_size= and http_cache=: the
 * spellings of both kept their meaning (Hugging Face's 5GB decimal, 5Gb
 * bits, 5GiB binary; the cache's 64M binary). */
Test(st_shard, sizes_as_hugging_face_spells_them)
{
  uint64_t v;
  const struct {
    const char *s;
    uint64_t v;
  } good[] = {{"5GB", 5000000000ull}, {"5GiB", 5ull << 30}, {"500MB", 500000000ull},
              {"10mib", 10ull << 20}, {"100KB", 100000ull}, {"1KiB", 1024ull},
              {"8Gb", 1000000000ull}, {"1234", 1234ull},    {"64M", 64ull << 20},
              {"64m", 64ull << 20},   {"2T", 2ull << 40},   {"5TB", 5000000000000ull},
              {"5B", 5ull},           {"1K", 1024ull},      {"0", 0}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    cr_assert_eq(bs_parse_size(good[i].s, &v), 0, "%s", good[i].s);
    cr_assert_eq(v, good[i].v, "%s: %" PRIu64, good[i].s, v);
  }
  const char *bad[] = {"",
                       "GB",
                       "5 GB",
                       "-1GB",
                       "1.5GB",
                       "99999999999999999999",
                       "5b",
                       "5KX",
                       "5Mi",
                       "5iB",
                       "18446744073709551615GB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(bs_parse_size(bad[i], &v), -1, "%s", bad[i]);
  /* max_shard_size= takes it, but not 0 (no shards) */
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_write_spec_parse("max_shard_size=2GB", &v, &err), 0, "%s", err.msg);
  cr_assert_eq(v, 2000000000ull);
  cr_assert_eq(bs_write_spec_parse("max_shard_size=64M", &v, &err), 0, "%s", err.msg);
  cr_assert_eq(v, 64ull << 20);
  cr_assert_eq(bs_write_spec_parse("max_shard_size=0GB", &v, &err), -1);
  cr_assert(strstr(err.msg, "max_shard_size=0GB"), "%s", err.msg);
}

static char *slurp_str(const char *dir, const char *name)
{
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  size_t len;
  uint8_t *b = bs_test_slurp(p, &len);
  char *s = strndup((const char *)b, len);
  bs_free(b);
  return s;
}

Test(st_shard, a_new_set_gets_the_mode_and_a_new_shard_its_index_s)
{
  uint8_t mem[64] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "a", BS_DT_U8, 1, (uint64_t[]){20}, 0);
  bs_test_add(&cat, "b", BS_DT_U8, 1, (uint64_t[]){20}, 20);
  bs_test_add(&cat, "c", BS_DT_U8, 1, (uint64_t[]){20}, 40);
  bs_err err;
  bs_err_clear(&err);
  char *dir = bs_test_tmpdir("stshard");
  char path[4200], p[4200];
  snprintf(path, sizeof path, "%s/m.safetensors.index.json", dir);
  mode_t old = umask(022);
  struct bs_write_opts o = {.max_shard_size = 40, .has_mode = true, .mode = 0600};
  cr_assert_eq(bs_st_write_set(&cat, path, &o, &err), 0, "%s", err.msg);
  const char *two[] = {"m.safetensors.index.json", "m-00001-of-00002.safetensors",
                       "m-00002-of-00002.safetensors"};
  struct stat st;
  for (size_t i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, two[i]);
    cr_assert_eq(stat(p, &st), 0, "%s", p);
    cr_expect_eq(st.st_mode & 07777, 0600, "%s: %o", two[i], st.st_mode & 07777);
  }
  /* Resharded into three: the existing files keep their modes, the new
   * third shard gets the index's (0640 now), not the options' 0600. */
  cr_assert_eq(chmod(path, 0640), 0);
  o.max_shard_size = 20;
  cr_assert_eq(bs_st_write_set(&cat, path, &o, &err), 0, "%s", err.msg);
  umask(old);
  const char *three[] = {"m-00001-of-00003.safetensors", "m-00002-of-00003.safetensors",
                         "m-00003-of-00003.safetensors"};
  for (size_t i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, three[i]);
    cr_assert_eq(stat(p, &st), 0, "%s", p);
    cr_expect_eq(st.st_mode & 07777, 0640, "%s: %o", three[i], st.st_mode & 07777);
  }
  cr_assert_eq(stat(path, &st), 0);
  cr_expect_eq(st.st_mode & 07777, 0640, "the index keeps its mode: %o", st.st_mode & 07777);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}

Test(st_shard, writes_a_set_and_its_index_as_transformers_does)
{
  uint8_t mem[64];
  for (int i = 0; i < 64; i++)
    mem[i] = (uint8_t)i;
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "b", BS_DT_U8, 1, (uint64_t[]){20}, 0);
  bs_test_add(&cat, "a\xc3\xa9\xf0\x9f\x98\x80", BS_DT_U8, 1, (uint64_t[]){20}, 20);
  bs_test_add(&cat, "c", BS_DT_F32, 1, (uint64_t[]){2}, 40);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_catalog_add_meta(&cat, "total_size", "1", &err), 0);
  char *dir = bs_test_tmpdir("stshard");
  char path[4200];
  snprintf(path, sizeof path, "%s/m.safetensors", dir);
  struct bs_write_opts o = {.max_shard_size = 30};
  cr_assert_eq(bs_st_write_set(&cat, path, &o, &err), 0, "%s", err.msg);
  char *ix = slurp_str(dir, "m.safetensors.index.json");
  const char *want = "{\n  \"metadata\": {\n    \"total_size\": 48\n  },\n  \"weight_map\": {\n"
                     "    \"a\\u00e9\\ud83d\\ude00\": \"m-00002-of-00002.safetensors\",\n"
                     "    \"b\": \"m-00001-of-00002.safetensors\",\n"
                     "    \"c\": \"m-00002-of-00002.safetensors\"\n  }\n}\n";
  cr_assert_str_eq(ix, want);
  free(ix);
  snprintf(path, sizeof path, "%s/m-00002-of-00002.safetensors", dir);
  size_t len;
  uint8_t *b = bs_test_slurp(path, &len);
  struct bs_catalog back;
  cr_assert_eq(st_read_mem(&back, b, len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, 2);
  cr_assert_eq(back.nmeta, 1);
  cr_assert_str_eq(back.meta[0].key, "format", "total_size is the index's; shards get format=pt");
  cr_assert_str_eq(back.meta[0].value, "pt");
  bs_catalog_destroy(&back);
  bs_free(b);

  /* Without max_shard_size, the existing index's shards are kept. */
  bs_test_add(&cat, "d", BS_DT_U8, 1, (uint64_t[]){4}, 60);
  snprintf(path, sizeof path, "%s/m.safetensors.index.json", dir);
  o.max_shard_size = 0;
  cr_assert_eq(bs_st_write_set(&cat, path, &o, &err), 0, "%s", err.msg);
  ix = slurp_str(dir, "m.safetensors.index.json");
  cr_assert(strstr(ix, "\"d\": \"m-00002-of-00002.safetensors\""), "%s", ix);
  cr_assert(strstr(ix, "\"total_size\": 52"), "%s", ix);
  free(ix);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}
