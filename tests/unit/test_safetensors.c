/* SafeTensors reader: the test vectors of safetensors-format.md section 9,
 * every validation rule, every dtype, and the real fixture files. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"
#include "st_fixture.h"

/* The header of the reference crate's tests: 60 bytes, one I32 [2, 2]. */
#define H "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"

#define FIXTURES BS_FIXTURES_DIR "/burn"
#define MULTI_LAYER                                                                                \
  FIXTURES "/burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors"
#define MNIST FIXTURES "/examples/import-model-weights/weights/mnist.safetensors"

/* File offset of `needle` inside the header `h`. */
static uint64_t at(const char *h, const char *needle)
{
  const char *p = strstr(h, needle);
  cr_assert_not_null(p, "'%s' not in the header", needle);
  return 8 + (uint64_t)(p - h);
}

/* Read buf (freed here) and expect a failure with this code, offset, key
 * (NULL: don't care) and message substring. */
static void expect_fail(uint8_t *buf, size_t len, int code, uint64_t off, const char *key,
                        const char *sub)
{
  struct bs_catalog cat;
  bs_err err;
  bs_err_clear(&err);
  int rc = st_read_mem(&cat, buf, len, &err);
  cr_assert_eq(rc, -1, "expected failure containing '%s'", sub);
  cr_expect_eq(err.code, code, "code %d, want %d (%s)", err.code, code, err.msg);
  cr_expect_eq(err.off, off, "off %llu, want %llu (%s)", (unsigned long long)err.off,
               (unsigned long long)off, err.msg);
  cr_expect_not_null(strstr(err.msg, sub), "message '%s' lacks '%s'", err.msg, sub);
  if (key)
    cr_expect_str_eq(err.key, key);
  cr_expect_eq(cat.count, 0, "a failed read left %zu tensors", cat.count);
  cr_expect_eq(cat.nmeta, 0);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

static void expect_fail_h(const char *h, size_t dlen, int code, uint64_t off, const char *key,
                          const char *sub)
{
  size_t len;
  uint8_t *buf = st_build(h, dlen, &len);
  expect_fail(buf, len, code, off, key, sub);
}

/* Read and expect success; the caller checks and destroys cat, frees *buf. */
static void expect_ok(struct bs_catalog *cat, const uint8_t *buf, size_t len)
{
  bs_err err;
  bs_err_clear(&err);
  int rc = st_read_mem(cat, buf, len, &err);
  cr_assert_eq(rc, 0, "read failed: code %d off %llu key '%s': %s", err.code,
               (unsigned long long)err.off, err.key, err.msg);
}

static void expect_shape(const struct bs_tensor *t, uint32_t rank, const uint64_t *shape)
{
  cr_assert_eq(t->rank, rank, "'%s': rank %u, want %u", t->key, t->rank, rank);
  for (uint32_t i = 0; i < rank; i++)
    cr_expect_eq(t->shape[i], shape[i], "'%s': dim %u", t->key, i);
}

/* ---- Section 9 test vectors -------------------------------------------- */

Test(safetensors, vector_valid_i32_2x2)
{
  cr_assert_eq(strlen(H), 60);
  size_t len;
  uint8_t *buf = st_build(H, 16, &len);
  cr_assert_eq(bs_le64(buf), 0x3c);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 1);
  const struct bs_tensor *t = &cat.tensors[0];
  cr_expect_str_eq(t->key, "test");
  cr_expect_eq(t->dtype, BS_DT_I32);
  expect_shape(t, 2, (uint64_t[]){2, 2});
  cr_expect_eq(t->nbytes, 16);
  cr_expect_eq(t->src, 0);
  cr_expect_eq(t->off, 68);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, vector_trailing_bytes_rejected)
{
  size_t len;
  uint8_t *buf = st_build(H, 16 + 3, &len);
  expect_fail(buf, len, EINVAL, 84, NULL, "3 bytes after the last tensor");
}

Test(safetensors, vector_truncated_data_rejected)
{
  size_t len;
  uint8_t *buf = st_build(H, 14, &len);
  expect_fail(buf, len, EINVAL, 82, "test", "file has 82 bytes, header says 84");
}

Test(safetensors, vector_offsets_shorter_than_shape_rejected)
{
  const char *h = "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0, 4]}}";
  cr_assert_eq(strlen(h), 60);
  expect_fail_h(h, 4, EINVAL, 9, "test",
                "size mismatch: shape [2,2] x I32 = 16 bytes but data_offsets span 4");
}

Test(safetensors, vector_empty_tensor_2x0_valid)
{
  const char *h = "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,0],\"data_offsets\":[0, 0]}}";
  cr_assert_eq(strlen(h), 60);
  size_t len;
  uint8_t *buf = st_build(h, 0, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 1);
  expect_shape(&cat.tensors[0], 2, (uint64_t[]){2, 0});
  cr_expect_eq(cat.tensors[0].nbytes, 0);
  cr_expect_eq(cat.tensors[0].off, 68);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, vector_shape_2_pow_64_overflow_rejected)
{
  const char *h = "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,18446744073709551614],"
                  "\"data_offsets\":[0,16]}}";
  cr_assert_eq(strlen(h), 79);
  /* jansson stops right after the number token. */
  expect_fail_h(h, 16, EINVAL, at(h, ",\"data_offsets") - 1, "test",
                "integer too large: too big integer near '18446744073709551614'");
}

