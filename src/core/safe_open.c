/* Opening what burnstore did not just create (safe_open.h). */
#include "core/safe_open.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

bool bs_plain_name(const char *n)
{
  size_t len = strlen(n);
  if (len == 0 || len > NAME_MAX || strcmp(n, ".") == 0 || strcmp(n, "..") == 0)
    return false;
  for (const unsigned char *p = (const unsigned char *)n; *p; p++)
    if (*p == '/' || *p < 0x20 || *p == 0x7f)
      return false;
  return true;
}

/* One name in a directory, as unlinkat, renameat and mkdirat take it: not
 * empty, not "." or "..", no '/', at most NAME_MAX bytes. (Control
 * characters are the user's to put in a file name: a checkpoint named
 * "a\tb.ext" has a staging directory and temp files named after
 * it; bs_plain_name, which refuses them, is for names read from a file.) */
static bool one_name(const char *n)
{
  size_t len = strlen(n);
  return len > 0 && len <= NAME_MAX && strcmp(n, ".") != 0 && strcmp(n, "..") != 0 &&
         !strchr(n, '/');
}

void bs_safe_owner(uid_t uid, char *buf, size_t n)
{
  struct passwd pw, *res = NULL;
  char tmp[1024];
  if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res && res->pw_name)
    snprintf(buf, n, "uid %u (%s)", (unsigned)uid, res->pw_name);
  else
    snprintf(buf, n, "uid %u", (unsigned)uid);
}

const char *bs_file_kind(mode_t m)
{
  return S_ISREG(m)    ? "a regular file"
         : S_ISDIR(m)  ? "a directory"
         : S_ISLNK(m)  ? "a symbolic link"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "of an unknown type";
}

/* "DIR/NAME" for messages: the end of a long directory names it, its
 * control characters as '?' (another user chose the name: a newline in it
 * would make a line of theirs, an escape would drive the terminal). */
static void shown(char *buf, size_t n, const char *dir, const char *name)
{
  size_t dl = dir ? strlen(dir) : 0, tail = dl > 120 ? 120 : dl;
  snprintf(buf, n, "%s%s%s%.80s", dl > tail ? "..." : "", dir ? dir + dl - tail : "",
           name && dl ? "/" : "", name ? name : "");
  bs_text_clean(buf);
}

int bs_safe_check(const struct stat *st, unsigned want, const char *dir, const char *name,
                  bs_err *err)
{
  char p[220], who[160];
  if ((want & BS_SAFE_REG) && !S_ISREG(st->st_mode)) {
    shown(p, sizeof p, dir, name);
    return bs_fail(err, S_ISDIR(st->st_mode) ? EISDIR : EINVAL, BS_OFF_NONE, NULL,
                   "%s: is %s, not a regular file: not opened", p, bs_file_kind(st->st_mode));
  }
  if ((want & BS_SAFE_DIR) && !S_ISDIR(st->st_mode)) {
    shown(p, sizeof p, dir, name);
    return bs_fail(err, ENOTDIR, BS_OFF_NONE, NULL, "%s: is %s, not a directory: not used", p,
                   bs_file_kind(st->st_mode));
  }
  if (!(want & BS_SAFE_ANY_OWNER) && st->st_uid != geteuid() && st->st_uid != 0) {
    shown(p, sizeof p, dir, name);
    bs_safe_owner(st->st_uid, who, sizeof who);
    return bs_fail(err, EPERM, BS_OFF_NONE, NULL, "%s: owned by %s, not by you: not used", p, who);
  }
  if ((want & BS_SAFE_PRIVATE) && (st->st_mode & (S_IWGRP | S_IWOTH))) {
    shown(p, sizeof p, dir, name);
    return bs_fail(err, EPERM, BS_OFF_NONE, NULL, "%s: others may write it (mode %04o): not used",
                   p, (unsigned)(st->st_mode & 07777));
  }
  return 0;
}

/* Why an open of dir/name (name NULL: the path dir) failed with errno e, in
 * one line. */
