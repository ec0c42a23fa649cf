/* The write-back without a mount (core/writeback.h): a SafeTensors checkpoint
 * on disk, its tree and editable catalog as a writable mount has them, one
 * file staged by hand as fs_stage would, then bs_wb_run, and what a
 * write-back that did not end leaves: bs_wb_list and bs_wb_finish. The
 * failure paths that need a kill in a mount are a closed lock fd here. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/target.h"
#include "formats/formats.h"
#include "policy/stage_index.h"
#include "policy/writeback.h"

static bs_err err;

static const uint8_t staged_a[16] = {9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7, 6, 6, 6, 6};

/* The checkpoint a (F32 [4]) b (U8 [4]), its mount's tree and editable
 * catalog, a staging directory (bs_test.h). */
static struct bs_test_wb W;

static void setup(void)
{
  bs_err_clear(&err);
  bs_test_wb_setup(&W);
}

static void teardown(void)
{
  bs_test_wb_teardown(&W);
}

TestSuite(writeback, .init = setup, .fini = teardown);

/* Stage new bytes for tensor a, as the first write of a mount does. */
static struct bs_entry *stage_a(void)
{
  struct bs_entry *e = bs_edit_entry(&W.ed, bs_tree_lookup(&W.tree, BS_TREE_ROOT, "a"));
  cr_assert_not_null(e);
  char p[160];
  snprintf(p, sizeof p, "%s/1", W.stg);
  bs_test_put_file(p, staged_a, sizeof staged_a);
  e->stage = 1;
  e->size = sizeof staged_a;
  return e;
}

static struct bs_wb job(const char *target, uint64_t max_shard_size)
{
  struct bs_wb wb = {.target = target,
                     .source = W.src_path,
                     .edit = &W.ed,
                     .staging = W.stg,
                     .staging_fd = &W.stg_fd,
                     .staging_lock = &W.stg_lock};
  wb.opts.max_shard_size = max_shard_size;
  bs_err e;
  bs_err_clear(&e);
  wb.writer = bs_wb_writer(target, target, max_shard_size, &e);
  cr_assert_not_null(wb.writer, "%s", e.msg);
  return wb;
}

static bool exists(const char *path)
{
  struct stat st;
  return stat(path, &st) == 0;
}

static bool has_index(void)
{
  char p[160];
  snprintf(p, sizeof p, "%s/" BS_STAGE_INDEX_NAME, W.stg);
  return exists(p);
}

/* The target holds a = staged_a, b = the checkpoint's bytes. */
static void check_result(const char *path)
{
  struct bs_catalog out;
  bs_test_open_file(path, &out);
  cr_assert_eq(out.count, 2);
  long a = bs_catalog_find(&out, "a"), b = bs_catalog_find(&out, "b");
  cr_assert(a >= 0 && b >= 0);
  uint8_t got[16];
  cr_assert_eq(bs_tensor_read(&out, &out.tensors[a], 0, got, 16), 16);
  cr_assert_arr_eq(got, staged_a, 16);
  cr_assert_eq(bs_tensor_read(&out, &out.tensors[b], 0, got, 4), 4);
  const uint8_t want_b[4] = {17, 18, 19, 20};
  cr_assert_arr_eq(got, want_b, 4);
  bs_catalog_destroy(&out);
}

/* The daemon is gone: its staging lock goes with it. */
static void kill_owner(void)
{
  close(W.stg_lock);
  close(W.stg_fd);
  W.stg_lock = W.stg_fd = -1;
}

Test(writeback, writer_follows_the_output_path)
{
  cr_assert_eq(bs_wb_writer("/x/m.bpk", "m.bpk", 0, &err)->format, BS_FMT_BURNPACK);
  cr_assert_eq(bs_wb_writer("/x/m.safetensors", "m", 0, &err)->format, BS_FMT_SAFETENSORS);
  cr_assert_eq(bs_wb_writer("/x/m.safetensors", "m", 100, &err)->format, BS_FMT_ST_SHARDED);
  cr_assert_eq(bs_wb_writer("/x/m.safetensors.index.json", "m", 0, &err)->format,
               BS_FMT_ST_SHARDED);
  cr_assert_null(bs_wb_writer("/x/m.bpk", "output=m.bpk", 100, &err));
  cr_assert(err.code == EINVAL && strstr(err.msg, "max_shard_size="), "%s", err.msg);
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_writer("/x/m.pth", "output=m.pth", 0, &err)->format, BS_FMT_PYTORCH);
  cr_assert_null(bs_wb_writer("/x/m.npz", "output=m.npz", 0, &err));
  cr_assert(strstr(err.msg, "output=m.npz: burnstore cannot write .npz files"), "%s", err.msg);
  bs_err_clear(&err);
  cr_assert_null(bs_wb_writer("/x/m", "m", 0, &err));
  cr_assert(strstr(err.msg, "m: no extension"), "%s", err.msg);
}

