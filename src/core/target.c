/* Output targets and the one target lock of every writer (target.h). */
#include "core/target.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "core/checked.h"
#include "core/safe_open.h"
#include "core/source.h"

char *bs_abs_path(const char *p)
{
  char buf[PATH_MAX], parent[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", p) >= (int)sizeof buf) {
    errno = ENAMETOOLONG;
    return NULL;
  }
  size_t len = strlen(buf);
  while (len > 1 && buf[len - 1] == '/')
    buf[--len] = '\0';
  char *slash = strrchr(buf, '/');
  const char *base;
  if (!slash) {
    snprintf(parent, sizeof parent, ".");
    base = buf;
  } else {
    *slash = '\0';
    snprintf(parent, sizeof parent, "%s", slash == buf ? "/" : buf);
    base = slash + 1;
  }
  char *rp = realpath(parent, NULL);
  if (!rp)
    return NULL;
  char *out = bs_malloc(strlen(rp) + strlen(base) + 2);
  if (out) {
    if (strcmp(base, ".") == 0 || base[0] == '\0')
      strcpy(out, rp);
    else if (strcmp(base, "..") == 0) {
      char *r2 = realpath(p, NULL);
      strcpy(out, r2 ? r2 : rp);
      free(r2);
    } else
      sprintf(out, "%s%s%s", rp, strcmp(rp, "/") == 0 ? "" : "/", base);
  } else {
    errno = ENOMEM;
  }
  free(rp);
  return out;
}

/* Whether the link lst describes may be followed to write: the caller's or
 * root's. Another user's names a file of their choosing (in a sticky /tmp,
 * in a group-writable directory, in their own home): writing through it
 * writes any file the caller may write. (The kernel's protected_symlinks
 * guards only sticky directories, and a link followed by hand bypasses it.) */
static bool link_trusted(const struct stat *lst)
{
  return lst->st_uid == geteuid() || lst->st_uid == 0;
}

char *bs_follow_links(const char *p, bool trusted_only)
{
  char *abs = bs_abs_path(p);
  /* A symlink is followed by hand, each target resolved as bs_abs_path
   * does (its parent only): realpath would check the last directory itself
   * (a target written with a trailing slash: faccessat), which asks the
   * file system mounted there, and a hung daemon never answers. readlink
   * of a directory fails without asking it. As many hops as the kernel's
   * own limit (40). */
  for (int hop = 0; abs && hop < 40; hop++) {
    char t[PATH_MAX], joined[PATH_MAX * 2 + 2];
    ssize_t n = readlink(abs, t, sizeof t);
    if (n > 0 && trusted_only) {
      /* A link (readlink asks no file system mounted there): its owner,
       * and its target again, through an fd of the link itself (the link
       * checked is the link read). */
      int fd = open(abs, O_PATH | O_NOFOLLOW | O_CLOEXEC);
      struct stat lst;
      n = fd >= 0 && fstat(fd, &lst) == 0 && S_ISLNK(lst.st_mode) && link_trusted(&lst)
              ? readlinkat(fd, "", t, sizeof t)
              : -1;
      if (fd >= 0)
        close(fd);
    }
    if (n <= 0 || (size_t)n >= sizeof t)
      break;
    t[n] = '\0';
    if (t[0] != '/') { /* relative to the link's directory */
      size_t dir = (size_t)(strrchr(abs, '/') - abs);
      snprintf(joined, sizeof joined, "%.*s/%s", (int)dir, abs, t);
    }
    char *next = bs_abs_path(t[0] == '/' ? t : joined);
    if (!next)
      break; /* (a target in no directory: the link's own path) */
    bs_free(abs);
    abs = next;
  }
  return abs;
}

char *bs_link_path(const char *p)
{
  return bs_follow_links(p, true);
}

char *bs_write_path(const char *p, bs_err *err)
{
  char *path = bs_link_path(p);
  if (!path) {
    bs_fail(err, errno, BS_OFF_NONE, NULL, "%s: %s", p, strerror(errno));
    return NULL;
  }
  struct stat lst;
  if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
    char who[160];
    bs_safe_owner(lst.st_uid, who, sizeof who);
    bs_fail(err, EPERM, BS_OFF_NONE, NULL,
            "%s: a symbolic link of %s, not yours: a write never follows another user's link "
            "(it could name any file); name the file itself",
            path, who);
    bs_free(path);
    return NULL;
  }
  return path;
}

