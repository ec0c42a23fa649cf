/* The PyTorch reader: burn's fixture files (keys, dtypes, shapes and values of
 * MANIFEST.md), files written by real torch at test time, and hand-built
 * archives for the failure paths. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"

/* Under ASan an allocation over 512 MiB returns NULL instead of succeeding
 * lazily: a reader that sizes a buffer by an untrusted count before the bytes
 * exist then fails with ENOMEM, which the tests notice. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
  return "allocator_may_return_null=1:max_allocation_size_mb=512";
}

#define TD BS_FIXTURES_DIR "/burn/burn-store/src/pytorch/tests/reader/test_data/"

/* ---- helpers -------------------------------------------------------------------------------- */

/* CPU seconds of this thread: the parse runs here, and the figure does not
 * grow when other processes load the machine (a wall-clock bound failed
 * under ASan while seven builds shared the two cores). */
static double cpu_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Peak resident memory of this process (each Criterion test runs in its own), in MiB. */
static double peak_mib(void)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

static int open_file(struct bs_catalog *cat, const char *path, bool strict, bs_err *err)
{
  struct bs_src src;
  bs_catalog_init(cat);
  bs_err_clear(err);
  if (bs_src_open(&src, path, err) != 0)
    return -1;
  struct bs_open_opts o = {.strict = strict};
  return bs_open_any(cat, &src, &o, err);
}

static int open_mem(struct bs_catalog *cat, const void *buf, size_t len, bool strict, bs_err *err)
{
  struct bs_src src;
  bs_catalog_init(cat);
  bs_err_clear(err);
  if (bs_src_init_mem(&src, buf, len, "mem.pt", err) != 0)
    return -1;
  struct bs_open_opts o = {.strict = strict};
  return bs_open_any(cat, &src, &o, err);
}

static void must_open(struct bs_catalog *cat, const char *path)
{
  bs_err e;
  char msg[512];
  int rc = open_file(cat, path, false, &e);
  cr_assert_eq(rc, 0, "%s", bs_err_format(&e, path, msg, sizeof msg));
}

static const struct bs_tensor *get(const struct bs_catalog *cat, const char *key)
{
  long i = bs_catalog_find(cat, key);
  cr_assert_geq(i, 0, "no tensor '%s'", key);
  return &cat->tensors[i];
}

/* The whole tensor, read in odd-sized pieces to exercise the gather. */
static uint8_t *read_all(const struct bs_catalog *cat, const struct bs_tensor *t)
{
  uint8_t *b = bs_malloc(t->nbytes + 1);
  cr_assert_not_null(b);
  for (uint64_t off = 0; off < t->nbytes;) {
    size_t want = t->nbytes - off < 7 ? (size_t)(t->nbytes - off) : 7;
    long r = bs_tensor_read(cat, t, off, b + off, want);
    cr_assert_eq(r, (long)want, "read of '%s' at %llu gave %ld", t->key, (unsigned long long)off,
                 r);
    off += (uint64_t)r;
  }
  return b;
}

static void expect_f32(const struct bs_catalog *cat, const char *key, const float *want, size_t n)
{
  const struct bs_tensor *t = get(cat, key);
  cr_assert_eq(t->dtype, BS_DT_F32, "%s", key);
  cr_assert_eq(t->nbytes, n * 4, "%s", key);
  float *got = (float *)read_all(cat, t);
  for (size_t i = 0; i < n; i++)
    cr_expect(fabsf(got[i] - want[i]) <= 1e-6f || (isnan(got[i]) && isnan(want[i])) ||
                  got[i] == want[i],
              "%s[%zu] = %g, want %g", key, i, got[i], want[i]);
  bs_free(got);
}

static void expect_bytes(const struct bs_catalog *cat, const char *key, enum bs_dtype dt,
                         const void *want, size_t n)
{
  const struct bs_tensor *t = get(cat, key);
  cr_assert_eq(t->dtype, dt, "%s: dtype %s", key, bs_dtype_name(t->dtype));
  cr_assert_eq(t->nbytes, n, "%s", key);
  uint8_t *got = read_all(cat, t);
  cr_expect_eq(memcmp(got, want, n), 0, "%s: bytes differ", key);
  bs_free(got);
}

/* ---- MANIFEST.md: every .pt and .tar with its keys, dtypes and shapes ----------------------- */

struct mtensor {
  char key[256];
  char dtype[16];
  uint32_t rank;
  uint64_t shape[8];
};

/* "`k` F32[3, 2]; `k2` I64[] — non-tensor entries: ..." */
static size_t parse_tensors(const char *col, struct mtensor *out, size_t max)
{
  size_t n = 0;
  const char *end = strstr(col, "\xe2\x80\x94"); /* em dash ends the tensor list */
  const char *p = col;
  while (n < max) {
    const char *a = strchr(p, '`');
    if (!a || (end && a > end))
      break;
    const char *b = strchr(a + 1, '`');
    cr_assert_not_null(b);
    struct mtensor *m = &out[n];
    memset(m, 0, sizeof *m);
    snprintf(m->key, sizeof m->key, "%.*s", (int)(b - a - 1), a + 1);
    const char *d = b + 1;
    while (*d == ' ')
      d++;
    const char *br = strchr(d, '[');
    cr_assert_not_null(br);
    snprintf(m->dtype, sizeof m->dtype, "%.*s", (int)(br - d), d);
    if (strcmp(m->dtype, "Bool") == 0)
      strcpy(m->dtype, "BOOL");
    const char *q = br + 1;
    while (*q != ']') {
      char *e;
      m->shape[m->rank++] = strtoull(q, &e, 10);
      q = e;
      while (*q == ',' || *q == ' ')
        q++;
    }
    p = q + 1;
    n++;
  }
  return n;
}

Test(pth, every_manifest_pt_and_tar_has_its_keys_dtypes_and_shapes)
{
  size_t mlen;
  char *man = (char *)bs_test_slurp(BS_FIXTURES_DIR "/burn/MANIFEST.md", &mlen);
  man[mlen] = '\0';
  int files = 0;
  for (char *line = strtok(man, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "| `", 3) != 0)
      continue;
    char *pe = strchr(line + 3, '`');
    *pe = '\0';
    const char *rel = line + 3;
    size_t rl = strlen(rel);
    bool pt = rl > 3 && strcmp(rel + rl - 3, ".pt") == 0;
    bool tar = rl > 4 && strcmp(rel + rl - 4, ".tar") == 0;
    if ((!pt && !tar) ||
        (strncmp(rel, "burn-store/", 11) != 0 && strncmp(rel, "examples/", 9) != 0))
      continue;
    /* the 5th column */
    char *col = pe + 1;
    for (int k = 0; k < 4; k++) {
      col = strchr(col + 1, '|');
      cr_assert_not_null(col, "%s: bad table row", rel);
    }
    static struct mtensor want[64];
    size_t n = parse_tensors(col, want, 64);
    char path[1024];
    snprintf(path, sizeof path, "%s/burn/%s", BS_FIXTURES_DIR, rel);
    struct bs_catalog cat;
    bs_err e;
    int rc = open_file(&cat, path, false, &e);
    files++;
    if (n == 0) { /* broken.pt */
      cr_expect_eq(rc, -1, "%s should be refused", rel);
      bs_catalog_destroy(&cat);
      continue;
    }
    cr_assert_eq(rc, 0, "%s: %s", rel, e.msg);
    cr_expect_eq(cat.count, n, "%s: %zu tensors, manifest lists %zu", rel, cat.count, n);
    for (size_t i = 0; i < n && i < cat.count; i++) {
      const struct bs_tensor *t = &cat.tensors[i];
      cr_expect_str_eq(t->key, want[i].key, "%s: tensor %zu", rel, i);
      cr_expect_str_eq(bs_dtype_name(t->dtype), want[i].dtype, "%s: %s", rel, t->key);
      cr_expect_eq(t->rank, want[i].rank, "%s: %s rank", rel, t->key);
      for (uint32_t d = 0; d < t->rank && d < want[i].rank; d++)
        cr_expect_eq(t->shape[d], want[i].shape[d], "%s: %s dim %u", rel, t->key, d);
      uint8_t *b = read_all(&cat, t); /* every byte must be readable */
      bs_free(b);
    }
    bs_catalog_destroy(&cat);
  }
  cr_expect_geq(files, 60, "only %d .pt/.tar rows found in MANIFEST.md", files);
  bs_free(man);
}

