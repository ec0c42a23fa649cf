#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpk_fixture.h"
#include "bs_test.h"
#include "core/alloc.h"
#include "core/version.h"
#include "formats/burnpack_write.h"
#include "formats/formats.h"

#define MNIST BS_FIXTURES_DIR "/burn/examples/mnist-inference-web/model.bpk"

static void read_ok(struct bs_catalog *cat, const void *buf, size_t len)
{
  bs_err err;
  cr_assert_eq(bpk_fixture_read(cat, buf, len, &err), 0, "read: code %d key '%s': %s", err.code,
               err.key, err.msg);
}

static void add_meta(struct bs_catalog *cat, const char *k, const char *v)
{
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_catalog_add_meta(cat, k, v, &err), 0);
}

static void write_ok(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                     struct bs_buf *out)
{
  bs_err err;
  bs_err_clear(&err);
  int rc = bs_bpk_write_mem(cat, plan, out, &err);
  cr_assert_eq(rc, 0, "write: code %d key '%s': %s", err.code, err.key, err.msg);
}

static void put_f32(uint8_t *p, float v)
{
  memcpy(p, &v, 4); /* tests run on little-endian */
}

/* The plan that writes every tensor in the order of its data in the source. */
static size_t *order_by_offset(const struct bs_catalog *cat)
{
  size_t *o = malloc((cat->count + 1) * sizeof *o);
  for (size_t i = 0; i < cat->count; i++)
    o[i] = i;
  for (size_t i = 1; i < cat->count; i++)
    for (size_t j = i; j > 0 && cat->tensors[o[j]].off < cat->tensors[o[j - 1]].off; j--) {
      size_t x = o[j];
      o[j] = o[j - 1];
      o[j - 1] = x;
    }
  return o;
}

static void expect_same(const struct bs_buf *got, const uint8_t *want, size_t n)
{
  cr_assert_eq(got->len, n, "wrote %zu bytes, want %zu", got->len, n);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(got->data[i], want[i], "byte 0x%zx: 0x%02x, want 0x%02x", i, got->data[i],
                 want[i]);
}

static void example11_catalog(struct bs_catalog *cat, uint8_t mem[24])
{
  static const float w[4] = {1, 2, 3, 4}, b[2] = {0.5f, -1.0f};
  for (int i = 0; i < 4; i++)
    put_f32(mem + 4 * i, w[i]);
  for (int i = 0; i < 2; i++)
    put_f32(mem + 16 + 4 * i, b[i]);
  bs_test_mem_catalog(cat, mem, 24);
  struct bs_tensor *t = bs_test_add(cat, "fc.weight", BS_DT_F32, 2, (uint64_t[]){2, 2}, 0);
  t->has_param_id = true;
  cr_assert_not_null(bs_tensor_x(cat, t));
  t->x->param_id = 7;
  bs_test_add(cat, "fc.bias", BS_DT_F32, 1, (uint64_t[]){2}, 16);
  add_meta(cat, "version", "0.22.0-pre.2");
  add_meta(cat, "format", "burnpack");
  add_meta(cat, "producer", "burn");
}

Test(bpk_write, spec_example_is_written_byte_for_byte)
{
  uint8_t mem[24];
  struct bs_catalog cat;
  struct bpk_fixture f;
  struct bs_buf out;
  example11_catalog(&cat, mem);
  bpk_fixture_example11(&f);
  write_ok(&cat, NULL, &out);
  expect_same(&out, f.data, 520);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_write, mnist_model_rewritten_in_data_order_is_identical)
{
  size_t len;
  uint8_t *orig = bs_test_slurp(MNIST, &len);
  struct bs_catalog cat;
  struct bs_buf out;
  read_ok(&cat, orig, len);
  size_t *o = order_by_offset(&cat);
  cr_assert_str_eq(cat.tensors[o[0]].key, "conv1.conv.weight");
  struct bs_bpk_plan plan = {o, cat.count};
  write_ok(&cat, &plan, &out);
  expect_same(&out, orig, len);
  bs_buf_destroy(&out);
  free(o);
  bs_catalog_destroy(&cat);
  bs_free(orig);
}

