/* The public API (include/burnstore.h) as a program sees it: linked against
 * the build's libburnstore.so only (no internal header), every function's
 * contract and failure: init and shutdown, errors (code and one line, per
 * thread), opening and its options, tensors, attributes, metadata, the
 * buffer rule, reads, file ranges, the writer and its refusals. The
 * examples (lib/examples) and the Python tests (e2e/test_python.py) cover
 * the formats and the network. */
#include <burnstore.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BPK BS_FIXTURES_DIR "/burn/examples/mnist-inference-web/model.bpk"
#define BF16_PT BS_FIXTURES_DIR "/burn/burn-store/src/pytorch/tests/reader/test_data/bfloat16.pt"
#define ST                                                                                         \
  BS_FIXTURES_DIR "/burn/burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors"

static char dir[64];

static void setup(void)
{
  cr_assert_eq(burnstore_init(0), 0, "%s", burnstore_errmsg());
  snprintf(dir, sizeof dir, "/tmp/bs-api-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  /* the target locks of this test's writes, in a run directory of its own */
  char run[128];
  snprintf(run, sizeof run, "%s/run", dir);
  setenv("BURNSTORE_RUN_DIR", run, 1);
}

static void teardown(void)
{
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_expect_eq(system(cmd), 0);
  burnstore_shutdown();
}

static const char *at(const char *name)
{
  static char buf[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

TestSuite(api, .init = setup, .fini = teardown);

Test(api_init, counted_and_required)
{
  /* Before init: no handle, EINVAL, one line saying why. */
  cr_assert_null(burnstore_open(BPK, NULL));
  cr_assert_eq(burnstore_errcode(), EINVAL);
  cr_assert(strstr(burnstore_errmsg(), "burnstore_init"), "%s", burnstore_errmsg());
  cr_assert_null(burnstore_writer_new("/tmp/x.bpk", NULL));
  cr_assert_eq(burnstore_init(1), EINVAL, "unknown flags");
  cr_assert_eq(burnstore_init(0), 0);
  cr_assert_eq(burnstore_init(0), 0);
  burnstore_shutdown();
  burnstore_checkpoint *ck = burnstore_open(BPK, NULL); /* one init is left */
  cr_assert_not_null(ck, "%s", burnstore_errmsg());
  burnstore_close(ck);
  burnstore_shutdown();
  cr_assert_null(burnstore_open(BPK, NULL), "undone");
  burnstore_shutdown(); /* one too many: nothing */
  cr_assert_eq(burnstore_init(0), 0, "again after the last shutdown");
  burnstore_shutdown();
}

Test(api_init, version)
{
  cr_assert_eq(burnstore_version_num(), BURNSTORE_VERSION_NUM);
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", BURNSTORE_VERSION_MAJOR, BURNSTORE_VERSION_MINOR,
           BURNSTORE_VERSION_PATCH);
  cr_assert_str_eq(burnstore_version(), v);
}

Test(api, open_failures_one_line_each)
{
  cr_assert_null(burnstore_open(at("missing.bpk"), NULL));
  cr_assert_eq(burnstore_errcode(), ENOENT);
  cr_assert(strstr(burnstore_errmsg(), "missing.bpk"), "%s", burnstore_errmsg());
  cr_assert_null(burnstore_open(BS_SOURCE_DIR "/README.md", NULL));
  cr_assert_eq(burnstore_errcode(), EINVAL);
  cr_assert(strstr(burnstore_errmsg(), "README.md: offset 0x0: unknown format"), "%s",
            burnstore_errmsg());
  cr_assert_null(burnstore_open(dir, NULL), "a directory without an index");
  cr_assert(strstr(burnstore_errmsg(), ".safetensors.index.json"), "%s", burnstore_errmsg());
  static const char *bad[] = {"bogus", "as=I8", "include=(",      "http_cache=1K",
                              "ro",    "npy",   "http_timeout=30" /* on a local file */};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_null(burnstore_open(BPK, bad[i]), "%s", bad[i]);
    cr_assert_eq(burnstore_errcode(), EINVAL, "%s", bad[i]);
    cr_assert(strchr(burnstore_errmsg(), '\n') == NULL);
    cr_assert(strstr(burnstore_errmsg(), bad[i][0] == 'h' && bad[i][5] == 't' ? "URL" : bad[i]),
              "%s: %s", bad[i], burnstore_errmsg());
  }
  cr_assert_null(burnstore_open(NULL, NULL));
  cr_assert_eq(burnstore_errcode(), EINVAL);
  cr_assert_null(burnstore_open("http://127.0.0.1:1/m.gguf", "http_timeout=2"));
  cr_assert_neq(burnstore_errcode(), 0);
  cr_assert(strstr(burnstore_errmsg(), "127.0.0.1:1"), "%s", burnstore_errmsg());
}

Test(api, a_checkpoint_its_tensors_and_attributes)
{
  burnstore_checkpoint *ck = burnstore_open(BPK, NULL);
  cr_assert_not_null(ck, "%s", burnstore_errmsg());
  cr_assert_str_eq(burnstore_format(ck), "burnpack");
  cr_assert_eq(burnstore_source(ck)[0], '/', "absolute: %s", burnstore_source(ck));
  cr_assert_eq(burnstore_count(ck), 18);
  cr_assert_null(burnstore_tensor_at(ck, 18));
  const burnstore_tensor *t = burnstore_find(ck, "conv1.conv.weight");
  cr_assert_not_null(t);
  cr_assert_eq(burnstore_tensor_at(ck, 1), t, "in the file's order");
  cr_assert_str_eq(burnstore_tensor_key(t), "conv1.conv.weight");
  cr_assert_eq(burnstore_tensor_dtype(t), BURNSTORE_DT_F32);
  cr_assert_eq(burnstore_tensor_stored_dtype(t), BURNSTORE_DT_F32);
  cr_assert_eq(burnstore_tensor_rank(t), 4);
  const uint64_t *s = burnstore_tensor_shape(t);
  cr_assert(s[0] == 64 && s[1] == 1 && s[2] == 3 && s[3] == 3);
  cr_assert_eq(burnstore_tensor_nbytes(t), 2304);
  cr_assert_null(burnstore_tensor_unreadable(t));
  cr_assert_null(burnstore_find(ck, "conv1"));
  cr_assert_eq(burnstore_errcode(), ENOENT);
  cr_assert(strstr(burnstore_errmsg(), "no tensor 'conv1'"), "%s", burnstore_errmsg());

  /* The mount's xattrs, with or without their prefix; the buffer rule. */
  char v[64];
  size_t len = 99;
  cr_assert_eq(burnstore_tensor_attr(t, "shape", NULL, 0, &len), 0);
  cr_assert_eq(len, strlen("[64,1,3,3]"), "size query");
  cr_assert_eq(burnstore_tensor_attr(t, "shape", v, len, &len), ERANGE, "no room for the NUL");
  memset(v, 'x', sizeof v);
  cr_assert_eq(burnstore_tensor_attr(t, "user.burnstore.shape", v, sizeof v, &len), 0);
  cr_assert_str_eq(v, "[64,1,3,3]");
  cr_assert_eq(burnstore_tensor_attr(t, "dtype", v, sizeof v, &len), 0);
  cr_assert_str_eq(v, "F32");
  cr_assert_eq(burnstore_tensor_attr(t, "key", v, sizeof v, &len), 0);
  cr_assert_str_eq(v, "conv1.conv.weight");
  cr_assert_eq(burnstore_tensor_attr(t, "param_id", v, sizeof v, &len), 0);
  cr_assert_eq(burnstore_tensor_attr(t, "shard", v, sizeof v, &len), ENODATA);
  cr_assert_eq(burnstore_tensor_attr(t, "format", v, sizeof v, &len), ENODATA, "root only");
  cr_assert_eq(burnstore_tensor_attr(t, "user.other", v, sizeof v, &len), ENODATA);
  char names[256];
  cr_assert_eq(burnstore_tensor_attr_names(t, names, sizeof names, &len), 0);
  cr_assert_eq(len, strlen("dtype") + strlen("shape") + strlen("key") + strlen("param_id") + 4);
  cr_assert_str_eq(names, "dtype");
  cr_assert_str_eq(names + 6, "shape");
  cr_assert_eq(burnstore_checkpoint_attr(ck, "format", v, sizeof v, &len), 0);
  cr_assert_str_eq(v, "burnpack");
  cr_assert_eq(burnstore_checkpoint_attr(ck, "notes", v, sizeof v, &len), ENODATA);
  cr_assert(strstr(burnstore_errmsg(), "notes"), "%s", burnstore_errmsg());
  cr_assert_eq(burnstore_checkpoint_attr_names(ck, names, sizeof names, &len), 0);
  cr_assert_eq(len, strlen("format") + 1);
  cr_assert_eq(burnstore_meta_count(ck), 0);
  cr_assert_null(burnstore_meta_key(ck, 0));
  cr_assert_eq(burnstore_meta_value(ck, 0, v, sizeof v, &len), EINVAL);
  burnstore_close(ck);
  burnstore_close(NULL);
}

Test(api, reads_and_file_ranges)
{
  burnstore_checkpoint *ck = burnstore_open(BPK, NULL);
  cr_assert_not_null(ck);
  const burnstore_tensor *t = burnstore_find(ck, "fc3.bias");
  const char *path;
  uint64_t off;
  cr_assert_eq(burnstore_tensor_file_range(t, &path, &off), 0, "%s", burnstore_errmsg());
  cr_assert_str_eq(path, burnstore_source(ck));
  uint8_t want[40], got[40];
  int fd = open(path, O_RDONLY);
  cr_assert_eq(pread(fd, want, sizeof want, (off_t)off), (ssize_t)sizeof want);
  close(fd);
  size_t n = 0;
  cr_assert_eq(burnstore_tensor_read(t, 0, got, sizeof got, &n), 0);
  cr_assert_eq(n, 40);
  cr_assert_arr_eq(got, want, 40);
  cr_assert_eq(burnstore_tensor_read(t, 36, got, 100, &n), 0, "clamped to the end");
  cr_assert_eq(n, 4);
  cr_assert_arr_eq(got, want + 36, 4);
  cr_assert_eq(burnstore_tensor_read(t, 40, got, 4, &n), 0);
  cr_assert_eq(n, 0, "at the end: nothing");
  cr_assert_eq(burnstore_tensor_read(t, 0, NULL, 4, &n), EINVAL);
  burnstore_close(ck);

  /* as=F32: BF16 decoded, its stored dtype kept; no file range for it. */
  ck = burnstore_open(BF16_PT, "as=F32");
  cr_assert_not_null(ck, "%s", burnstore_errmsg());
  t = burnstore_find(ck, "tensor");
  cr_assert_eq(burnstore_tensor_dtype(t), BURNSTORE_DT_F32);
  cr_assert_eq(burnstore_tensor_stored_dtype(t), BURNSTORE_DT_BF16);
  float f[3];
  cr_assert_eq(burnstore_tensor_read(t, 0, f, sizeof f, &n), 0);
  cr_assert(n == 12 && f[0] == 1.5f && f[1] == -2.5f && f[2] == 3.5f);
  cr_assert_eq(burnstore_tensor_file_range(t, &path, &off), ENOTSUP);
  cr_assert(strstr(burnstore_errmsg(), "decoded"), "%s", burnstore_errmsg());
  char v[16];
  size_t len;
  cr_assert_eq(burnstore_tensor_attr(t, "stored_dtype", v, sizeof v, &len), 0);
  cr_assert_str_eq(v, "BF16");
  burnstore_close(ck);
}

Test(api, a_changed_file_fails_reads_in_one_line)
{
  const char *p = at("m.safetensors");
  char cmd[512];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ST, p);
  cr_assert_eq(system(cmd), 0);
  burnstore_checkpoint *ck = burnstore_open(p, NULL);
  cr_assert_not_null(ck);
  const burnstore_tensor *t = burnstore_tensor_at(ck, 0);
  int fd = open(p, O_WRONLY | O_APPEND);
  cr_assert_eq(write(fd, "x", 1), 1);
  close(fd);
  char buf[16];
  size_t n;
  cr_assert_eq(burnstore_tensor_read(t, 0, buf, sizeof buf, &n), EIO);
  cr_assert(strstr(burnstore_errmsg(), "changed"), "%s", burnstore_errmsg());
  cr_assert(strstr(burnstore_errmsg(), burnstore_tensor_key(t)), "%s", burnstore_errmsg());
  const char *path;
  uint64_t off;
  cr_assert_eq(burnstore_tensor_file_range(t, &path, &off), EIO);
  burnstore_close(ck);
}