Test(safetensors, vector_header_too_large_rejected)
{
  uint8_t *buf = bs_malloc(16);
  memcpy(buf, "\x3c\x00\x00\x00\x00\xff\xff\xff{}      ", 16);
  expect_fail(buf, 16, EINVAL, 0, NULL,
              "header length 18446742974197923900 exceeds the limit of 100000000 bytes");
}

Test(safetensors, vector_empty_file_rejected)
{
  expect_fail(bs_malloc(1), 0, EINVAL, 0, NULL, "file is 0 bytes, too short");
}

Test(safetensors, vector_prefix_only_rejected)
{
  size_t len;
  uint8_t *buf = st_build_raw(0x3c, NULL, 0, 0, &len);
  expect_fail(buf, len, EINVAL, 0, NULL,
              "header length 60 runs past the end of the file: "
              "8 + 60 > file size 8");
}

Test(safetensors, vector_not_utf8_rejected)
{
  size_t len;
  uint8_t *buf = st_build_raw(1, "\xff", 1, 0, &len);
  expect_fail(buf, len, EINVAL, 8, NULL, "header is not valid UTF-8: unable to decode byte 0xff");
}

Test(safetensors, vector_unterminated_object_rejected)
{
  size_t len;
  uint8_t *buf = st_build_raw(1, "{", 1, 0, &len);
  expect_fail(buf, len, EINVAL, 9, NULL, "header is not valid JSON");
}

Test(safetensors, vector_trailing_whitespace_valid)
{
  size_t len;
  uint8_t *buf = st_build_raw(6, "{}\r \t\n", 6, 0, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.count, 0);
  cr_expect_eq(cat.nmeta, 0);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, vector_leading_whitespace_valid)
{
  size_t len;
  uint8_t *buf = st_build_raw(6, "\t\n{}\r ", 6, 0, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.count, 0);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, vector_gap_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}";
  expect_fail_h(h, 10, EINVAL, at(h, "\"b\""), "b",
                "gap: data_offsets start at 6, expected 4 where tensor 'a' ends (2 bytes");
}

Test(safetensors, vector_overlap_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}";
  expect_fail_h(h, 6, EINVAL, at(h, "\"b\""), "b",
                "overlap: data_offsets start at 2, expected 4 where tensor 'a' ends");
}

/* ---- Layout rules ------------------------------------------------------- */

Test(safetensors, first_tensor_not_at_zero_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}";
  expect_fail_h(h, 8, EINVAL, at(h, "\"a\""), "a",
                "gap: the first tensor in data order starts at 4, expected 0");
}

Test(safetensors, end_before_begin_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,2]}}";
  expect_fail_h(h, 4, EINVAL, at(h, "\"b\""), "b", "data_offsets [4, 2] end before they begin");
}

Test(safetensors, tied_weights_same_bytes_rejected)
{
  const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"tied\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  /* Equal ranges sort in header order, so the second name is the culprit. */
  expect_fail_h(h, 8, EINVAL, at(h, "\"tied\""), "tied", "overlap");
}

Test(safetensors, catalog_keeps_header_order_not_data_order)
{
  const char *h = "{\"z\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]},"
                  "\"m\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}";
  size_t len;
  uint8_t *buf = st_build(h, 10, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 3);
  const char *want[] = {"z", "m", "a"};
  const uint64_t begin[] = {6, 0, 2};
  uint64_t data = 8 + strlen(h);
  for (int i = 0; i < 3; i++) {
    cr_expect_str_eq(cat.tensors[i].key, want[i]);
    cr_expect_str_eq(cat.tensors[i].name, want[i]);
    cr_expect_eq(cat.tensors[i].off, data + begin[i]);
  }
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, empty_tensor_sharing_offset_with_next_valid)
{
  const char *h = "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                  "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"e2\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}";
  size_t len;
  uint8_t *buf = st_build(h, 8, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 4);
  cr_expect_eq(cat.tensors[1].nbytes, 0);
  cr_expect_eq(cat.tensors[3].nbytes, 0);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, scalar_shape_empty_is_one_element)
{
  const char *h = "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}";
  size_t len;
  uint8_t *buf = st_build(h, 4, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 1);
  cr_expect_eq(cat.tensors[0].rank, 0);
  cr_expect_null(cat.tensors[0].shape);
  cr_expect_eq(cat.tensors[0].nbytes, 4);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, scalar_with_zero_bytes_rejected)
{
  const char *h = "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,0]}}";
  expect_fail_h(h, 0, EINVAL, 9, "s", "shape [] x F32 = 4 bytes but data_offsets span 0");
}

/* Found by fuzzing: with only scalars there is no shape array at all, and
 * the reader did arithmetic on its NULL pointer (UBSan). */
