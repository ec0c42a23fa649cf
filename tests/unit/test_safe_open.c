/* Opening what burnstore did not just create (core/safe_open.h), on
 * temporary directories: symbolic links, FIFOs, another user's files,
 * modes others may write, a directory swapped after it was opened, paths
 * out of the directory; every case again with openat2 hidden by a seccomp
 * filter (ENOSYS, as on a kernel before 5.6), so that the per-component
 * fallback is what runs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/safe_open.h"
#include "core/source.h"

#define NOBODY 65534

static bs_err err;
static char *dir;
static int dfd = -1;

static char *made[64];
static size_t nmade;

static void setup(void)
{
  bs_err_clear(&err);
  dir = bs_test_tmpdir("safe_open");
  dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  cr_assert_geq(dfd, 0);
}

static void teardown(void)
{
  if (dfd >= 0)
    close(dfd);
  bs_test_rmrf(dir);
  free(dir);
  while (nmade)
    free(made[--nmade]);
}

/* openat2 answers ENOSYS from here on in this process (each test is one). */
static void hide_openat2(void)
{
#if defined(__x86_64__)
  const unsigned arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  const unsigned arch = AUDIT_ARCH_AARCH64;
#else
#error "the native audit arch of this machine"
#endif
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
  cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
  cr_assert_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0, "%s", strerror(errno));
  cr_assert_eq(syscall(SYS_openat2, AT_FDCWD, ".", NULL, 0), -1);
  cr_assert_eq(errno, ENOSYS, "openat2 is hidden");
}

/* d/name, malloc'd: freed by teardown. */
static char *join(const char *d, const char *name)
{
  char *p = malloc(strlen(d) + strlen(name) + 2);
  cr_assert_not_null(p);
  cr_assert_lt(nmade, sizeof made / sizeof made[0]);
  sprintf(p, "%s/%s", d, name);
  return made[nmade++] = p;
}

static char *at(const char *name)
{
  return join(dir, name);
}

static void put(const char *name, const char *text, mode_t mode)
{
  char *p = at(name);
  bs_test_put_file(p, text, strlen(text));
  cr_assert_eq(chmod(p, mode), 0);
}

static void assert_refused(int fd, int code, const char *words)
{
  cr_assert_lt(fd, 0, "refused");
  cr_assert_eq(err.code, code, "code %d (%s), expected %d", err.code, err.msg, code);
  cr_assert(strstr(err.msg, words), "'%s' in '%s'", words, err.msg);
  cr_assert(!strchr(err.msg, '\n'), "one line");
  bs_err_clear(&err);
}

static void read_back(int fd, const char *want)
{
  char buf[64] = {0};
  cr_assert_eq(pread(fd, buf, sizeof buf - 1, 0), (ssize_t)strlen(want));
  cr_assert_str_eq(buf, want);
}

/* ---- the cases, run with openat2 and without ---- */

static void regular_file_opens(void)
{
  put("f", "mine", 0644);
  struct stat st;
  int fd = bs_safe_openat(dfd, dir, "f", O_RDONLY, 0, BS_SAFE_REG, &st, &err);
  cr_assert_geq(fd, 0, "%s", err.msg);
  cr_assert(S_ISREG(st.st_mode));
  cr_assert_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "O_NONBLOCK cleared on a regular file");
  cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  read_back(fd, "mine");
  close(fd);
  fd = bs_safe_openat(dfd, dir, "missing", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, ENOENT, "missing");
}

static void symlinks_are_not_followed(void)
{
  put("secret", "root only", 0600);
  char *s = at("secret"), *l = at("link");
  cr_assert_eq(symlink(s, l), 0);
  int fd = bs_safe_openat(dfd, dir, "link", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, ELOOP, "link: is a symbolic link (owned by uid 0");
  /* O_CREAT through a link creates nothing where it points. */
  char *gone = at("made-by-link");
  cr_assert_eq(symlink(gone, l = at("lock")), 0);
  fd = bs_safe_openat(dfd, dir, "lock", O_RDWR | O_CREAT, 0600, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, ELOOP, "not followed");
  cr_assert_eq(access(gone, F_OK), -1, "nothing created at the link's target");
  /* A link in the middle of the path, and paths out of the directory. */
  cr_assert_eq(mkdir(s = at("sub"), 0700), 0);
  put("sub/x", "x", 0644);
  cr_assert_eq(symlink(s, l = at("sublink")), 0);
  fd = bs_safe_openat(dfd, dir, "sublink/x", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, ELOOP, "symbolic link");
  fd = bs_safe_openat(dfd, dir, "sub/x", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  cr_assert_geq(fd, 0, "a real subdirectory: %s", err.msg);
  close(fd);
  fd = bs_safe_openat(dfd, dir, "sub/../sub/x", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, EXDEV, "out of its directory");
  fd = bs_safe_openat(dfd, dir, "/etc/passwd", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, EXDEV, "out of its directory");
}

/* Each open here would block forever without O_NONBLOCK: the test's
 * timeout fails it rather than hang the suite. */
static void fifos_never_block(void)
{
  char *p = at("JOURNAL");
  cr_assert_eq(mkfifo(p, 0600), 0);
  static const int modes[] = {O_RDONLY, O_WRONLY, O_RDWR, O_RDWR | O_CREAT, O_WRONLY | O_APPEND};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    int fd = bs_safe_openat(dfd, dir, "JOURNAL", modes[i], 0600, BS_SAFE_REG, NULL, &err);
    assert_refused(fd, EINVAL, "JOURNAL: is a FIFO, not a regular file");
  }
  /* Asked for no type, it is opened, and still without blocking. */
  int fd = bs_safe_openat(dfd, dir, "JOURNAL", O_RDONLY, 0, 0, NULL, &err);
  cr_assert_geq(fd, 0, "no type asked: opened, without blocking: %s", err.msg);
  close(fd);
  cr_assert_eq(mkdir(p = at("d"), 0700), 0);
  fd = bs_safe_openat(dfd, dir, "d", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, EISDIR, "is a directory, not a regular file");
  fd = bs_safe_openat(dfd, dir, "JOURNAL", O_RDONLY | O_DIRECTORY, 0, BS_SAFE_DIR, NULL, &err);
  assert_refused(fd, ENOTDIR, "is a FIFO, not a directory");
}