/* ---- asserted values ------------------------------------------------------------------------ */

Test(pth, float_files_have_their_values)
{
  struct bs_catalog cat;
  must_open(&cat, TD "float32.pt");
  expect_f32(&cat, "tensor", (const float[]){1.0f, 2.5f, -3.7f, 0.0f}, 4);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "float64.pt");
  expect_bytes(&cat, "tensor", BS_DT_F64, (const double[]){1.1, 2.2, 3.3}, 24);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "float16.pt"); /* 1.5, -2.25, 3.125 */
  expect_bytes(&cat, "tensor", BS_DT_F16, (const uint16_t[]){0x3E00, 0xC080, 0x4240}, 6);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "bfloat16.pt"); /* 1.5, -2.5, 3.5 */
  expect_bytes(&cat, "tensor", BS_DT_BF16, (const uint16_t[]){0x3FC0, 0xC020, 0x4060}, 6);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "special_values.pt");
  expect_f32(&cat, "tensor", (const float[]){NAN, INFINITY, -INFINITY, 0.0f, 1.0f}, 5);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "extreme_values.pt");
  expect_f32(&cat, "tensor", (const float[]){1e-30f, 1e30f, -1e-30f, -1e30f}, 4);
  bs_catalog_destroy(&cat);
}

Test(pth, integer_and_bool_files_have_their_values)
{
  struct bs_catalog cat;
  must_open(&cat, TD "int64.pt");
  expect_bytes(&cat, "tensor", BS_DT_I64, (const int64_t[]){100, -200, 300, 0}, 32);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "int32.pt");
  expect_bytes(&cat, "tensor", BS_DT_I32, (const int32_t[]){10, 20, -30}, 12);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "int16.pt");
  expect_bytes(&cat, "tensor", BS_DT_I16, (const int16_t[]){1000, -2000, 3000}, 6);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "int8.pt");
  expect_bytes(&cat, "tensor", BS_DT_I8, (const int8_t[]){127, -128, 0, 50}, 4);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "uint8.pt"); /* ByteStorage is uint8, not int8 */
  expect_bytes(&cat, "tensor", BS_DT_U8, (const uint8_t[]){0, 128, 255, 42}, 4);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "bool.pt");
  expect_bytes(&cat, "tensor", BS_DT_BOOL, (const uint8_t[]){1, 0, 1, 1, 0}, 5);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "buffers.pt");
  expect_bytes(&cat, "buffer1", BS_DT_I32, (const int32_t[]){1, 2, 3}, 12);
  expect_bytes(&cat, "buffer2", BS_DT_BOOL, (const uint8_t[]){1, 0}, 2);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "mixed_types.pt");
  expect_f32(&cat, "float32", (const float[]){1, 2}, 2);
  expect_bytes(&cat, "int64", BS_DT_I64, (const int64_t[]){100, 200}, 16);
  expect_bytes(&cat, "bool", BS_DT_BOOL, (const uint8_t[]){1, 0}, 2);
  expect_bytes(&cat, "float64", BS_DT_F64, (const double[]){1.1, 2.2}, 16);
  bs_catalog_destroy(&cat);
}

Test(pth, shapes_scalar_empty_large_and_parameter)
{
  struct bs_catalog cat;
  must_open(&cat, TD "tensor_2d.pt");
  expect_f32(&cat, "tensor", (const float[]){1, 2, 3, 4, 5, 6}, 6);
  cr_assert_eq(get(&cat, "tensor")->shape[0], 3);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "scalar.pt");
  cr_assert_eq(get(&cat, "tensor")->rank, 0);
  expect_f32(&cat, "tensor", (const float[]){42.0f}, 1);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "empty.pt");
  cr_assert_eq(get(&cat, "tensor")->rank, 1);
  cr_assert_eq(get(&cat, "tensor")->shape[0], 0);
  cr_assert_eq(get(&cat, "tensor")->nbytes, 0);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "large_shape.pt");
  const struct bs_tensor *t = get(&cat, "tensor");
  float *v = (float *)read_all(&cat, t);
  cr_assert_eq(v[0], 1.0f);
  cr_assert_eq(v[50 * 100 + 50], 2.0f);
  cr_assert_eq(v[99 * 100 + 99], 3.0f);
  cr_assert_eq(v[1], 0.0f);
  bs_free(v);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "parameter.pt");
  cr_assert_eq(get(&cat, "param")->rank, 2);
  cr_assert_eq(get(&cat, "param")->nbytes, 36);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "state_dict.pt");
  expect_f32(&cat, "running_mean", (const float[]){0, 0, 0}, 3);
  expect_f32(&cat, "running_var", (const float[]){1, 1, 1}, 3);
  bs_catalog_destroy(&cat);
}

Test(pth, checkpoint_values_json_has_epoch_and_loss)
{
  struct bs_catalog cat;
  must_open(&cat, TD "checkpoint.pt");
  cr_assert_not_null(cat.values_json);
  json_error_t je;
  json_t *j = json_loads(cat.values_json, 0, &je);
  cr_assert_not_null(j, "%s", cat.values_json);
  cr_assert_eq(json_integer_value(json_object_get(j, "epoch")), 42);
  cr_assert_float_eq(json_real_value(json_object_get(j, "loss")), 0.123, 1e-12);
  json_decref(j);
  get(&cat, "optimizer_state_dict.state.0.momentum_buffer");
  bs_catalog_destroy(&cat);

  must_open(&cat, BS_FIXTURES_DIR "/burn/burn-store/pytorch-tests/tests/config/"
                                  "weights_with_config.pt");
  j = json_loads(cat.values_json, 0, &je);
  cr_assert_not_null(j);
  cr_assert_eq(json_integer_value(json_object_get(j, "my_config.d_model")), 512);
  cr_assert_str_eq(json_string_value(json_object_get(j, "my_config.some_str")), "hello");
  cr_assert(json_is_true(json_object_get(j, "my_config.some_bool")));
  cr_assert_eq(json_array_size(json_object_get(j, "my_config.some_list_int")), 3);
  cr_assert_str_eq(json_string_value(json_object_get(j, "my_config.some_dict.some_key")),
                   "some_value");
  json_decref(j);
  bs_catalog_destroy(&cat);
}

Test(pth, legacy_files_have_their_values_and_shared_storages)
{
  struct bs_catalog cat;
  must_open(&cat, TD "simple_legacy.pt");
  cr_assert_eq(cat.count, 3);
  cr_assert_eq(get(&cat, "weight")->nbytes, 24);
  expect_f32(&cat, "bias", (const float[]){1, 1}, 2);
  expect_f32(&cat, "running_mean", (const float[]){0, 0}, 2);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "legacy_uncloned_views.pt");
  float w1[10], w2[10];
  for (int i = 0; i < 10; i++) {
    w1[i] = (float)(10 + i);
    w2[i] = (float)(50 + i);
  }
  expect_f32(&cat, "tensor1", w1, 10);
  expect_f32(&cat, "tensor2", w2, 10);
  cr_assert_eq(get(&cat, "tensor2")->off - get(&cat, "tensor1")->off, 40 * 4);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "legacy_with_offsets.pt");
  float t1[10];
  for (int i = 0; i < 10; i++)
    t1[i] = 1.0f + 0.01f * (float)i;
  expect_f32(&cat, "tensor1", t1, 10);
  expect_f32(&cat, "tensor2", (const float[]){2.0f, 2.1f, 2.2f, 2.3f, 2.4f}, 5);
  expect_f32(&cat, "tensor3", (const float[]){3.0f, 3.1f, 3.2f, 3.3f, 3.4f}, 5);
  bs_catalog_destroy(&cat);

  must_open(&cat, TD "legacy_shared_storage.pt");
  cr_assert_eq(get(&cat, "view2")->nbytes, 80);
  bs_free(read_all(&cat, get(&cat, "view3")));
  bs_catalog_destroy(&cat);
}