Test(safetensors, only_scalars_size_mismatch_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,11]}}";
  expect_fail_h(h, 11, EINVAL, 61, "b",
                "size mismatch: shape [] x F32 = 4 bytes but data_offsets span 3");
}

Test(safetensors, zero_tensors_valid)
{
  size_t len;
  uint8_t *buf = st_build("{}", 0, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.count, 0);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, zero_tensors_with_data_rejected)
{
  expect_fail_h("{}", 1, EINVAL, 10, NULL, "1 bytes after the last tensor");
}

Test(safetensors, unknown_fields_in_entry_ignored)
{
  const char *h = "{\"a\":{\"x\":[1,{\"y\":null}],\"dtype\":\"U8\",\"shape\":[2],"
                  "\"data_offsets\":[0,2],\"z\":1.5e300}}";
  size_t len;
  uint8_t *buf = st_build(h, 2, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.count, 1);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, escaped_names_decoded)
{
  const char *h = "{\"a\\\"b\\\\c/d.\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1]},\"\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[1,2]}}";
  size_t len;
  uint8_t *buf = st_build(h, 2, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 2);
  cr_expect_str_eq(cat.tensors[0].key, "a\"b\\c/d.\xc3\xa9");
  cr_expect_str_eq(cat.tensors[1].key, "");
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

/* ---- dtypes -------------------------------------------------------------- */

Test(safetensors, every_dtype_parses_with_its_size)
{
  static const struct {
    const char *name;
    enum bs_dtype dt;
    unsigned bits;
  } all[] = {
      {"BOOL", BS_DT_BOOL, 8},
      {"F4", BS_DT_F4, 4},
      {"F6_E2M3", BS_DT_F6_E2M3, 6},
      {"F6_E3M2", BS_DT_F6_E3M2, 6},
      {"U8", BS_DT_U8, 8},
      {"I8", BS_DT_I8, 8},
      {"F8_E5M2", BS_DT_F8_E5M2, 8},
      {"F8_E4M3", BS_DT_F8_E4M3, 8},
      {"F8_E8M0", BS_DT_F8_E8M0, 8},
      {"F8_E4M3FNUZ", BS_DT_F8_E4M3FNUZ, 8},
      {"F8_E5M2FNUZ", BS_DT_F8_E5M2FNUZ, 8},
      {"I16", BS_DT_I16, 16},
      {"U16", BS_DT_U16, 16},
      {"F16", BS_DT_F16, 16},
      {"BF16", BS_DT_BF16, 16},
      {"I32", BS_DT_I32, 32},
      {"U32", BS_DT_U32, 32},
      {"F32", BS_DT_F32, 32},
      {"C64", BS_DT_C64, 64},
      {"F64", BS_DT_F64, 64},
      {"I64", BS_DT_I64, 64},
      {"U64", BS_DT_U64, 64},
  };
  cr_assert_eq(sizeof all / sizeof all[0], 22);
  /* All 22 in one file, 8 elements each, back to back. */
  char h[4096];
  size_t used = 0;
  uint64_t off = 0;
  used += (size_t)snprintf(h + used, sizeof h - used, "{");
  for (size_t i = 0; i < 22; i++) {
    uint64_t nb = 8 * all[i].bits / 8;
    used += (size_t)snprintf(h + used, sizeof h - used,
                             "%s\"t_%s\":{\"dtype\":\"%s\",\"shape\":[2,4],"
                             "\"data_offsets\":[%llu,%llu]}",
                             i ? "," : "", all[i].name, all[i].name, (unsigned long long)off,
                             (unsigned long long)(off + nb));
    off += nb;
  }
  snprintf(h + used, sizeof h - used, "}");
  size_t len;
  uint8_t *buf = st_build(h, off, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 22);
  for (size_t i = 0; i < 22; i++) {
    cr_expect_eq(cat.tensors[i].dtype, all[i].dt, "%s", all[i].name);
    cr_expect_eq(cat.tensors[i].nbytes, all[i].bits, "%s: %llu bytes", all[i].name,
                 (unsigned long long)cat.tensors[i].nbytes);
    cr_expect_str_eq(bs_dtype_name(cat.tensors[i].dtype), all[i].name);
  }
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, f4_even_count_is_half_a_byte_each)
{
  const char *h = "{\"q\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[0,3]}}";
  size_t len;
  uint8_t *buf = st_build(h, 3, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.tensors[0].nbytes, 3);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, f4_odd_count_misaligned_rejected)
{
  const char *h = "{\"q\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}";
  expect_fail_h(h, 2, EINVAL, 9, "q", "misaligned: 3 elements of 4-bit F4");
}

Test(safetensors, f6_multiple_of_four_valid)
{
  const char *h = "{\"q\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[0,3]}}";
  size_t len;
  uint8_t *buf = st_build(h, 3, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.tensors[0].nbytes, 3);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, f6_not_multiple_of_four_misaligned_rejected)
{
  const char *h = "{\"q\":{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}}";
  expect_fail_h(h, 2, EINVAL, 9, "q", "misaligned: 2 elements of 6-bit F6_E2M3");
}

Test(safetensors, unknown_dtype_rejected_as_unsupported)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"big\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[1,17]}}";
  expect_fail_h(h, 17, ENOTSUP, at(h, "\"big\""), "big", "unknown dtype \"F128\"");
}