Test(writeback, run_writes_the_target_after_its_index)
{
  stage_a();
  char out[128];
  snprintf(out, sizeof out, "%s/out.bpk", W.dir);
  struct bs_wb wb = job(out, 0);
  char *report = NULL;
  cr_assert_eq(bs_wb_run(&wb, &report, &err), 0, "%s", err.msg);
  bs_free(report);
  cr_assert(has_index(), "the INDEX stays until the caller removes the directory");
  check_result(out);
  bs_staging_remove(W.stg, NULL, &W.stg_fd, &W.stg_lock);
  cr_assert(!exists(W.stg) && W.stg_fd == -1 && W.stg_lock == -1);
}

Test(writeback, run_creates_its_staging_from_the_template)
{
  kill_owner();
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", W.stg);
  cr_assert_eq(system(cmd), 0);
  snprintf(W.stg, sizeof W.stg, "%s/burnstore-XXXXXX", W.dir);
  char out[128];
  snprintf(out, sizeof out, "%s/conv.safetensors", W.dir);
  struct bs_wb wb = job(out, 0);
  char *report = NULL;
  cr_assert_eq(bs_wb_run(&wb, &report, &err), 0, "%s", err.msg);
  bs_free(report);
  cr_assert(W.stg_fd >= 0 && W.stg_lock >= 0 && has_index(), "created for the INDEX: %s", W.stg);
}

/* A write-back whose writer fails: its target's directory (sub) is missing. */
static void fail_writer(char *sub, size_t nsub, char *out, size_t nout)
{
  stage_a();
  snprintf(sub, nsub, "%s/later", W.dir);
  snprintf(out, nout, "%s/out.bpk", sub);
  struct bs_wb wb = job(out, 0);
  char *report = NULL;
  cr_assert_eq(bs_wb_run(&wb, &report, &err), -1, "no directory for the target");
  cr_assert_null(report);
  cr_assert(!exists(out) && has_index() && exists(W.stg));
}

/* bs_wb_list's text (owned: free) and status. */
static char *list(int want)
{
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_list(W.stg, f, &err), want, "%s", err.msg);
  fclose(f);
  return text;
}

Test(writeback, writer_failure_keeps_staging_and_finish_replays_it)
{
  char sub[128], out[160];
  fail_writer(sub, sizeof sub, out, sizeof out);
  /* While its daemon lives, --finish is refused. */
  struct bs_wb_finished res;
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), -1);
  cr_assert(err.code == EBUSY && strstr(err.msg, "running burnstore daemon"), "%s", err.msg);
  bs_free(res.target);
  /* The daemon dies; the list names the staged file; finish writes the target. */
  kill_owner();
  char *text = list(0);
  cr_assert(strstr(text, "daemon pid") && strstr(text, "(gone)") && strstr(text, "a\tF32\t[4]\t16"),
            "%s", text);
  free(text);
  cr_assert_eq(mkdir(sub, 0755), 0);
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  cr_assert(!res.already && res.tensors == 2 && strcmp(res.target, out) == 0);
  bs_free(res.target);
  cr_assert(!exists(W.stg), "finish removes the staging directory");
  check_result(out);
}