static int open_failed(int dirfd, const char *dir, const char *name, int e, bs_err *err)
{
  char p[220], who[160];
  shown(p, sizeof p, dir, name);
  struct stat st;
  bool there = fstatat(name ? dirfd : AT_FDCWD, name ? name : dir, &st, AT_SYMLINK_NOFOLLOW) == 0;
  if ((e == ELOOP || e == ENXIO || e == ENOTDIR) && there && !S_ISREG(st.st_mode) &&
      !S_ISDIR(st.st_mode)) {
    bs_safe_owner(st.st_uid, who, sizeof who);
    return bs_fail(err, S_ISLNK(st.st_mode) ? ELOOP : EINVAL, BS_OFF_NONE, NULL,
                   "%s: is %s (owned by %s): not %s", p, bs_file_kind(st.st_mode), who,
                   S_ISLNK(st.st_mode) ? "followed" : "opened");
  }
  if (e == ELOOP)
    return bs_fail(err, ELOOP, BS_OFF_NONE, NULL,
                   "%s: its path holds a symbolic link: not followed", p);
  if (e == EXDEV)
    return bs_fail(err, EXDEV, BS_OFF_NONE, NULL, "%s: leads out of its directory: not opened", p);
  return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: %s", p, strerror(e));
}

/* The kernel without openat2 (before 5.6), or a seccomp filter that hides
 * it: each component opened O_NOFOLLOW beneath the last, no "..", no
 * absolute path. */
static int open_beneath_fallback(int dirfd, const char *name, int flags, mode_t mode)
{
  if (name[0] == '/') {
    errno = EXDEV;
    return -1;
  }
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", name) >= (int)sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int cur = dirfd;
  char *save = NULL, *comp = strtok_r(buf, "/", &save);
  while (comp) {
    char *next = strtok_r(NULL, "/", &save);
    if (strcmp(comp, "..") == 0) {
      if (cur != dirfd)
        close(cur);
      errno = EXDEV;
      return -1;
    }
    if (strcmp(comp, ".") == 0 && next) {
      comp = next;
      continue;
    }
    int fd = next ? openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                  : openat(cur, comp, flags, mode);
    int e = errno;
    struct stat st;
    if (fd < 0 && next && e == ENOTDIR && fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode))
      e = ELOOP; /* as openat2's RESOLVE_NO_SYMLINKS says it */
    if (cur != dirfd)
      close(cur);
    if (fd < 0) {
      errno = e;
      return -1;
    }
    if (!next)
      return fd;
    cur = fd;
    comp = next;
  }
  errno = EINVAL; /* an empty name */
  return -1;
}

static int open_beneath(int dirfd, const char *name, int flags, mode_t mode)
{
  struct open_how how = {
      .flags = (unsigned long long)flags,
      .mode = (flags & O_CREAT) ? mode : 0,
      .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
  };
  long fd = syscall(SYS_openat2, dirfd, name, &how, sizeof how);
  if (fd < 0 && errno == ENOSYS)
    return open_beneath_fallback(dirfd, name, flags, mode);
  return (int)fd;
}

int bs_safe_openat(int dirfd, const char *dir, const char *name, int flags, mode_t mode,
                   unsigned want, struct stat *st, bs_err *err)
{
  struct stat tmp;
  if (!st)
    st = &tmp;
  if (!name[0])
    return open_failed(dirfd, dir, name, EINVAL, err);
  /* No "..", even one that stays beneath (openat2 would allow it; the
   * fallback never does): the same answer on every kernel. */
  for (const char *c = name; c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL)
    if (c[0] == '.' && c[1] == '.' && (c[2] == '/' || c[2] == '\0'))
      return open_failed(dirfd, dir, name, EXDEV, err);
  /* Something that is there but of the wrong type is refused before an
   * open (which could rewind a tape); the fstat below decides. */
  struct stat pre;
  if (fstatat(dirfd, name, &pre, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISLNK(pre.st_mode) &&
      bs_safe_check(&pre, (want & (BS_SAFE_REG | BS_SAFE_DIR)) | BS_SAFE_ANY_OWNER, dir, name,
                    err) != 0)
    return -1;
  int fd = open_beneath(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, mode);
  if (fd < 0)
    return open_failed(dirfd, dir, name, errno, err);
  if (fstat(fd, st) != 0) {
    int e = errno;
    close(fd);
    return open_failed(dirfd, dir, name, e, err);
  }
  if (bs_safe_check(st, want, dir, name, err) != 0) {
    close(fd);
    return -1;
  }
  int fl;
  if (S_ISREG(st->st_mode) && !(flags & O_NONBLOCK) &&
      ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)) {
    int e = errno;
    close(fd);
    return open_failed(dirfd, dir, name, e, err);
  }
  return fd;
}