Test(safetensors, burn_only_dtype_names_rejected)
{
  /* bs_dtype_from_name knows these, SafeTensors does not. */
  const char *names[] = {"C128", "FLEX32", "QFLOAT", "QI8", "BOOL_U8", "f32", "F32\\u0000"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char h[256];
    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"%s\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             names[i]);
    expect_fail_h(h, 4, ENOTSUP, 9, "a", "unknown dtype");
  }
}

/* ---- Numbers ------------------------------------------------------------- */

Test(safetensors, negative_number_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}";
  expect_fail_h(h, 0, EINVAL, 9, "a", "shape[0] is -1, not a non-negative integer");
}

Test(safetensors, real_number_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[16.0],\"data_offsets\":[0,16]}}";
  expect_fail_h(h, 16, EINVAL, 9, "a", "shape[0] is the real number 16");
}

Test(safetensors, exponent_number_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2e0]}}";
  expect_fail_h(h, 2, EINVAL, 9, "a", "data_offsets[1] is the real number 2");
}

Test(safetensors, string_and_null_numbers_rejected)
{
  expect_fail_h("{\"a\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, EINVAL, 9,
                "a", "shape[0] is a string, not a non-negative integer");
  expect_fail_h("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[null,2]}}", 2, EINVAL, 9,
                "a", "data_offsets[0] is null, not a non-negative integer");
}

Test(safetensors, offset_2_pow_64_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,"
                  "18446744073709551616]}}";
  expect_fail_h(h, 2, EINVAL, 8 + strlen(h) - 3, "a", "integer too large");
}

Test(safetensors, offset_2_pow_63_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,"
                  "9223372036854775808]}}";
  expect_fail_h(h, 2, EINVAL, 8 + strlen(h) - 3, "a", "must be below 2^63");
}

Test(safetensors, offset_2_pow_63_minus_1_is_parsed)
{
  /* The largest integer jansson keeps is accepted as a number; then the
   * size rule and the file size decide. */
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,9223372036854775807]}}";
  expect_fail_h(h, 1, EINVAL, 9, "a",
                "shape [1] x U8 = 1 bytes but data_offsets span 9223372036854775807");
  h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1152921504606846976],"
      "\"data_offsets\":[0,1152921504606846976]}}";
  expect_fail_h(h, 1, EINVAL, 8 + strlen(h) + 1, "a",
                "file has 98 bytes, header says 1152921504606847073");
}

Test(safetensors, shape_product_overflow_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,2],"
                  "\"data_offsets\":[0,4]}}";
  expect_fail_h(h, 4, EINVAL, 9, "a", "shape overflows");
}

Test(safetensors, rank_above_cap_unsupported)
{
  char h[1024];
  size_t used = (size_t)snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"U8\",\"shape\":[");
  for (int i = 0; i < BS_MAX_RANK + 1; i++)
    used += (size_t)snprintf(h + used, sizeof h - used, "%s1", i ? "," : "");
  snprintf(h + used, sizeof h - used, "],\"data_offsets\":[0,1]}}");
  expect_fail_h(h, 1, ENOTSUP, 9, "a", "rank 65 exceeds the limit of 64");
}

/* ---- JSON shape ---------------------------------------------------------- */

Test(safetensors, header_not_object_rejected)
{
  expect_fail_h("[]", 0, EINVAL, 8, NULL, "header is an array, not a JSON object");
}

Test(safetensors, entry_not_object_rejected)
{
  expect_fail_h("{\"a\":[1,2]}", 0, EINVAL, 9, "a", "entry is an array, not an object");
}

Test(safetensors, missing_fields_name_key_and_field)
{
  expect_fail_h("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, EINVAL, 9, "a",
                "missing field \"dtype\"");
  expect_fail_h("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, EINVAL, 9, "a",
                "missing field \"shape\"");
  expect_fail_h("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, EINVAL, 9, "a",
                "missing field \"data_offsets\"");
}

Test(safetensors, wrong_field_types_rejected)
{
  expect_fail_h("{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, EINVAL, 9, "a",
                "field \"dtype\" is an integer, not a string");
  expect_fail_h("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, EINVAL, 9, "a",
                "field \"shape\" is an integer, not an array");
  expect_fail_h("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, EINVAL, 9,
                "a", "data_offsets has 3 entries, expected [BEGIN, END]");
}

Test(safetensors, trailing_garbage_rejected)
{
  const char *h = "{} x";
  expect_fail_h(h, 0, EINVAL, 12, NULL, "trailing characters after the header's JSON object");
}

Test(safetensors, second_object_rejected)
{
  /* safetensors < 0.4.3 wrote this for metadata-only files (#466). */
  const char *h = "{},\"__metadata__\":{\"format\":\"pt\"}}";
  expect_fail_h(h, 0, EINVAL, 11, NULL, "trailing characters");
}

