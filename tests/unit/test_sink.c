/* The sinks (memory, fd) and the atomic file commit, with its temp files. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/sink.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static char *dir;

static void setup(void)
{
  dir = bs_test_tmpdir("sink");
}

static void teardown(void)
{
  bs_test_rmrf(dir);
  free(dir);
}

static char *at(const char *name)
{
  return bs_test_at(dir, name);
}

static void put_file(const char *path, const char *text, mode_t mode)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  cr_assert_eq(fchmod(fd, mode), 0);
  close(fd);
}

static void expect_content(const char *path, const char *text)
{
  size_t len;
  uint8_t *got = bs_test_slurp(path, &len);
  cr_assert_eq(len, strlen(text), "%s: %zu bytes, expected %zu", path, len, strlen(text));
  cr_assert_arr_eq(got, text, len);
  bs_free(got);
}

/* Entries of the test directory whose name contains `part`. */
static int count(const char *part)
{
  int n = 0;
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d));)
    n += strstr(e->d_name, part) != NULL;
  closedir(d);
  return n;
}

static bool exists(const char *path)
{
  struct stat st;
  return lstat(path, &st) == 0;
}

static void commit_text(const char *path, const char *text)
{
  struct bs_atomic a;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_atomic_open(&a, path, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_sink_put(&a.sink, text, strlen(text), &err), 0, "%s", err.msg);
  cr_assert_eq(bs_atomic_commit(&a, &err), 0, "%s", err.msg);
}

/* ---- memory and fd sinks ----------------------------------------------------------------------
 */

Test(sink, memory_sink_appends_bytes_and_zeros)
{
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_err err;
  bs_err_clear(&err);
  bs_sink_init_mem(&k, &b, NULL);
  cr_assert_eq(bs_sink_reserve(&k, 8, &err), 0);
  cr_assert_geq(b.cap, 8);
  cr_assert_eq(b.len, 0);
  cr_assert_eq(bs_sink_put(&k, "abc", 3, &err), 0);
  cr_assert_eq(bs_sink_zeros(&k, 5000, &err), 0);
  cr_assert_eq(bs_sink_put(&k, "z", 1, &err), 0);
  cr_assert_eq(bs_sink_put(&k, NULL, 0, &err), 0);
  cr_assert_eq(k.pos, 5004);
  cr_assert_eq(b.len, 5004);
  cr_assert_arr_eq(b.data, "abc", 3);
  for (size_t i = 3; i < 5003; i++)
    cr_assert_eq(b.data[i], 0);
  cr_assert_eq(b.data[5003], 'z');
  bs_buf_destroy(&b);
  bs_buf_destroy(&b); /* twice is fine */
  cr_assert_null(b.data);
}

Test(sink, memory_sink_out_of_memory_is_enomem)
{
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_err err;
  bs_err_clear(&err);
  bs_sink_init_mem(&k, &b, "m");
  bs_alloc_fail_after(0);
  int rc = bs_sink_put(&k, "abc", 3, &err);
  bs_alloc_fail_after(-1);
  cr_assert_eq(rc, -1);
  cr_assert_eq(err.code, ENOMEM);
  cr_assert_eq(b.len, 0);
  bs_err_clear(&err);
  cr_assert_eq(bs_sink_reserve(&k, UINT64_MAX, &err), -1);
  cr_assert_eq(err.code, ENOMEM);
  cr_assert(strstr(err.msg, "out of memory"), "%s", err.msg);
  bs_buf_destroy(&b);
}

Test(sink, fd_sink_full_device_names_the_output_and_byte)
{
  int fd = open("/dev/full", O_WRONLY);
  if (fd < 0)
    cr_skip_test("no /dev/full");
  struct bs_sink k;
  bs_err err;
  bs_err_clear(&err);
  bs_sink_init_fd(&k, fd, "out.bpk");
  cr_assert_eq(bs_sink_reserve(&k, 1 << 20, &err), 0); /* a no-op on fds */
  cr_assert_eq(bs_sink_put(&k, "abc", 3, &err), -1);
  close(fd);
  cr_assert_eq(err.code, ENOSPC);
  cr_assert_eq(err.off, BS_OFF_NONE);
  cr_assert(strstr(err.msg, "out.bpk: no space left on the device after writing 0 bytes"), "%s",
            err.msg);
}

