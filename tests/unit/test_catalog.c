/* The catalog, dtypes and byte sources: sizes, strided gathers, errors. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "core/checked.h"
#include "formats/burnpack_dtype.h"

static bs_err err;
static void reset(void)
{
  bs_err_clear(&err);
}
TestSuite(catalog, .init = reset);
TestSuite(dtype, .init = reset);
TestSuite(src, .init = reset);

Test(dtype, names_round_trip_and_sizes)
{
  for (int i = 0; i < BS_DT_COUNT; i++) {
    enum bs_dtype d;
    cr_assert_eq(bs_dtype_from_name(bs_dtype_name((enum bs_dtype)i), &d), 0);
    cr_assert_eq(d, (enum bs_dtype)i);
  }
  enum bs_dtype d;
  cr_assert_eq(bs_dtype_from_name("f32", &d), -1, "names are case-sensitive");
  cr_assert_eq(bs_dtype_bits(BS_DT_F4), 4);
  cr_assert_eq(bs_dtype_bits(BS_DT_BF16), 16);
}

Test(dtype, burnpack_names_are_one_table_for_reader_and_writer)
{
  static const char *const plain[] = {"F64", "F32", "Flex32", "F16", "BF16", "I64", "I32",
                                      "I16", "I8",  "U64",    "U32", "U16",  "U8"};
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
    enum bs_dtype dt;
    cr_assert_eq(bs_dtype_from_bpk_name(plain[i], &dt), 0, "%s", plain[i]);
    cr_expect_str_eq(bs_dtype_bpk_name(dt), plain[i]);
    cr_expect_null(bs_dtype_bpk_bool(dt));
  }
  static const char *const stores[] = {"Native", "U8", "U32"};
  static const enum bs_dtype bools[] = {BS_DT_BOOL, BS_DT_BOOL_U8, BS_DT_BOOL_U32};
  for (size_t i = 0; i < 3; i++) {
    enum bs_dtype dt;
    cr_assert_eq(bs_dtype_from_bpk_bool(stores[i], &dt), 0);
    cr_expect_eq(dt, bools[i]);
    cr_expect_str_eq(bs_dtype_bpk_bool(bools[i]), stores[i]);
    cr_expect_null(bs_dtype_bpk_name(bools[i]), "Bool is written as a map, never bare");
  }
  enum bs_dtype dt = BS_DT_F32;
  cr_expect_eq(bs_dtype_from_bpk_name("Bool", &dt), 0, "burn <= 0.20's bare Bool");
  cr_expect_eq(dt, BS_DT_BOOL);
  cr_expect_eq(bs_dtype_from_bpk_name("FLEX32", &dt), -1, "Burnpack spells it Flex32");
  cr_expect_eq(bs_dtype_from_bpk_name("QFloat", &dt), -1, "QFloat is a map");
  cr_expect_eq(bs_dtype_from_bpk_bool("Bool", &dt), -1);
  cr_expect_null(bs_dtype_bpk_name(BS_DT_QFLOAT));
  cr_expect_null(bs_dtype_bpk_name(BS_DT_C64));
  cr_expect_null(bs_dtype_bpk_name(BS_DT_COUNT));
}

Test(dtype, shape_format_is_snprintf_like)
{
  const uint64_t shape[] = {64, 1, 3, 18446744073709551615ull};
  char buf[64];
  cr_expect_eq(bs_shape_format(buf, sizeof buf, 0, NULL), 2);
  cr_expect_str_eq(buf, "[]");
  cr_expect_eq(bs_shape_format(buf, sizeof buf, 3, shape), 8);
  cr_expect_str_eq(buf, "[64,1,3]");
  size_t full = bs_shape_format(NULL, 0, 4, shape);
  cr_expect_eq(full, strlen("[64,1,3,18446744073709551615]"));
  char small[6];
  cr_expect_eq(bs_shape_format(small, sizeof small, 4, shape), full);
  cr_expect_str_eq(small, "[64,1");
  char one[1] = {'x'};
  cr_expect_eq(bs_shape_format(one, 1, 1, shape), 4);
  cr_expect_eq(one[0], '\0');
}

Test(dtype, sub_byte_sizes_need_whole_bytes)
{
  uint64_t n, shape[2] = {3, 5};
  cr_assert_eq(bs_dtype_nbytes(BS_DT_F4, 2, shape, &n, "k", 7, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_eq(err.off, 7);
  cr_assert_str_eq(err.key, "k");
  cr_assert_not_null(strstr(err.msg, "misaligned"));
  uint64_t s2[1] = {4};
  reset();
  cr_assert_eq(bs_dtype_nbytes(BS_DT_F6_E2M3, 1, s2, &n, "k", 0, &err), 0);
  cr_assert_eq(n, 3);
}

Test(dtype, shape_overflow_is_refused)
{
  uint64_t n, shape[2] = {2, UINT64_MAX - 1};
  cr_assert_eq(bs_dtype_nbytes(BS_DT_F32, 2, shape, &n, "big", 9, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_not_null(strstr(err.msg, "overflow"));
  uint64_t zero[3] = {0, 5, 7};
  reset();
  cr_assert_eq(bs_dtype_nbytes(BS_DT_F64, 3, zero, &n, "e", 0, &err), 0);
  cr_assert_eq(n, 0);
  cr_assert_eq(bs_dtype_nbytes(BS_DT_F64, 0, NULL, &n, "s", 0, &err), 0);
  cr_assert_eq(n, 8, "a 0-d scalar holds one element");
}

Test(catalog, first_error_wins)
{
  cr_assert_eq(bs_fail(&err, EINVAL, 16, "a", "first %d", 1), -1);
  cr_assert_eq(bs_fail(&err, EIO, 32, "b", "second"), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_str_eq(err.msg, "first 1");
  char line[512];
  cr_assert_str_eq(bs_err_format(&err, "f.bpk", line, sizeof line),
                   "f.bpk: offset 0x10: tensor 'a': first 1");
}

/* A 2x3 F32 storage 0..5, viewed in several ways. */
static float storage[6] = {0, 1, 2, 3, 4, 5};