static void *errmsg_of_thread(void *arg)
{
  (void)arg;
  return (void *)burnstore_errmsg();
}

Test(api, key_options_and_errors_per_thread)
{
  burnstore_checkpoint *ck = burnstore_open(BPK, "remap=^fc(\\d)=>dense$1,include=^dense");
  cr_assert_not_null(ck, "%s", burnstore_errmsg());
  cr_assert_eq(burnstore_count(ck), 6);
  const burnstore_tensor *t = burnstore_find(ck, "dense3.bias");
  cr_assert_not_null(t);
  char v[64];
  size_t len;
  cr_assert_eq(burnstore_tensor_attr(t, "key", v, sizeof v, &len), 0);
  cr_assert_str_eq(v, "fc3.bias", "the key in the file");
  burnstore_close(ck);
  /* A failure on one thread leaves another's last error alone. */
  cr_assert_null(burnstore_open(at("a"), NULL));
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, errmsg_of_thread, NULL), 0);
  void *other;
  pthread_join(th, &other);
  cr_assert_str_eq((const char *)other, "", "another thread's error is its own");
  cr_assert(strstr(burnstore_errmsg(), "/a:"), "%s", burnstore_errmsg());
}

static const float ABC[6] = {1, 2, 3, 4, 5, 6};

Test(api, writes_from_memory_and_from_a_checkpoint)
{
  burnstore_writer *w = burnstore_writer_new(at("out.safetensors"), NULL);
  cr_assert_not_null(w, "%s", burnstore_errmsg());
  cr_assert_str_eq(burnstore_writer_format(w), "safetensors");
  uint64_t shape[2] = {2, 3};
  cr_assert_eq(burnstore_writer_add(w, "a.w", BURNSTORE_DT_F32, 2, shape, ABC, sizeof ABC), 0, "%s",
               burnstore_errmsg());
  cr_assert_eq(burnstore_writer_add(w, "a.w", BURNSTORE_DT_F32, 2, shape, ABC, sizeof ABC), EEXIST);
  cr_assert(strstr(burnstore_errmsg(), "'a.w'"), "%s", burnstore_errmsg());
  cr_assert_eq(burnstore_writer_add(w, "b", BURNSTORE_DT_F32, 2, shape, ABC, 20), EINVAL);
  cr_assert(strstr(burnstore_errmsg(), "20 bytes of data, but F32 [2,3] takes 24"), "%s",
            burnstore_errmsg());
  cr_assert_eq(burnstore_writer_add(w, "b", BURNSTORE_DT_QFLOAT, 1, shape, ABC, 2), EINVAL);
  cr_assert_eq(burnstore_writer_add(w, "b", (burnstore_dtype)999, 1, shape, ABC, 2), EINVAL);
  cr_assert_eq(burnstore_writer_add(w, "b", BURNSTORE_DT_F32, 65, shape, ABC, 4), EINVAL);
  cr_assert_eq(burnstore_writer_add(w, "b", BURNSTORE_DT_QI8, 1, shape, ABC, 2), ENOTSUP,
               "SafeTensors has no torch.qint8");
  cr_assert(strstr(burnstore_errmsg(), "'b'"), "%s", burnstore_errmsg());
  cr_assert_eq(burnstore_writer_add(w, "scalar", BURNSTORE_DT_F32, 0, NULL, ABC, 4), 0);
  cr_assert_eq(burnstore_writer_add(w, "empty", BURNSTORE_DT_I8, 1, (uint64_t[]){0}, NULL, 0), 0);
  burnstore_checkpoint *src = burnstore_open(BPK, NULL);
  cr_assert_eq(burnstore_writer_add_tensor(w, "copied", burnstore_find(src, "fc3.bias")), 0);
  cr_assert_eq(burnstore_writer_add_tensor(w, NULL, burnstore_find(src, "fc3.bias")), 0);
  cr_assert_eq(burnstore_writer_set_meta(w, "note", "first"), 0);
  cr_assert_eq(burnstore_writer_set_meta(w, "note", "second"), 0, "replaced");
  cr_assert_eq(burnstore_writer_save(w), 0, "%s", burnstore_errmsg());
  cr_assert_eq(burnstore_writer_save(w), EINVAL, "once");
  burnstore_writer_free(w);

  burnstore_checkpoint *ck = burnstore_open(at("out.safetensors"), NULL);
  cr_assert_not_null(ck, "%s", burnstore_errmsg());
  cr_assert_eq(burnstore_count(ck), 5);
  cr_assert_eq(burnstore_meta_count(ck), 1);
  cr_assert_str_eq(burnstore_meta_key(ck, 0), "note");
  char v[16];
  size_t len;
  cr_assert_eq(burnstore_meta_value(ck, 0, v, sizeof v, &len), 0);
  cr_assert_str_eq(v, "second");
  cr_assert_eq(burnstore_meta_value(ck, 0, v, 6, &len), ERANGE);
  float back[6];
  size_t n;
  cr_assert_eq(burnstore_tensor_read(burnstore_find(ck, "a.w"), 0, back, sizeof back, &n), 0);
  cr_assert_arr_eq(back, ABC, sizeof ABC);
  uint8_t x[40], y[40];
  cr_assert_eq(burnstore_tensor_read(burnstore_find(ck, "copied"), 0, x, 40, &n), 0);
  cr_assert_eq(burnstore_tensor_read(burnstore_find(src, "fc3.bias"), 0, y, 40, &n), 0);
  cr_assert_arr_eq(x, y, 40);
  cr_assert_eq(burnstore_tensor_rank(burnstore_find(ck, "scalar")), 0);
  cr_assert_null(burnstore_tensor_shape(burnstore_find(ck, "scalar")));
  cr_assert_eq(burnstore_tensor_nbytes(burnstore_find(ck, "empty")), 0);
  burnstore_close(ck);
  burnstore_close(src);
}