Test(writeback, full_disk_fails_the_writer_and_finish_completes_later)
{
  stage_a();
  /* A big tensor (b of another checkpoint would do; a staged file is simpler). */
  struct bs_entry *e = bs_edit_entry(&W.ed, bs_tree_lookup(&W.tree, BS_TREE_ROOT, "b"));
  static uint8_t big[256 << 10];
  memset(big, 5, sizeof big);
  char p[160];
  snprintf(p, sizeof p, "%s/2", W.stg);
  bs_test_put_file(p, big, sizeof big);
  e->stage = 2;
  e->size = sizeof big;
  cr_assert_eq(bs_entry_set_shape(NULL, e, "[262144]", 8, &err), 0, "%s", err.msg);
  char out[128];
  snprintf(out, sizeof out, "%s/full.safetensors", W.dir);
  struct bs_wb wb = job(out, 0);
  /* Files over 64 KiB cannot grow: the writer fails as on a full disk (the INDEX fits). */
  struct rlimit old, small = {64 << 10, 0};
  cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  small.rlim_max = old.rlim_max;
  signal(SIGXFSZ, SIG_IGN);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
  char *report = NULL;
  int rc = bs_wb_run(&wb, &report, &err);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  cr_assert_eq(rc, -1);
  cr_assert(err.code == EFBIG && strstr(err.msg, "full.safetensors"), "%d %s", err.code, err.msg);
  cr_assert(!exists(out) && has_index(), "the target untouched, the INDEX kept");
  kill_owner();
  struct bs_wb_finished res;
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  bs_free(res.target);
  struct bs_catalog got;
  bs_test_open_file(out, &got);
  long b = bs_catalog_find(&got, "b");
  cr_assert(b >= 0 && got.tensors[b].nbytes == sizeof big);
  bs_catalog_destroy(&got);
}

Test(writeback, finish_after_the_rename_sees_the_result)
{
  /* In place: the write-back replaced the checkpoint, then was killed
   * before it removed its staging directory. */
  stage_a();
  struct bs_wb wb = job(W.src_path, 0);
  wb.keep_hidden = true;
  char *report = NULL;
  cr_assert_eq(bs_wb_run(&wb, &report, &err), 0, "%s", err.msg);
  bs_free(report);
  kill_owner();
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  cr_assert(res.already, "the target already holds the result");
  bs_free(res.target);
  cr_assert(!exists(W.stg));
  check_result(W.src_path);
}

Test(writeback, finish_refused_while_another_writer_holds_the_target)
{
  stage_a();
  char out[128];
  snprintf(out, sizeof out, "%s/held.bpk", W.dir);
  int tfd = bs_writer_lock(out, "/mnt/other", &err);
  cr_assert_geq(tfd, 0, "%s", err.msg);
  /* The daemon's INDEX was saved, then it died before its writer ran. */
  struct bs_stage_index idx;
  bs_stage_index_init(&idx);
  idx.pid = 1;
  idx.target = out;
  idx.format = BS_FMT_BURNPACK;
  struct bs_buf buf = {0};
  cr_assert_eq(bs_stage_index_format(&idx, NULL, W.stg, &buf, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_stage_index_save(W.stg_fd, &buf, &err), 0, "%s", err.msg);
  bs_buf_destroy(&buf);
  kill_owner();
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), -1);
  cr_assert(err.code == EBUSY && strstr(err.msg, "/mnt/other") && strstr(err.msg, "pid"), "%s",
            err.msg);
  bs_free(res.target);
  cr_assert(exists(W.stg) && !exists(out), "nothing written, the staging directory kept");
  bs_target_unlock(tfd); /* (its file too: a run leaves none behind) */
}

Test(writeback, bad_file_leaves_an_incomplete_index_finish_refuses)
{
  struct bs_entry *e = stage_a();
  cr_assert_eq(bs_entry_set_shape(NULL, e, "[3]", 3, &err), 0, "%s", err.msg); /* 16 bytes != 12 */
  char out[128];
  snprintf(out, sizeof out, "%s/bad.bpk", W.dir);
  struct bs_wb wb = job(out, 0);
  char *report = NULL;
  cr_assert_eq(bs_wb_run(&wb, &report, &err), -1);
  cr_assert(!exists(out) && has_index());
  kill_owner();
  char *text = list(0);
  cr_assert(strstr(text, "incomplete: ") && strstr(text, "a\tF32\t[3]\t16\tstaged "), "%s", text);
  free(text);
  struct bs_wb_finished res;
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), -1);
  cr_assert(strstr(err.msg, "stopped before it could describe the output"), "%s", err.msg);
  bs_free(res.target);
}

