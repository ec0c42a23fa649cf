/* Sinks (memory, fd) and the atomic file commit; see sink.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "core/crc32.h"
#include "core/safe_open.h"
#include "core/sink.h"
#include "core/target.h"

#define TMP_TAG ".burnstore-tmp-"
#define TMP_RAND 6 /* random characters after the tag */

void bs_buf_destroy(struct bs_buf *b)
{
  if (!b)
    return;
  bs_free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

int bs_buf_put(struct bs_buf *b, const void *d, size_t n)
{
  if (n == 0)
    return 0;
  if (n > SIZE_MAX - b->len || bs_grow((void **)&b->data, &b->cap, b->len + n, 1) != 0)
    return -1;
  memcpy(b->data + b->len, d, n);
  b->len += n;
  return 0;
}

void bs_sink_init_mem(struct bs_sink *k, struct bs_buf *buf, const char *name)
{
  memset(k, 0, sizeof *k);
  k->mem = buf;
  k->fd = -1;
  k->name = name ? name : "<memory>";
  k->pos = 0;
}

void bs_sink_init_fd(struct bs_sink *k, int fd, const char *name)
{
  memset(k, 0, sizeof *k);
  k->mem = NULL;
  k->fd = fd;
  k->name = name ? name : "<fd>";
  k->pos = 0;
}

int bs_sink_reserve(struct bs_sink *k, uint64_t n, bs_err *err)
{
  if (!k->mem)
    return 0;
  struct bs_buf *b = k->mem;
  if (n > SIZE_MAX - b->len || bs_grow((void **)&b->data, &b->cap, b->len + (size_t)n, 1) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory for a %" PRIu64 "-byte file", n);
  return 0;
}

static void (*observer)(void *ctx, uint64_t n);
static void *observer_ctx;

void bs_sink_set_observer(void (*fn)(void *ctx, uint64_t n), void *ctx)
{
  observer = fn;
  observer_ctx = ctx;
}

/* The write-behind: the disk's write-out of each 16 MiB window starts as
 * soon as it is put; the writer waits only for the bytes BEHIND_LAG behind
 * it, which bounds what the final fsync must flush. Waiting for the window
 * just before (a lag of 16 MiB) held the writer to the disk's pace window
 * by window: a convert of 1 GiB + sync took 1.6x cp + sync; with
 * 64-128 MiB in flight, 1.0-1.1x (issue 34, docs/performance.md). */
#define BEHIND_WINDOW (16u << 20)
#define BEHIND_LAG (128u << 20)

/* Report the bytes on disk up to `upto` to the observer. */
static void tell(struct bs_sink *k, uint64_t upto)
{
  if (upto > k->told && observer)
    observer(observer_ctx, upto - k->told);
  if (upto > k->told)
    k->told = upto;
}

/* Start writing out what was put since the last window, then wait for what
 * lies BEHIND_LAG behind to be on disk. A write error that shows here is the write's error
 * (the final fsync would not see it again). */
static int write_behind(struct bs_sink *k, bs_err *err)
{
  int rc = sync_file_range(k->fd, (off_t)k->started, (off_t)(k->pos - k->started),
                           SYNC_FILE_RANGE_WRITE);
  uint64_t upto = k->pos > BEHIND_LAG ? k->pos - BEHIND_LAG : 0;
  if (rc == 0 && upto > k->told)
    rc = sync_file_range(k->fd, (off_t)k->told, (off_t)(upto - k->told),
                         SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                             SYNC_FILE_RANGE_WAIT_AFTER);
  if (rc != 0 && (errno == EINVAL || errno == ESPIPE || errno == ENOSYS || errno == EOPNOTSUPP)) {
    k->behind = false; /* not a file that can: report writes as they are made */
    tell(k, k->pos);
    return 0;
  }
  if (rc != 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL,
                   "%s: writing to the disk failed near byte %" PRIu64 ": %s", k->name, k->told,
                   strerror(e));
  }
  tell(k, upto);
  k->started = k->pos;
  return 0;
}

static int no_space(const struct bs_sink *k, bs_err *err)
{
  return bs_fail(err, ENOSPC, BS_OFF_NONE, NULL,
                 "%s: no space left on the device after writing %" PRIu64 " bytes", k->name,
                 k->pos);
}

/* n more bytes written to an fd sink. */
static void advance(struct bs_sink *k, uint64_t n)
{
  k->pos += n;
  if (!k->behind)
    tell(k, k->pos);
}

static int behind_maybe(struct bs_sink *k, bs_err *err)
{
  if (k->behind && k->pos - k->started >= BEHIND_WINDOW)
    return write_behind(k, err);
  return 0;
}

int bs_sink_put(struct bs_sink *k, const void *d, size_t n, bs_err *err)
{
  if (n == 0)
    return 0;
  if (k->mem) {
    struct bs_buf *b = k->mem;
    if (n > SIZE_MAX - b->len || bs_grow((void **)&b->data, &b->cap, b->len + n, 1) != 0)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory building the file");
    memcpy(b->data + b->len, d, n);
    b->len += n;
    k->pos += n;
    return 0;
  }
  const uint8_t *p = d;
  while (n > 0) {
    ssize_t r = write(k->fd, p, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && errno == ENOSPC)
      return no_space(k, err);
    if (r < 0) {
      int e = errno;
      return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: write failed at byte %" PRIu64 ": %s", k->name,
                     k->pos, strerror(e));
    }
    if (r == 0)
      return bs_fail(err, EIO, BS_OFF_NONE, NULL, "%s: write returned 0 at byte %" PRIu64, k->name,
                     k->pos);
    p += r;
    n -= (size_t)r;
    advance(k, (uint64_t)r);
  }
  return behind_maybe(k, err);
}