Test(safetensors, nul_padded_header_rejected)
{
  size_t len;
  uint8_t *buf = st_build_raw(8, "{}\0\0 \0\0\0", 8, 0, &len);
  expect_fail(buf, len, EINVAL, 10, NULL, "header is padded with NUL bytes (from header byte 2)");
}

Test(safetensors, nul_in_the_middle_rejected)
{
  size_t len;
  uint8_t *buf = st_build_raw(6, "{\0}   ", 6, 0, &len);
  expect_fail(buf, len, EINVAL, 10, NULL, "header is not valid JSON");
}

Test(safetensors, invalid_utf8_in_name_rejected)
{
  const char *h = "{\"\xc3\x28\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_h(h, 1, EINVAL, 10, NULL, "header is not valid UTF-8");
}

Test(safetensors, overlong_utf8_rejected)
{
  const char *h = "{\"\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_h(h, 1, EINVAL, 10, NULL, "not valid UTF-8");
}

Test(safetensors, nul_escape_in_name_unsupported)
{
  const char *h = "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_h(h, 1, ENOTSUP, 8 + 11, NULL, "contains \\u0000");
}

Test(safetensors, syntax_error_inside_entry_names_tensor)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[1,],\"data_offsets\":[1,2]}}";
  expect_fail_h(h, 2, EINVAL, at(h, ",],") + 2, "b", "header is not valid JSON");
}

Test(safetensors, deep_nesting_rejected_without_crash)
{
  /* 100k '[' in an unknown field: jansson stops at its depth limit. */
  size_t depth = 100000, hlen = 0;
  char *h = bs_malloc(depth + 64);
  cr_assert_not_null(h);
  hlen += (size_t)sprintf(h, "{\"a\":{\"x\":");
  memset(h + hlen, '[', depth);
  hlen += depth;
  h[hlen++] = '}';
  size_t len;
  uint8_t *buf = st_build_raw(hlen, h, hlen, 0, &len);
  struct bs_catalog cat;
  bs_err err;
  bs_err_clear(&err);
  cr_expect_eq(st_read_mem(&cat, buf, len, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  cr_expect_str_eq(err.key, "a");
  cr_expect_not_null(strstr(err.msg, "maximum parsing depth"), "%s", err.msg);
  bs_catalog_destroy(&cat);
  bs_free(buf);
  bs_free(h);
}

/* ---- Duplicates ------------------------------------------------------------ */

Test(safetensors, duplicate_tensor_name_rejected)
{
  const char *h = "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}";
  expect_fail_h(h, 2, EINVAL, at(h, ",\"w\"") + 1, "w", "duplicate tensor name 'w'");
}

Test(safetensors, duplicate_escaped_name_decoded)
{
  /* "a\"" and "a\u0022" are the same name. */
  const char *h = "{\"a\\\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"a\\u0022\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}";
  expect_fail_h(h, 2, EINVAL, at(h, "\"a\\u0022"), "a\"", "duplicate tensor name 'a\"'");
}

Test(safetensors, duplicate_metadata_rejected)
{
  const char *h = "{\"__metadata__\":{},\"__metadata__\":null}";
  expect_fail_h(h, 0, EINVAL, at(h, ",\"__") + 1, NULL, "duplicate __metadata__");
}

Test(safetensors, duplicate_field_in_entry_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],"
                  "\"data_offsets\":[0,1]}}";
  expect_fail_h(h, 1, EINVAL, at(h, ",\"dtype") + 1, NULL,
                "duplicate key in the header: duplicate object key near '\"dtype\"'");
}

/* ---- __metadata__ ---------------------------------------------------------- */

Test(safetensors, metadata_parsed_in_order)
{
  const char *h = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9\",\"e\":\"\"},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  size_t len;
  uint8_t *buf = st_build(h, 1, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 1);
  cr_assert_eq(cat.nmeta, 3);
  cr_expect_str_eq(cat.meta[0].key, "format");
  cr_expect_str_eq(cat.meta[0].value, "pt");
  cr_expect_str_eq(cat.meta[1].key, "note");
  cr_expect_str_eq(cat.meta[1].value, "caf\xc3\xa9");
  cr_expect_str_eq(cat.meta[2].key, "e");
  cr_expect_str_eq(cat.meta[2].value, "");
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, metadata_only_file_valid)
{
  size_t len;
  uint8_t *buf = st_build("{\"__metadata__\":{\"format\":\"np\"}}", 0, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.count, 0);
  cr_expect_eq(cat.nmeta, 1);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, metadata_null_is_none)
{
  size_t len;
  uint8_t *buf = st_build("{\"__metadata__\":null}", 0, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_expect_eq(cat.nmeta, 0);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, metadata_non_string_value_rejected)
{
  const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"__metadata__\":{\"format\":\"pt\",\"epoch\":3}}";
  expect_fail_h(h, 1, EINVAL, at(h, "\"__metadata__\""), NULL,
                "__metadata__ value of \"epoch\" is an integer; metadata values must be strings");
  expect_fail_h("{\"__metadata__\":{\"x\":{\"y\":\"z\"}}}", 0, EINVAL, 9, NULL,
                "is an object; metadata values must be strings");
}

Test(safetensors, metadata_not_object_rejected)
{
  expect_fail_h("{\"__metadata__\":[\"pt\"]}", 0, EINVAL, 9, NULL,
                "__metadata__ is an array, not an object of strings");
  expect_fail_h("{\"__metadata__\":\"pt\"}", 0, EINVAL, 9, NULL,
                "__metadata__ is a string, not an object of strings");
}

Test(safetensors, metadata_value_with_nul_unsupported)
{
  expect_fail_h("{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, ENOTSUP, 9, NULL,
                "__metadata__ value of \"k\" contains \\u0000");
}

Test(safetensors, tensor_named_metadata_is_reserved)
{
  /* What a writer before #850 produced: the reference reader rejects it. */
  const char *h = "{\"__metadata__\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  expect_fail_h(h, 1, EINVAL, 9, NULL,
                "__metadata__ value of \"shape\" is an array; metadata values must be strings");
}