Test(sink, fd_sink_write_error_names_the_output, .init = setup, .fini = teardown)
{
  put_file(at("ro"), "x", 0644);
  int fd = open(at("ro"), O_RDONLY);
  cr_assert_geq(fd, 0);
  struct bs_sink k;
  bs_err err;
  bs_err_clear(&err);
  bs_sink_init_fd(&k, fd, "ro-file");
  cr_assert_eq(bs_sink_put(&k, "abc", 3, &err), -1);
  close(fd);
  cr_assert_eq(err.code, EBADF);
  cr_assert(strstr(err.msg, "ro-file: write failed at byte 0"), "%s", err.msg);
}

/* ---- atomic commit ------------------------------------------------------------------------------
 */

/* A progress line must reach 100% only when the data is on disk: an atomic
 * output's bytes are pushed out 16 MiB window by window (sync_file_range)
 * and reported once on disk, waited for 128 MiB behind the writer; the last
 * ones after its fsync. A plain fd sink reports each write. */
static uint64_t observed;
static void observe(void *ctx, uint64_t n)
{
  (void)ctx;
  observed += n;
}

Test(atomic, observer_counts_bytes_once_they_are_on_disk, .init = setup, .fini = teardown)
{
  enum { MIB = 1 << 20 };
  char *chunk = calloc(1, MIB);
  cr_assert_not_null(chunk);
  bs_err err;
  bs_err_clear(&err);
  struct bs_atomic a;
  cr_assert_eq(bs_atomic_open(&a, at("big.bin"), &err), 0, "%s", err.msg);
  observed = 0;
  bs_sink_set_observer(observe, NULL);
  for (int i = 0; i < 140; i++)
    cr_assert_eq(bs_sink_put(&a.sink, chunk, MIB, &err), 0, "%s", err.msg);
  cr_expect_eq(observed, 0, "140 MiB written, none waited for yet: %llu reported",
               (unsigned long long)observed);
  for (int i = 0; i < 20; i++)
    cr_assert_eq(bs_sink_put(&a.sink, chunk, MIB, &err), 0, "%s", err.msg);
  cr_expect_eq(observed, 32u * MIB,
               "160 MiB written: the two windows 128 MiB behind are on disk, %llu reported",
               (unsigned long long)observed);
  cr_assert_eq(bs_atomic_sync(&a, &err), 0, "%s", err.msg);
  cr_expect_eq(observed, 160u * MIB, "after the fsync, all of it: %llu",
               (unsigned long long)observed);
  cr_assert_eq(bs_atomic_publish(&a, &err), 0, "%s", err.msg);

  int fd = open(at("plain.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0);
  struct bs_sink k;
  bs_sink_init_fd(&k, fd, "plain.bin");
  observed = 0;
  cr_assert_eq(bs_sink_put(&k, chunk, MIB, &err), 0, "%s", err.msg);
  cr_expect_eq(observed, MIB, "a plain fd sink reports each write");
  bs_sink_set_observer(NULL, NULL);
  close(fd);
  free(chunk);
}

Test(atomic, commit_creates_a_new_file_with_0644_minus_umask, .init = setup, .fini = teardown)
{
  mode_t old = umask(022);
  commit_text(at("new.bpk"), "hello");
  umask(old);
  expect_content(at("new.bpk"), "hello");
  struct stat st;
  cr_assert_eq(stat(at("new.bpk"), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0644);
  cr_assert_eq(count("burnstore-tmp"), 0);
}

Test(atomic, a_new_file_gets_the_given_mode_minus_umask_and_an_old_one_keeps_its_own, .init = setup,
     .fini = teardown)
{
  mode_t old = umask(027);
  bs_err err;
  bs_err_clear(&err);
  struct bs_atomic a;
  cr_assert_eq(bs_atomic_open_mode(&a, at("private.bpk"), 0600, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_atomic_commit(&a, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_atomic_open_mode(&a, at("shared.bpk"), 0777, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_atomic_commit(&a, &err), 0, "%s", err.msg);
  put_file(at("old.bpk"), "old", 0604);
  cr_assert_eq(bs_atomic_open_mode(&a, at("old.bpk"), 0600, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_atomic_commit(&a, &err), 0, "%s", err.msg);
  umask(old);
  struct stat st;
  cr_assert_eq(stat(at("private.bpk"), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0600, "%o", st.st_mode & 07777);
  cr_assert_eq(stat(at("shared.bpk"), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0640, "& 0666 & ~umask: %o", st.st_mode & 07777);
  cr_assert_eq(stat(at("old.bpk"), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0604, "an existing file keeps its mode: %o", st.st_mode & 07777);
}

Test(atomic, commit_replaces_the_target_and_keeps_its_mode, .init = setup, .fini = teardown)
{
  put_file(at("model.bpk"), "old contents", 0640);
  commit_text(at("model.bpk"), "new");
  expect_content(at("model.bpk"), "new");
  struct stat st;
  cr_assert_eq(stat(at("model.bpk"), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0640);
  cr_assert_eq(count("burnstore-tmp"), 0);
}

Test(atomic, temp_file_is_hidden_beside_the_target_and_locked, .init = setup, .fini = teardown)
{
  struct bs_atomic a;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_atomic_open(&a, at("model.bpk"), &err), 0, "%s", err.msg);
  const char *base = strrchr(a.tmp, '/') + 1;
  cr_assert_eq(strncmp(base, ".model.bpk.burnstore-tmp-", 25), 0, "%s", base);
  cr_assert_eq(strlen(base), 25 + 6, "%s", base);
  cr_assert_eq(strncmp(a.tmp, dir, strlen(dir)), 0, "%s", a.tmp);
  /* Another open file description cannot take the lock. */
  int fd = open(a.tmp, O_RDONLY);
  cr_assert_geq(fd, 0);
  cr_assert_eq(flock(fd, LOCK_EX | LOCK_NB), -1);
  cr_assert_eq(errno, EWOULDBLOCK);
  /* Nor a cleaner: a live writer's temp file survives. */
  cr_assert_eq(bs_atomic_clean_stale(at("model.bpk")), 0);
  cr_assert(exists(a.tmp));
  /* The lock stays held after the data is synced and closed, until publish. */
  cr_assert_eq(bs_sink_put(&a.sink, "abc", 3, &err), 0);
  cr_assert_eq(bs_atomic_sync(&a, &err), 0, "%s", err.msg);
  cr_assert_eq(flock(fd, LOCK_EX | LOCK_NB), -1);
  cr_assert_eq(bs_atomic_clean_stale(at("model.bpk")), 0);
  cr_assert_eq(bs_atomic_publish(&a, &err), 0, "%s", err.msg);
  close(fd);
  expect_content(at("model.bpk"), "abc");
  cr_assert_eq(count("burnstore-tmp"), 0);
}

Test(atomic, abort_leaves_the_old_file_and_no_temp, .init = setup, .fini = teardown)
{
  put_file(at("model.bpk"), "old contents", 0644);
  struct bs_atomic a;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_atomic_open(&a, at("model.bpk"), &err), 0, "%s", err.msg);
  cr_assert_eq(bs_sink_put(&a.sink, "partial", 7, &err), 0);
  cr_assert_eq(count("burnstore-tmp"), 1);
  bs_fail(&err, EIO, BS_OFF_NONE, "k", "the writer failed");
  cr_assert_eq(bs_atomic_fail(&a, &err), -1);
  cr_assert(strstr(err.msg, at("model.bpk")), "the message names the target: %s", err.msg);
  bs_atomic_abort(&a); /* twice is fine */
  expect_content(at("model.bpk"), "old contents");
  cr_assert_eq(count("burnstore-tmp"), 0);
  struct bs_atomic z = {0};
  bs_atomic_abort(&z); /* and on a zeroed one */
}

Test(atomic, open_in_a_missing_directory_fails_naming_the_path, .init = setup, .fini = teardown)
{
  struct bs_atomic a;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_atomic_open(&a, at("missing/model.bpk"), &err), -1);
  cr_assert_eq(err.code, ENOENT);
  cr_assert(strstr(err.msg, at("missing/model.bpk")), "%s", err.msg);
  cr_assert(strstr(err.msg, "cannot create the temporary file"), "%s", err.msg);
  bs_atomic_abort(&a);
}

Test(atomic, rename_failure_keeps_the_target_and_removes_the_temp, .init = setup, .fini = teardown)
{
  cr_assert_eq(mkdir(at("model.bpk"), 0755), 0);
  cr_assert_eq(mkdir(at("model.bpk/keep"), 0755), 0); /* a non-empty directory */
  struct bs_atomic a;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_atomic_open(&a, at("model.bpk"), &err), 0, "%s", err.msg);
  cr_assert_eq(bs_sink_put(&a.sink, "abc", 3, &err), 0);
  cr_assert_eq(bs_atomic_commit(&a, &err), -1);
  cr_assert_eq(err.code, EISDIR, "%s", err.msg);
  cr_assert(strstr(err.msg, "cannot rename"), "%s", err.msg);
  cr_assert(strstr(err.msg, at("model.bpk")), "%s", err.msg);
  cr_assert(exists(at("model.bpk/keep")));
  cr_assert_eq(count("burnstore-tmp"), 0);
}

Test(atomic, a_set_of_files_syncs_all_then_publishes_all, .init = setup, .fini = teardown)
{
  const char *names[2] = {"a.bpk", "b.bpk"};
  struct bs_atomic set[2];
  bs_err err;
  bs_err_clear(&err);
  put_file(at("a.bpk"), "old a", 0644);
  /* A failure after every file is written and synced: abort all, nothing changes. */
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(bs_atomic_open(&set[i], at(names[i]), &err), 0, "%s", err.msg);
    cr_assert_eq(bs_sink_put(&set[i].sink, names[i], 5, &err), 0);
    cr_assert_eq(bs_atomic_sync(&set[i], &err), 0, "%s", err.msg);
  }
  for (int i = 0; i < 2; i++)
    bs_atomic_abort(&set[i]);
  expect_content(at("a.bpk"), "old a");
  cr_assert(!exists(at("b.bpk")));
  cr_assert_eq(count("burnstore-tmp"), 0);
  /* Then for real. */
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(bs_atomic_open(&set[i], at(names[i]), &err), 0, "%s", err.msg);
    cr_assert_eq(bs_sink_put(&set[i].sink, names[i], 5, &err), 0);
  }
  for (int i = 0; i < 2; i++)
    cr_assert_eq(bs_atomic_sync(&set[i], &err), 0, "%s", err.msg);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(bs_atomic_publish(&set[i], &err), 0, "%s", err.msg);
  expect_content(at("a.bpk"), "a.bpk");
  expect_content(at("b.bpk"), "b.bpk");
  cr_assert_eq(count("burnstore-tmp"), 0);
}

/* ---- stale temp files
 * ---------------------------------------------------------------------------- */

Test(stale, temp_file_of_a_dead_writer_is_removed_by_the_next_write, .init = setup,
     .fini = teardown)
{
  put_file(at("model.bpk"), "old", 0644);
  put_file(at(".model.bpk.burnstore-tmp-Ab3xY9"), "stale bytes", 0644); /* nobody locks it */
  /* Not ours: another target's temp file, and names that only look alike. */
  put_file(at(".other.bpk.burnstore-tmp-Ab3xY9"), "x", 0644);
  put_file(at(".model.bpk.burnstore-tmp-Ab3"), "x", 0644);
  put_file(at(".model.bpk.burnstore-tmp-Ab3xY9.bak"), "x", 0644);
  put_file(at("model.bpk.burnstore-tmp-Ab3xY9"), "x", 0644);
  cr_assert_eq(symlink("model.bpk", at(".model.bpk.burnstore-tmp-Link00")), 0);
  cr_assert_eq(mkfifo(at(".model.bpk.burnstore-tmp-Fifo00"), 0600), 0);
  commit_text(at("model.bpk"), "new");
  expect_content(at("model.bpk"), "new");
  cr_assert(!exists(at(".model.bpk.burnstore-tmp-Ab3xY9")), "the stale temp file is gone");
  cr_assert(exists(at(".other.bpk.burnstore-tmp-Ab3xY9")));
  cr_assert(exists(at(".model.bpk.burnstore-tmp-Ab3")));
  cr_assert(exists(at(".model.bpk.burnstore-tmp-Ab3xY9.bak")));
  cr_assert(exists(at("model.bpk.burnstore-tmp-Ab3xY9")));
  cr_assert(exists(at(".model.bpk.burnstore-tmp-Link00")), "a symlink is never followed");
  cr_assert(exists(at(".model.bpk.burnstore-tmp-Fifo00")), "only regular files are temp files");
  cr_assert_eq(bs_atomic_clean_stale(at("model.bpk")), 0);
}

Test(stale, temp_file_locked_by_a_live_writer_survives, .init = setup, .fini = teardown)
{
  const char *tmp = at(".model.bpk.burnstore-tmp-LiVe42");
  put_file(tmp, "a live writer's bytes", 0644);
  int go[2], ready[2];
  cr_assert_eq(pipe(go), 0);
  cr_assert_eq(pipe(ready), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) { /* the live writer: another process holding the lock */
    int fd = open(tmp, O_RDWR);
    char c = 0;
    if (fd < 0 || flock(fd, LOCK_EX) != 0)
      _exit(1);
    if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
      _exit(2);
    _exit(0);
  }
  char c;
  cr_assert_eq(read(ready[0], &c, 1), 1);
  commit_text(at("model.bpk"), "new");
  cr_assert(exists(tmp), "a temp file whose writer is alive is never removed");
  expect_content(tmp, "a live writer's bytes");
  /* The writer dies: its lock goes with it, and the next write cleans up. */
  cr_assert_eq(write(go[1], "g", 1), 1);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  commit_text(at("model.bpk"), "newer");
  cr_assert(!exists(tmp));
  expect_content(at("model.bpk"), "newer");
}

Test(stale, writer_killed_mid_write_leaves_a_temp_the_next_write_removes, .init = setup,
     .fini = teardown)
{
  put_file(at("model.bpk"), "old", 0644);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    struct bs_atomic a;
    bs_err err;
    bs_err_clear(&err);
    if (bs_atomic_open(&a, at("model.bpk"), &err) != 0 ||
        bs_sink_zeros(&a.sink, 1 << 20, &err) != 0)
      _exit(1);
    raise(SIGKILL);
    _exit(2);
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  cr_assert_eq(count(".model.bpk.burnstore-tmp-"), 1, "kill -9 leaves its temp file");
  expect_content(at("model.bpk"), "old");
  commit_text(at("model.bpk"), "new");
  cr_assert_eq(count("burnstore-tmp"), 0, "the next write of the target removed it");
  expect_content(at("model.bpk"), "new");
}

Test(stale, long_target_names_get_a_cut_temp_name_that_is_still_cleaned, .init = setup,
     .fini = teardown)
{
  char name[NAME_MAX + 1];
  memset(name, 'n', NAME_MAX - 4);
  strcpy(name + NAME_MAX - 4, ".bpk");
  cr_assert_eq(strlen(name), NAME_MAX);
  struct bs_atomic a;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_atomic_open(&a, at(name), &err), 0, "%s", err.msg);
  const char *base = strrchr(a.tmp, '/') + 1;
  cr_assert_leq(strlen(base), NAME_MAX);
  cr_assert(strstr(base, ".burnstore-tmp-"), "%s", base);
  char stale[NAME_MAX + 1];
  snprintf(stale, sizeof stale, "%s", base);
  memcpy(stale + strlen(stale) - 6, "Stale0", 6);
  put_file(at(stale), "x", 0644);
  cr_assert_eq(bs_sink_put(&a.sink, "abc", 3, &err), 0);
  cr_assert_eq(bs_atomic_commit(&a, &err), 0, "%s", err.msg);
  expect_content(at(name), "abc");
  cr_assert(exists(at(stale)), "created after our open: cleaned by the next one");
  commit_text(at(name), "def");
  cr_assert(!exists(at(stale)));
  cr_assert_eq(count("burnstore-tmp"), 0);
}

Test(stale, a_bare_file_name_works_in_the_current_directory, .init = setup, .fini = teardown)
{
  char cwd[PATH_MAX];
  cr_assert_not_null(getcwd(cwd, sizeof cwd));
  cr_assert_eq(chdir(dir), 0);
  put_file(".bare.bpk.burnstore-tmp-zzzzzz", "x", 0644);
  commit_text("bare.bpk", "abc");
  cr_assert_eq(chdir(cwd), 0);
  expect_content(at("bare.bpk"), "abc");
  cr_assert_eq(count("burnstore-tmp"), 0);
}