Test(writeback, no_index_lists_raw_files)
{
  stage_a();
  kill_owner();
  char *text = list(1);
  cr_assert(strstr(text, "no INDEX: the daemon died") && strstr(text, "\t16\tstaged "), "%s", text);
  free(text);
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), -1);
  cr_assert_eq(err.code, ENOENT, "%s", err.msg);
  bs_free(res.target);
}

Test(writeback, out_of_memory_anywhere_leaves_the_target_untouched)
{
  stage_a();
  char out[128];
  snprintf(out, sizeof out, "%s/oom.bpk", W.dir);
  struct bs_wb wb = job(out, 0);
  int rc = -1;
  long n;
  for (n = 0; n < 10000 && rc != 0; n++) {
    bs_err_clear(&err);
    char *report = NULL;
    bs_alloc_fail_after(n);
    rc = bs_wb_run(&wb, &report, &err);
    bs_alloc_fail_after(-1);
    bs_free(report);
    if (rc != 0) {
      cr_assert_neq(err.code, 0, "allocation %ld: a failure without an error", n);
      cr_assert(!exists(out), "allocation %ld: no target after a failure", n);
    }
  }
  cr_assert_eq(rc, 0, "succeeds once allocations do");
  cr_assert_gt(n, 5, "the loop failed allocations (%ld)", n);
  check_result(out);
}

/* Run the burnstore binary of this build (in a core-only build: the CLI
 * alone); its output into *out (owned). Returns the exit status. */