int bs_sink_zeros(struct bs_sink *k, uint64_t n, bs_err *err)
{
  static const uint8_t zeros[4096];
  while (n > 0) {
    size_t c = n < sizeof zeros ? (size_t)n : sizeof zeros;
    if (bs_sink_put(k, zeros, c, err) != 0)
      return -1;
    n -= c;
  }
  return 0;
}

/* ---- Atomic file commit --------------------------------------------------------------------- */

/* Make sure a failure message names the file being written. */
static int name_path(bs_err *err, const char *path)
{
  if (err && err->code && !strstr(err->msg, path)) {
    char buf[sizeof err->msg];
    size_t used = 0, cap = sizeof buf - 1;
    for (const char *parts[] = {path, ": ", err->msg}, **q = parts; q < parts + 3; q++) {
      size_t l = strlen(*q);
      l = l < cap - used ? l : cap - used;
      memcpy(buf + used, *q, l);
      used += l;
    }
    buf[used] = '\0';
    memcpy(err->msg, buf, used + 1);
  }
  return -1;
}

/* The directory of `path` ("." for a bare name) and its base name, both owned. */
static int split_path(const char *path, char **dir, char **base)
{
  const char *slash = strrchr(path, '/');
  *dir = slash ? bs_strndup(path, slash == path ? 1 : (size_t)(slash - path)) : bs_strdup(".");
  *base = bs_strdup(slash ? slash + 1 : path);
  if (!*dir || !*base) {
    bs_free(*dir);
    bs_free(*base);
    *dir = *base = NULL;
    return -1;
  }
  return 0;
}

/* ".NAME.burnstore-tmp-": the base name is cut so that the whole temp name
 * fits NAME_MAX; writer and cleaner cut it the same way. Owned. */
static char *tmp_prefix(const char *base)
{
  size_t room = NAME_MAX - 1 - (sizeof TMP_TAG - 1) - TMP_RAND;
  size_t blen = strlen(base);
  if (blen > room)
    blen = room;
  char *p = bs_malloc(1 + blen + sizeof TMP_TAG);
  if (!p)
    return NULL;
  p[0] = '.';
  memcpy(p + 1, base, blen);
  memcpy(p + 1 + blen, TMP_TAG, sizeof TMP_TAG);
  return p;
}

static bool is_tmp_of(const char *name, const char *prefix)
{
  size_t pl = strlen(prefix);
  if (strncmp(name, prefix, pl) != 0 || strlen(name) != pl + TMP_RAND)
    return false;
  for (size_t i = pl; i < pl + TMP_RAND; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
      return false;
  }
  return true;
}