Test(bpk_write, fixture_round_trips_byte_for_byte)
{
  struct bpk_fixture f;
  struct bs_catalog cat;
  struct bs_buf out;
  bpk_fixture_build(BPK_FIX_NONE, &f);
  read_ok(&cat, f.data, f.len);
  size_t *o = order_by_offset(&cat);
  struct bs_bpk_plan plan = {o, cat.count};
  write_ok(&cat, &plan, &out);
  expect_same(&out, f.data, f.len);
  bs_buf_destroy(&out);
  free(o);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_write, qfloat_raw_dtype_round_trips)
{
  static const uint8_t q[] = {0xa1, 0x66, 'Q', 'F', 'l',  'o',  'a', 't', 0xa2, 0x65,
                              'v',  'a',  'l', 'u', 'e',  0x63, 'Q', '8', 'S',  0x64,
                              'm',  'o',  'd', 'e', 0x64, 'L',  'o', 'o', 'k'};
  struct bpk_fix_tensor t[] = {{.name = "a", .rank = 1, .shape = {3}, .start = 0, .end = 12},
                               {.name = "q",
                                .dtype_raw = q,
                                .dtype_len = sizeof q,
                                .rank = 2,
                                .shape = {4, 4},
                                .start = 256,
                                .end = 276}};
  struct bpk_fix_spec s = {.t = t, .n = 2};
  struct bpk_fixture f;
  struct bs_catalog cat, again;
  struct bs_buf out;
  bpk_fixture_custom(&s, &f);
  read_ok(&cat, f.data, f.len);
  size_t *o = order_by_offset(&cat);
  struct bs_bpk_plan plan = {o, cat.count};
  write_ok(&cat, &plan, &out);
  expect_same(&out, f.data, f.len);
  read_ok(&again, out.data, out.len);
  const struct bs_tensor *qt = &again.tensors[bs_catalog_find(&again, "q")];
  cr_assert_eq(qt->dtype, BS_DT_QFLOAT);
  cr_assert_eq(qt->nbytes, 20);
  cr_assert_eq(qt->x->dtype_raw_len, sizeof q);
  cr_assert_arr_eq(qt->x->dtype_raw, q, sizeof q);
  bs_catalog_destroy(&again);
  bs_buf_destroy(&out);
  free(o);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_write, zero_tensors_give_the_256_byte_file)
{
  struct bs_catalog cat;
  struct bs_buf out;
  bs_catalog_init(&cat);
  write_ok(&cat, NULL, &out);
  uint8_t want[256] = {'N',  'R',  'U', 'B', 1,   0,   10,  0,   0,   0,
                       0xa1, 0x67, 't', 'e', 'n', 's', 'o', 'r', 's', 0xa0};
  expect_same(&out, want, sizeof want);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

static bool has(const struct bs_buf *b, const void *needle, size_t n)
{
  return memmem(b->data, b->len, needle, n) != NULL;
}

static long at(const struct bs_buf *b, const char *needle, size_t n)
{
  const uint8_t *p = memmem(b->data, b->len, needle, n);
  cr_assert_not_null(p, "bytes not found");
  return p - b->data;
}

Test(bpk_write, bools_use_the_map_form_and_read_back)
{
  uint8_t mem[64] = {1, 0, 1};
  struct bs_catalog cat, back;
  struct bs_buf out;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "n", BS_DT_BOOL, 1, (uint64_t[]){3}, 0);
  bs_test_add(&cat, "u8", BS_DT_BOOL_U8, 1, (uint64_t[]){3}, 0);
  bs_test_add(&cat, "u32", BS_DT_BOOL_U32, 1, (uint64_t[]){3}, 0);
  bs_test_add(&cat, "flex", BS_DT_FLEX32, 1, (uint64_t[]){3}, 0);
  write_ok(&cat, NULL, &out);
  cr_assert(has(&out,
                "\xa1\x64"
                "Bool\x66"
                "Native",
                13));
  cr_assert(has(&out,
                "\xa1\x64"
                "Bool\x62"
                "U8",
                9));
  cr_assert(has(&out,
                "\xa1\x64"
                "Bool\x63"
                "U32",
                10));
  cr_assert(has(&out,
                "\x66"
                "Flex32",
                7));
  read_ok(&back, out.data, out.len);
  cr_assert_eq(back.tensors[bs_catalog_find(&back, "n")].dtype, BS_DT_BOOL);
  cr_assert_eq(back.tensors[bs_catalog_find(&back, "u8")].dtype, BS_DT_BOOL_U8);
  cr_assert_eq(back.tensors[bs_catalog_find(&back, "u32")].dtype, BS_DT_BOOL_U32);
  cr_assert_eq(back.tensors[bs_catalog_find(&back, "flex")].dtype, BS_DT_FLEX32);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, bare_bool_read_is_written_as_native_map)
{
  static const uint8_t bare[] = {0x64, 'B', 'o', 'o', 'l'};
  struct bpk_fix_tensor t[] = {{.name = "m",
                                .dtype_raw = bare,
                                .dtype_len = sizeof bare,
                                .rank = 1,
                                .shape = {2},
                                .start = 0,
                                .end = 2}};
  struct bpk_fix_spec s = {.t = t, .n = 1};
  struct bpk_fixture f;
  struct bs_catalog cat;
  struct bs_buf out;
  bpk_fixture_custom(&s, &f);
  read_ok(&cat, f.data, f.len);
  write_ok(&cat, NULL, &out);
  cr_assert(has(&out,
                "\x65"
                "dtype\xa1\x64"
                "Bool\x66"
                "Native",
                19));
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_write, names_and_metadata_sorted_bytewise_not_length_first)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat;
  struct bs_buf out;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "zz", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  bs_test_add(&cat, "zyx", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  bs_test_add(&cat, "zy", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  add_meta(&cat, "b", "v1");
  add_meta(&cat, "aa", "v2");
  add_meta(&cat, "B", "v3");
  add_meta(&cat, "a", "v4");
  write_ok(&cat, NULL, &out);
  /* byte-wise: zy < zyx < zz; length-first would put zz before zyx */
  long zy = at(&out,
               "\x62"
               "zy\xa3",
               4),
       zyx = at(&out,
                "\x63"
                "zyx\xa3",
                5),
       zz = at(&out,
               "\x62"
               "zz\xa3",
               4);
  cr_assert(zy < zyx && zyx < zz, "tensor order zy %ld zyx %ld zz %ld", zy, zyx, zz);
  long mB = at(&out,
               "\x61"
               "B\x62"
               "v3",
               5),
       ma = at(&out,
               "\x61"
               "a\x62"
               "v4",
               5),
       maa = at(&out,
                "\x62"
                "aa\x62"
                "v2",
                6),
       mb = at(&out,
               "\x61"
               "b\x62"
               "v1",
               5);
  cr_assert(mB < ma && ma < maa && maa < mb, "metadata order");
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, integers_use_the_shortest_head)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat;
  struct bs_buf out;
  static const uint64_t ids[] = {23, 24, 255, 256, 65535, 65536, 4294967295ull, 4294967296ull};
  static const char *const want[] = {"\x17",
                                     "\x18\x18",
                                     "\x18\xff",
                                     "\x19\x01\x00",
                                     "\x19\xff\xff",
                                     "\x1a\x00\x01\x00\x00",
                                     "\x1a\xff\xff\xff\xff",
                                     "\x1b\x00\x00\x00\x01\x00\x00\x00\x00"};
  static const size_t wlen[] = {1, 2, 2, 3, 3, 5, 5, 9};
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  for (size_t i = 0; i < 8; i++) {
    char name[4] = {'t', (char)('0' + i), 0};
    struct bs_tensor *t = bs_test_add(&cat, name, BS_DT_U8, 0, NULL, 0);
    t->has_param_id = true;
    cr_assert_not_null(bs_tensor_x(&cat, t));
    t->x->param_id = ids[i];
  }
  write_ok(&cat, NULL, &out);
  for (size_t i = 0; i < 8; i++) {
    char needle[20];
    memcpy(needle,
           "\x68"
           "param_id",
           9);
    memcpy(needle + 9, want[i], wlen[i]);
    cr_assert(has(&out, needle, 9 + wlen[i]), "param_id %llu", (unsigned long long)ids[i]);
  }
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, empty_last_tensor_is_padded_to_its_start_and_reads_back)
{
  uint8_t mem[24] = {1, 2, 3};
  struct bs_catalog cat, back;
  struct bs_buf out;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "w", BS_DT_F32, 1, (uint64_t[]){6}, 0);
  bs_test_add(&cat, "e", BS_DT_F32, 2, (uint64_t[]){0, 5}, 0);
  write_ok(&cat, NULL, &out);
  cr_assert(has(&out,
                "\x6c"
                "data_offsets\x82\x19\x01\x00\x19\x01\x00",
                18));
  read_ok(&back, out.data, out.len);
  const struct bs_tensor *e = &back.tensors[bs_catalog_find(&back, "e")];
  cr_assert_eq(e->nbytes, 0);
  cr_assert_eq(out.len, e->off);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, hidden_tensors_are_left_out_without_a_plan)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat, back;
  struct bs_buf out;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "keep", BS_DT_U8, 1, (uint64_t[]){4}, 0);
  bs_test_add(&cat, "drop", BS_DT_U8, 1, (uint64_t[]){4}, 4)->hidden = true;
  write_ok(&cat, NULL, &out);
  read_ok(&back, out.data, out.len);
  cr_assert_eq(back.count, 1);
  cr_assert_str_eq(back.tensors[0].key, "keep");
  bs_catalog_destroy(&back);
  bs_buf_destroy(&out);
  bs_catalog_destroy(&cat);
}