static int run_bin(const char *args, char **out)
{
  char cmd[512];
  snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", BS_BURNSTORE_BIN, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t len = 0, cap = 1 << 16;
  *out = calloc(1, cap);
  size_t n;
  while ((n = fread(*out + len, 1, cap - 1 - len, p)) > 0)
    len += n;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(writeback, the_binary_lists_and_finishes_without_a_mount)
{
  char sub[128], out[160];
  fail_writer(sub, sizeof sub, out, sizeof out);
  char args[256], *text;
  snprintf(args, sizeof args, "--finish '%s'", W.stg);
  cr_assert_eq(run_bin(args, &text), 1);
  cr_assert(strstr(text, "running burnstore daemon"), "%s", text);
  free(text);
  kill_owner();
  snprintf(args, sizeof args, "--list-staging '%s'", W.stg);
  cr_assert_eq(run_bin(args, &text), 0, "%s", text);
  cr_assert(strstr(text, "a\tF32\t[4]\t16\tstaged "), "%s", text);
  free(text);
  cr_assert_eq(mkdir(sub, 0755), 0);
  snprintf(args, sizeof args, "--finish '%s'", W.stg);
  cr_assert_eq(run_bin(args, &text), 0, "%s", text);
  cr_assert(strstr(text, "wrote ") && strstr(text, "(2 tensors)"), "%s", text);
  free(text);
  cr_assert(!exists(W.stg));
  check_result(out);
}

/* A directory W.dir/d.../d of exactly `len` bytes (len < PATH_MAX). */
static void deep_dir(char *p, size_t len)
{
  snprintf(p, PATH_MAX, "%s", W.dir);
  while (strlen(p) < len) {
    size_t n = strlen(p), k = len - n - 1 > 200 ? 200 : len - n - 1;
    p[n++] = '/';
    memset(p + n, 'd', k);
    p[n + k] = '\0';
    cr_assert(mkdir(p, 0700) == 0 || errno == EEXIST, "%s", strerror(errno));
  }
}

Test(writeback, a_staged_file_path_over_path_max_is_refused_never_cut)
{
  /* DIR/INDEX is 4095 bytes: it loads. DIR/123456789012 is 4102: cut to
   * PATH_MAX it would be DIR/12345, another file (here with 16 bytes). */
  char dir[PATH_MAX];
  deep_dir(dir, PATH_MAX - 1 - strlen("/" BS_STAGE_INDEX_NAME));
  char other[PATH_MAX];
  cr_assert_eq(bs_path_join_buf(other, sizeof other, dir, "12345", &err), 0, "%s", err.msg);
  bs_test_put_file(other, staged_a, sizeof staged_a);
  struct bs_stage_index idx;
  bs_stage_index_init(&idx);
  idx.pid = 1;
  idx.target = W.src_path;
  idx.format = BS_FMT_SAFETENSORS;
  struct bs_stage_file f = {.file = "123456789012", .key = "a", .dtype = BS_DT_U8};
  idx.files = &f;
  idx.nfiles = 1;
  struct bs_buf buf = {0};
  cr_assert_eq(bs_stage_index_format(&idx, NULL, dir, &buf, &err), 0, "%s", err.msg);
  char ipath[PATH_MAX];
  cr_assert_eq(bs_path_join_buf(ipath, sizeof ipath, dir, BS_STAGE_INDEX_NAME, &err), 0);
  bs_test_put_file(ipath, buf.data, buf.len);
  bs_buf_destroy(&buf);
  char *text = NULL;
  size_t len = 0;
  FILE *o = open_memstream(&text, &len);
  bs_err_clear(&err);
  int rc = bs_wb_list(dir, o, &err);
  fclose(o);
  cr_assert_eq(rc, -1, "listed: %s", text);
  cr_assert_eq(err.code, ENAMETOOLONG, "%s", err.msg);
  cr_assert(strstr(err.msg, "/123456789012: File name too long"), "%s", err.msg);
  cr_assert(!strstr(text, "12345\n") && !strstr(text, "\t16\t"), "never the cut path: %s", text);
  free(text);
  /* the join itself: one byte short of fitting is refused */
  char small[8];
  bs_err_clear(&err);
  cr_assert_eq(bs_path_join_buf(small, sizeof small, "abc", "def", &err), 0, "7 bytes fit");
  cr_assert_eq(bs_path_join_buf(small, sizeof small, "abc", "defg", &err), -1);
  cr_assert(err.code == ENAMETOOLONG && small[0] == '\0', "%s", err.msg);
}

/* -o output_as=BF16: the INDEX records the tensors as stored and the
 * option; a write-back and a --finish of it both write a as BF16 (the F32
 * 0x09090909... narrowed: its upper halves), b (U8) unchanged. */
static void check_bf16_result(const char *path)
{
  struct bs_catalog out;
  bs_test_open_file(path, &out);
  long a = bs_catalog_find(&out, "a"), b = bs_catalog_find(&out, "b");
  cr_assert(out.count == 2 && a >= 0 && b >= 0);
  cr_assert_eq(out.tensors[a].dtype, BS_DT_BF16);
  cr_assert_eq(out.tensors[b].dtype, BS_DT_U8);
  uint8_t got[8];
  cr_assert_eq(bs_tensor_read(&out, &out.tensors[a], 0, got, 8), 8);
  const uint8_t want_a[8] = {9, 9, 8, 8, 7, 7, 6, 6};
  cr_assert_arr_eq(got, want_a, 8);
  cr_assert_eq(bs_tensor_read(&out, &out.tensors[b], 0, got, 4), 4);
  const uint8_t want_b[4] = {17, 18, 19, 20};
  cr_assert_arr_eq(got, want_b, 4);
  bs_catalog_destroy(&out);
}

Test(writeback, output_as_is_applied_by_the_run_and_by_finish)
{
  stage_a();
  char out[160], sub[128], out2[200];
  snprintf(out, sizeof out, "%s/conv.safetensors", W.dir);
  struct bs_wb wb = job(out, 0);
  wb.has_output_as = true;
  wb.output_as = BS_DT_BF16;
  char *report = NULL;
  cr_assert_eq(bs_wb_run(&wb, &report, &err), 0, "%s", err.msg);
  bs_free(report);
  check_bf16_result(out);
  /* The INDEX of a run whose writer failed keeps the option for --finish. */
  snprintf(sub, sizeof sub, "%s/later", W.dir);
  snprintf(out2, sizeof out2, "%s/conv.safetensors", sub);
  wb = job(out2, 0);
  wb.has_output_as = true;
  wb.output_as = BS_DT_BF16;
  cr_assert_eq(bs_wb_run(&wb, &report, &err), -1, "no directory for the target");
  kill_owner();
  char *text = list(0);
  cr_assert(strstr(text, "a\tF32\t[4]\t16"), "the INDEX lists a as stored: %s", text);
  free(text);
  cr_assert_eq(mkdir(sub, 0755), 0);
  struct bs_wb_finished res;
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  bs_free(res.target);
  check_bf16_result(out2);
}
