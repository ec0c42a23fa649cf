/* End-to-end tests in C: really mount, use real syscalls, always unmount.
 * Each test has a deadline (.timeout), and the fini runs `burnstore -u`
 * (then fusermount3 -uz) whatever happened. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "formats/formats.h"

#define BPK BS_FIXTURES_DIR "/burn/examples/mnist-inference-web/model.bpk"

static char *tmp;
static char mnt[4096];

/* Run argv with a deadline; returns the exit status, or -1 on timeout. */
static int run_deadline(char *const argv[], int seconds)
{
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0)
      dup2(null, 1);
    execv(argv[0], argv);
    execvp(argv[0], argv);
    _exit(127);
  }
  for (int i = 0; i < seconds * 20; i++) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static bool mounted(const char *path)
{
  FILE *f = fopen("/proc/self/mounts", "r");
  char line[8192];
  bool found = false;
  while (f && fgets(line, sizeof line, f)) {
    char *a = strchr(line, ' ');
    if (!a)
      continue;
    char *b = strchr(a + 1, ' ');
    if (b && (size_t)(b - a - 1) == strlen(path) && strncmp(a + 1, path, strlen(path)) == 0)
      found = true;
  }
  if (f)
    fclose(f);
  return found;
}

static int mount_it(const char *src, const char *opts)
{
  char *argv[] = {BS_BURNSTORE_BIN, (char *)src, mnt, opts ? "-o" : NULL, (char *)opts, NULL};
  return run_deadline(argv, 60);
}

static int unmount_it(void)
{
  char *argv[] = {BS_BURNSTORE_BIN, "-u", mnt, NULL};
  return run_deadline(argv, 120);
}

static void setup(void)
{
  tmp = bs_test_tmpdir("e2e");
  snprintf(mnt, sizeof mnt, "%s/mnt", tmp);
  cr_assert_eq(mkdir(mnt, 0755), 0);
}

static void teardown(void)
{
  if (mounted(mnt)) {
    unmount_it();
    char *u1[] = {"fusermount3", "-u", mnt, NULL};
    char *u2[] = {"fusermount3", "-uz", mnt, NULL};
    if (mounted(mnt))
      run_deadline(u1, 30);
    if (mounted(mnt))
      run_deadline(u2, 30);
  }
  bs_test_rmrf(tmp);
  free(tmp);
}

TestSuite(mount, .init = setup, .fini = teardown, .timeout = 120);

static void open_catalog(struct bs_catalog *cat, const char *path)
{
  bs_err err;
  bs_err_clear(&err);
  struct bs_src src;
  bs_catalog_init(cat);
  cr_assert_eq(bs_src_open(&src, path, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_open_any(cat, &src, NULL, &err), 0, "%s", err.msg);
}

Test(mount, burnpack_files_match_the_catalog)
{
  cr_assert_eq(mount_it(BPK, NULL), 0);
  cr_assert(mounted(mnt));
  struct bs_catalog cat;
  open_catalog(&cat, BPK);
  cr_assert_eq(cat.count, 18);
  for (size_t i = 0; i < cat.count; i++) {
    const struct bs_tensor *t = &cat.tensors[i];
    char path[8192], *p;
    snprintf(path, sizeof path, "%s/%s", mnt, t->key);
    for (p = path + strlen(mnt) + 1; *p; p++)
      if (*p == '.')
        *p = '/';
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "stat %s: %s", path, strerror(errno));
    cr_assert_eq((uint64_t)st.st_size, t->nbytes);
    char val[256];
    ssize_t n = getxattr(path, "user.burnstore.dtype", val, sizeof val);
    cr_assert_eq(n, 3);
    cr_assert_eq(memcmp(val, "F32", 3), 0);
    n = getxattr(path, "user.burnstore.shape", NULL, 0);
    cr_assert_gt(n, 1, "size probe");
    cr_assert_eq(getxattr(path, "user.burnstore.shape", val, 1), -1);
    cr_assert_eq(errno, ERANGE);
    uint8_t *a = bs_malloc(t->nbytes), *b = bs_malloc(t->nbytes);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pread(fd, a, t->nbytes, 0), (ssize_t)t->nbytes);
    cr_assert_eq(pread(fd, b, 16, (off_t)t->nbytes), 0, "read at EOF gives 0");
    close(fd);
    cr_assert_eq(bs_tensor_read(&cat, t, 0, b, t->nbytes), (long)t->nbytes);
    cr_assert_eq(memcmp(a, b, t->nbytes), 0, "bytes of %s", t->key);
    bs_free(a);
    bs_free(b);
  }
  bs_catalog_destroy(&cat);
  cr_assert_eq(unmount_it(), 0);
  cr_assert_not(mounted(mnt));
}

Test(mount, new_file_written_back_on_unmount)
{
  char out[4096], path[8192];
  snprintf(out, sizeof out, "%s/new.bpk", tmp);
  cr_assert_eq(mount_it(out, NULL), 0);
  snprintf(path, sizeof path, "%s/enc", mnt);
  cr_assert_eq(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/enc/w", mnt);
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  cr_assert_geq(fd, 0);
  float v[6] = {1, 2, 3, 4, 5, 6};
  cr_assert_eq(pwrite(fd, v + 3, 12, 12), 12, "write the second half first");
  cr_assert_eq(pwrite(fd, v, 12, 0), 12);
  cr_assert_eq(close(fd), 0);
  cr_assert_eq(setxattr(path, "user.burnstore.dtype", "F32", 3, 0), 0);
  cr_assert_eq(setxattr(path, "user.burnstore.shape", "[2,3]", 5, 0), 0);
  cr_assert_eq(setxattr(path, "user.burnstore.dtype", "F99", 3, 0), -1);
  cr_assert_eq(errno, EINVAL);
  cr_assert_eq(setxattr(path, "user.burnstore.shape", "[2,", 3, 0), -1);
  cr_assert_eq(errno, EINVAL);
  cr_assert_eq(unmount_it(), 0);
  struct bs_catalog cat;
  open_catalog(&cat, out);
  cr_assert_eq(cat.count, 1);
  const struct bs_tensor *t = &cat.tensors[0];
  cr_assert_str_eq(t->key, "enc.w");
  cr_assert_eq(t->dtype, BS_DT_F32);
  cr_assert_eq(t->rank, 2);
  cr_assert_eq(t->shape[0], 2);
  cr_assert_eq(t->shape[1], 3);
  float got[6];
  cr_assert_eq(bs_tensor_read(&cat, t, 0, got, sizeof got), (long)sizeof got);
  cr_assert_eq(memcmp(got, v, sizeof v), 0);
  bs_catalog_destroy(&cat);
}