/* ---- Reading bytes back ------------------------------------------------------ */

Test(safetensors, bytes_read_at_absolute_offsets)
{
  /* N = 61: an odd header, so nothing is aligned. */
  const char *h = "{\"b\":{\"dtype\":\"U16\",\"shape\":[3],\"data_offsets\":[5,11]},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[0,5]}} ";
  size_t len;
  uint8_t *buf = st_build(h, 11, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 2);
  uint8_t got[16];
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, sizeof got), 6);
  for (size_t i = 0; i < 6; i++)
    cr_expect_eq(got[i], st_data_byte(5 + i));
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[1], 2, got, sizeof got), 3);
  for (size_t i = 0; i < 3; i++)
    cr_expect_eq(got[i], st_data_byte(2 + i));
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, open_any_sniffs_and_reads)
{
  size_t len;
  uint8_t *buf = st_build_raw(64,
                              "\n\t{}"
                              "                                                  "
                              "          ",
                              64, 0, &len);
  struct bs_catalog cat;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_test_open_mem(&cat, buf, len, &err), 0, "%s", err.msg);
  cr_expect_eq(cat.format, BS_FMT_SAFETENSORS);
  bs_catalog_destroy(&cat);
  bs_free(buf);

  buf = st_build(H, 16, &len);
  bs_err_clear(&err);
  cr_assert_eq(bs_test_open_mem(&cat, buf, len, &err), 0, "%s", err.msg);
  cr_expect_eq(cat.count, 1);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, src_index_out_of_range_rejected)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err err;
  bs_err_clear(&err);
  cr_expect_eq(bs_st_read(&cat, 0, NULL, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  bs_catalog_destroy(&cat);
}

/* ---- Real files ------------------------------------------------------------ */

static void check_against_file(const struct bs_catalog *cat, const uint8_t *file, size_t len)
{
  uint64_t n = bs_le64(file), end = 0;
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    cr_assert(t->off >= 8 + n && t->off <= len && t->nbytes <= len - t->off, "'%s'", t->key);
    uint8_t *got = bs_malloc(t->nbytes + 1);
    cr_assert_eq(bs_tensor_read(cat, t, 0, got, t->nbytes), (long)t->nbytes, "'%s'", t->key);
    cr_expect_eq(memcmp(got, file + t->off, t->nbytes), 0, "'%s' bytes differ", t->key);
    bs_free(got);
    if (t->off + t->nbytes > end)
      end = t->off + t->nbytes;
  }
  cr_expect_eq(end, len);
}