static struct bs_tensor *view(struct bs_catalog *cat, uint32_t rank, const uint64_t *shape,
                              const int64_t *strides, uint64_t soff)
{
  struct bs_src s;
  uint32_t idx;
  if (cat->nsrcs == 0) {
    cr_assert_eq(bs_src_init_mem(&s, storage, sizeof storage, "mem", &err), 0);
    cr_assert_eq(bs_catalog_add_src(cat, &s, &idx, &err), 0);
  }
  struct bs_tensor *t = bs_catalog_add(cat, "v", BS_DT_F32, rank, shape, 0, &err);
  cr_assert_not_null(t);
  t->src = 0;
  t->off = 0;
  cr_assert_not_null(bs_tensor_x(cat, t));
  t->x->storage_off = soff;
  t->x->storage_bytes = sizeof storage;
  t->x->strides = bs_malloc(rank * sizeof *strides + 1);
  memcpy(t->x->strides, strides, rank * sizeof *strides);
  return t;
}

static void expect(struct bs_catalog *cat, const struct bs_tensor *t, const float *want, size_t n)
{
  cr_assert_eq(bs_tensor_check_view(t, 0, &err), 0, "%s", err.msg);
  float got[16];
  cr_assert_eq(bs_tensor_read(cat, t, 0, got, sizeof got), (long)(n * 4));
  cr_assert_eq(memcmp(got, want, n * 4), 0);
  /* Byte-granular reads at every offset give the same bytes. */
  for (size_t off = 0; off < n * 4; off++) {
    uint8_t b[3];
    long r = bs_tensor_read(cat, t, off, b, 3);
    cr_assert_gt(r, 0);
    cr_assert_eq(memcmp(b, (const uint8_t *)want + off, (size_t)r), 0, "offset %zu", off);
  }
}

Test(catalog, strided_views_read_as_contiguous)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  uint64_t tshape[2] = {3, 2};
  int64_t tstr[2] = {1, 3};
  expect(&cat, view(&cat, 2, tshape, tstr, 0), (float[]){0, 3, 1, 4, 2, 5}, 6);
  uint64_t sshape[2] = {2, 2};
  int64_t sstr[2] = {3, 2};
  expect(&cat, view(&cat, 2, sshape, sstr, 0), (float[]){0, 2, 3, 5}, 4);
  uint64_t eshape[2] = {3, 4};
  int64_t estr[2] = {1, 0};
  expect(&cat, view(&cat, 2, eshape, estr, 0), (float[]){0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, 12);
  uint64_t oshape[1] = {2};
  int64_t ostr[1] = {1};
  expect(&cat, view(&cat, 1, oshape, ostr, 4), (float[]){4, 5}, 2);
  bs_catalog_destroy(&cat);
}