static void expect_write_fail(const struct bs_catalog *cat, const struct bs_bpk_plan *plan,
                              int code, const char *key, const char *substr)
{
  struct bs_buf out = {0};
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_mem(cat, plan, &out, &err), -1);
  cr_assert_eq(err.code, code, "code %d: %s", err.code, err.msg);
  cr_assert_eq(err.off, BS_OFF_NONE, "off %llu", (unsigned long long)err.off);
  cr_assert_str_eq(err.key, key ? key : "");
  cr_assert(strstr(err.msg, substr), "'%s' lacks '%s'", err.msg, substr);
  cr_assert_null(out.data);
}

Test(bpk_write, rejects_dtype_burn_does_not_have)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "ok", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  bs_test_add(&cat, "fp8", BS_DT_F8_E4M3, 1, (uint64_t[]){2}, 0);
  expect_write_fail(&cat, NULL, ENOTSUP, "fp8", "Burnpack has no dtype for F8_E4M3");
  bs_catalog_destroy(&cat);
}

Test(bpk_write, rejects_duplicate_names)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "x", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  bs_test_add(&cat, "y", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  bs_test_add(&cat, "x", BS_DT_U8, 1, (uint64_t[]){1}, 1);
  expect_write_fail(&cat, NULL, EINVAL, "x", "Burnpack names must be unique");
  bs_catalog_destroy(&cat);
}