Test(api, writer_refusals_leave_nothing)
{
  cr_assert_null(burnstore_writer_new(at("x.npz"), NULL));
  cr_assert_eq(burnstore_errcode(), EINVAL);
  cr_assert(strstr(burnstore_errmsg(), "cannot write .npz"), "%s", burnstore_errmsg());
  cr_assert_null(burnstore_writer_new(at("x.bpk"), "max_shard_size=1MB"));
  cr_assert_null(burnstore_writer_new(at("x.safetensors"), "max_shard_size=lots"));
  cr_assert_null(burnstore_writer_new(at("x.safetensors"), "as=F32"));

  /* .pth: no metadata; a key GGUF cannot hold; a checkpoint half added. */
  burnstore_writer *w = burnstore_writer_new(at("x.pth"), NULL);
  cr_assert_eq(burnstore_writer_set_meta(w, "k", "v"), ENOTSUP);
  burnstore_writer_free(w);
  w = burnstore_writer_new(at("x.gguf"), NULL);
  char longkey[80];
  memset(longkey, 'k', sizeof longkey - 1);
  longkey[sizeof longkey - 1] = '\0';
  cr_assert_eq(burnstore_writer_add(w, longkey, BURNSTORE_DT_F32, 1, (uint64_t[]){6}, ABC, 24),
               EINVAL, "GGUF names are 63 bytes at most");
  cr_assert_eq(burnstore_writer_add(w, "fc3.bias", BURNSTORE_DT_F32, 1, (uint64_t[]){6}, ABC, 24),
               0);
  /* A value GGUF types: checked when written; nothing is. */
  cr_assert_eq(burnstore_writer_set_meta(w, "general.alignment", "abc"), 0);
  cr_assert_eq(burnstore_writer_save(w), EINVAL);
  cr_assert(strstr(burnstore_errmsg(), "alignment"), "%s", burnstore_errmsg());
  cr_assert_eq(access(at("x.gguf"), F_OK), -1);
  cr_assert_eq(burnstore_writer_set_meta(w, "general.alignment", "64"), 0);
  burnstore_checkpoint *src = burnstore_open(BPK, NULL);
  cr_assert_eq(burnstore_writer_add_checkpoint(w, src), EEXIST, "fc3.bias is there");
  /* ...and nothing of src was added: one tensor is written. */
  cr_assert_eq(burnstore_writer_save(w), 0, "%s", burnstore_errmsg());
  burnstore_writer_free(w);
  burnstore_checkpoint *ck = burnstore_open(at("x.gguf"), NULL);
  cr_assert_not_null(ck, "%s", burnstore_errmsg());
  cr_assert_eq(burnstore_count(ck), 1);
  burnstore_close(ck);
  burnstore_close(src);
  /* Not saved: nothing written. */
  w = burnstore_writer_new(at("never.bpk"), NULL);
  cr_assert_eq(burnstore_writer_add(w, "a", BURNSTORE_DT_F32, 1, (uint64_t[]){6}, ABC, 24), 0);
  burnstore_writer_free(w);
  cr_assert_eq(access(at("never.bpk"), F_OK), -1);
  burnstore_writer_free(NULL);
}