int bs_atomic_clean_stale(const char *path)
{
  char *dir, *base, *prefix = NULL;
  if (split_path(path, &dir, &base) != 0)
    return 0;
  int removed = 0;
  DIR *d = NULL;
  bs_err err;
  bs_err_clear(&err);
  int dfd = -1;
  if (!(prefix = tmp_prefix(base)) || (dfd = bs_safe_open_dir(dir, BS_SAFE_ANY_OWNER, &err)) < 0 ||
      !(d = bs_safe_dirstream(dfd)))
    goto out;
  for (struct dirent *de; (de = readdir(d)) != NULL;) {
    if (!is_tmp_of(de->d_name, prefix))
      continue;
    /* Never a device or FIFO that merely has the name, nor a file of
     * another user's (who may write the directory: it is theirs to remove). */
    struct stat held;
    bs_err_clear(&err);
    int fd = bs_safe_openat(dfd, dir, de->d_name, O_RDONLY, 0, BS_SAFE_REG, &held, &err);
    if (fd < 0)
      continue;
    /* A writer holds its lock from creation to rename: if we get the lock,
     * the writer is dead. The name must still be this inode (not renamed
     * over the target meanwhile) when we unlink it. */
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && bs_safe_unlink_same(dfd, de->d_name, &held, 0) == 0)
      removed++;
    close(fd);
  }
out:
  if (d)
    closedir(d);
  if (dfd >= 0)
    close(dfd);
  bs_free(prefix);
  bs_free(dir);
  bs_free(base);
  return removed;
}

static uint64_t random_u64(void)
{
  uint64_t v;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v)
    return v;
  static unsigned counter;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 40) ^
      __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdull;
  return v ^ (v >> 33);
}

static int sync_dir(const char *path, bs_err *err)
{
  char *dir, *base;
  if (split_path(path, &dir, &base) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  int rc = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {
    int e = errno;
    rc = bs_fail(err, e, BS_OFF_NONE, NULL, "%s: written, but syncing directory %s failed: %s",
                 path, dir, strerror(e));
  }
  if (fd >= 0)
    close(fd);
  bs_free(dir);
  bs_free(base);
  return rc;
}

static void release(struct bs_atomic *a)
{
  if (a->fd >= 0)
    close(a->fd);
  if (a->lock_fd >= 0)
    close(a->lock_fd);
  bs_free(a->path);
  bs_free(a->tmp);
  memset(a, 0, sizeof *a);
  a->fd = a->lock_fd = -1;
}

void bs_atomic_abort(struct bs_atomic *a)
{
  if (!a->path)
    return;
  /* Unlinked while the lock is still ours, so no cleaner races us. */
  if (a->tmp)
    unlink(a->tmp);
  release(a);
}

void bs_atomic_release(struct bs_atomic *a)
{
  if (a->path)
    release(a);
}

int bs_atomic_fail(struct bs_atomic *a, bs_err *err)
{
  if (a->path)
    name_path(err, a->path);
  bs_atomic_abort(a);
  return -1;
}

/* Create the temp file, lock it, and make sure the name still is this file
 * (a cleaner may have taken it between the create and the lock). Returns
 * the fd, -1 with errno for a hard failure, or -2 to try another name. */
static int create_locked(const char *tmp, unsigned mode)
{
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)(mode & 0666));
  if (fd < 0)
    return errno == EEXIST ? -2 : -1;
  struct stat held, now;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    close(fd);
    if (e == EWOULDBLOCK)
      return -2;
    errno = e;
    return -1;
  }
  if (fstat(fd, &held) != 0 || lstat(tmp, &now) != 0 || held.st_dev != now.st_dev ||
      held.st_ino != now.st_ino) {
    close(fd);
    return -2;
  }
  return fd;
}

int bs_atomic_open(struct bs_atomic *a, const char *path, bs_err *err)
{
  return bs_atomic_open_mode(a, path, 0644, err);
}