Test(pth, tar_files_have_their_values)
{
  struct bs_catalog cat;
  must_open(&cat, TD "tar_float32.tar");
  expect_f32(&cat, "tensor", (const float[]){1.0f, 2.5f, -3.7f, 0.0f}, 4);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "tar_float64.tar");
  expect_bytes(&cat, "tensor", BS_DT_F64, (const double[]){1.1, 2.2, 3.3}, 24);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "tar_int64.tar");
  expect_bytes(&cat, "tensor", BS_DT_I64, (const int64_t[]){100, -200, 300, 0}, 32);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "tar_weight_bias.tar");
  expect_f32(&cat, "weight", (const float[]){0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, 6);
  expect_f32(&cat, "bias", (const float[]){0.01f, 0.02f}, 2);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "tar_multi_dtype.tar");
  expect_f32(&cat, "float_tensor", (const float[]){1.5f, 2.5f, 3.5f}, 3);
  expect_bytes(&cat, "double_tensor", BS_DT_F64, (const double[]){1.111, 2.222}, 16);
  expect_bytes(&cat, "int_tensor", BS_DT_I64, (const int64_t[]){10, 20, 30, 40}, 32);
  bs_catalog_destroy(&cat);
  must_open(&cat, TD "tar_2d_tensor.tar");
  expect_f32(&cat, "matrix", (const float[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 12);
  bs_catalog_destroy(&cat);
}

Test(pth, broken_pt_is_refused)
{
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_file(&cat, TD "broken.pt", false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 0);
  cr_assert(strstr(e.msg, "not a checkpoint"), "%s", e.msg);
  cr_assert_eq(cat.count, 0);
}

Test(pth, zip_tensors_point_into_the_file_without_copies)
{
  struct bs_catalog cat;
  must_open(&cat, TD "float32.pt");
  const struct bs_tensor *t = get(&cat, "tensor");
  int fd;
  uint64_t off;
  cr_assert(bs_tensor_fd_range(&cat, t, &fd, &off));
  cr_assert_eq(off % 64, 0, "torch aligns data to 64, got %llu", (unsigned long long)off);
  cr_assert_eq(cat.nsrcs, 1);
  bs_catalog_destroy(&cat);
}

/* ---- real torch, at test time --------------------------------------------------------------- */

static char *slurp_str(const char *path)
{
  size_t n;
  char *s = (char *)bs_test_slurp(path, &n);
  s[n] = '\0';
  return s;
}

/* Open a generated case from its file (mem = false) or from memory. */
static void check_case(const char *dir, const char *name, bool mem)
{
  char path[2048], mpath[2048], epath[2048];
  snprintf(path, sizeof path, "%s/%s.pth", dir, name);
  snprintf(mpath, sizeof mpath, "%s/%s.json", dir, name);
  snprintf(epath, sizeof epath, "%s/%s.expect.json", dir, name);
  json_error_t je;
  json_t *man = json_load_file(mpath, 0, &je);
  cr_assert_not_null(man, "%s: %s", mpath, je.text);
  json_t *expect = access(epath, F_OK) == 0 ? json_load_file(epath, 0, &je) : NULL;
  struct bs_catalog cat;
  bs_err e;
  size_t flen = 0;
  uint8_t *fbuf = mem ? bs_test_slurp(path, &flen) : NULL;
  int rc = mem ? open_mem(&cat, fbuf, flen, false, &e) : open_file(&cat, path, false, &e);
  const char *want_err = expect ? json_string_value(json_object_get(expect, "error")) : NULL;
  if (want_err) {
    cr_expect_eq(rc, -1, "%s: should be refused", name);
    cr_expect(strstr(e.msg, want_err), "%s: error '%s' lacks '%s'", name, e.msg, want_err);
    json_decref(man);
    json_decref(expect);
    bs_free(fbuf);
    return;
  }
  cr_assert_eq(rc, 0, "%s: %s (offset %llu)", name, e.msg, (unsigned long long)e.off);
  cr_expect_eq(cat.count, json_object_size(man), "%s: %zu tensors, manifest has %zu", name,
               cat.count, json_object_size(man));
  const char *key;
  json_t *m;
  json_object_foreach(man, key, m)
  {
    long i = bs_catalog_find(&cat, key);
    cr_expect_geq(i, 0, "%s: no tensor '%s'", name, key);
    if (i < 0)
      continue;
    const struct bs_tensor *t = &cat.tensors[i];
    cr_expect_str_eq(bs_dtype_name(t->dtype), json_string_value(json_object_get(m, "dtype")),
                     "%s: %s", name, key);
    json_t *shape = json_object_get(m, "shape");
    cr_expect_eq(t->rank, json_array_size(shape), "%s: %s rank", name, key);
    for (uint32_t d = 0; d < t->rank && d < json_array_size(shape); d++)
      cr_expect_eq(t->shape[d], (uint64_t)json_integer_value(json_array_get(shape, d)),
                   "%s: %s dim %u", name, key, d);
    char bpath[2048];
    snprintf(bpath, sizeof bpath, "%s/%s", dir, json_string_value(json_object_get(m, "bin")));
    size_t blen;
    uint8_t *want = bs_test_slurp(bpath, &blen);
    cr_expect_eq(t->nbytes, blen, "%s: %s has %llu bytes, torch %zu", name, key,
                 (unsigned long long)t->nbytes, blen);
    if (t->nbytes == blen) {
      uint8_t *got = read_all(&cat, t);
      cr_expect_eq(memcmp(got, want, blen), 0, "%s: %s bytes differ from torch's", name, key);
      bs_free(got);
    }
    bs_free(want);
  }
  json_t *vals = expect ? json_object_get(expect, "values") : NULL;
  if (vals) {
    cr_assert_not_null(cat.values_json, "%s: no values_json", name);
    json_t *got = json_loads(cat.values_json, 0, &je);
    cr_assert_not_null(got);
    json_object_foreach(vals, key, m)
    {
      json_t *g = json_object_get(got, key);
      bool same = g && (json_equal(g, m) || (json_is_number(g) && json_is_number(m) &&
                                             json_number_value(g) == json_number_value(m)));
      char *gs = g ? json_dumps(g, JSON_ENCODE_ANY) : NULL;
      cr_expect(same, "%s: value '%s' is %s", name, key, gs ? gs : "missing");
      free(gs);
    }
    json_decref(got);
  }
  const char *note = expect ? json_string_value(json_object_get(expect, "note")) : NULL;
  if (note)
    cr_expect(cat.notes && strstr(cat.notes, note), "%s: notes '%s' lack '%s'", name,
              cat.notes ? cat.notes : "", note);
  const char *absent = expect ? json_string_value(json_object_get(expect, "absent")) : NULL;
  if (absent)
    cr_expect_neq(access(absent, F_OK), 0, "%s: %s exists: something was executed!", name, absent);
  bs_catalog_destroy(&cat);
  bs_free(fbuf);
  json_decref(man);
  json_decref(expect);
}

Test(pth, files_written_by_real_torch_match_torchs_bytes, .timeout = 280)
{
  int st = system("timeout 120 /usr/bin/python3 -c 'import torch' >/dev/null 2>&1");
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "/usr/bin/python3 cannot import torch: this test needs real torch and does not skip");
  char *dir = bs_test_tmpdir("pth");
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "timeout 240 /usr/bin/python3 '%s/tests/support/make_torch_cases.py' '%s' "
           "'%s/tests/support/make-pth-fixtures.py' >'%s/gen.log' 2>&1",
           BS_SOURCE_DIR, dir, BS_SOURCE_DIR, dir);
  st = system(cmd);
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    char lpath[2100];
    snprintf(lpath, sizeof lpath, "%s/gen.log", dir);
    char *log = slurp_str(lpath);
    cr_assert_fail("the torch case generator failed (status %d):\n%s", st, log);
  }
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  int cases = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t n = strlen(de->d_name);
    if (n < 5 || strcmp(de->d_name + n - 4, ".pth") != 0)
      continue;
    char name[512];
    snprintf(name, sizeof name, "%.*s", (int)(n - 4), de->d_name);
    check_case(dir, name, false);
    check_case(dir, name, true);
    cases++;
  }
  closedir(d);
  cr_expect_geq(cases, 20, "only %d generated cases", cases);
  bs_test_rmrf(dir);
  free(dir);
}

/* ---- hand-built zips ------------------------------------------------------------------------ */

/* Records are written {name, data, len} and, when deflated, {..., true}. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
struct zbe {
  const char *name;
  const void *data;
  size_t len;
  bool deflate; /* store the record deflated (raw deflate, as zip has it) */
};