Test(safetensors, real_multi_layer_file)
{
  size_t len;
  uint8_t *file = bs_test_slurp(MULTI_LAYER, &len);
  cr_assert_eq(len, 17624);
  struct bs_src src;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_src_open(&src, MULTI_LAYER, &err), 0, "%s", err.msg);
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  uint32_t idx;
  cr_assert_eq(bs_catalog_add_src(&cat, &src, &idx, &err), 0);
  cr_assert_eq(bs_st_read(&cat, idx, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(cat.count, 9);
  cr_expect_eq(cat.nmeta, 0);
  static const struct {
    const char *key;
    enum bs_dtype dt;
    uint32_t rank;
    uint64_t shape[4];
  } want[] = {
      {"norm1.num_batches_tracked", BS_DT_I64, 0, {0}},
      {"conv1.bias", BS_DT_F32, 1, {4}},
      {"conv1.weight", BS_DT_F32, 4, {4, 3, 3, 3}},
      {"fc1.bias", BS_DT_F32, 1, {16}},
      {"fc1.weight", BS_DT_F32, 2, {16, 256}},
      {"norm1.bias", BS_DT_F32, 1, {4}},
      {"norm1.running_mean", BS_DT_F32, 1, {4}},
      {"norm1.running_var", BS_DT_F32, 1, {4}},
      {"norm1.weight", BS_DT_F32, 1, {4}},
  };
  for (size_t i = 0; i < 9; i++) {
    const struct bs_tensor *t = &cat.tensors[i];
    cr_expect_str_eq(t->key, want[i].key);
    cr_expect_eq(t->dtype, want[i].dt, "%s", t->key);
    expect_shape(t, want[i].rank, want[i].shape);
  }
  cr_expect_eq(cat.tensors[0].off, 8 + 648);
  cr_expect_eq(cat.tensors[0].nbytes, 8);
  cr_expect_eq(cat.tensors[4].off, 8 + 648 + 520);
  cr_expect_eq(cat.tensors[4].nbytes, 16 * 256 * 4);
  int fd;
  uint64_t abs;
  cr_expect(bs_tensor_fd_range(&cat, &cat.tensors[4], &fd, &abs));
  cr_expect_eq(abs, 8 + 648 + 520);
  check_against_file(&cat, file, len);
  bs_catalog_destroy(&cat);
  bs_free(file);
}

Test(safetensors, real_mnist_file)
{
  size_t len;
  uint8_t *file = bs_test_slurp(MNIST, &len);
  struct bs_catalog cat;
  expect_ok(&cat, file, len);
  cr_assert_eq(cat.count, 20);
  cr_expect_str_eq(cat.tensors[0].key, "norm1.num_batches_tracked");
  long fc1 = bs_catalog_find(&cat, "fc1.weight");
  cr_assert_geq(fc1, 0);
  expect_shape(&cat.tensors[fc1], 2, (uint64_t[]){32, 11616});
  cr_expect_eq(cat.tensors[fc1].nbytes, 32 * 11616 * 4);
  long conv2 = bs_catalog_find(&cat, "conv2.weight");
  cr_assert_geq(conv2, 0);
  expect_shape(&cat.tensors[conv2], 4, (uint64_t[]){16, 8, 3, 3});
  check_against_file(&cat, file, len);
  bs_catalog_destroy(&cat);
  bs_free(file);
}

/* ---- Scale and allocation failures --------------------------------------------- */

/* A header of n F32 [4] tensors named "layers.<i>.weight". */
static char *many_header(size_t n, size_t *hlen)
{
  size_t cap = n * 96 + 64, used = 0;
  char *h = bs_malloc(cap);
  cr_assert_not_null(h);
  h[used++] = '{';
  for (size_t i = 0; i < n; i++)
    used += (size_t)snprintf(h + used, cap - used,
                             "%s\"layers.%zu.weight\":{\"dtype\":\"F32\",\"shape\":[4],"
                             "\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", i, i * 16, i * 16 + 16);
  h[used++] = '}';
  h[used] = '\0';
  *hlen = used;
  return h;
}

Test(safetensors, header_of_50k_tensors)
{
  size_t hlen, len;
  char *h = many_header(50000, &hlen);
  uint8_t *buf = st_build_raw(hlen, h, hlen, 50000 * 16, &len);
  struct bs_catalog cat;
  expect_ok(&cat, buf, len);
  cr_assert_eq(cat.count, 50000);
  cr_expect_str_eq(cat.tensors[49999].key, "layers.49999.weight");
  cr_expect_eq(cat.tensors[49999].off, 8 + hlen + 49999 * 16);
  bs_catalog_destroy(&cat);
  bs_free(buf);
  bs_free(h);
}

/* Fail each allocation in turn until the read succeeds; returns how many
 * allocations the read made. */
static long oom_loop(const char *h)
{
  size_t len;
  uint8_t *buf = st_build(h, 20, &len);
  long n = 0;
  for (;; n++) {
    struct bs_catalog cat;
    bs_err err;
    bs_err_clear(&err);
    bs_alloc_fail_after(n);
    int rc = st_read_mem(&cat, buf, len, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0) {
      cr_expect_eq(cat.count, 2);
      cr_expect_eq(cat.nmeta, 2);
      bs_catalog_destroy(&cat);
      break;
    }
    cr_expect_eq(err.code, ENOMEM, "allocation %ld: code %d: %s", n, err.code, err.msg);
    cr_expect_eq(cat.count, 0);
    bs_catalog_destroy(&cat);
    cr_assert_lt(n, 10000, "never succeeds");
  }
  bs_free(buf);
  return n;
}

Test(safetensors, out_of_memory_at_every_allocation)
{
  /* The streaming pass: a handful of allocations, no JSON tree. */
  long n = oom_loop("{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[4,20]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}");
  cr_expect_gt(n, 3, "only %ld allocations", n);
  cr_expect_lt(n, 20, "%ld allocations: the streaming pass should build no tree", n);
  /* An unknown field sends the header to jansson, whose allocations are
   * counted too: a header this size takes dozens. */
  n = oom_loop("{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[4,20]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1}}");
  cr_expect_gt(n, 30, "only %ld allocations: is jansson routed through bs_malloc?", n);
}

/* The streaming pass and the jansson path read a header the same: the
 * second header differs only by an ignored field, which the streaming pass
 * leaves to jansson. */
static void expect_same(const char *fast, const char *slow, size_t dlen)
{
  struct bs_catalog a, b;
  size_t la, lb;
  uint8_t *ba = st_build(fast, dlen, &la), *bb = st_build(slow, dlen, &lb);
  expect_ok(&a, ba, la);
  expect_ok(&b, bb, lb);
  cr_assert_eq(a.count, b.count);
  for (size_t i = 0; i < a.count; i++) {
    const struct bs_tensor *x = &a.tensors[i], *y = &b.tensors[i];
    cr_expect_str_eq(x->key, y->key, "tensor %zu", i);
    cr_expect_eq(x->dtype, y->dtype, "%s", x->key);
    cr_expect_eq(x->rank, y->rank, "%s", x->key);
    for (uint32_t d = 0; d < x->rank && d < y->rank; d++)
      cr_expect_eq(x->shape[d], y->shape[d], "%s", x->key);
    cr_expect_eq(x->off - la, y->off - lb, "%s", x->key);
    cr_expect_eq(x->nbytes, y->nbytes, "%s", x->key);
  }
  cr_assert_eq(a.nmeta, b.nmeta);
  for (size_t i = 0; i < a.nmeta; i++) {
    cr_expect_str_eq(a.meta[i].key, b.meta[i].key);
    cr_expect_str_eq(a.meta[i].value, b.meta[i].value);
  }
  bs_catalog_destroy(&a);
  bs_catalog_destroy(&b);
  bs_free(ba);
  bs_free(bb);
}

Test(safetensors, streaming_pass_reads_as_jansson_does)
{
  /* Escapes, UTF-8, whitespace, a metadata value holding JSON, header order. */
  expect_same(" {\"__metadata__\" : {\"cfg\":\"{\\\"a\\\": [1, 2]}\\n\\t\\/\", "
              "\"\\u00e9t\\u00e9\":\"\\ud83d\\ude00\"},\n"
              "\"z.caf\xc3\xa9\":{\"dtype\":\"BF16\",\"shape\":[1, 2],\"data_offsets\":[0,4]},"
              "\"a\\\"q\\u0041\":{\"shape\":[0],\"dtype\":\"U8\",\"data_offsets\":[4,4]},"
              "\"m\":{\"data_offsets\":[4,12],\"dtype\":\"F64\",\"shape\":[]} } \r\n",
              " {\"__metadata__\" : {\"cfg\":\"{\\\"a\\\": [1, 2]}\\n\\t\\/\", "
              "\"\\u00e9t\\u00e9\":\"\\ud83d\\ude00\"},\n"
              "\"z.caf\xc3\xa9\":{\"dtype\":\"BF16\",\"shape\":[1, 2],\"data_offsets\":[0,4]},"
              "\"a\\\"q\\u0041\":{\"shape\":[0],\"dtype\":\"U8\",\"data_offsets\":[4,4]},"
              "\"m\":{\"data_offsets\":[4,12],\"dtype\":\"F64\",\"shape\":[],\"u\":null} } \r\n",
              12);
  struct bs_catalog cat;
  size_t len;
  uint8_t *buf =
      st_build("{\"a\\\"q\\u0041\":{\"shape\":[1],\"dtype\":\"U8\",\"data_offsets\":[0,1]},"
               "\"__metadata__\":null}",
               1, &len);
  expect_ok(&cat, buf, len);
  cr_expect_str_eq(cat.tensors[0].key, "a\"qA");
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

/* A header the streaming pass must not accept: the jansson path's verdict. */
static void doubt(const char *h, size_t dlen, int code, const char *key, const char *sub)
{
  size_t len;
  uint8_t *buf = st_build(h, dlen, &len);
  struct bs_catalog cat;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(st_read_mem(&cat, buf, len, &err), -1, "%s: accepted", h);
  cr_expect_eq(err.code, code, "%s: code %d (%s)", h, err.code, err.msg);
  cr_expect_not_null(strstr(err.msg, sub), "%s: message '%s' lacks '%s'", h, err.msg, sub);
  if (key)
    cr_expect_str_eq(err.key, key, "%s", h);
  cr_expect_eq(cat.count, 0);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(safetensors, streaming_pass_leaves_every_doubt_to_jansson)
{
  /* Each of these is decided (and worded) by the jansson path. */
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
        8, EINVAL, "a", "duplicate tensor name 'a'");
  doubt("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
        "\"data_offsets\":[0,4]}}",
        4, EINVAL, NULL, "duplicate key");
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, EINVAL, NULL,
        "not valid JSON");
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, EINVAL, "a",
        "real number");
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, EINVAL, "a",
        "not a non-negative integer");
  doubt("{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ENOTSUP, NULL,
        "\\u0000");
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, EINVAL, NULL,
        "trailing characters");
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, EINVAL, NULL,
        "not valid JSON");
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, EINVAL, "a",
        "missing field \"data_offsets\"");
  doubt("{\"\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, EINVAL, NULL,
        "UTF-8");
  doubt("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"__metadata__\":{\"k\":1}}",
        4, EINVAL, NULL, "must be strings");
}

Test(safetensors, a_failing_read_at_any_allocation_leaves_the_catalog_as_it_was)
{
  static const char h[] =
      "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
      "\"data_offsets\":[0,8]},\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]}}";
  size_t len;
  uint8_t *b = st_build(h, 10, &len);
  cr_assert_gt(bs_test_rollback_sweep_mem(b, len, "m.safetensors", bs_st_read), 0);
  bs_free(b);
}
