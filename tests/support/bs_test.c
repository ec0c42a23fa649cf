#include "bs_test.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/sink.h"
#include "formats/formats.h"
#include "formats/writers.h"
#include "policy/writeback.h"

uint8_t *bs_test_slurp(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = bs_malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

char *bs_test_tmpdir(const char *tag)
{
  const char *base = getenv("TMPDIR");
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/bs-%s-XXXXXX", base && *base ? base : "/tmp", tag);
  char *d = mkdtemp(tmpl);
  cr_assert_not_null(d, "mkdtemp failed");
  return strdup(d);
}

void bs_test_rmrf(const char *path)
{
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", path);
}

int bs_test_open_mem(struct bs_catalog *cat, const void *buf, size_t len, bs_err *err)
{
  struct bs_src src;
  bs_catalog_init(cat);
  if (bs_src_init_mem(&src, buf, len, "test.bin", err) != 0)
    return -1;
  return bs_open_any(cat, &src, NULL, err);
}

void bs_test_put_file(const char *path, const void *data, size_t n)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  cr_assert_eq(write(fd, data, n), (ssize_t)n);
  close(fd);
}

void bs_test_write_ab_checkpoint(const char *path)
{
  const char h[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                   "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[16,20]}}";
  size_t hl = (sizeof h - 1 + 7) / 8 * 8;
  uint8_t buf[256];
  memset(buf, ' ', sizeof buf);
  for (int i = 0; i < 8; i++)
    buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
  memcpy(buf + 8, h, sizeof h - 1);
  for (int i = 0; i < 20; i++)
    buf[8 + hl + i] = (uint8_t)(i + 1);
  bs_test_put_file(path, buf, 8 + hl + 20);
}

void bs_test_open_file(const char *path, struct bs_catalog *c)
{
  struct bs_src s;
  struct bs_open_opts oo = {0};
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(c);
  cr_assert_eq(bs_src_open(&s, path, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_open_any(c, &s, &oo, &err), 0, "%s: %s", path, err.msg);
}

void bs_test_wb_setup(struct bs_test_wb *w)
{
  bs_err err;
  bs_err_clear(&err);
  memset(w, 0, sizeof *w);
  snprintf(w->dir, sizeof w->dir, "/tmp/bs-wb-XXXXXX");
  cr_assert_not_null(mkdtemp(w->dir));
  char run[128];
  snprintf(run, sizeof run, "%s/run", w->dir);
  cr_assert_eq(mkdir(run, 0700), 0);
  setenv("XDG_RUNTIME_DIR", run, 1); /* this test's own target locks */
  snprintf(w->src_path, sizeof w->src_path, "%s/m.safetensors", w->dir);
  bs_test_write_ab_checkpoint(w->src_path);
  bs_test_open_file(w->src_path, &w->cat);
  cr_assert_eq(bs_tree_init(&w->tree, &err), 0);
  cr_assert_eq(bs_tree_build(&w->tree, &w->cat, false, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_edit_init(&w->ed, &w->cat, &w->tree, false, &err), 0);
  cr_assert_eq(bs_edit_attach(&w->ed, NULL, NULL, &err), 0);
  snprintf(w->stg, sizeof w->stg, "%s/burnstore-XXXXXX", w->dir);
  cr_assert_eq(bs_staging_create(w->stg, &w->stg_fd, &w->stg_lock), 0);
}

void bs_test_wb_teardown(struct bs_test_wb *w)
{
  bs_edit_destroy(&w->ed);
  bs_tree_destroy(&w->tree);
  bs_catalog_destroy(&w->cat);
  if (w->stg_fd >= 0)
    close(w->stg_fd);
  if (w->stg_lock >= 0)
    close(w->stg_lock);
  w->stg_fd = w->stg_lock = -1;
  bs_test_rmrf(w->dir);
}

size_t bs_test_rollback_sweep(struct bs_catalog *cat, uint32_t src, bs_test_reader read)
{
  bs_err err;
  bs_err_clear(&err);
  uint64_t one = 1;
  struct bs_tensor *t = bs_catalog_add(cat, "before.t", BS_DT_U8, 1, &one, 0, &err);
  cr_assert_not_null(t, "%s", err.msg);
  t->src = src;
  cr_assert_eq(bs_catalog_add_meta(cat, "before", "1", &err), 0);
  cr_assert_eq(bs_catalog_note(cat, "a note from before", &err), 0);
  const size_t count = cat->count, nmeta = cat->nmeta, nsrcs = cat->nsrcs;
  char *notes = strdup(cat->notes);
  const bool values = cat->values_json != NULL;
  size_t fails = 0;
  for (long n = 0;; n++) {
    cr_assert_lt(n, 1000000, "the reader never succeeds");
    bs_err_clear(&err);
    bs_alloc_fail_after(n);
    int rc = read(cat, src, NULL, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0)
      break;
    fails++;
    cr_assert_eq(err.code, ENOMEM, "allocation %ld: the read fails by itself: %s", n, err.msg);
    cr_assert_eq(cat->count, count, "allocation %ld failed (%s): %zu tensors left, not %zu", n,
                 err.msg, cat->count, count);
    cr_assert_str_eq(cat->tensors[count - 1].key, "before.t");
    cr_assert_eq(cat->nmeta, nmeta, "allocation %ld failed (%s): %zu metadata left, not %zu", n,
                 err.msg, cat->nmeta, nmeta);
    cr_assert_eq(cat->nsrcs, nsrcs, "allocation %ld failed (%s): %zu sources left, not %zu", n,
                 err.msg, cat->nsrcs, nsrcs);
    cr_assert(cat->notes && strcmp(cat->notes, notes) == 0,
              "allocation %ld failed (%s): notes left: %s", n, err.msg,
              cat->notes ? cat->notes : "(none)");
    cr_assert_eq(cat->values_json != NULL, values, "allocation %ld failed (%s): values left", n,
                 err.msg);
  }
  free(notes);
  cr_assert(cat->count > count || cat->nmeta > nmeta, "the reader added to the catalog in the end");
  return fails;
}

size_t bs_test_rollback_sweep_mem(const void *buf, size_t len, const char *name,
                                  bs_test_reader read)
{
  struct bs_catalog cat;
  struct bs_src src;
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(&cat);
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&src, buf, len, name, &err), 0);
  cr_assert_eq(bs_catalog_add_src(&cat, &src, &idx, &err), 0);
  size_t fails = bs_test_rollback_sweep(&cat, idx, read);
  bs_catalog_destroy(&cat);
  return fails;
}

char *bs_test_at(const char *dir, const char *name)
{
  static char buf[8][PATH_MAX + 300];
  static int i;
  char *p = buf[i++ % 8];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

void bs_test_mem_catalog(struct bs_catalog *cat, const void *mem, size_t n)
{
  struct bs_src src;
  uint32_t idx;
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(cat);
  cr_assert_eq(bs_src_init_mem(&src, mem, n, "mem", &err), 0);
  cr_assert_eq(bs_catalog_add_src(cat, &src, &idx, &err), 0);
  cr_assert_eq(idx, 0);
}

struct fault_src {
  const uint8_t *mem;
  uint64_t bad0, bad1;
  bool changed;
};

static long fault_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  const struct fault_src *f = s->impl;
  if (off >= f->bad0 && off < f->bad1)
    return -EIO;
  if (off < f->bad0 && n > f->bad0 - off)
    n = (size_t)(f->bad0 - off);
  memcpy(buf, f->mem + off, n);
  return (long)n;
}

static bool fault_changed(const struct bs_src *s, char *why, size_t n)
{
  const struct fault_src *f = s->impl;
  if (f->changed)
    snprintf(why, n, "changed (test)");
  return f->changed;
}

static void fault_release(struct bs_src *s)
{
  bs_free(s->impl);
}

static const struct bs_src_ops fault_ops = {
    .pread = fault_pread, .changed = fault_changed, .release = fault_release};

void bs_test_fault_catalog(struct bs_catalog *cat, const void *mem, size_t n, uint64_t bad0,
                           uint64_t bad1, bool changed)
{
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(cat);
  struct fault_src *f = bs_malloc(sizeof *f);
  cr_assert_not_null(f);
  *f = (struct fault_src){mem, bad0, bad1, changed};
  struct bs_src s = {.ops = &fault_ops, .impl = f, .size = n, .name = bs_strdup("fault")};
  uint32_t idx;
  cr_assert_eq(bs_catalog_add_src(cat, &s, &idx, &err), 0);
  cr_assert_eq(idx, 0);
}

void bs_test_check_slices(const struct bs_catalog *cat, const struct bs_tensor *t,
                          const uint8_t *whole, uint64_t step)
{
  uint8_t got[64];
  for (uint64_t off = 0; off < t->nbytes; off += step)
    for (size_t n = 1; n < sizeof got && off + n <= t->nbytes + 3; n += 5) {
      long r = bs_tensor_read(cat, t, off, got, n);
      size_t want = off + n > t->nbytes ? (size_t)(t->nbytes - off) : n;
      cr_assert_eq(r, (long)want, "off %llu n %zu: %ld", (unsigned long long)off, n, r);
      cr_assert_eq(memcmp(got, whole + off, want), 0, "off %llu n %zu", (unsigned long long)off, n);
    }
}

struct bs_tensor *bs_test_add(struct bs_catalog *cat, const char *key, enum bs_dtype dt,
                              uint32_t rank, const uint64_t *shape, uint64_t off)
{
  bs_err err;
  bs_err_clear(&err);
  struct bs_tensor *t = bs_catalog_add(cat, key, dt, rank, shape, off, &err);
  cr_assert_not_null(t, "%s", err.msg);
  t->src = 0;
  t->off = off;
  return t;
}

void bs_test_write_survives_oom(int (*write)(const struct bs_catalog *, struct bs_sink *, bs_err *),
                                const struct bs_catalog *cat)
{
  bool ok = false;
  for (long n = 0; n < 200 && !ok; n++) {
    struct bs_buf b = {0};
    struct bs_sink k;
    bs_sink_init_mem(&k, &b, "mem");
    bs_err err;
    bs_err_clear(&err);
    bs_alloc_fail_after(n);
    int rc = write(cat, &k, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0)
      ok = true;
    else
      cr_assert_eq(err.code, ENOMEM, "n=%ld: %s", n, err.msg);
    bs_buf_destroy(&b);
  }
  cr_assert(ok, "the write succeeds once allocations do");
}

void bs_test_writer_refuses(const char *out, enum bs_dtype dt, const char *words)
{
  const struct bs_writer *w = bs_writer_for_path(out);
  cr_assert_not_null(w, "%s", out);
  uint8_t mem[64] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "ok", BS_DT_F32, 1, (uint64_t[]){1}, 0);
  struct bs_tensor *t = bs_test_add(&cat, "layer.bad", dt, 1, (uint64_t[]){2}, 8);
  if (dt == BS_DT_QFLOAT)
    t->nbytes = 8;
  char what[64];
  snprintf(what, sizeof what, "cannot be written as %s", w->name);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_check(w, &cat, &err), -1, "%s", bs_dtype_name(dt));
  cr_assert_eq(err.code, ENOTSUP);
  cr_assert_str_eq(err.key, "layer.bad");
  cr_assert(strstr(err.msg, what), "%s", err.msg);
  cr_assert(strstr(err.msg, words), "%s: %s", words, err.msg);
  /* And at write time too (a dtype set by setxattr after the mount). */
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  bs_err_clear(&err);
  cr_assert_eq(w->write(&cat, &k, &err), -1);
  cr_assert_str_eq(err.key, "layer.bad");
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}