Test(api, dtypes)
{
  cr_assert_str_eq(burnstore_dtype_name(BURNSTORE_DT_BF16), "BF16");
  cr_assert_str_eq(burnstore_dtype_name(BURNSTORE_DT_MXFP4), "MXFP4");
  cr_assert_null(burnstore_dtype_name(BURNSTORE_DTYPE_COUNT));
  for (int d = 0; d < BURNSTORE_DTYPE_COUNT; d++) {
    burnstore_dtype back;
    cr_assert_eq(burnstore_dtype_from_name(burnstore_dtype_name((burnstore_dtype)d), &back), 0);
    cr_assert_eq((int)back, d, "%s", burnstore_dtype_name((burnstore_dtype)d));
  }
  burnstore_dtype x;
  cr_assert_eq(burnstore_dtype_from_name("F33", &x), EINVAL);
  cr_assert_eq(burnstore_dtype_bits(BURNSTORE_DT_F6_E2M3), 6);
  cr_assert_eq(burnstore_dtype_bits(BURNSTORE_DT_Q8_0), 0);
  uint32_t e = 0, b = 0;
  cr_assert(burnstore_dtype_block(BURNSTORE_DT_Q8_0, &e, &b));
  cr_assert(e == 32 && b == 34);
  cr_assert_not(burnstore_dtype_block(BURNSTORE_DT_F32, &e, &b));
}

/* Reads of one checkpoint from several threads at once (run under the
 * sanitizers: no race, the same bytes). */
struct reader {
  const burnstore_checkpoint *ck;
  int bad;
};

static void *read_all(void *arg)
{
  struct reader *r = arg;
  uint8_t *buf = malloc(1 << 20);
  for (int round = 0; round < 20; round++)
    for (size_t i = 0; i < burnstore_count(r->ck); i++) {
      const burnstore_tensor *t = burnstore_tensor_at(r->ck, i);
      size_t n;
      if (burnstore_tensor_read(t, 0, buf, 1 << 20, &n) != 0 || n != burnstore_tensor_nbytes(t))
        r->bad++;
    }
  free(buf);
  return NULL;
}

Test(api, reads_from_threads)
{
  burnstore_checkpoint *ck = burnstore_open(BPK, NULL);
  struct reader r[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    r[i] = (struct reader){.ck = ck};
    cr_assert_eq(pthread_create(&th[i], NULL, read_all, &r[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(r[i].bad, 0);
  }
  burnstore_close(ck);
}
