/* The runtime directory: paths, lock files, and removing what dead daemons
 * left (see fs_run.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checked.h"
#include "core/stage_index.h"
#include "fs_run.h"

void fs_run_dir(char *out, size_t n)
{
  if (geteuid() == 0) {
    snprintf(out, n, "/run/burnstore");
  } else {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
      snprintf(out, n, "%s/burnstore", xdg);
    else
      snprintf(out, n, "/tmp/burnstore-%u", (unsigned)geteuid());
  }
  mkdir(out, 0700);
}

void fs_run_path(const char *key, const char *suffix, char *out, size_t n)
{
  char dir[PATH_MAX];
  fs_run_dir(dir, sizeof dir);
  uint64_t h = bs_fnv1a_str(BS_FNV1A_INIT, key);
  if (snprintf(out, n, "%s/%016llx%s", dir, (unsigned long long)h, suffix) >= (int)n)
    out[0] = '\0';
}

static bool names_fd(const char *path, int fd)
{
  struct stat held, now;
  return fstat(fd, &held) == 0 && lstat(path, &now) == 0 && held.st_dev == now.st_dev &&
         held.st_ino == now.st_ino;
}

int fs_run_lock(const char *path)
{
  /* A holder removes its file before it lets the lock go: whoever got the
   * lock on a removed file opens the new one. */
  for (int tries = 0; tries < 100; tries++) {
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
      return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    if (names_fd(path, fd))
      return fd;
    close(fd);
  }
  errno = EAGAIN;
  return -1;
}

bool fs_run_unlink(const char *path, int fd)
{
  return fd >= 0 && path[0] && names_fd(path, fd) && unlink(path) == 0;
}

static bool has_suffix(const char *s, const char *suf)
{
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* dir/name: removed if nobody holds its lock (taken without creating it). */
static bool remove_if_free(int dfd, const char *name)
{
  int fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return false;
  bool gone = false;
  struct stat held, now;
  if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &held) == 0 &&
      fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && held.st_ino == now.st_ino &&
      held.st_dev == now.st_dev)
    gone = unlinkat(dfd, name, 0) == 0;
  close(fd);
  return gone;
}

/* dir/name is a dead daemon's staging directory holding only its lock:
 * remove it (under that lock, so no daemon or --finish can be using it). */
static void remove_empty_staging(int pfd, const char *name)
{
  int dfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0)
    return;
  int lk = openat(dfd, BS_STAGE_LOCK_NAME, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  DIR *d = NULL;
  if (lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) == 0) {
    int dup_fd = dup(dfd);
    d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d && dup_fd >= 0)
      close(dup_fd);
  }
  bool empty = d != NULL;
  for (struct dirent *de; empty && (de = readdir(d)) != NULL;)
    empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            strcmp(de->d_name, BS_STAGE_LOCK_NAME) == 0;
  if (d)
    closedir(d);
  if (empty && unlinkat(dfd, BS_STAGE_LOCK_NAME, 0) == 0)
    unlinkat(pfd, name, AT_REMOVEDIR);
  if (lk >= 0)
    close(lk);
  close(dfd);
}

void fs_run_sweep_staging(const char *template)
{
  const char *slash = strrchr(template, '/');
  size_t tl = strlen(template);
  if (!slash || tl < 6 || strcmp(template + tl - 6, "XXXXXX") != 0)
    return;
  char dir[PATH_MAX], prefix[NAME_MAX + 1];
  snprintf(dir, sizeof dir, "%.*s", (int)(slash == template ? 1 : slash - template), template);
  snprintf(prefix, sizeof prefix, "%.*s", (int)(tl - 6 - (size_t)(slash + 1 - template)),
           slash + 1);
  size_t pl = strlen(prefix);
  int pfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int dup_fd = pfd >= 0 ? dup(pfd) : -1;
  DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
  if (!d && dup_fd >= 0)
    close(dup_fd);
  for (struct dirent *de; d && (de = readdir(d)) != NULL;)
    if (strncmp(de->d_name, prefix, pl) == 0 && strlen(de->d_name) == pl + 6)
      remove_empty_staging(pfd, de->d_name);
  if (d)
    closedir(d);
  if (pfd >= 0)
    close(pfd);
}

void fs_run_sweep(void)
{
  char dir[PATH_MAX];
  fs_run_dir(dir, sizeof dir);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    if (dfd >= 0)
      close(dfd);
    return;
  }
  /* Pass 1: the lock files of dead daemons. Pass 2: logs and progress
   * files whose status file is gone (a daemon creates its status file
   * first and removes it last). */
  for (int pass = 1; pass <= 2; pass++) {
    rewinddir(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
      const char *n = de->d_name;
      if (pass == 1 && (has_suffix(n, ".status") || has_suffix(n, ".target"))) {
        remove_if_free(dfd, n);
      } else if (pass == 2 && (has_suffix(n, ".log") || has_suffix(n, ".status.progress"))) {
        char status[NAME_MAX + 1];
        size_t stem = strcspn(n, ".");
        snprintf(status, sizeof status, "%.*s.status", (int)stem, n);
        struct stat st;
        if (fstatat(dfd, status, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT)
          unlinkat(dfd, n, 0);
      }
    }
  }
  closedir(d);
}
