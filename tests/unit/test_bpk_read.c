#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpk_fixture.h"
#include "bs_test.h"
#include "core/alloc.h"
#include "formats/formats.h"

#define MNIST BS_FIXTURES_DIR "/burn/examples/mnist-inference-web/model.bpk"

static const struct bs_tensor *find(const struct bs_catalog *cat, const char *key)
{
  long i = bs_catalog_find(cat, key);
  cr_assert_geq(i, 0, "no tensor '%s'", key);
  return &cat->tensors[i];
}

static const char *meta_get(const struct bs_catalog *cat, const char *key)
{
  for (size_t i = 0; i < cat->nmeta; i++)
    if (strcmp(cat->meta[i].key, key) == 0)
      return cat->meta[i].value;
  return NULL;
}

static float f32_at(const struct bs_catalog *cat, const struct bs_tensor *t, size_t i)
{
  float v;
  cr_assert_eq(bs_tensor_read(cat, t, i * 4, &v, 4), 4);
  return v;
}

static void expect_ok(const struct bpk_fixture *f, struct bs_catalog *cat)
{
  bs_err err;
  int rc = bpk_fixture_read(cat, f->data, f->len, &err);
  cr_assert_eq(rc, 0, "read failed: code %d off %llu key '%s': %s", err.code,
               (unsigned long long)err.off, err.key, err.msg);
}

/* ---- valid files -------------------------------------------------------------------------- */