Test(bpk_write, rejects_plan_index_out_of_range)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "x", BS_DT_U8, 1, (uint64_t[]){1}, 0);
  size_t order[] = {0, 5};
  struct bs_bpk_plan plan = {order, 2};
  expect_write_fail(&cat, &plan, EINVAL, NULL, "write plan entry 1 is tensor 5");
  bs_catalog_destroy(&cat);
}

Test(bpk_write, rejects_qfloat_without_raw_dtype)
{
  uint8_t mem[8] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "q", BS_DT_QFLOAT, 1, (uint64_t[]){4}, 0)->nbytes = 4;
  expect_write_fail(&cat, NULL, EINVAL, "q", "no encoded quantization scheme");
  bs_catalog_destroy(&cat);
}

Test(bpk_write, rejects_tensor_whose_source_is_short)
{
  uint8_t mem[10] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "short", BS_DT_F32, 1, (uint64_t[]){6}, 0);
  struct bs_buf out = {0};
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_mem(&cat, NULL, &out, &err), -1);
  cr_assert_eq(err.code, EIO, "%s", err.msg);
  cr_assert_eq(err.off, 0);
  cr_assert_str_eq(err.key, "short");
  cr_assert(strstr(err.msg, "cannot read the tensor's data at byte 0 of 24"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, default_meta_fills_only_missing_keys)
{
  struct bs_catalog cat;
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(&cat);
  add_meta(&cat, "producer", "me");
  cr_assert_eq(bs_bpk_default_meta(&cat, &err), 0);
  cr_assert_eq(cat.nmeta, 3);
  cr_assert_str_eq(cat.meta[0].value, "me");
  cr_assert_str_eq(cat.meta[1].key, "format");
  cr_assert_str_eq(cat.meta[1].value, "burnpack");
  cr_assert_str_eq(cat.meta[2].key, "version");
  cr_assert_str_eq(cat.meta[2].value, BURNSTORE_VERSION);
  cr_assert_eq(bs_bpk_default_meta(&cat, &err), 0);
  cr_assert_eq(cat.nmeta, 3);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, each_failed_allocation_gives_enomem)
{
  uint8_t mem[24];
  struct bs_catalog cat;
  struct bpk_fixture f;
  example11_catalog(&cat, mem);
  bpk_fixture_example11(&f);
  for (long n = 0;; n++) {
    struct bs_buf out = {0};
    bs_err err;
    bs_err_clear(&err);
    bs_alloc_fail_after(n);
    int rc = bs_bpk_write_mem(&cat, NULL, &out, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0) {
      expect_same(&out, f.data, f.len);
      bs_buf_destroy(&out);
      break;
    }
    cr_assert_eq(err.code, ENOMEM, "allocation %ld: %s", n, err.msg);
    cr_assert_null(out.data);
    cr_assert_lt(n, 10000);
  }
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

/* ---- fd and file sinks -------------------------------------------------------------------- */

static uint8_t *slurp_path(const char *path, size_t *len)
{
  return bs_test_slurp(path, len);
}

static int count_tmp(const char *dir)
{
  int n = 0;
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d));)
    n += strstr(e->d_name, ".burnstore-tmp-") != NULL;
  closedir(d);
  return n;
}