static void other_owners_and_open_modes(void)
{
  put("theirs", "planted", 0644);
  char *p = at("theirs");
  cr_assert_eq(chown(p, NOBODY, NOBODY), 0);
  int fd = bs_safe_openat(dfd, dir, "theirs", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  assert_refused(fd, EPERM, "theirs: owned by uid 65534 (nobody), not by you: not used");
  fd = bs_safe_openat(dfd, dir, "theirs", O_RDONLY, 0, BS_SAFE_REG | BS_SAFE_ANY_OWNER, NULL, &err);
  cr_assert_geq(fd, 0, "any owner: %s", err.msg);
  close(fd);
  put("open", "0666", 0666);
  fd = bs_safe_openat(dfd, dir, "open", O_RDONLY, 0, BS_SAFE_REG | BS_SAFE_PRIVATE, NULL, &err);
  assert_refused(fd, EPERM, "open: others may write it (mode 0666)");
  fd = bs_safe_openat(dfd, dir, "open", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  cr_assert_geq(fd, 0, "a file of ours others may write, where that does not matter");
  close(fd);
  /* Directories by path: another user's, one others may write, a link. */
  char *d = at("nobodys");
  cr_assert_eq(mkdir(d, 0700), 0);
  cr_assert_eq(chown(d, NOBODY, NOBODY), 0);
  fd = bs_safe_open_dir(d, BS_SAFE_PRIVATE, &err);
  assert_refused(fd, EPERM, "nobodys: owned by uid 65534 (nobody), not by you");
  fd = bs_safe_open_dir(d, BS_SAFE_ANY_OWNER, &err);
  cr_assert_geq(fd, 0, "%s", err.msg);
  close(fd);
  cr_assert_eq(chown(d, 0, 0), 0);
  cr_assert_eq(chmod(d, 0770), 0);
  fd = bs_safe_open_dir(d, BS_SAFE_PRIVATE, &err);
  assert_refused(fd, EPERM, "others may write it (mode 0770)");
  char *l = at("dirlink");
  cr_assert_eq(symlink(d, l), 0);
  fd = bs_safe_open_dir(l, 0, &err);
  assert_refused(fd, ELOOP, "dirlink: is a symbolic link");
  char slash[PATH_MAX];
  snprintf(slash, sizeof slash, "%s///", l);
  fd = bs_safe_open_dir(slash, BS_SAFE_PRIVATE, &err);
  assert_refused(fd, ELOOP, "is a symbolic link");
  /* A directory the user names (an output's) may be reached through a link. */
  fd = bs_safe_open_dir(l, BS_SAFE_ANY_OWNER, &err);
  cr_assert_geq(fd, 0, "%s", err.msg);
  close(fd);
}

/* A held directory stays the one opened: another user who may write its
 * parent renames it away and puts their own in its place. */
static void a_held_directory_is_not_swapped(void)
{
  char *stg = at("stg"), *away = at("away");
  cr_assert_eq(mkdir(stg, 0700), 0);
  put("stg/1", "root's staged bytes", 0600);
  int sfd = bs_safe_open_dir(stg, BS_SAFE_PRIVATE, &err);
  cr_assert_geq(sfd, 0, "%s", err.msg);
  cr_assert_eq(rename(stg, away), 0);
  cr_assert_eq(mkdir(stg, 0700), 0);
  put("secret", "a key", 0600);
  char *secret = at("secret"), *planted = at("stg/1");
  cr_assert_eq(symlink(secret, planted), 0);
  int fd = bs_safe_openat(sfd, stg, "1", O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  cr_assert_geq(fd, 0, "%s", err.msg);
  read_back(fd, "root's staged bytes");
  close(fd);
  /* A source over the held directory reads the same file, and one made
   * before the file was replaced in it fails rather than read another. */
  struct bs_src s;
  cr_assert_eq(bs_src_init_at(&s, sfd, stg, "1", &err), 0, "%s", err.msg);
  char buf[32] = {0};
  cr_assert_eq(bs_src_pread(&s, 0, buf, 5), 5);
  cr_assert_str_eq(buf, "root'");
  cr_assert_str_eq(s.name, planted);
  char *old = join(away, "1");
  int keep = open(old, O_RDONLY | O_CLOEXEC); /* (its inode number is not reused) */
  cr_assert_geq(keep, 0);
  cr_assert_eq(unlink(old), 0);
  bs_test_put_file(old, "other", 5);
  cr_assert_eq(bs_src_pread(&s, 0, buf, 5), -EIO, "a replaced file is not read");
  char why[128];
  cr_assert(bs_src_changed(&s, why, sizeof why));
  bs_src_destroy(&s);
  close(keep);
  close(sfd);
}

static void new_directories_and_removal(void)
{
  char name[] = ".out.bpk.staging-XXXXXX";
  int fd = bs_safe_mkdtempat(dfd, dir, name, &err);
  cr_assert_geq(fd, 0, "%s", err.msg);
  cr_assert_neq(strcmp(name + sizeof name - 7, "XXXXXX"), 0, "a random name: %s", name);
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0700);
  int f =
      bs_safe_openat(fd, name, "lock", O_RDWR | O_CREAT | O_EXCL, 0600, BS_SAFE_REG, NULL, &err);
  cr_assert_geq(f, 0, "%s", err.msg); /* held open: its inode number is not reused */
  struct stat was;
  cr_assert_eq(fstatat(fd, "lock", &was, 0), 0);
  cr_assert_eq(unlinkat(fd, "lock", 0), 0);
  char *lk = join(dir, name);
  char *lkf = join(lk, "lock");
  bs_test_put_file(lkf, "new", 3);
  cr_assert_eq(bs_safe_unlink_same(fd, "lock", &was, 0), -1, "another file now");
  cr_assert_eq(errno, ESTALE);
  cr_assert_eq(access(lkf, F_OK), 0);
  close(f);
  cr_assert_eq(fstatat(fd, "lock", &was, 0), 0);
  cr_assert_eq(bs_safe_unlink_same(fd, "lock", &was, 0), 0);
  cr_assert_eq(bs_safe_unlinkat(fd, "../x", 0), -1);
  cr_assert_eq(errno, EINVAL);
  cr_assert_eq(bs_safe_renameat(fd, "a", "sub/b"), -1);
  cr_assert_eq(errno, EINVAL);
  close(fd);
  cr_assert_eq(fstatat(dfd, name, &was, 0), 0);
  cr_assert_eq(bs_safe_unlink_same(dfd, name, &was, AT_REMOVEDIR), 0);
}

TestSuite(safe_open, .init = setup, .fini = teardown, .timeout = 20);

Test(safe_open, regular_file_opens)
{
  regular_file_opens();
}
Test(safe_open, symlinks_are_not_followed)
{
  symlinks_are_not_followed();
}
Test(safe_open, fifos_never_block)
{
  fifos_never_block();
}
Test(safe_open, other_owners_and_open_modes)
{
  if (geteuid() != 0)
    cr_skip_test("chown to nobody needs root (the suite runs as root in CI)");
  other_owners_and_open_modes();
}
Test(safe_open, a_held_directory_is_not_swapped)
{
  a_held_directory_is_not_swapped();
}
Test(safe_open, new_directories_and_removal)
{
  new_directories_and_removal();
}

Test(safe_open_enosys, regular_file_opens, .init = setup, .fini = teardown, .timeout = 20)
{
  hide_openat2();
  regular_file_opens();
}
Test(safe_open_enosys, symlinks_are_not_followed, .init = setup, .fini = teardown, .timeout = 20)
{
  hide_openat2();
  symlinks_are_not_followed();
}
Test(safe_open_enosys, fifos_never_block, .init = setup, .fini = teardown, .timeout = 20)
{
  hide_openat2();
  fifos_never_block();
}
Test(safe_open_enosys, other_owners_and_open_modes, .init = setup, .fini = teardown, .timeout = 20)
{
  if (geteuid() != 0)
    cr_skip_test("chown to nobody needs root (the suite runs as root in CI)");
  hide_openat2();
  other_owners_and_open_modes();
}
Test(safe_open_enosys, a_held_directory_is_not_swapped, .init = setup, .fini = teardown,
     .timeout = 20)
{
  hide_openat2();
  a_held_directory_is_not_swapped();
}
Test(safe_open_enosys, new_directories_and_removal, .init = setup, .fini = teardown, .timeout = 20)
{
  hide_openat2();
  new_directories_and_removal();
}

/* The soft limit on open files goes up to the hard one. */
Test(safe_open, raise_nofile)
{
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max > 1024) {
    struct rlimit low = {1024, rl.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
  }
  cr_assert_eq(bs_raise_nofile(), 0);
  struct rlimit now;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &now), 0);
  cr_assert_eq(now.rlim_cur, rl.rlim_max);
}