Test(bpk_read, fixture_reads_three_tensors_with_absolute_offsets)
{
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_build(BPK_FIX_NONE, &f);
  expect_ok(&f, &cat);
  cr_assert_eq(cat.count, 3);
  const struct bs_tensor *w = find(&cat, "enc.weight"), *b = find(&cat, "enc.bias"),
                         *s = find(&cat, "step");
  cr_assert_eq(w->dtype, BS_DT_F32);
  cr_assert_eq(w->rank, 2);
  cr_assert_eq(w->shape[0], 2);
  cr_assert_eq(w->shape[1], 3);
  cr_assert_eq(w->nbytes, 24);
  cr_assert_eq(w->off, f.data_start);
  cr_assert(w->has_param_id);
  cr_assert_eq(w->x->param_id, 300);
  cr_assert_eq(b->off, f.data_start + 256);
  cr_assert_not(b->has_param_id);
  cr_assert_eq(s->dtype, BS_DT_I64);
  cr_assert_eq(s->rank, 0);
  cr_assert_eq(s->nbytes, 8);
  cr_assert_eq(s->off, f.data_start + 512);
  cr_assert_eq(s->x->param_id, 1ull << 40);
  cr_assert_float_eq(f32_at(&cat, w, 5), 6.0f, 0);
  cr_assert_float_eq(f32_at(&cat, b, 1), -1.0f, 0);
  int64_t st;
  cr_assert_eq(bs_tensor_read(&cat, s, 0, &st, 8), 8);
  cr_assert_eq(st, -7);
  cr_assert_eq(cat.nmeta, 1);
  cr_assert_str_eq(meta_get(&cat, "producer"), "fixture");
  cr_assert_null(cat.values_json);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, spec_example_520_bytes_gives_two_tensors)
{
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_example11(&f);
  expect_ok(&f, &cat);
  cr_assert_eq(cat.count, 2);
  const struct bs_tensor *w = find(&cat, "fc.weight"), *b = find(&cat, "fc.bias");
  cr_assert_eq(w->dtype, BS_DT_F32);
  cr_assert_eq(w->rank, 2);
  cr_assert_eq(w->shape[0], 2);
  cr_assert_eq(w->shape[1], 2);
  cr_assert_eq(w->off, 256);
  cr_assert_eq(w->nbytes, 16);
  cr_assert(w->has_param_id);
  cr_assert_eq(w->x->param_id, 7);
  cr_assert_eq(b->dtype, BS_DT_F32);
  cr_assert_eq(b->rank, 1);
  cr_assert_eq(b->shape[0], 2);
  cr_assert_eq(b->off, 512);
  cr_assert_eq(b->nbytes, 8);
  cr_assert_not(b->has_param_id);
  for (int i = 0; i < 4; i++)
    cr_assert_float_eq(f32_at(&cat, w, (size_t)i), (float)(i + 1), 0);
  cr_assert_float_eq(f32_at(&cat, b, 0), 0.5f, 0);
  cr_assert_float_eq(f32_at(&cat, b, 1), -1.0f, 0);
  cr_assert_eq(cat.nmeta, 3);
  cr_assert_str_eq(meta_get(&cat, "format"), "burnpack");
  cr_assert_str_eq(meta_get(&cat, "producer"), "burn");
  cr_assert_str_eq(meta_get(&cat, "version"), "0.22.0-pre.2");
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

static void check_mnist(const struct bs_catalog *cat)
{
  cr_assert_eq(cat->count, 18);
  cr_assert_eq(cat->nmeta, 0);
  for (size_t i = 0; i < cat->count; i++) {
    cr_assert_eq(cat->tensors[i].dtype, BS_DT_F32, "%s", cat->tensors[i].key);
    cr_assert(cat->tensors[i].has_param_id, "%s", cat->tensors[i].key);
  }
  const struct bs_tensor *c = find(cat, "conv1.conv.weight");
  cr_assert_eq(c->rank, 4);
  cr_assert_eq(c->shape[0], 64);
  cr_assert_eq(c->shape[1], 1);
  cr_assert_eq(c->shape[2], 3);
  cr_assert_eq(c->shape[3], 3);
  cr_assert_eq(c->off, 1536);
  cr_assert_eq(find(cat, "conv1.conv.bias")->off, 1536 + 2304);
  const struct bs_tensor *fc3 = find(cat, "fc3.bias");
  cr_assert_eq(fc3->off + fc3->nbytes, 1044776);
  const struct bs_tensor *fc1 = find(cat, "fc1.weight");
  cr_assert_eq(fc1->shape[0], 1600);
  cr_assert_eq(fc1->shape[1], 128);
}

Test(bpk_read, mnist_model_from_memory_has_18_f32_tensors)
{
  size_t len;
  uint8_t *buf = bs_test_slurp(MNIST, &len);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(len, 1044776);
  cr_assert_eq(bpk_fixture_read(&cat, buf, len, &err), 0, "%s", err.msg);
  check_mnist(&cat);
  bs_catalog_destroy(&cat);
  bs_free(buf);
}

Test(bpk_read, mnist_model_from_fd_through_open_any)
{
  struct bs_src src;
  struct bs_catalog cat;
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(&cat);
  cr_assert_eq(bs_src_open(&src, MNIST, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_open_any(&cat, &src, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(cat.format, BS_FMT_BURNPACK);
  check_mnist(&cat);
  bs_catalog_destroy(&cat);
}

Test(bpk_read, unaligned_019_layout_reads_data_after_metadata)
{
  static const uint8_t w[24] = {1, 2, 3}, b[12] = {9, 9, 9};
  struct bpk_fix_tensor t[] = {
      {.name = "w", .rank = 2, .shape = {2, 3}, .start = 0, .end = 24, .bytes = w},
      {.name = "b", .rank = 1, .shape = {3}, .start = 24, .end = 36, .bytes = b},
      {.name = "e", .rank = 1, .shape = {0}, .start = 36, .end = 36},
  };
  struct bpk_fix_spec s = {.t = t, .n = 3, .unaligned = true};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  cr_assert_neq((10 + f.meta_len) % 256, 0, "both layouts would coincide");
  cr_assert_eq(f.len, 10 + f.meta_len + 36);
  expect_ok(&f, &cat);
  cr_assert_eq(find(&cat, "w")->off, 10 + f.meta_len);
  cr_assert_eq(find(&cat, "b")->off, 10 + f.meta_len + 24);
  cr_assert_eq(find(&cat, "e")->nbytes, 0);
  uint8_t got[12];
  cr_assert_eq(bs_tensor_read(&cat, find(&cat, "b"), 0, got, 12), 12);
  cr_assert_arr_eq(got, b, 12);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, unaligned_file_with_a_gap_is_truncated)
{
  struct bpk_fix_tensor t[] = {
      {.name = "w", .rank = 1, .shape = {6}, .start = 0, .end = 24},
      {.name = "b", .rank = 1, .shape = {3}, .start = 28, .end = 40},
  };
  struct bpk_fix_spec s = {.t = t, .n = 2, .unaligned = true};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bs_err err;
  bpk_fixture_custom(&s, &f);
  cr_assert_eq(bpk_fixture_read(&cat, f.data, f.len, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_eq(err.off, f.len);
  cr_assert_str_eq(err.key, "b");
  cr_assert(strstr(err.msg, "truncated: data ends at"), "%s", err.msg);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, aligned_file_with_trailing_bytes_is_accepted)
{
  struct bpk_fix_tensor t[] = {{.name = "w", .rank = 1, .shape = {6}, .start = 0, .end = 24}};
  struct bpk_fix_spec s = {.t = t, .n = 1, .trailing = 1000};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  expect_ok(&f, &cat);
  cr_assert_eq(find(&cat, "w")->off, f.data_start);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, bool_forms_map_to_bool_dtypes)
{
  static const uint8_t bare[] = {0x64, 'B', 'o', 'o', 'l'};
  static const uint8_t native[] = {0xa1, 0x64, 'B', 'o', 'o', 'l', 0x66,
                                   'N',  'a',  't', 'i', 'v', 'e'};
  static const uint8_t u8[] = {0xa1, 0x64, 'B', 'o', 'o', 'l', 0x62, 'U', '8'};
  static const uint8_t u32[] = {0xa1, 0x64, 'B', 'o', 'o', 'l', 0x63, 'U', '3', '2'};
  struct bpk_fix_tensor t[] = {
      {.name = "bare",
       .dtype_raw = bare,
       .dtype_len = sizeof bare,
       .rank = 1,
       .shape = {3},
       .start = 0,
       .end = 3},
      {.name = "native",
       .dtype_raw = native,
       .dtype_len = sizeof native,
       .rank = 1,
       .shape = {3},
       .start = 256,
       .end = 259},
      {.name = "u8",
       .dtype_raw = u8,
       .dtype_len = sizeof u8,
       .rank = 1,
       .shape = {3},
       .start = 512,
       .end = 515},
      {.name = "u32",
       .dtype_raw = u32,
       .dtype_len = sizeof u32,
       .rank = 1,
       .shape = {3},
       .start = 768,
       .end = 780},
  };
  struct bpk_fix_spec s = {.t = t, .n = 4};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  expect_ok(&f, &cat);
  cr_assert_eq(find(&cat, "bare")->dtype, BS_DT_BOOL);
  cr_assert_eq(find(&cat, "native")->dtype, BS_DT_BOOL);
  cr_assert_eq(find(&cat, "u8")->dtype, BS_DT_BOOL_U8);
  cr_assert_eq(find(&cat, "u32")->dtype, BS_DT_BOOL_U32);
  cr_assert_eq(find(&cat, "u32")->nbytes, 12);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

/* {"QFloat": {"value": "Q8S", "store": "Native", "mode": "Symmetric", "tensor": "F32",
 *             "block": null}} */
static const uint8_t qfloat[] = {
    0xa1, 0x66, 'Q',  'F',  'l', 'o', 'a', 't',  0xa5, 0x65, 'v', 'a', 'l', 'u',  'e', 0x63, 'Q',
    '8',  'S',  0x65, 's',  't', 'o', 'r', 'e',  0x66, 'N',  'a', 't', 'i', 'v',  'e', 0x64, 'm',
    'o',  'd',  'e',  0x69, 'S', 'y', 'm', 'm',  'e',  't',  'r', 'i', 'c', 0x66, 't', 'e',  'n',
    's',  'o',  'r',  0x63, 'F', '3', '2', 0x65, 'b',  'l',  'o', 'c', 'k', 0xf6};

Test(bpk_read, qfloat_is_opaque_and_keeps_its_raw_dtype)
{
  struct bpk_fix_tensor t[] = {{.name = "q",
                                .dtype_raw = qfloat,
                                .dtype_len = sizeof qfloat,
                                .rank = 2,
                                .shape = {4, 4},
                                .start = 0,
                                .end = 20}};
  struct bpk_fix_spec s = {.t = t, .n = 1};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  expect_ok(&f, &cat);
  const struct bs_tensor *q = find(&cat, "q");
  cr_assert_eq(q->dtype, BS_DT_QFLOAT);
  cr_assert_eq(q->nbytes, 20);
  cr_assert_eq(q->x->dtype_raw_len, sizeof qfloat);
  cr_assert_arr_eq(q->x->dtype_raw, qfloat, sizeof qfloat);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, zero_tensor_file_of_256_bytes)
{
  struct bpk_fix_spec s = {0};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  cr_assert_eq(f.len, 256);
  expect_ok(&f, &cat);
  cr_assert_eq(cat.count, 0);
  bs_catalog_destroy(&cat);
  /* Any size from 10 + M on is fine with no tensors. */
  bs_err err;
  cr_assert_eq(bpk_fixture_read(&cat, f.data, 10 + f.meta_len, &err), 0, "%s", err.msg);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, version_zero_is_accepted)
{
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_build(BPK_FIX_NONE, &f);
  f.data[4] = 0;
  expect_ok(&f, &cat);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

/* Indefinite lengths, a tag, non-shortest integers, an unknown key, param_id null. */
Test(bpk_read, lenient_cbor_forms_are_accepted)
{
  static const uint8_t meta[] = {
      0xbf,                                                           /* map (indefinite) */
      0x7f, 0x63, 't',  'e', 'n', 0x64, 's',  'o',  'r',  's',  0xff, /* "tensors" in 2 chunks */
      0xd9, 0xd9, 0xf7,                                               /* tag 55799 */
      0xbf, 0x61, 'a',                                                /* { "a": */
      0xbf, 0x65, 'd',  't', 'y', 'p',  'e',  0x63, 'F',  '3',  '2',  /* {"dtype": "F32", */
      0x65, 's',  'h',  'a', 'p', 'e',  0x9f, 0x1a, 0,    0,    0,    2,    0xff, /* "shape": [2] */
      0x6c, 'd',  'a',  't', 'a', '_',  'o',  'f',  'f',  's',  'e',  't',  's',  0x82,
      0x18, 0x00, 0x1b, 0,   0,   0,    0,    0,    0,    0,    8, /* [0, 8] */
      0x68, 'p',  'a',  'r', 'a', 'm',  '_',  'i',  'd',  0xf6,    /* null */
      0x67, 'u',  'n',  'k', 'n', 'o',  'w',  'n',  0xa1, 0x01, 0x82, 0x80, 0xf5, 0xff,
      0xff, 0x65, 'f',  'u', 't', 'u',  'r',  0x9f, 0xff, /* an unknown top-level key */
      0xff};
  uint8_t file[256 + 8] = {'N', 'R', 'U', 'B', 1, 0, sizeof meta, 0, 0, 0};
  memcpy(file + 10, meta, sizeof meta);
  file[256] = 0x11;
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(bpk_fixture_read(&cat, file, sizeof file, &err), 0, "%s", err.msg);
  cr_assert_eq(cat.count, 1);
  const struct bs_tensor *a = find(&cat, "a");
  cr_assert_eq(a->rank, 1);
  cr_assert_eq(a->shape[0], 2);
  cr_assert_eq(a->off, 256);
  cr_assert_not(a->has_param_id);
  bs_catalog_destroy(&cat);
}

Test(bpk_read, scalars_become_values_json)
{
  static const uint8_t sc[] = {
      0x67, 's',  'c',  'a',  'l',  'a',  'r',  's',  0xa5, 0x62, 'l',  'r',
      0xa1, 0x65, 'F',  'l',  'o',  'a',  't',  0xf9, 0x38, 0x00,             /* 0.5 */
      0x64, 's',  't',  'e',  'p',  0xa1, 0x63, 'I',  'n',  't',  0x22,       /* -3 */
      0x61, 'n',  0xa1, 0x64, 'U',  'I',  'n',  't',  0x07,                   /* 7 */
      0x64, 'f',  'l',  'a',  'g',  0xa1, 0x64, 'B',  'o',  'o',  'l',  0xf5, /* true */
      0x63, 'o',  'd',  'd',  0xa1, 0x63, 'S',  't',  'r',  0x60};            /* skipped */
  struct bpk_fix_spec s = {.extra = sc, .extra_len = sizeof sc, .extra_pairs = 1};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  expect_ok(&f, &cat);
  cr_assert_not_null(cat.values_json);
  cr_assert_str_eq(cat.values_json, "{\"lr\":0.5,\"step\":-3,\"n\":7,\"flag\":true}");
  cr_assert_not_null(cat.notes);
  cr_assert(strstr(cat.notes, "scalar 'odd' skipped"), "%s", cat.notes);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, repeated_metadata_key_keeps_the_last_value)
{
  static const char *const meta[][2] = {{"k", "first"}, {"a", "x"}, {"k", "second"}};
  struct bpk_fix_spec s = {.meta = meta, .nmeta = 3};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  expect_ok(&f, &cat);
  cr_assert_eq(cat.nmeta, 2);
  cr_assert_str_eq(meta_get(&cat, "k"), "second");
  cr_assert_str_eq(meta_get(&cat, "a"), "x");
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, nesting_of_128_levels_is_accepted)
{
  /* top map (1) + 127 arrays = 128 levels */
  uint8_t extra[2 + 127 + 1];
  extra[0] = 0x61, extra[1] = 'x';
  memset(extra + 2, 0x81, 127);
  extra[129] = 0x00;
  struct bpk_fix_spec s = {.extra = extra, .extra_len = sizeof extra, .extra_pairs = 1};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bpk_fixture_custom(&s, &f);
  expect_ok(&f, &cat);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

/* ---- one corruption each ------------------------------------------------------------------ */

static void expect_reject(enum bpk_fix fault, int code, const char *substr)
{
  struct bpk_fixture f;
  struct bs_catalog cat;
  bs_err err;
  bpk_fixture_build(fault, &f);
  cr_assert_eq(bpk_fixture_read(&cat, f.data, f.len, &err), -1, "fault %d was accepted", fault);
  cr_assert_eq(err.code, code, "code %d, want %d: %s", err.code, code, err.msg);
  cr_assert_eq(err.off, f.bad_off, "off %llu, want %llu: %s", (unsigned long long)err.off,
               (unsigned long long)f.bad_off, err.msg);
  cr_assert(strstr(err.msg, substr), "message '%s' lacks '%s'", err.msg, substr);
  if (f.bad_key)
    cr_assert_str_eq(err.key, f.bad_key, "%s", err.msg);
  cr_assert_eq(cat.count, 0, "tensors left after a failed read");
  cr_assert_eq(cat.nmeta, 0);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_read, rejects_file_shorter_than_header)
{
  expect_reject(BPK_FIX_SHORT_FILE, EINVAL, "9 bytes is shorter than the 10-byte");
}
Test(bpk_read, rejects_bad_magic_naming_the_bytes)
{
  expect_reject(BPK_FIX_BAD_MAGIC, EINVAL,
                "bad magic 42 55 52 4e (\"BURN\"): a Burnpack file "
                "starts with \"NRUB\"");
}
Test(bpk_read, rejects_version_above_1)
{
  expect_reject(BPK_FIX_BAD_VERSION, ENOTSUP, "version 2 is newer");
}
Test(bpk_read, rejects_metadata_over_100_mib)
{
  expect_reject(BPK_FIX_META_TOO_BIG, EFBIG, "metadata_size 104857601 exceeds");
}
Test(bpk_read, rejects_metadata_past_eof)
{
  expect_reject(BPK_FIX_META_PAST_EOF, EINVAL, "runs past the end of the file");
}
Test(bpk_read, rejects_reserved_cbor_head_at_its_offset)
{
  expect_reject(BPK_FIX_BAD_CBOR, EINVAL, "malformed CBOR: head byte 0x1c");
}
Test(bpk_read, rejects_truncated_cbor_at_the_cut_item)
{
  expect_reject(BPK_FIX_CBOR_TRUNCATED, EINVAL, "metadata CBOR truncated");
}
Test(bpk_read, rejects_nesting_deeper_than_128)
{
  expect_reject(BPK_FIX_DEEP_NESTING, EINVAL, "nesting deeper than 128 levels");
}
Test(bpk_read, rejects_top_level_array)
{
  expect_reject(BPK_FIX_NOT_A_MAP, EINVAL, "metadata is an array; expected a CBOR map");
}
Test(bpk_read, rejects_missing_tensors_map)
{
  expect_reject(BPK_FIX_NO_TENSORS, EINVAL, "no 'tensors' map");
}
Test(bpk_read, rejects_integer_map_key)
{
  expect_reject(BPK_FIX_KEY_NOT_TEXT, EINVAL, "map keys must be text strings");
}
Test(bpk_read, rejects_unknown_dtype_as_unsupported)
{
  expect_reject(BPK_FIX_DTYPE_UNKNOWN, ENOTSUP, "unknown Burnpack dtype 'F128'");
}
Test(bpk_read, rejects_shape_that_is_not_an_array)
{
  expect_reject(BPK_FIX_SHAPE_NOT_ARRAY, EINVAL, "shape is an unsigned integer; expected an array");
}
Test(bpk_read, rejects_negative_shape_entry)
{
  expect_reject(BPK_FIX_SHAPE_NEGATIVE, EINVAL, "shape entry 0 is a negative integer");
}
Test(bpk_read, rejects_rank_above_limit)
{
  expect_reject(BPK_FIX_RANK_TOO_BIG, EINVAL, "rank 65 exceeds the limit of 64");
}
Test(bpk_read, rejects_data_offsets_with_three_entries)
{
  expect_reject(BPK_FIX_OFFSETS_NOT_PAIR, EINVAL, "data_offsets has 3 entries; expected exactly 2");
}
Test(bpk_read, rejects_end_before_start)
{
  expect_reject(BPK_FIX_END_BEFORE_START, EINVAL, "data_offsets end 256 < start 268");
}
Test(bpk_read, rejects_size_that_disagrees_with_shape)
{
  expect_reject(BPK_FIX_SIZE_MISMATCH, EINVAL, "span 10 bytes but 1-d F32 needs 12");
}
Test(bpk_read, rejects_overlapping_tensors)
{
  expect_reject(BPK_FIX_OVERLAP, EINVAL, "data [16, 28) overlaps tensor 'enc.weight' [0, 24)");
}
Test(bpk_read, rejects_duplicate_tensor_name)
{
  expect_reject(BPK_FIX_DUP_NAME, EINVAL, "appears twice");
}
Test(bpk_read, rejects_truncated_data_section)
{
  expect_reject(BPK_FIX_TRUNCATED_DATA, EINVAL, "truncated: data ends at");
}
Test(bpk_read, rejects_offsets_that_overflow_past_2_64)
{
  expect_reject(BPK_FIX_OFFSET_OVERFLOW, EINVAL, "overflows when added to the data start");
}
Test(bpk_read, rejects_more_than_100000_tensors)
{
  expect_reject(BPK_FIX_TOO_MANY_TENSORS, EFBIG, "100001 tensors exceed Burn's limit of 100000");
}

Test(bpk_read, every_fault_is_rejected_and_none_crashes)
{
  for (int fault = BPK_FIX_NONE + 1; fault < BPK_FIX_COUNT; fault++) {
    struct bpk_fixture f;
    struct bs_catalog cat;
    bs_err err;
    bpk_fixture_build((enum bpk_fix)fault, &f);
    cr_assert_eq(bpk_fixture_read(&cat, f.data, f.len, &err), -1, "fault %d accepted", fault);
    cr_assert_neq(err.code, 0);
    cr_assert_neq(err.msg[0], '\0');
    bs_catalog_destroy(&cat);
    bpk_fixture_free(&f);
  }
}

/* Every prefix of a valid file fails cleanly (or, past the data, succeeds). */
Test(bpk_read, every_truncation_of_the_fixture_fails_cleanly)
{
  struct bpk_fixture f;
  bpk_fixture_build(BPK_FIX_NONE, &f);
  for (size_t n = 0; n < f.len; n++) {
    struct bs_catalog cat;
    bs_err err;
    cr_assert_eq(bpk_fixture_read(&cat, f.data, n, &err), -1, "prefix of %zu bytes accepted", n);
    cr_assert_neq(err.code, 0);
    bs_catalog_destroy(&cat);
  }
  bpk_fixture_free(&f);
}

/* ---- allocation failures ------------------------------------------------------------------ */

static void oom_loop(const struct bpk_fixture *f)
{
  for (long n = 0;; n++) {
    struct bs_catalog cat;
    bs_err err;
    bs_alloc_fail_after(n);
    int rc = bpk_fixture_read(&cat, f->data, f->len, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0) {
      cr_assert_gt(cat.count + cat.nmeta, 0);
      bs_catalog_destroy(&cat);
      break;
    }
    cr_assert_eq(err.code, ENOMEM, "allocation %ld: code %d: %s", n, err.code, err.msg);
    bs_catalog_destroy(&cat);
    cr_assert_lt(n, 100000, "never succeeded");
  }
}

Test(bpk_read, each_failed_allocation_gives_enomem)
{
  struct bpk_fixture f;
  bpk_fixture_build(BPK_FIX_NONE, &f);
  oom_loop(&f);
  bpk_fixture_free(&f);
  static const uint8_t sc[] = {0x67, 's',  'c',  'a',  'l', 'a', 'r', 's',  0xa2,
                               0x61, 'a',  0xa1, 0x63, 'I', 'n', 't', 0x01, 0x61,
                               'b',  0xa1, 0x63, 'S',  't', 'r', 0x60};
  struct bpk_fix_tensor t[] = {{.name = "q",
                                .dtype_raw = qfloat,
                                .dtype_len = sizeof qfloat,
                                .rank = 1,
                                .shape = {4},
                                .start = 0,
                                .end = 8}};
  static const char *const meta[][2] = {{"k", "v"}, {"k", "w"}};
  struct bpk_fix_spec s = {.t = t,
                           .n = 1,
                           .meta = meta,
                           .nmeta = 2,
                           .extra = sc,
                           .extra_len = sizeof sc,
                           .extra_pairs = 1};
  bpk_fixture_custom(&s, &f);
  oom_loop(&f);
  bpk_fixture_free(&f);
}

/* Single-byte mutations of the spec example's header and metadata: each read either succeeds
 * or fails with a code and a message; ASan/UBSan catch the rest. */
Test(bpk_read, single_byte_mutations_never_crash)
{
  static const uint8_t vals[] = {0x00, 0x17, 0x18, 0x1b, 0x1c, 0x5f, 0x7f, 0x80,
                                 0x9f, 0xa0, 0xbf, 0xc0, 0xf6, 0xf8, 0xff};
  struct bpk_fixture f;
  bpk_fixture_example11(&f);
  for (size_t pos = 0; pos < 10 + f.meta_len; pos++) {
    uint8_t keep = f.data[pos];
    for (size_t v = 0; v <= sizeof vals; v++) {
      f.data[pos] = v < sizeof vals ? vals[v] : (uint8_t)(keep ^ 0x80);
      struct bs_catalog cat;
      bs_err err;
      if (bpk_fixture_read(&cat, f.data, f.len, &err) != 0) {
        cr_assert_neq(err.code, 0);
        cr_assert_neq(err.msg[0], '\0');
        cr_assert_eq(cat.count, 0);
      }
      bs_catalog_destroy(&cat);
    }
    f.data[pos] = keep;
  }
  bpk_fixture_free(&f);
}

/* libcbor 0.8 asserts in cbor_is_null() on a float; found by fuzzing. */
Test(bpk_read, float_param_id_is_an_error_not_an_abort)
{
  static const uint8_t sc[] = {0x67, 's',  'c',  'a', 'l', 'a', 'r', 's',  0xa1, 0x61,
                               'f',  0xa1, 0x64, 'B', 'o', 'o', 'l', 0xf9, 0x3e, 0x00};
  static const uint8_t offs[] = {0x82, 0x00, 0x04};
  struct bpk_fix_tensor t[] = {{.name = "p",
                                .rank = 1,
                                .shape = {1},
                                .offsets_raw = offs,
                                .offsets_len = sizeof offs,
                                .end = 4}};
  struct bpk_fix_spec s = {.t = t, .n = 1, .extra = sc, .extra_len = sizeof sc, .extra_pairs = 1};
  struct bpk_fixture f;
  struct bs_catalog cat;
  bs_err err;
  bpk_fixture_custom(&s, &f);
  /* A scalar {"Bool": 1.5} is skipped with a note. */
  expect_ok(&f, &cat);
  cr_assert(strstr(cat.notes, "scalar 'f' skipped"), "%s", cat.notes);
  bs_catalog_destroy(&cat);
  /* Turn the descriptor into a 4-entry map whose param_id is the float 1.5. */
  uint8_t file[512];
  size_t d = f.desc_off[0];
  cr_assert_eq(f.data[d], 0xa3);
  static const uint8_t pid[] = {0x68, 'p', 'a', 'r', 'a', 'm', '_', 'i', 'd', 0xf9, 0x3e, 0x00};
  size_t desc_end = f.extra_off; /* the descriptor is the last item before the extra pair */
  memcpy(file, f.data, desc_end);
  file[d] = 0xa4;
  memcpy(file + desc_end, pid, sizeof pid);
  memcpy(file + desc_end + sizeof pid, f.data + desc_end, 10 + f.meta_len - desc_end);
  uint32_t m = f.meta_len + sizeof pid;
  file[6] = (uint8_t)m, file[7] = (uint8_t)(m >> 8), file[8] = 0, file[9] = 0;
  memset(file + 10 + m, 0, 256 - (10 + m));
  memcpy(file + 256, f.data + f.data_start, 4);
  cr_assert_eq(bpk_fixture_read(&cat, file, 260, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_eq(err.off, d);
  cr_assert_str_eq(err.key, "p");
  cr_assert(strstr(err.msg, "param_id is a float; expected an unsigned integer"), "%s", err.msg);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

/* Every allocation that fails leaves the catalog as it was: tensors, metadata
 * and the note of the skipped scalar too (the note was left behind). */
Test(bpk_read, a_failing_read_leaves_the_catalog_as_it_was)
{
  static const uint8_t sc[] = {0x67, 's',  'c',  'a',  'l', 'a', 'r', 's',  0xa2, 0x63, 'o',
                               'd',  'd',  0xa1, 0x63, 'S', 't', 'r', 0x60, 0x62, 'l',  'r',
                               0xa1, 0x65, 'F',  'l',  'o', 'a', 't', 0xf9, 0x38, 0x00};
  static const struct bpk_fix_tensor t[] = {
      {.name = "a", .rank = 1, .shape = {2}, .end = 8},
      {.name = "b", .rank = 1, .shape = {1}, .start = 256, .end = 260}};
  static const char *const meta[][2] = {{"producer", "fixture"}};
  struct bpk_fix_spec s = {.t = t,
                           .n = 2,
                           .meta = meta,
                           .nmeta = 1,
                           .extra = sc,
                           .extra_len = sizeof sc,
                           .extra_pairs = 1};
  struct bpk_fixture f;
  bpk_fixture_custom(&s, &f);
  cr_assert_gt(bs_test_rollback_sweep_mem(f.data, f.len, "t.bpk", bs_bpk_read), 0);
  bpk_fixture_free(&f);
}