/* The checks of bs_run_dir on its directory. */
static int run_dir_ok(const char *dir, bs_err *err)
{
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    return bs_fail(err, errno, BS_OFF_NONE, NULL, "cannot create the run directory %s: %s", dir,
                   strerror(errno));
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0) {
    int e = errno;
    struct stat lst;
    if ((e == ELOOP || e == ENOTDIR) && lstat(dir, &lst) == 0)
      return bs_fail(err, ENOTDIR, BS_OFF_NONE, NULL,
                     "the run directory %s is %s (owner uid %u), not a directory: another user "
                     "may have planted it; remove it",
                     dir, S_ISLNK(lst.st_mode) ? "a symbolic link" : "not a directory",
                     (unsigned)lst.st_uid);
    return bs_fail(err, e, BS_OFF_NONE, NULL, "the run directory %s: %s", dir, strerror(e));
  }
  int rc = fstat(fd, &st);
  int e = errno;
  close(fd);
  if (rc != 0)
    return bs_fail(err, e, BS_OFF_NONE, NULL, "the run directory %s: %s", dir, strerror(e));
  if (st.st_uid != geteuid())
    return bs_fail(err, EPERM, BS_OFF_NONE, NULL,
                   "the run directory %s belongs to uid %u, not to uid %u: another user may have "
                   "made it; remove it (or set XDG_RUNTIME_DIR)",
                   dir, (unsigned)st.st_uid, (unsigned)geteuid());
  if (st.st_mode & 022)
    return bs_fail(err, EPERM, BS_OFF_NONE, NULL,
                   "the run directory %s is writable by others (mode %04o): chmod go-w it", dir,
                   (unsigned)(st.st_mode & 07777));
  return 0;
}

int bs_run_dir(char *out, size_t n, bs_err *err)
{
  const char *own = getenv("BURNSTORE_RUN_DIR");
  if (own && *own) {
    /* Another run directory (tests, containers): the same checks. Only the
     * burnstores that share one see each other's target locks. */
    if (own[0] != '/' || snprintf(out, n, "%s", own) >= (int)n) {
      out[0] = '\0';
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "BURNSTORE_RUN_DIR=%.200s: not an absolute path that fits (%zu bytes)", own,
                     n - 1);
    }
  } else if (geteuid() == 0) {
    snprintf(out, n, "/run/burnstore");
  } else {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
      snprintf(out, n, "%s/burnstore", xdg);
    else
      snprintf(out, n, "/tmp/burnstore-%u", (unsigned)geteuid());
  }
  if (run_dir_ok(out, err) != 0) {
    out[0] = '\0';
    return -1;
  }
  return 0;
}

int bs_path_join_buf(char *buf, size_t n, const char *dir, const char *name, bs_err *err)
{
  int w = snprintf(buf, n, "%s/%s", dir, name);
  if (w >= 0 && (size_t)w < n)
    return 0;
  buf[0] = '\0';
  size_t dl = strlen(dir), tail = dl > 100 ? 100 : dl; /* the end of a long path names it */
  return bs_fail(err, ENAMETOOLONG, BS_OFF_NONE, NULL, "%s%s/%.60s: %s (%zu bytes, over %zu)",
                 dl > tail ? "..." : "", dir + dl - tail, name, strerror(ENAMETOOLONG),
                 dl + 1 + strlen(name), n - 1);
}

int bs_run_path(const char *key, const char *suffix, char *out, size_t n, bs_err *err)
{
  char base[PATH_MAX];
  out[0] = '\0';
  if (bs_run_dir(base, sizeof base, err) != 0)
    return -1;
  uint64_t h = bs_fnv1a_str(BS_FNV1A_INIT, key);
  if (snprintf(out, n, "%s/%016llx%s", base, (unsigned long long)h, suffix) >= (int)n) {
    out[0] = '\0';
    return bs_fail(err, ENAMETOOLONG, BS_OFF_NONE, NULL, "%s: %s", base, strerror(ENAMETOOLONG));
  }
  return 0;
}