Test(catalog, view_past_the_storage_is_refused)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  uint64_t shape[2] = {2, 3};
  int64_t strides[2] = {3, 1};
  struct bs_tensor *t = view(&cat, 2, shape, strides, 1);
  cr_assert_eq(bs_tensor_check_view(t, 40, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_eq(err.off, 40);
  cr_assert_not_null(strstr(err.msg, "storage too short"));
  bs_catalog_destroy(&cat);
}

Test(catalog, oom_on_add_leaves_a_valid_catalog)
{
  for (long n = 0; n < 10; n++) {
    struct bs_catalog cat;
    bs_catalog_init(&cat);
    reset();
    bs_alloc_fail_after(n);
    uint64_t shape[1] = {4};
    struct bs_tensor *t = bs_catalog_add(&cat, "x", BS_DT_F32, 1, shape, 0, &err);
    bs_alloc_fail_after(-1);
    if (!t)
      cr_assert_eq(err.code, ENOMEM);
    bs_catalog_destroy(&cat);
  }
}

/* One note per file of a big write-back (or per skipped scalar of a
 * hostile header): appending must not recount what is there (it was
 * quadratic: 200,000 notes took about 40 s). */
Test(catalog, notes_append_in_linear_time_and_roll_back)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  cr_assert_eq(bs_catalog_note(&cat, "a", &err), 0);
  cr_assert_eq(bs_catalog_note(&cat, "bc", &err), 0);
  cr_assert_str_eq(cat.notes, "a\nbc\n");
  bs_catalog_notes_truncate(&cat, 2);
  cr_assert_str_eq(cat.notes, "a\n");
  cr_assert_eq(bs_catalog_note(&cat, "d", &err), 0);
  cr_assert_str_eq(cat.notes, "a\nd\n");
  bs_catalog_notes_truncate(&cat, 0);
  cr_assert_null(cat.notes);
  cr_assert_eq(bs_catalog_note(&cat, "e", &err), 0);
  cr_assert_str_eq(cat.notes, "e\n");
  bs_catalog_notes_truncate(&cat, 0);

  char line[100];
  memset(line, 'x', sizeof line - 1);
  line[sizeof line - 1] = '\0';
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < 200000; i++)
    cr_assert_eq(bs_catalog_note(&cat, line, &err), 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  cr_assert_eq(strlen(cat.notes), 200000u * sizeof line);
  cr_assert_lt(secs, 5.0, "200,000 notes took %.1f s", secs);
  bs_catalog_destroy(&cat);
}

Test(src, reads_past_the_end_name_the_offset)
{
  struct bs_src s;
  uint8_t buf[8] = {0};
  cr_assert_eq(bs_src_init_mem(&s, buf, 8, "m", &err), 0);
  uint8_t out[4];
  cr_assert_eq(bs_src_read(&s, 6, out, 4, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_eq(err.off, 6);
  cr_assert_not_null(strstr(err.msg, "truncated"));
  reset();
  cr_assert_eq(bs_src_read(&s, UINT64_MAX - 1, out, 4, &err), -1, "no overflow");
  bs_src_destroy(&s);
}

Test(src, read_alloc_checks_the_range_before_allocating)
{
  struct bs_src s;
  uint8_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  cr_assert_eq(bs_src_init_mem(&s, buf, 8, "m", &err), 0);
  uint8_t *out = (uint8_t *)1;
  /* With every allocation failing, a length past the end must still be
   * refused as truncated: the check comes first. */
  bs_alloc_fail_after(0);
  int rc = bs_src_read_alloc(&s, 4, UINT64_MAX / 2, &out, &err);
  bs_alloc_fail_after(-1);
  cr_assert_eq(rc, -1);
  cr_assert_null(out);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_eq(err.off, 4);
  cr_assert_not_null(strstr(err.msg, "truncated"));
  bs_err_clear(&err);
  cr_assert_eq(bs_src_read_alloc(&s, 2, 3, &out, &err), 0);
  cr_assert_eq(memcmp(out, buf + 2, 3), 0);
  bs_free(out);
  cr_assert_eq(bs_src_read_alloc(&s, 8, 0, &out, &err), 0, "zero bytes at the end is fine");
  bs_free(out);
  bs_src_destroy(&s);
}