int bs_safe_open_dir(const char *path, unsigned want, bs_err *err)
{
  char buf[PATH_MAX];
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') /* "DIR/" would follow a link DIR */
    n--;
  if (n >= sizeof buf)
    return bs_fail(err, ENAMETOOLONG, BS_OFF_NONE, NULL, "%.100s...: %s", path,
                   strerror(ENAMETOOLONG));
  memcpy(buf, path, n);
  buf[n] = '\0';
  /* A directory the user named (any owner) is theirs to name through a
   * link; one that holds state of ours is not followed. */
  int nofollow = (want & BS_SAFE_ANY_OWNER) ? 0 : O_NOFOLLOW;
  int fd = open(buf, O_RDONLY | O_DIRECTORY | nofollow | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return open_failed(AT_FDCWD, buf, NULL, errno, err);
  struct stat st;
  if (fstat(fd, &st) != 0 || bs_safe_check(&st, want | BS_SAFE_DIR, buf, NULL, err) != 0) {
    if (!err->code)
      bs_fail(err, errno, BS_OFF_NONE, NULL, "%s: %s", buf, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

int bs_safe_open_path(const char *path, int flags, mode_t mode, unsigned want, bs_err *err)
{
  const char *slash = strrchr(path, '/');
  char dir[PATH_MAX];
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if ((size_t)(slash - path) >= sizeof dir)
    return bs_fail(err, ENAMETOOLONG, BS_OFF_NONE, NULL, "%.100s...: %s", path,
                   strerror(ENAMETOOLONG));
  else
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  int dfd = bs_safe_open_dir(dir, BS_SAFE_ANY_OWNER, err);
  if (dfd < 0)
    return -1;
  int fd = bs_safe_openat(dfd, dir, slash ? slash + 1 : path, flags, mode, want, NULL, err);
  close(dfd);
  return fd;
}

int bs_safe_mkdtempat(int dirfd, const char *dir, char *name, bs_err *err)
{
  static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  size_t len = strlen(name);
  if (len < 6 || strcmp(name + len - 6, "XXXXXX") != 0 || !one_name(name))
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "%s/%s: not a directory template", dir, name);
  for (int tries = 0; tries < 100; tries++) {
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      r = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)tries;
    }
    for (size_t i = len - 6; i < len; i++, r /= sizeof alnum - 1)
      name[i] = alnum[r % (sizeof alnum - 1)];
    if (mkdirat(dirfd, name, 0700) != 0) {
      if (errno == EEXIST)
        continue;
      int e = errno;
      memcpy(name + len - 6, "XXXXXX", 6);
      return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: cannot create %s: %s", dir, name, strerror(e));
    }
    /* Another user who may write dir could swap it before the open: the
     * owner check finds theirs. */
    struct stat st;
    int fd = bs_safe_openat(dirfd, dir, name, O_RDONLY | O_DIRECTORY, 0,
                            BS_SAFE_DIR | BS_SAFE_PRIVATE, &st, err);
    if (fd >= 0 && st.st_uid != geteuid()) {
      close(fd);
      fd = -1;
      char p[220];
      shown(p, sizeof p, dir, name);
      bs_fail(err, EPERM, BS_OFF_NONE, NULL, "%s: not the directory just made: not used", p);
    }
    if (fd < 0)
      return -1; /* (not ours: never removed) */
    return fd;
  }
  return bs_fail(err, EEXIST, BS_OFF_NONE, NULL, "%s: no free name like %s", dir, name);
}

int bs_safe_unlinkat(int dirfd, const char *name, int flags)
{
  if (!one_name(name)) {
    errno = EINVAL;
    return -1;
  }
  return unlinkat(dirfd, name, flags);
}

int bs_safe_renameat(int dirfd, const char *from, const char *to)
{
  if (!one_name(from) || !one_name(to)) {
    errno = EINVAL;
    return -1;
  }
  return renameat(dirfd, from, dirfd, to);
}

int bs_safe_unlink_same(int dirfd, const char *name, const struct stat *was, int flags)
{
  struct stat now;
  if (!one_name(name)) {
    errno = EINVAL;
    return -1;
  }
  if (fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0)
    return -1;
  if (now.st_dev != was->st_dev || now.st_ino != was->st_ino) {
    errno = ESTALE;
    return -1;
  }
  return unlinkat(dirfd, name, flags);
}

DIR *bs_safe_dirstream(int dirfd)
{
  int fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return NULL;
  DIR *d = fdopendir(fd);
  if (!d) {
    int e = errno;
    close(fd);
    errno = e;
    return NULL;
  }
  rewinddir(d); /* a dup shares the offset of dirfd */
  return d;
}

int bs_raise_nofile(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return -1;
  if (rl.rlim_cur >= rl.rlim_max)
    return 0;
  rl.rlim_cur = rl.rlim_max;
  return setrlimit(RLIMIT_NOFILE, &rl);
}