/* Raw deflate of n bytes into a malloc'd buffer. */
static uint8_t *raw_deflate(const void *data, size_t n, size_t *outlen)
{
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  cr_assert_eq(deflateInit2(&zs, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  size_t cap = deflateBound(&zs, (uLong)n) + 16;
  uint8_t *out = malloc(cap);
  zs.next_in = (Bytef *)data;
  zs.avail_in = (uInt)n;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
  *outlen = cap - zs.avail_out;
  deflateEnd(&zs);
  return out;
}

/* A zip (no zip64) of the given records, STORED unless deflate is set. */
static uint8_t *zip_build(const struct zbe *e, size_t n, size_t *outlen)
{
  size_t cap = 1024;
  uint8_t **body = calloc(n, sizeof *body);
  size_t *blen = calloc(n, sizeof *blen);
  for (size_t i = 0; i < n; i++) {
    if (e[i].deflate)
      body[i] = raw_deflate(e[i].data, e[i].len, &blen[i]);
    else
      blen[i] = e[i].len;
    cap += 2 * (strlen(e[i].name) + 46) + blen[i];
  }
  uint8_t *b = bs_calloc(1, cap), *p = b;
  uint32_t *lho = calloc(n, sizeof *lho);
  for (size_t i = 0; i < n; i++) {
    uint16_t nl = (uint16_t)strlen(e[i].name);
    lho[i] = (uint32_t)(p - b);
    bs_put_le32(p, 0x04034b50);
    bs_put_le16(p + 8, e[i].deflate ? 8 : 0);
    bs_put_le32(p + 14, (uint32_t)crc32(0, e[i].data, (uInt)e[i].len));
    bs_put_le32(p + 18, (uint32_t)blen[i]);
    bs_put_le32(p + 22, (uint32_t)e[i].len);
    bs_put_le16(p + 26, nl);
    memcpy(p + 30, e[i].name, nl);
    memcpy(p + 30 + nl, body[i] ? body[i] : e[i].data, blen[i]);
    p += 30 + nl + blen[i];
  }
  uint8_t *cd = p;
  for (size_t i = 0; i < n; i++) {
    uint16_t nl = (uint16_t)strlen(e[i].name);
    bs_put_le32(p, 0x02014b50);
    bs_put_le16(p + 10, e[i].deflate ? 8 : 0);
    bs_put_le32(p + 16, (uint32_t)crc32(0, e[i].data, (uInt)e[i].len));
    bs_put_le32(p + 20, (uint32_t)blen[i]);
    bs_put_le32(p + 24, (uint32_t)e[i].len);
    bs_put_le16(p + 28, nl);
    bs_put_le32(p + 42, lho[i]);
    memcpy(p + 46, e[i].name, nl);
    p += 46 + nl;
  }
  bs_put_le32(p, 0x06054b50);
  bs_put_le16(p + 8, (uint16_t)n);
  bs_put_le16(p + 10, (uint16_t)n);
  bs_put_le32(p + 12, (uint32_t)(p - cd));
  bs_put_le32(p + 16, (uint32_t)(cd - b));
  p += 22;
  for (size_t i = 0; i < n; i++)
    free(body[i]);
  free(body);
  free(blen);
  free(lho);
  *outlen = (size_t)(p - b);
  return b;
}

/* {'w': tensor (2, 3) of storage '0' (8 floats) at offset 2, strides (3, 1)} + extra pickle
 * items inserted before the final SETITEMS' STOP */
#define W_PICKLE(extra)                                                                            \
  "\x80\x02}(X\x01\x00\x00\x00w"                                                                   \
  "ctorch._utils\n_rebuild_tensor_v2\n"                                                            \
  "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"                              \
  "0X\x03\x00\x00\x00"                                                                             \
  "cpuK\x08tQK\x02K\x02K\x03\x86K\x03K\x01\x86\x89"                                                \
  "ccollections\nOrderedDict\n)RtR" extra "u."

static const float STORE8[8] = {0, 1, 2, 3, 4, 5, 6, 7};

static uint8_t *w_zip(const char *pkl, size_t plen, const void *store, size_t slen, size_t *len)
{
  struct zbe e[] = {
      {"arch/data.pkl", pkl, plen}, {"arch/data/0", store, slen}, {"arch/version", "3\n", 2}};
  return zip_build(e, 3, len);
}

Test(pth, hand_built_zip_reads_an_offset_tensor)
{
  static const char pk[] = W_PICKLE("");
  size_t len;
  uint8_t *z = w_zip(pk, sizeof pk - 1, STORE8, sizeof STORE8, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), 0, "%s", e.msg);
  expect_f32(&cat, "w", (const float[]){2, 3, 4, 5, 6, 7}, 6);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

Test(pth, malicious_global_in_a_zip_is_skipped_and_reported_tensors_still_read)
{
  /* 'evil': posix.system('touch /tmp/x'), 'cfg': argparse.Namespace(lr=0.5) */
  static const char pk[] = W_PICKLE("X\x04\x00\x00\x00"
                                    "evilcposix\nsystem\nX\x0c\x00\x00\x00"
                                    "touch /tmp/x\x85R"
                                    "X\x03\x00\x00\x00"
                                    "cfgcargparse\nNamespace\n)\x81}X\x02\x00"
                                    "\x00\x00lrG?\xe0\x00\x00\x00\x00\x00\x00sb");
  size_t len;
  uint8_t *z = w_zip(pk, sizeof pk - 1, STORE8, sizeof STORE8, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), 0, "%s", e.msg);
  expect_f32(&cat, "w", (const float[]){2, 3, 4, 5, 6, 7}, 6);
  cr_assert_not_null(cat.notes);
  cr_assert(strstr(cat.notes, "skipped object of class posix.system at pickle offset"), "%s",
            cat.notes);
  cr_assert_str_eq(cat.values_json, "{\"cfg.lr\":0.5}");
  bs_catalog_destroy(&cat);

  cr_assert_eq(open_mem(&cat, z, len, true, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  const char *g = memmem(pk, sizeof pk - 1, "cposix", 6);
  cr_assert_eq(e.off, 30 + 13 + (uint64_t)(g - pk)); /* data.pkl data offset + GLOBAL position */
  cr_assert(strstr(e.msg, "posix.system"), "%s", e.msg);
  bs_free(z);
}

Test(pth, missing_storage_record_names_tensor_and_storage)
{
  static const char pk[] = W_PICKLE("");
  struct zbe ents[] = {{"arch/data.pkl", pk, sizeof pk - 1}, {"arch/version", "3\n", 2}};
  size_t len;
  uint8_t *z = zip_build(ents, 2, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, BS_OFF_NONE);
  cr_assert_str_eq(e.key, "w");
  cr_assert(strstr(e.msg, "storage '0' has no record 'arch/data/0'"), "%s", e.msg);
  bs_free(z);
}

Test(pth, short_storage_record_is_refused)
{
  static const char pk[] = W_PICKLE("");
  size_t len;
  uint8_t *z = w_zip(pk, sizeof pk - 1, STORE8, 28, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 30 + 13 + (sizeof pk - 1) + 30 + 11); /* the record's data */
  cr_assert_str_eq(e.key, "w");
  cr_assert(strstr(e.msg, "storage '0' has 28 bytes but its persistent id declares 8 elements"),
            "%s", e.msg);
  bs_free(z);
}

Test(pth, view_past_the_storage_is_refused)
{
  /* stride (4, 1) with offset 2: last element 2 + 4 + 2 = 8 > 7 */
  static const char pk[] = "\x80\x02}(X\x01\x00\x00\x00w"
                           "ctorch._utils\n_rebuild_tensor_v2\n"
                           "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                           "0X\x03\x00\x00\x00"
                           "cpuK\x08tQK\x02K\x02K\x03\x86K\x04K\x01\x86\x89"
                           "ccollections\nOrderedDict\n)RtRu.";
  size_t len;
  uint8_t *z = w_zip(pk, sizeof pk - 1, STORE8, sizeof STORE8, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 30 + 13 + (sizeof pk - 1) + 30 + 11);
  cr_assert_str_eq(e.key, "w");
  cr_assert(strstr(e.msg, "storage too short"), "%s", e.msg);
  bs_free(z);
}

Test(pth, torchscript_archive_is_refused)
{
  static const char pk[] = W_PICKLE("");
  struct zbe ents[] = {{"m/data.pkl", pk, sizeof pk - 1},
                       {"m/constants.pkl", "\x80\x02).", 4},
                       {"m/code/__torch__.py", "x", 1}};
  size_t len;
  uint8_t *z = zip_build(ents, 3, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  cr_assert_eq(e.off, BS_OFF_NONE);
  cr_assert(strstr(e.msg, "TorchScript archive"), "%s", e.msg);
  bs_free(z);
}

Test(pth, big_endian_byteorder_is_refused)
{
  static const char pk[] = W_PICKLE("");
  struct zbe ents[] = {{"a/data.pkl", pk, sizeof pk - 1},
                       {"a/byteorder", "big", 3},
                       {"a/data/0", STORE8, sizeof STORE8}};
  size_t len;
  uint8_t *z = zip_build(ents, 3, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  cr_assert_eq(e.off, 30 + 10 + sizeof pk - 1);
  cr_assert(strstr(e.msg, "big-endian checkpoint"), "%s", e.msg);
  bs_free(z);
}

/* Found by fuzzing: a deflated data.pkl whose directory claimed 1 GiB made
 * the reader allocate 1 GiB before inflating 2 bytes. Under ASan (see
 * __asan_default_options) such an allocation fails, so the old code gave ENOMEM.
 * Now a claim beyond deflate's ratio limit is refused before anything is inflated. */
Test(pth, deflated_pickle_claiming_a_gigabyte_allocates_nothing)
{
  struct zbe ents[] = {{"a/data.pkl", "\x03\x00", 2}}; /* an empty final deflate block */
  size_t len;
  uint8_t *z = zip_build(ents, 1, &len);
  uint64_t cd = bs_le32(z + len - 22 + 16);
  bs_put_le16(z + 8, 8); /* method: deflate */
  bs_put_le16(z + cd + 10, 8);
  bs_put_le32(z + 22, 1u << 30); /* uncompressed size */
  bs_put_le32(z + cd + 24, 1u << 30);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL, "%d %s", e.code, e.msg);
  cr_assert_eq(e.off, 0);
  cr_assert(strstr(e.msg, "zip member 'a/data.pkl' claims 1073741824 bytes from 2 compressed"),
            "%s", e.msg);
  bs_free(z);
}

Test(pth, zip_without_data_pkl_or_prefix_is_refused)
{
  struct zbe a[] = {{"a/version", "3\n", 2}};
  size_t len;
  uint8_t *z = zip_build(a, 1, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, BS_OFF_NONE);
  cr_assert(strstr(e.msg, "no 'a/data.pkl'"), "%s", e.msg);
  bs_free(z);
  struct zbe b[] = {{"data.pkl", "\x80\x02N.", 4}};
  z = zip_build(b, 1, &len);
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert(strstr(e.msg, "not inside a directory"), "%s", e.msg);
  bs_free(z);
}

Test(pth, unknown_opcode_in_data_pkl_names_byte_and_file_offset)
{
  size_t len;
  uint8_t *f = bs_test_slurp(TD "float32.pt", &len);
  uint8_t *pk = memmem(f, len, "\x80\x02}q\x00X", 6);
  cr_assert_not_null(pk);
  uint64_t d = (uint64_t)(pk - f);
  pk[2] = 0xff;
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, f, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, d + 2);
  cr_assert(strstr(e.msg, "pickle offset 2: unknown pickle opcode 0xff"), "%s", e.msg);
  bs_free(f);
}

Test(pth, numel_mismatch_in_a_real_file_is_refused)
{
  size_t len;
  uint8_t *f = bs_test_slurp(TD "float32.pt", &len);
  uint8_t *k = memmem(f, len,
                      "cpu"
                      "q\x06K\x04t",
                      8);
  cr_assert_not_null(k);
  k[6] = 5;
  static const float v[4] = {1.0f, 2.5f, -3.7f, 0.0f};
  uint8_t *data = memmem(f, len, v, sizeof v);
  cr_assert_not_null(data);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, f, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, (uint64_t)(data - f));
  cr_assert_str_eq(e.key, "tensor");
  cr_assert(strstr(e.msg, "declares 5 elements of 4 bytes"), "%s", e.msg);
  bs_free(f);
}

/* ---- hostile values: bounded by bytes and work ----------------------------------------------- */

struct pbuf {
  char *p;
  size_t n, cap;
};

static void pb_put(struct pbuf *b, const void *d, size_t n)
{
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}

/* W_PICKLE's {'w': tensor} plus 'v': VALUE, where VALUE is built by the caller
 * between pb_value_begin and pb_value_end. */
static void pb_value_begin(struct pbuf *b)
{
  static const char full[] = W_PICKLE("X\x01\x00\x00\x00v");
  pb_put(b, full, sizeof full - 1 - 2); /* without the final "u." */
}

static void pb_value_end(struct pbuf *b)
{
  pb_put(b, "u.", 2);
}

/* s = 'x' * slen memoized at 1, then [s] * n (n BINGETs). */
static void pb_shared_string_list(struct pbuf *b, size_t slen, size_t n)
{
  uint8_t h[5] = {'X'};
  bs_put_le32(h + 1, (uint32_t)slen);
  pb_put(b, h, 5);
  char *x = malloc(slen);
  memset(x, 'x', slen);
  pb_put(b, x, slen);
  free(x);
  pb_put(b,
         "q\x01"
         "0]q\x02(",
         7); /* memoize s, pop it, start the list */
  for (size_t i = 0; i < n; i++)
    pb_put(b, "h\x01", 2);
  pb_put(b, "e", 1);
}

/* The hostile files below cost the old code seconds to minutes and hundreds of MB to GBs; now
 * milliseconds and a few MB. The memory bounds are the tight checks; the CPU-time bound is loose,
 * as these also run under ASan on a loaded 2-core machine, two tests at a time. */
#define HOSTILE_SECS 3.0

/* Returns the archive, which the (memory-backed) catalog reads: free it after the catalog. */
static uint8_t *open_hostile(const struct pbuf *b, struct bs_catalog *cat, double *secs)
{
  size_t len;
  uint8_t *z = w_zip(b->p, b->n, STORE8, sizeof STORE8, &len);
  bs_err e;
  double t0 = cpu_s();
  cr_assert_eq(open_mem(cat, z, len, false, &e), 0, "%s", e.msg);
  *secs = cpu_s() - t0;
  expect_f32(cat, "w", (const float[]){2, 3, 4, 5, 6, 7}, 6);
  return z;
}

/* A 200 KB pickle sharing one 10 KB string 20,000 times: the old walk copied
 * it 20,000 times (200 MB of values text, ~600 MB peak). */
Test(pth, a_shared_string_is_not_copied_past_the_values_budget)
{
  struct pbuf b = {0};
  pb_value_begin(&b);
  pb_shared_string_list(&b, 10000, 20000);
  pb_value_end(&b);
  cr_assert_lt(b.n, 100000);
  struct bs_catalog cat;
  double secs;
  uint8_t *z = open_hostile(&b, &cat, &secs);
  free(b.p);
  cr_assert_lt(secs, HOSTILE_SECS, "%.2f s", secs);
  cr_assert_lt(peak_mib(), 64, "peak %.0f MiB", peak_mib());
  cr_assert(!cat.values_json || strlen(cat.values_json) <= (16u << 20));
  cr_assert_not_null(cat.notes);
  cr_assert(strstr(cat.notes, "non-tensor values stop at 'v': over the budget of 16 MiB"), "%s",
            cat.notes);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* The same string referenced by lists of lists, 10 levels of 10: 10^10
 * copies in the old walk (minutes, then out of memory). */
Test(pth, nested_shared_references_decide_fast_in_little_memory)
{
  struct pbuf b = {0};
  pb_value_begin(&b);
  uint8_t h[5] = {'X'};
  bs_put_le32(h + 1, 10000);
  pb_put(&b, h, 5);
  char x[10000];
  memset(x, 'y', sizeof x);
  pb_put(&b, x, sizeof x);
  pb_put(&b,
         "q\x01"
         "0",
         3);
  for (uint8_t k = 1; k <= 10; k++) { /* level k: [memo k] * 10, memoized at k + 1 and popped */
    pb_put(&b, "](", 2);
    for (int i = 0; i < 10; i++)
      pb_put(&b, (uint8_t[]){'h', k}, 2);
    pb_put(&b, (uint8_t[]){'e', 'q', (uint8_t)(k + 1), '0'}, 4);
  }
  pb_put(&b, "h\x0b", 2);
  pb_value_end(&b);
  struct bs_catalog cat;
  double secs;
  uint8_t *z = open_hostile(&b, &cat, &secs);
  free(b.p);
  cr_assert_lt(secs, HOSTILE_SECS, "%.2f s", secs);
  cr_assert_lt(peak_mib(), 64, "peak %.0f MiB", peak_mib());
  cr_assert(strstr(cat.notes, "non-tensor values stop at 'v."), "%s", cat.notes);
  json_error_t je;
  json_t *j = json_loads(cat.values_json, 0, &je);
  cr_assert_not_null(j, "%s", je.text);
  json_decref(j);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* Lists of lists of small ints, shared: many small values, each charged. */
Test(pth, many_small_shared_values_stop_at_the_budget)
{
  struct pbuf b = {0};
  pb_value_begin(&b);
  pb_put(&b,
         "](K\x01K\x02K\x03"
         "eq\x01"
         "0",
         12);
  for (uint8_t k = 1; k <= 8; k++) {
    pb_put(&b, "](", 2);
    for (int i = 0; i < 10; i++)
      pb_put(&b, (uint8_t[]){'h', k}, 2);
    pb_put(&b, (uint8_t[]){'e', 'q', (uint8_t)(k + 1), '0'}, 4);
  }
  pb_put(&b, "h\x09", 2);
  pb_value_end(&b);
  struct bs_catalog cat;
  double secs;
  uint8_t *z = open_hostile(&b, &cat, &secs);
  free(b.p);
  cr_assert_lt(secs, HOSTILE_SECS, "%.2f s", secs);
  cr_assert_lt(peak_mib(), 80, "peak %.0f MiB", peak_mib());
  cr_assert(strstr(cat.notes, "non-tensor values stop at"), "%s", cat.notes);
  cr_assert_leq(strlen(cat.values_json), 16u << 20);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* Shared values within the budget are all listed (a reference is a value at
 * each of its paths, as torch.load gives it). */
Test(pth, shared_values_under_the_budget_are_all_listed)
{
  struct pbuf b = {0};
  pb_value_begin(&b);
  pb_shared_string_list(&b, 3, 4);
  pb_value_end(&b);
  struct bs_catalog cat;
  double secs;
  uint8_t *z = open_hostile(&b, &cat, &secs);
  free(b.p);
  cr_assert_str_eq(cat.values_json, "{\"v\":[\"xxx\",\"xxx\",\"xxx\",\"xxx\"]}");
  cr_assert_null(cat.notes);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* Floats in the values use the shortest text that reads back the same. */
Test(pth, float_values_use_the_shortest_round_trip_form)
{
  struct pbuf b = {0};
  pb_value_begin(&b);
  static const double f[] = {0.1, 1e-7, 2.5, 1.0 / 3, 1.0, -0.0, 1e300, 123456789.125};
  pb_put(&b, "](", 2);
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    uint64_t u;
    memcpy(&u, &f[i], 8);
    uint8_t g[9] = {'G'};
    for (int k = 0; k < 8; k++)
      g[1 + k] = (uint8_t)(u >> (56 - 8 * k)); /* BINFLOAT is big-endian */
    pb_put(&b, g, 9);
  }
  pb_put(&b, "e", 1);
  pb_value_end(&b);
  struct bs_catalog cat;
  double secs;
  uint8_t *z = open_hostile(&b, &cat, &secs);
  free(b.p);
  cr_assert_str_eq(cat.values_json, "{\"v\":[0.1,1e-07,2.5,0.3333333333333333,1.0,-0.0,1e+300,"
                                    "123456789.125]}");
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* The values text is built by hand now: escapes, non-ASCII and invalid UTF-8
 * (null, as jansson gave it) must still make valid JSON. */
Test(pth, values_text_escapes_strings_and_nulls_invalid_utf8)
{
  struct pbuf b = {0};
  pb_value_begin(&b);
  static const char items[] = "](X\x08\x00\x00\x00q\"\\\n\x01\xc3\xa9z"
                              "X\x02\x00\x00\x00\xff\x41"
                              "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x80"
                              "e";
  pb_put(&b, items, sizeof items - 1);
  pb_value_end(&b);
  struct bs_catalog cat;
  double secs;
  uint8_t *z = open_hostile(&b, &cat, &secs);
  free(b.p);
  json_error_t je;
  json_t *j = json_loads(cat.values_json, 0, &je);
  cr_assert_not_null(j, "%s: %s", je.text, cat.values_json);
  json_t *v = json_object_get(j, "v");
  cr_assert_eq(json_array_size(v), 3);
  cr_assert_str_eq(json_string_value(json_array_get(v, 0)), "q\"\\\n\x01\xc3\xa9z");
  cr_assert(json_is_null(json_array_get(v, 1)));
  cr_assert_str_eq(json_string_value(json_array_get(v, 2)), "-2361183241434822606848");
  json_decref(j);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* ---- deflated members, temporary files, rollback ----------------------------------------------
 */

/* A re-zipped checkpoint (deflated storage): the copy is a file on disk in
 * $TMPDIR, unlinked; the old code inflated it into a memfd (RAM). */
Test(pth, deflated_storage_is_inflated_to_an_unlinked_file_in_tmpdir)
{
  static const char pk[] = W_PICKLE("");
  struct zbe ents[] = {{"arch/data.pkl", pk, sizeof pk - 1, true},
                       {"arch/data/0", STORE8, sizeof STORE8, true}};
  size_t len;
  uint8_t *z = zip_build(ents, 2, &len);
  char *dir = bs_test_tmpdir("pth-tmp");
  const char *old = getenv("TMPDIR");
  char *saved = old ? strdup(old) : NULL;
  setenv("TMPDIR", dir, 1);
  struct bs_catalog cat;
  bs_err e;
  int rc = open_mem(&cat, z, len, false, &e);
  if (saved)
    setenv("TMPDIR", saved, 1);
  else
    unsetenv("TMPDIR");
  free(saved);
  cr_assert_eq(rc, 0, "%s", e.msg);
  expect_f32(&cat, "w", (const float[]){2, 3, 4, 5, 6, 7}, 6);
  const struct bs_tensor *t = get(&cat, "w");
  cr_assert_gt(t->src, 0);
  char link[64], target[4096];
  int fd = bs_src_fd_get(&cat.srcs[t->src]);
  cr_assert_geq(fd, 0, "the copy is a file");
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  bs_src_fd_put(&cat.srcs[t->src], fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  cr_assert_gt(n, 0);
  target[n] = '\0';
  cr_assert(strncmp(target, dir, strlen(dir)) == 0, "the copy is %s, not in %s", target, dir);
  cr_assert(strstr(target, "(deleted)"), "%s", target);
  DIR *d = opendir(dir);
  struct dirent *de;
  int files = 0;
  while ((de = readdir(d)))
    files += de->d_name[0] != '.';
  closedir(d);
  cr_assert_eq(files, 0);
  bs_catalog_destroy(&cat);
  bs_test_rmrf(dir);
  free(dir);
  bs_free(z);
}

/* Many deflated storages share one temporary file (one descriptor), not one each. */
Test(pth, deflated_storages_share_one_temporary_file)
{
  static const char pk[] =
      W_PICKLE("X\x01\x00\x00\x00"
               "uctorch._utils\n_rebuild_tensor_v2\n"
               "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
               "1X\x03\x00\x00\x00"
               "cpuK\x01tQK\x00K\x01\x85K\x01\x85\x89"
               "ccollections\nOrderedDict\n)RtR");
  static const float one = 42;
  struct zbe ents[] = {{"arch/data.pkl", pk, sizeof pk - 1},
                       {"arch/data/0", STORE8, sizeof STORE8, true},
                       {"arch/data/1", &one, sizeof one, true}};
  size_t len;
  uint8_t *z = zip_build(ents, 3, &len);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), 0, "%s", e.msg);
  expect_f32(&cat, "w", (const float[]){2, 3, 4, 5, 6, 7}, 6);
  expect_f32(&cat, "u", &one, 1);
  cr_assert_eq(cat.nsrcs, 2);
  cr_assert_eq(get(&cat, "w")->src, 1);
  cr_assert_eq(get(&cat, "u")->src, 1);
  cr_assert_eq(cat.srcs[1].size, sizeof STORE8 + sizeof one);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* A deflated member that inflates to more than its entry declares, or one
 * whose CRC does not match, is refused naming the member. */
Test(pth, deflated_member_larger_than_declared_is_refused)
{
  static const char pk[] = W_PICKLE("");
  float big[64] = {0};
  struct zbe ents[] = {{"arch/data.pkl", pk, sizeof pk - 1},
                       {"arch/data/0", big, sizeof big, true}};
  size_t len;
  uint8_t *z = zip_build(ents, 2, &len);
  uint64_t cd = bs_le32(z + len - 22 + 16);
  uint64_t e2 = cd + 46 + strlen("arch/data.pkl");
  bs_put_le32(z + e2 + 24, sizeof STORE8); /* declare 32 bytes: the storage's real size */
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert(strstr(e.msg, "zip member 'arch/data/0' inflates to more than the 32 bytes"), "%s",
            e.msg);
  bs_free(z);
}

/* The reader's entry called directly (bs_open_any empties the catalog on
 * failure, which would hide a reader that does not roll back). The only
 * call of the entry in the tests: the format registry changes its signature. */
static int read_zip_entry(struct bs_catalog *cat, uint32_t idx, bs_err *err)
{
  return bs_pth_read(cat, idx, NULL, err);
}

/* A zip pickle: tensor 'bad' (one float) of storage KEY (NUMEL floats),
 * then 'evil', a call of posix.system (skipped, with a note). */
#define BAD_THEN_EVIL(KEY, NUMEL)                                                                  \
  W_PICKLE("X\x03\x00\x00\x00"                                                                     \
           "badctorch._utils\n_rebuild_tensor_v2\n"                                                \
           "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" KEY                 \
           "X\x03\x00\x00\x00"                                                                     \
           "cpuK" NUMEL "tQK\x00K\x01\x85K\x01\x85\x89"                                            \
           "ccollections\nOrderedDict\n)RtRX\x04\x00\x00\x00"                                      \
           "evilcposix\nsystem\nX\x01\x00\x00\x00x\x85R")

/* The reader takes back what it added when it fails half way (tensors,
 * notes, decompressed copies), like the other readers. */
Test(pth, a_failed_read_rolls_the_catalog_back)
{
  /* 'w' is read, then 'bad' names a storage the archive lacks */
  static const char pk[] = BAD_THEN_EVIL("9", "\x01");
  struct zbe ents[] = {{"arch/data.pkl", pk, sizeof pk - 1},
                       {"arch/data/0", STORE8, sizeof STORE8, true}};
  size_t len;
  uint8_t *z = zip_build(ents, 2, &len);
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err e;
  bs_err_clear(&e);
  struct bs_src src;
  cr_assert_eq(bs_src_init_mem(&src, z, len, "mem.pt", &e), 0);
  uint32_t idx;
  cr_assert_eq(bs_catalog_add_src(&cat, &src, &idx, &e), 0);
  cr_assert_eq(read_zip_entry(&cat, idx, &e), -1);
  cr_assert(strstr(e.msg, "has no record 'arch/data/9'"), "%s", e.msg);
  cr_assert_eq(cat.count, 0);
  cr_assert_null(cat.notes);
  cr_assert_null(cat.values_json);
  cr_assert_eq(cat.nsrcs, 1);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

Test(pth, deeply_nested_lists_in_a_zip_are_a_clean_error)
{
  size_t depth = 5000, n = 2 + depth + (depth - 1) + 1;
  char *pk = malloc(n);
  pk[0] = (char)0x80;
  pk[1] = 2;
  memset(pk + 2, ']', depth);
  memset(pk + 2 + depth, 'a', depth - 1);
  pk[n - 1] = '.';
  struct zbe ents[] = {{"a/data.pkl", pk, n}};
  size_t len;
  uint8_t *z = zip_build(ents, 1, &len);
  free(pk);
  struct bs_catalog cat;
  bs_err e;
  cr_assert_eq(open_mem(&cat, z, len, false, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, BS_OFF_NONE);
  cr_assert(strstr(e.msg, "nested deeper than"), "%s", e.msg);
  bs_free(z);
}

/* A reference cycle (l = [l]; d = {'d': d}) is skipped with a note; the old
 * recursive walk went 1000 frames deep (4 KiB each for dicts) and failed, or
 * crashed on a 1 MiB stack (tests/e2e/test_pytorch_hostile.py). */
Test(pth, self_referencing_containers_mount_with_a_note)
{
  static const char pl[] = W_PICKLE("X\x01\x00\x00\x00l]q\x09h\x09"
                                    "a");
  static const char pd[] = W_PICKLE("X\x01\x00\x00\x00"
                                    "d}q\x09X\x01\x00\x00\x00"
                                    "dh\x09s");
  const char *pks[] = {pl, pd};
  size_t lens[] = {sizeof pl - 1, sizeof pd - 1};
  const char *where[] = {"key 'l.0'", "key 'd.d'"};
  for (int i = 0; i < 2; i++) {
    size_t len;
    uint8_t *z = w_zip(pks[i], lens[i], STORE8, sizeof STORE8, &len);
    struct bs_catalog cat;
    bs_err e;
    cr_assert_eq(open_mem(&cat, z, len, false, &e), 0, "%s", e.msg);
    expect_f32(&cat, "w", (const float[]){2, 3, 4, 5, 6, 7}, 6);
    cr_assert_not_null(cat.notes);
    cr_assert(strstr(cat.notes, "skipped a reference cycle at"), "%s", cat.notes);
    cr_assert(strstr(cat.notes, where[i]), "%s", cat.notes);
    bs_catalog_destroy(&cat);
    bs_free(z);
  }
}

/* One cyclic dict shared 20,000 times: the notes stay short. */
Test(pth, a_shared_cycle_is_noted_a_bounded_number_of_times)
{
  struct pbuf b = {0};
  pb_value_begin(&b);
  pb_put(&b,
         "}q\x01X\x01\x00\x00\x00"
         "dh\x01s0](",
         15);
  for (int i = 0; i < 20000; i++)
    pb_put(&b, "h\x01", 2);
  pb_put(&b, "e", 1);
  pb_value_end(&b);
  struct bs_catalog cat;
  double secs;
  uint8_t *z = open_hostile(&b, &cat, &secs);
  free(b.p);
  cr_assert_lt(secs, HOSTILE_SECS, "%.2f s", secs);
  size_t lines = 0;
  for (const char *p = cat.notes; p && *p; p++)
    lines += *p == '\n';
  cr_assert_leq(lines, 102, "%zu note lines", lines);
  cr_assert(strstr(cat.notes, "skipped a reference cycle at key 'v.0.d'"), "%s", cat.notes);
  cr_assert(strstr(cat.notes, "further notes about skipped cycles"), "%s", cat.notes);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* l0 = [b, b]; l(k+1) = [lk, lk]: 2^40 paths from 40 levels, no tensor and
 * no value in any of them. The old walk refused the file after 4M nodes; now
 * a subtree known to hold no tensor is not walked again once values stop. */
Test(pth, shared_reference_bomb_without_tensors_is_walked_once)
{
  char pk[1024];
  size_t n = 0;
  const char head[] = "\x80\x02]q\x00(C\x01xC\x01xe";
  memcpy(pk, head, sizeof head - 1);
  n = sizeof head - 1;
  for (int k = 0; k < 40; k++) {
    const uint8_t lvl[] = {']', 'q', (uint8_t)(k + 1), '(', 'h', (uint8_t)k, 'h', (uint8_t)k, 'e'};
    memcpy(pk + n, lvl, sizeof lvl);
    n += sizeof lvl;
  }
  pk[n++] = '.';
  struct zbe ents[] = {{"a/data.pkl", pk, n}};
  size_t len;
  uint8_t *z = zip_build(ents, 1, &len);
  struct bs_catalog cat;
  bs_err e;
  double t0 = cpu_s();
  cr_assert_eq(open_mem(&cat, z, len, false, &e), 0, "%s", e.msg);
  cr_assert_lt(cpu_s() - t0, 1.0);
  cr_assert_eq(cat.count, 0);
  bs_catalog_destroy(&cat);
  bs_free(z);
}

/* The stored torch zip of pickle pk (n bytes; freed) is refused (EFBIG)
 * within cpu_max CPU seconds and max_mib of peak memory (twice that under
 * AddressSanitizer, whose shadow and quarantine double a 48 MiB arena),
 * adding no tensor; *e says why. */
static void refused_fast(char *pk, size_t n, double cpu_max, double max_mib, bs_err *e)
{
#if defined(__SANITIZE_ADDRESS__)
  max_mib *= 2;
#endif
  size_t len;
  uint8_t *z = w_zip(pk, n, STORE8, sizeof STORE8, &len);
  free(pk);
  struct bs_catalog cat;
  double t0 = cpu_s();
  cr_assert_eq(open_mem(&cat, z, len, false, e), -1, "%zu bytes read", len);
  cr_assert_lt(cpu_s() - t0, cpu_max);
  cr_assert_lt(peak_mib(), max_mib, "peak %.0f MiB", peak_mib());
  cr_assert_eq(e->code, EFBIG, "%s", e->msg);
  cr_assert_eq(cat.count, 0);
  bs_free(z);
}

/* Shared tensors are real paths (tied weights), but 2^40 paths to one tensor
 * are refused fast, in little memory (the old walk took 4M steps and
 * hundreds of MB of keys before refusing). */
Test(pth, shared_tensor_bomb_is_refused_fast)
{
  size_t cap = 4096, n = 0;
  char *pk = malloc(cap);
  /* hand-built: l0 = [t, t] (t a tensor), l(k+1) = [lk, lk] */
  static const char t0pk[] = "\x80\x02"
                             "ctorch._utils\n_rebuild_tensor_v2\n"
                             "((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                             "0X\x03\x00\x00\x00"
                             "cpuK\x08tQK\x00K\x08\x85K\x01\x85\x89"
                             "ccollections\nOrderedDict\n)RtRq\x00";
  memcpy(pk, t0pk, sizeof t0pk - 1);
  n = sizeof t0pk - 1;
  for (int k = 0; k < 40; k++) {
    const uint8_t lvl[] = {']', 'q', (uint8_t)(k + 1), '(', 'h', (uint8_t)k, 'h', (uint8_t)k, 'e'};
    memcpy(pk + n, lvl, sizeof lvl);
    n += sizeof lvl;
  }
  pk[n++] = '.';
  bs_err e;
  refused_fast(pk, n, 0.5, 64, &e);
  cr_assert(strstr(e.msg, "1 distinct tensor(s) appear under 4112 keys"), "%s", e.msg);
}

/* A few bytes of pickle make a tensor; a reference to a dict of them under
 * another key names them all again, and a key can be 4 KB long: a 86 KB file
 * of 2000 tensors under 16 keys of 4000 bytes made 32,000 catalog entries
 * of 4 KB keys (the catalog, the flattening's key map: 390 MB for ls). What a
 * tensor's key will hold is charged to the unpickler's memory bound. */
Test(pth, tensors_under_many_long_keys_stop_at_the_memory_bound)
{
  static const char head[] = "\x80\x02}ctorch._utils\n_rebuild_tensor_v2\nq\x00"
                             "0((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                             "0X\x03\x00\x00\x00"
                             "cpuK\x08tQK\x00K\x08\x85K\x01\x85\x89"
                             "ccollections\nOrderedDict\n)Rtq\x01"
                             "0}q\x02";
  enum { TENSORS = 2000, COPIES = 16, KLEN = 4000 };
  size_t cap = sizeof head + TENSORS * 16 + COPIES * (KLEN + 8) + 64, n = 0;
  char *pk = malloc(cap);
  cr_assert_not_null(pk);
  memcpy(pk, head, sizeof head - 1);
  n = sizeof head - 1;
  for (int i = 0; i < TENSORS; i++) { /* (key, _rebuild_tensor_v2, args) SETITEMS of 100 */
    if (i % 100 == 0)
      pk[n++] = '(';
    n += (size_t)sprintf(pk + n, "\x8c\x04%04x", i);
    memcpy(pk + n, "h\x00h\x01R", 5);
    n += 5;
    if (i % 100 == 99)
      pk[n++] = 'u';
  }
  memcpy(pk + n, "0(", 2); /* the dict of tensors off the stack; the root's items: */
  n += 2;
  for (int k = 0; k < COPIES; k++) { /* 'NNkkkk...': that dict */
    const uint32_t kl = KLEN;
    pk[n++] = 'X';
    memcpy(pk + n, &kl, 4);
    n += 4;
    sprintf(pk + n, "%02d", k);
    memset(pk + n + 2, 'k', KLEN - 2);
    n += KLEN;
    memcpy(pk + n, "h\x02", 2);
    n += 2;
  }
  memcpy(pk + n, "u.", 2);
  n += 2;
  bs_err e;
  refused_fast(pk, n, 1.0, 64, &e);
  cr_assert(strstr(e.msg, "the pickle's values and the catalog of its tensors need more than "
                          "50331648 bytes of memory (the bound is the larger of 48 MiB and 24 x "
                          "the file's"),
            "%s", e.msg);
}

Test(pth, truncated_zip_and_legacy_files_fail_cleanly)
{
  const char *files[] = {TD "float32.pt", TD "legacy_with_offsets.pt"};
  for (size_t f = 0; f < 2; f++) {
    size_t len;
    uint8_t *b = bs_test_slurp(files[f], &len);
    for (size_t cut = 0; cut < len; cut++) {
      uint8_t *c = bs_malloc(cut + 1);
      memcpy(c, b, cut);
      struct bs_catalog cat;
      bs_err e;
      int rc = open_mem(&cat, c, cut, false, &e);
      cr_expect_eq(rc, -1, "%s cut at %zu was accepted", files[f], cut);
      cr_expect_neq(e.code, 0);
      cr_expect(e.msg[0] != '\0');
      bs_catalog_destroy(&cat);
      bs_free(c);
    }
    bs_free(b);
  }
}

Test(pth, bit_flips_never_crash)
{
  const char *files[] = {TD "float32.pt", TD "legacy_with_offsets.pt", TD "tar_multi_dtype.tar",
                         TD "checkpoint.pt"};
  for (size_t f = 0; f < 4; f++) {
    size_t len;
    uint8_t *b = bs_test_slurp(files[f], &len);
    size_t step = len > 4000 ? 3 : 1;
    for (size_t i = 0; i < len; i += step) {
      for (int bit = 0; bit < 8; bit += 3) {
        b[i] ^= (uint8_t)(1u << bit);
        struct bs_catalog cat;
        bs_err e;
        if (open_mem(&cat, b, len, false, &e) == 0) {
          for (size_t t = 0; t < cat.count; t++) {
            const struct bs_tensor *bt = &cat.tensors[t];
            if (bt->x->unsupported || bt->nbytes > (1u << 24))
              continue;
            uint8_t *buf = bs_malloc(bt->nbytes + 1);
            long r = bs_tensor_read(&cat, bt, 0, buf, bt->nbytes);
            cr_expect(r == (long)bt->nbytes, "%s flip %zu.%d: read %ld of %llu", files[f], i, bit,
                      r, (unsigned long long)bt->nbytes);
            bs_free(buf);
          }
        } else {
          cr_expect_neq(e.code, 0);
        }
        bs_catalog_destroy(&cat);
        b[i] ^= (uint8_t)(1u << bit);
      }
    }
    bs_free(b);
  }
}

Test(pth, failing_allocations_give_enomem_and_no_leak)
{
  size_t len;
  uint8_t *b = bs_test_slurp(TD "checkpoint.pt", &len);
  bool ok = false;
  for (long n = 0; n < 2000 && !ok; n++) {
    struct bs_catalog cat;
    bs_err e;
    struct bs_src src;
    bs_catalog_init(&cat);
    bs_err_clear(&e);
    cr_assert_eq(bs_src_init_mem(&src, b, len, "ck.pt", &e), 0);
    bs_alloc_fail_after(n);
    int rc = bs_open_any(&cat, &src, NULL, &e);
    bs_alloc_fail_after(-1);
    bs_catalog_destroy(&cat);
    ok = rc == 0;
    if (!ok)
      cr_assert_eq(e.code, ENOMEM, "n=%ld: %s", n, e.msg);
  }
  cr_assert(ok, "never succeeded");
  bs_free(b);
}

/* Every allocation that fails leaves the catalog as it was: the tensors, the
 * temporary source of the deflated storage, the note of the skipped global
 * and the values. */
Test(pth, a_failing_read_at_any_allocation_leaves_the_catalog_as_it_was)
{
  static const char pk[] = BAD_THEN_EVIL("0", "\x08");
  struct zbe ents[] = {{"arch/data.pkl", pk, sizeof pk - 1},
                       {"arch/data/0", STORE8, sizeof STORE8, true}};
  size_t len;
  uint8_t *z = zip_build(ents, 2, &len);
  cr_assert_gt(bs_test_rollback_sweep_mem(z, len, "mem.pt", bs_pth_read), 0);
  bs_free(z);
}