Test(bpk_write, fd_sink_writes_the_same_bytes_as_memory)
{
  uint8_t mem[24];
  struct bs_catalog cat;
  struct bpk_fixture f;
  example11_catalog(&cat, mem);
  bpk_fixture_example11(&f);
  char *dir = bs_test_tmpdir("bpkfd");
  char path[4200];
  snprintf(path, sizeof path, "%s/out.bpk", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_fd(&cat, NULL, fd, &err), 0, "%s", err.msg);
  cr_assert_eq(close(fd), 0);
  size_t len;
  uint8_t *got = slurp_path(path, &len);
  struct bs_buf b = {got, len, len};
  expect_same(&b, f.data, f.len);
  bs_free(got);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_write, full_device_reports_no_space)
{
  uint8_t mem[24];
  struct bs_catalog cat;
  example11_catalog(&cat, mem);
  int fd = open("/dev/full", O_WRONLY);
  if (fd < 0)
    cr_skip_test("no /dev/full");
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_fd(&cat, NULL, fd, &err), -1);
  close(fd);
  cr_assert_eq(err.code, ENOSPC);
  cr_assert_eq(err.off, BS_OFF_NONE);
  cr_assert(strstr(err.msg, "no space left on the device"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, file_write_replaces_target_and_leaves_no_temp)
{
  uint8_t mem[24];
  struct bs_catalog cat;
  struct bpk_fixture f;
  example11_catalog(&cat, mem);
  bpk_fixture_example11(&f);
  char *dir = bs_test_tmpdir("bpkfile");
  char path[4200];
  snprintf(path, sizeof path, "%s/model.bpk", dir);
  FILE *old = fopen(path, "w");
  fputs("old contents", old);
  fclose(old);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_file(&cat, NULL, path, &err), 0, "%s", err.msg);
  size_t len;
  uint8_t *got = slurp_path(path, &len);
  struct bs_buf b = {got, len, len};
  expect_same(&b, f.data, f.len);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(count_tmp(dir), 0);
  bs_free(got);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
  bpk_fixture_free(&f);
}