unsigned bs_sources_mode(const struct bs_catalog *cat, size_t n, unsigned mode)
{
  struct bs_src_ident id;
  struct stat st;
  for (size_t i = 0; i < n && i < cat->nsrcs; i++) {
    if (!bs_src_ident(&cat->srcs[i], &id) || !cat->srcs[i].name)
      continue;
    /* The name may now be another file than the one opened (swapped by
     * whoever may write its directory): then it grants others nothing. */
    if (stat(cat->srcs[i].name, &st) == 0 && (uint64_t)st.st_dev == id.dev &&
        (uint64_t)st.st_ino == id.ino)
      mode &= st.st_mode | ~07777u;
    else
      mode &= ~077u;
  }
  return mode;
}

bool bs_fd_named(int dirfd, const char *name, int fd)
{
  struct stat held, now;
  return fstat(fd, &held) == 0 && fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
         held.st_dev == now.st_dev && held.st_ino == now.st_ino;
}

int bs_run_lock(const char *path)
{
  /* A holder removes its file before it lets the lock go: whoever got the
   * lock on a removed file opens the new one. */
  for (int tries = 0; tries < 100; tries++) {
    bs_err err;
    bs_err_clear(&err);
    int fd = bs_safe_open_path(path, O_RDWR | O_CREAT, 0600, BS_SAFE_REG, &err);
    if (fd < 0) {
      errno = err.code;
      return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    if (bs_fd_named(AT_FDCWD, path, fd))
      return fd;
    close(fd);
  }
  errno = EAGAIN;
  return -1;
}

bool bs_run_holds(const char *path, int fd)
{
  return fd >= 0 && path[0] && bs_fd_named(AT_FDCWD, path, fd);
}

bool bs_run_unlink(const char *path, int fd)
{
  return fd >= 0 && path[0] && bs_fd_named(AT_FDCWD, path, fd) && unlink(path) == 0;
}

/* dir/name: removed if nobody holds its lock (taken without creating it). */
static void remove_if_free(int dfd, const char *name)
{
  bs_err err;
  bs_err_clear(&err);
  struct stat st;
  int fd = bs_safe_openat(dfd, NULL, name, O_RDWR, 0, BS_SAFE_REG, &st, &err);
  if (fd < 0)
    return;
  if (flock(fd, LOCK_EX | LOCK_NB) == 0)
    bs_safe_unlink_same(dfd, name, &st, 0);
  close(fd);
}

void bs_run_sweep(void)
{
  char dir[PATH_MAX];
  bs_err err;
  bs_err_clear(&err);
  if (bs_run_dir(dir, sizeof dir, &err) != 0)
    return; /* the next lock or status file says why */
  int dfd = bs_safe_open_dir(dir, BS_SAFE_PRIVATE, &err);
  DIR *d = dfd >= 0 ? bs_safe_dirstream(dfd) : NULL;
  if (!d) {
    if (dfd >= 0)
      close(dfd);
    return;
  }
  /* Pass 1: the lock files of dead holders. Pass 2: logs and progress files
   * whose status file is gone (a daemon creates its status file first and
   * removes it last). */
  for (int pass = 1; pass <= 2; pass++) {
    rewinddir(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
      const char *n = de->d_name;
      if (pass == 1 && (bs_ends_with(n, strlen(n), ".status", false) ||
                        bs_ends_with(n, strlen(n), ".target", false))) {
        remove_if_free(dfd, n);
      } else if (pass == 2 && (bs_ends_with(n, strlen(n), ".log", false) ||
                               bs_ends_with(n, strlen(n), ".status.progress", false))) {
        char status[NAME_MAX + 1];
        size_t stem = strcspn(n, ".");
        snprintf(status, sizeof status, "%.*s.status", (int)stem, n);
        struct stat st;
        if (fstatat(dfd, status, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT)
          bs_safe_unlinkat(dfd, n, 0);
      }
    }
  }
  closedir(d);
  close(dfd);
}

char *bs_target_key(const char *target, bs_target_name_fn name, bs_err *err)
{
  char *real = realpath(target, NULL); /* one lock whatever symlink names it */
  char *abs = real ? bs_strdup(real) : bs_abs_path(target);
  int e = errno;
  free(real);
  if (!abs) {
    bs_fail(err, e ? e : ENOMEM, BS_OFF_NONE, NULL, "%s: %s", target, strerror(e ? e : ENOMEM));
    return NULL;
  }
  char *slash = strrchr(abs, '/');
  char *base = slash ? slash + 1 : abs, set[NAME_MAX + 1];
  if (!name || !name(base, set, sizeof set))
    return abs;
  /* a file of a set: the set's one name */
  char *key = bs_malloc((size_t)(base - abs) + strlen(set) + 1);
  if (key)
    sprintf(key, "%.*s%s", (int)(base - abs), abs, set);
  else
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  bs_free(abs);
  return key;
}

static void record(int fd, const char *target, const char *holder, bool unmounted)
{
  char text[PATH_MAX * 2 + 128];
  int n = snprintf(text, sizeof text, "pid %ld\nholder %s\ntarget %s\n%s", (long)getpid(), holder,
                   target, unmounted ? "unmounted\n" : "");
  if (n < 0 || n >= (int)sizeof text)
    return;
  /* informative only */
  if (ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)n, 0) == n)
    fsync(fd);
}