int bs_atomic_open_mode(struct bs_atomic *a, const char *path, unsigned mode, bs_err *err)
{
  static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  memset(a, 0, sizeof *a);
  a->fd = a->lock_fd = -1;
  char *dir = NULL, *base = NULL, *prefix = NULL;
  if (!(a->path = bs_strdup(path)) || split_path(path, &dir, &base) != 0 ||
      !(prefix = tmp_prefix(base))) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "%s: out of memory", path);
    goto fail;
  }
  bs_atomic_clean_stale(path);
  size_t cap = strlen(dir) + 1 + strlen(prefix) + TMP_RAND + 1;
  if (!(a->tmp = bs_malloc(cap))) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "%s: out of memory", path);
    goto fail;
  }
  int fd = -2;
  for (int tries = 0; fd == -2 && tries < 100; tries++) {
    uint64_t r = random_u64();
    char rnd[TMP_RAND + 1];
    for (int i = 0; i < TMP_RAND; i++, r /= sizeof alnum - 1)
      rnd[i] = alnum[r % (sizeof alnum - 1)];
    rnd[TMP_RAND] = '\0';
    if (strchr(path, '/'))
      snprintf(a->tmp, cap, "%s/%s%s", strcmp(dir, "/") == 0 ? "" : dir, prefix, rnd);
    else
      snprintf(a->tmp, cap, "%s%s", prefix, rnd);
    fd = create_locked(a->tmp, mode);
  }
  if (fd < 0) {
    int e = fd == -2 ? EEXIST : errno;
    bs_fail(err, e, BS_OFF_NONE, NULL, "%s: cannot create the temporary file %s: %s", path, a->tmp,
            strerror(e));
    bs_free(a->tmp);
    a->tmp = NULL; /* nothing of ours to remove */
    goto fail;
  }
  a->fd = fd;
  /* Replacing a file keeps its permissions (as sed -i and rsync do); a new
   * file gets `mode` & 0666, filtered by the umask (as cp does), and so does
   * one replacing another user's file (a planted file's 0666 is not copied),
   * or another user's link (the mode of a file they chose, a set-uid
   * program's: never copied; the caller's own link gives its file's). */
  struct stat old;
  char *named = bs_link_path(path);
  bool keep = named && lstat(named, &old) == 0 && S_ISREG(old.st_mode) &&
              (old.st_uid == geteuid() || old.st_uid == 0);
  bs_free(named);
  if (keep && fchmod(fd, old.st_mode & 07777) != 0) {
    int e = errno;
    bs_fail(err, e, BS_OFF_NONE, NULL, "%s: cannot set the mode of %s: %s", path, a->tmp,
            strerror(e));
    goto fail;
  }
  /* The lock lives on the open file, so a dup keeps it after the data fd is
   * closed (whose close() result we check before the rename). */
  if ((a->lock_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
    int e = errno;
    bs_fail(err, e, BS_OFF_NONE, NULL, "%s: %s", path, strerror(e));
    goto fail;
  }
  bs_sink_init_fd(&a->sink, fd, a->path);
  a->sink.behind = true;
  bs_free(dir);
  bs_free(base);
  bs_free(prefix);
  return 0;
fail:
  bs_free(dir);
  bs_free(base);
  bs_free(prefix);
  if (a->path)
    bs_atomic_abort(a);
  else
    release(a);
  return -1;
}

int bs_atomic_sync(struct bs_atomic *a, bs_err *err)
{
  if (!a->path || a->fd < 0)
    return bs_fail(err, EBADF, BS_OFF_NONE, NULL, "the atomic file is not open for writing");
  if (fsync(a->fd) != 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: fsync of %s failed: %s", a->path, a->tmp,
                   strerror(e));
  }
  tell(&a->sink, a->sink.pos);
  int fd = a->fd;
  a->fd = -1;
  a->sink.fd = -1;
  if (close(fd) != 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: closing %s failed: %s", a->path, a->tmp,
                   strerror(e));
  }
  return 0;
}

void bs_atomic_unlock(struct bs_atomic *a)
{
  if (a->fd < 0 && a->lock_fd >= 0) {
    close(a->lock_fd);
    a->lock_fd = -1;
  }
}

int bs_atomic_publish(struct bs_atomic *a, bs_err *err)
{
  if (!a->path || a->fd >= 0)
    return bs_fail(err, EBADF, BS_OFF_NONE, NULL, "the atomic file was not synced");
  if (rename(a->tmp, a->path) != 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: cannot rename %s over it: %s", a->path, a->tmp,
                   strerror(e));
  }
  bs_free(a->tmp);
  a->tmp = NULL; /* renamed: nothing left to remove */
  int rc = sync_dir(a->path, err);
  if (rc != 0)
    name_path(err, a->path);
  release(a);
  return rc;
}

int bs_atomic_commit(struct bs_atomic *a, bs_err *err)
{
  if (bs_atomic_sync(a, err) != 0 || bs_atomic_publish(a, err) != 0)
    return bs_atomic_fail(a, err);
  return 0;
}

/* A tensor's bytes (strided views gathered) through buf[cap] into k: what
 * every writer does for a tensor it does not transform. */