Test(bpk_write, file_write_into_missing_directory_fails_naming_the_path)
{
  uint8_t mem[24];
  struct bs_catalog cat;
  example11_catalog(&cat, mem);
  char *dir = bs_test_tmpdir("bpknodir");
  char path[4200];
  snprintf(path, sizeof path, "%s/missing/model.bpk", dir);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_file(&cat, NULL, path, &err), -1);
  cr_assert_eq(err.code, ENOENT);
  cr_assert_eq(err.off, BS_OFF_NONE);
  cr_assert(strstr(err.msg, path), "%s", err.msg);
  cr_assert(strstr(err.msg, "cannot create the temporary file"), "%s", err.msg);
  cr_assert_eq(count_tmp(dir), 0);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, failed_tensor_read_keeps_existing_target)
{
  uint8_t mem[10] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "short", BS_DT_F32, 1, (uint64_t[]){6}, 0);
  char *dir = bs_test_tmpdir("bpkkeep");
  char path[4200];
  snprintf(path, sizeof path, "%s/model.bpk", dir);
  FILE *old = fopen(path, "w");
  fputs("old contents", old);
  fclose(old);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_file(&cat, NULL, path, &err), -1);
  cr_assert_eq(err.code, EIO);
  cr_assert_str_eq(err.key, "short");
  cr_assert(strstr(err.msg, path), "%s", err.msg);
  cr_assert(strstr(err.msg, "cannot read the tensor's data"), "%s", err.msg);
  size_t len;
  uint8_t *got = slurp_path(path, &len);
  cr_assert_eq(len, 12);
  cr_assert_arr_eq(got, "old contents", 12);
  cr_assert_eq(count_tmp(dir), 0);
  bs_free(got);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}

Test(bpk_write, rename_failure_removes_the_temp_file)
{
  uint8_t mem[24];
  struct bs_catalog cat;
  example11_catalog(&cat, mem);
  char *dir = bs_test_tmpdir("bpkren");
  char path[4200], inner[4300];
  snprintf(path, sizeof path, "%s/model.bpk", dir);
  snprintf(inner, sizeof inner, "%s/keep", path);
  cr_assert_eq(mkdir(path, 0755), 0);
  cr_assert_eq(mkdir(inner, 0755), 0); /* a non-empty directory cannot be renamed over */
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_bpk_write_file(&cat, NULL, path, &err), -1);
  cr_assert_eq(err.code, EISDIR, "%s", err.msg);
  cr_assert(strstr(err.msg, "cannot rename"), "%s", err.msg);
  cr_assert(strstr(err.msg, path), "%s", err.msg);
  cr_assert_eq(count_tmp(dir), 0);
  struct stat st;
  cr_assert_eq(stat(inner, &st), 0);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}