void bs_target_lock_update(int fd, const char *target, const char *holder, bool unmounted)
{
  if (fd >= 0)
    record(fd, target, holder, unmounted);
}

/* The refusal: who holds it, from the record it wrote. bs_err's message is
 * short (256 bytes): when the full sentence does not fit, the target is named
 * by its base name and the hint drops the mountpoint, so that the holder's
 * mountpoint and pid always survive. */
static int refuse(int fd, const char *target, bs_err *err)
{
  char buf[PATH_MAX * 2 + 128];
  ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
  buf[r > 0 ? r : 0] = '\0';
  long pid = 0;
  const char *pp = strstr(buf, "pid ");
  if (pp)
    pid = strtol(pp + 4, NULL, 10);
  char holder[PATH_MAX] = "?";
  const char *h = strstr(buf, "holder ");
  if (h)
    snprintf(holder, sizeof holder, "%.*s", (int)strcspn(h + 7, "\n"), h + 7);
  const char *slash = strrchr(target, '/');
  char msg[2 * PATH_MAX + 256];
  for (int pass = 0; pass < 2; pass++) {
    const char *t = pass == 0 || !slash ? target : slash + 1;
    if (holder[0] != '/')
      snprintf(msg, sizeof msg, "%s is being written by burnstore %s (pid %ld): wait for it to end",
               t, holder, pid);
    else if (strstr(buf, "\nunmounted\n"))
      snprintf(msg, sizeof msg,
               "%s is still being written back by the daemon of %s (burnstore pid %ld, already "
               "unmounted): wait for it",
               t, holder, pid);
    else
      snprintf(msg, sizeof msg,
               "%s is already the target of a writable mount on %s (burnstore pid %ld): unmount "
               "that first (burnstore -u %s)",
               t, holder, pid, pass == 0 ? holder : "MOUNTPOINT");
    if (strlen(msg) < sizeof err->msg)
      break;
  }
  return bs_fail(err, EBUSY, BS_OFF_NONE, NULL, "%s", msg);
}

int bs_target_lock(const char *target, bs_target_name_fn name, const char *holder, bs_err *err)
{
  char *key = bs_target_key(target, name, err);
  if (!key)
    return -1;
  char path[PATH_MAX];
  bs_err sub;
  bs_err_clear(&sub);
  int rc = bs_run_path(key, ".target", path, sizeof path, &sub);
  bs_free(key);
  if (rc != 0)
    return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "cannot lock the target %s: %s", target,
                   sub.msg);
  int fd;
  /* A daemon that was just unmounted may still be writing back: wait a bit. */
  for (int i = 0; (fd = bs_run_lock(path)) < 0; i++) {
    if (errno != EWOULDBLOCK)
      return bs_fail(err, errno, BS_OFF_NONE, NULL, "cannot lock the target %s (%s: %s)", target,
                     path, strerror(errno));
    if (i >= 50) {
      bs_err_clear(&sub);
      int rfd = bs_safe_open_path(path, O_RDONLY, 0, BS_SAFE_REG, &sub);
      refuse(rfd, target, err);
      if (rfd >= 0)
        close(rfd);
      return -1;
    }
    usleep(20000);
  }
  record(fd, target, holder, false);
  return fd;
}

void bs_target_unlock(int fd)
{
  if (fd < 0)
    return;
  /* The lock file this fd holds, by its own name: the target's key may
   * have changed since it was locked (a symlink the write replaced by the
   * file), and bs_run_unlink checks the name still is this file. */
  char proc[64], path[PATH_MAX];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(proc, path, sizeof path - 1);
  if (n > 0) {
    path[n] = '\0';
    bs_run_unlink(path, fd);
  }
  close(fd);
}