uint8_t *bs_sink_chunk(uint64_t biggest, size_t *cap, bs_err *err)
{
  *cap = biggest < BS_SINK_CHUNK ? (size_t)biggest : BS_SINK_CHUNK;
  if (*cap == 0)
    *cap = 1;
  uint8_t *b = bs_malloc(*cap);
  if (!b)
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  return b;
}

int bs_sink_put_tensor(const struct bs_catalog *cat, const struct bs_tensor *t, uint8_t *buf,
                       size_t cap, struct bs_sink *k, bs_err *err)
{
  return bs_sink_put_tensor_crc(cat, t, buf, cap, k, NULL, err);
}

/* The kernel's copy of [off, off + n) of fd to the fd sink k
 * (copy_file_range: a reflink on btrfs and XFS, a copy inside the kernel on
 * ext4; never through this process), one write-behind window at a time.
 * *done counts the bytes copied; it stops early, with 0, where the kernel
 * cannot (another file system, an old kernel, the source's end): the caller
 * writes the rest itself. -1 with err set on a write error. */
static int copy_range(struct bs_sink *k, int fd, uint64_t off, uint64_t n, uint64_t *done,
                      const char *what, bs_err *err)
{
  while (*done < n) {
    uint64_t left = n - *done;
    size_t want = left < BEHIND_WINDOW ? (size_t)left : BEHIND_WINDOW;
    loff_t in = (loff_t)(off + *done);
    ssize_t r = copy_file_range(fd, &in, k->fd, NULL, want, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0 && errno == ENOSPC)
      return no_space(k, err);
    if (r < 0 && (errno == EIO || errno == EDQUOT || errno == EFBIG)) {
      int e = errno;
      return bs_fail(err, e, BS_OFF_NONE, what,
                     "%s: copying byte %" PRIu64 " of %" PRIu64 " at byte %" PRIu64
                     " of the output failed: %s",
                     k->name, *done, n, k->pos, strerror(e));
    }
    if (r <= 0)
      return 0; /* EXDEV, EINVAL, ENOSYS, EOPNOTSUPP, EBADF..., or the end */
    *done += (uint64_t)r;
    advance(k, (uint64_t)r);
    if (behind_maybe(k, err) != 0)
      return -1;
  }
  return 0;
}

int bs_sink_put_tensor_crc(const struct bs_catalog *cat, const struct bs_tensor *t, uint8_t *buf,
                           size_t cap, struct bs_sink *k, uint32_t *crc, bs_err *err)
{
  uint64_t done = 0;
  int fd;
  uint64_t base;
  /* A tensor stored as it is in a local file, and no CRC to compute: let
   * the kernel move its bytes. A source that changed meanwhile is an error,
   * as bs_tensor_read makes it. */
  if (!crc && !k->mem && t->nbytes && bs_tensor_fd_range(cat, t, &fd, &base)) {
    int rc = copy_range(k, fd, base, t->nbytes, &done, t->name, err);
    bs_tensor_fd_put(cat, t, fd);
    if (rc != 0)
      return -1;
    if (done && bs_src_changed(&cat->srcs[t->src], NULL, 0)) {
      char why[BS_LOG_LINE];
      return bs_fail(err, EIO, t->off, t->name, "cannot read the tensor's data: %s",
                     bs_tensor_why(cat, t, EIO, why, sizeof why));
    }
  }
  while (done < t->nbytes) {
    size_t want = t->nbytes - done < cap ? (size_t)(t->nbytes - done) : cap;
    long got = bs_tensor_read(cat, t, done, buf, want);
    if (got < 0) {
      char why[BS_LOG_LINE];
      return bs_fail(err, (int)-got, t->off + done, t->name,
                     "cannot read the tensor's data at byte %" PRIu64 " of %" PRIu64 ": %s", done,
                     t->nbytes, bs_tensor_why(cat, t, (int)-got, why, sizeof why));
    }
    if (got == 0)
      return bs_fail(err, EIO, t->off + done, t->name,
                     "the source gave %" PRIu64 " bytes of the tensor, expected %" PRIu64, done,
                     t->nbytes);
    if (crc)
      *crc = bs_crc32(*crc, buf, (size_t)got);
    if (bs_sink_put(k, buf, (size_t)got, err) != 0)
      return -1;
    done += (uint64_t)got;
  }
  return 0;
}
