/* The byte sources: the generic calls (bounds, exact reads) over an ops
 * table, and the kinds that implement it. */
#include "core/source.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/safe_open.h"

/* ---- the generic calls ---- */

static void zero(struct bs_src *s)
{
  memset(s, 0, sizeof *s);
}

void bs_src_destroy(struct bs_src *s)
{
  if (!s)
    return;
  if (s->ops)
    s->ops->release(s);
  bs_free(s->name);
  zero(s);
}

/* Fill the common fields; on failure release impl through ops. */
static int src_make(struct bs_src *s, const struct bs_src_ops *ops, void *impl, uint64_t size,
                    const char *name, bs_err *err)
{
  s->ops = ops;
  s->impl = impl;
  s->size = size;
  s->name = bs_strdup(name);
  if (!s->name) {
    bs_src_destroy(s);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  return 0;
}

long bs_src_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  if (!s->ops || off >= s->size || n == 0)
    return 0;
  if (n > s->size - off)
    n = (size_t)(s->size - off);
  if (n > (size_t)INT32_MAX)
    n = (size_t)INT32_MAX;
  bs_log_flush(); /* (what this read logs is its own failure's reason) */
  return s->ops->pread(s, off, buf, n);
}

const char *bs_src_why(const struct bs_src *s, int code, char *buf, size_t n)
{
  char why[200];
  if (bs_log_take(buf, n))
    return buf;
  if (s && bs_src_changed(s, why, sizeof why))
    snprintf(buf, n, "%s changed since it was opened (%s)", s->name ? s->name : "the source", why);
  else
    snprintf(buf, n, "%s", strerror(code ? code : EIO));
  return buf;
}

int bs_src_read(const struct bs_src *s, uint64_t off, void *buf, size_t n, bs_err *err)
{
  if (!bs_range_ok(off, n, s->size))
    return bs_fail(err, EINVAL, off, NULL,
                   "truncated: need %zu bytes at offset %llu but the file has %llu bytes", n,
                   (unsigned long long)off, (unsigned long long)s->size);
  size_t got = 0;
  while (got < n) {
    long r = bs_src_pread(s, off + got, (char *)buf + got, n - got);
    if (r < 0) {
      char why[BS_LOG_LINE];
      return bs_fail(err, EIO, off + got, NULL, "read error: %s",
                     bs_src_why(s, (int)-r, why, sizeof why));
    }
    if (r == 0)
      return bs_fail(err, EINVAL, off + got, NULL, "unexpected end of file (file shrank?)");
    got += (size_t)r;
  }
  return 0;
}

int bs_src_read_alloc(const struct bs_src *s, uint64_t off, uint64_t n, uint8_t **out, bs_err *err)
{
  *out = NULL;
  if (!bs_range_ok(off, n, s->size))
    return bs_fail(err, EINVAL, off, NULL,
                   "truncated: need %llu bytes at offset %llu but the file has %llu bytes",
                   (unsigned long long)n, (unsigned long long)off, (unsigned long long)s->size);
  if (n > SIZE_MAX - 1)
    return bs_fail(err, EFBIG, off, NULL, "%llu bytes do not fit in memory", (unsigned long long)n);
  uint8_t *buf = bs_malloc(n ? (size_t)n : 1);
  if (!buf)
    return bs_fail(err, ENOMEM, off, NULL, "out of memory for %llu bytes", (unsigned long long)n);
  if (n && bs_src_read(s, off, buf, (size_t)n, err) != 0) {
    bs_free(buf);
    return -1;
  }
  *out = buf;
  return 0;
}

bool bs_src_changed(const struct bs_src *s, char *why, size_t n)
{
  if (!s->ops || !s->ops->changed)
    return false;
  char tmp[1];
  if (!why || n == 0) {
    why = tmp;
    n = sizeof tmp;
  }
  return s->ops->changed(s, why, n);
}

int bs_src_fd_get(const struct bs_src *s)
{
  return s->ops && s->ops->fd_get ? s->ops->fd_get(s) : -1;
}

void bs_src_fd_put(const struct bs_src *s, int fd)
{
  if (fd >= 0 && s->ops && s->ops->fd_put)
    s->ops->fd_put(s, fd);
}

int bs_src_view(const struct bs_src *s, uint64_t off, size_t n, struct bs_src_view *v)
{
  v->count = 0;
  if (!s->ops || !s->ops->view)
    return -ENOTSUP;
  if (n == 0 || !bs_range_ok(off, n, s->size))
    return -EINVAL;
  return s->ops->view(s, off, n, v);
}

void bs_src_view_put(const struct bs_src *s, struct bs_src_view *v)
{
  if (v->count && s->ops && s->ops->view_put)
    s->ops->view_put(s, v);
  v->count = 0;
}

bool bs_src_ident(const struct bs_src *s, struct bs_src_ident *id)
{
  return s->ops && s->ops->ident && s->ops->ident(s, id);
}

bool bs_src_remote(const struct bs_src *s, const char **reopen, const char **validator)
{
  return s && s->ops && s->ops->remote && s->ops->remote(s, reopen, validator);
}

int bs_src_open_sibling(const struct bs_src *s, const char *rel, struct bs_src *out, bs_err *err)
{
  zero(out);
  if (!s->ops || !s->ops->open_sibling)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "%s has no files beside it to open %s",
                   s->name ? s->name : "the source", rel);
  return s->ops->open_sibling(s, rel, out, err);
}

/* ---- files: what they share ---- */

/* A regular file's identity at open. */
struct stamp {
  bool on;
  uint64_t dev, ino, size;
  struct timespec mtim, ctim;
};

static void stamp_take(struct stamp *p, const struct stat *st)
{
  p->on = S_ISREG(st->st_mode);
  p->dev = (uint64_t)st->st_dev;
  p->ino = (uint64_t)st->st_ino;
  p->size = (uint64_t)st->st_size;
  p->mtim = st->st_mtim;
  p->ctim = st->st_ctim;
}

static bool ts_eq(struct timespec a, struct timespec b)
{
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* Whether st (an fstat of the file now) differs from the stamp; why says how. */
static bool stamp_differs(const struct stamp *p, const struct stat *st, char *why, size_t n)
{
  if ((uint64_t)st->st_size != p->size) {
    snprintf(why, n, "its size changed from %llu to %llu bytes", (unsigned long long)p->size,
             (unsigned long long)st->st_size);
    return true;
  }
  if (!ts_eq(st->st_mtim, p->mtim)) {
    snprintf(why, n, "it was modified (its mtime changed)");
    return true;
  }
  if (st->st_nlink > 0 && !ts_eq(st->st_ctim, p->ctim)) {
    snprintf(why, n, "its inode changed (ctime: an edit, or a chmod, link or rename of the file)");
    return true;
  }
  return false;
}

static bool fd_differs(const struct stamp *p, int fd, char *why, size_t n)
{
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(why, n, "cannot stat it: %s", strerror(errno));
    return true;
  }
  return stamp_differs(p, &st, why, n);
}

static void stamp_ident(const struct stamp *p, struct bs_src_ident *id)
{
  *id = (struct bs_src_ident){.dev = p->dev,
                              .ino = p->ino,
                              .size = p->size,
                              .mtime_sec = (int64_t)p->mtim.tv_sec,
                              .mtime_nsec = p->mtim.tv_nsec};
}

/* pread(2) until n bytes, EOF or an error (bytes so far win over an error). */
static long pread_full(int fd, uint64_t off, void *buf, size_t n)
{
  if (off > INT64_MAX)
    return -EINVAL;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return got ? (long)got : -errno;
    }
    if (r == 0)
      break;
    got += (size_t)r;
  }
  return (long)got;
}

/* The path of `rel` beside the file `path` ("dir/rel"; "./rel" for a bare name). */
static char *beside(const char *path, const char *rel)
{
  const char *slash = strrchr(path, '/');
  size_t a = slash ? (size_t)(slash - path) + (slash == path) : 1, b = strlen(rel);
  char *p = bs_malloc(a + b + 2);
  if (p) {
    memcpy(p, slash ? path : ".", a);
    p[a] = '/';
    memcpy(p + a + 1, rel, b + 1);
  }
  return p;
}

/* Open a regular file read-only: the fd, or -errno; -EINVAL when it is
 * something else (st_mode says what). A FIFO or a device is refused by stat
 * before open can block on it (or rewind a tape), and again by fstat of an
 * O_NONBLOCK open in case it was swapped in between. */
static int open_regular(const char *path, struct stat *st)
{
  if (stat(path, st) != 0)
    return -errno;
  if (!S_ISREG(st->st_mode))
    return -EINVAL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return -errno;
  int fl;
  if (fstat(fd, st) != 0 || (fl = fcntl(fd, F_GETFL)) < 0 ||
      fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    return -EINVAL;
  }
  return fd;
}

/* ---- a file, fd held ---- */

struct pool;
static int shard_open(struct pool **pool, const char *path, struct bs_src *out, bs_err *err);
static void pool_unref(struct pool *p);

struct fd_src {
  int fd;
  bool owns;
  struct stamp st;
  struct pool *pool; /* of the files opened beside it (shards), once there is one */
};

static long fd_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  const struct fd_src *f = s->impl;
  return pread_full(f->fd, off, buf, n);
}

static bool fd_changed(const struct bs_src *s, char *why, size_t n)
{
  const struct fd_src *f = s->impl;
  return f->st.on && fd_differs(&f->st, f->fd, why, n);
}

static int fd_get(const struct bs_src *s)
{
  return ((const struct fd_src *)s->impl)->fd;
}

static bool fd_ident(const struct bs_src *s, struct bs_src_ident *id)
{
  const struct fd_src *f = s->impl;
  stamp_ident(&f->st, id);
  return true;
}

static int fd_sibling(const struct bs_src *s, const char *rel, struct bs_src *out, bs_err *err)
{
  char *path = beside(s->name, rel);
  if (!path)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  struct fd_src *f = s->impl;
  int rc = shard_open(&f->pool, path, out, err);
  bs_free(path);
  return rc;
}

static void fd_release(struct bs_src *s)
{
  struct fd_src *f = s->impl;
  if (f && f->owns && f->fd >= 0)
    close(f->fd);
  if (f)
    pool_unref(f->pool);
  bs_free(f);
}

static const struct bs_src_ops fd_ops = {
    .pread = fd_pread,
    .changed = fd_changed,
    .open_sibling = fd_sibling,
    .fd_get = fd_get,
    .ident = fd_ident,
    .release = fd_release,
};

int bs_src_init_fd(struct bs_src *s, int fd, unsigned flags, const char *name, bs_err *err)
{
  zero(s);
  bool owns = flags & BS_SRC_OWN_FD;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    if (owns)
      close(fd);
    return bs_fail(err, e, BS_OFF_NONE, NULL, "cannot stat: %s", strerror(e));
  }
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
    if (owns)
      close(fd);
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "not a regular file");
  }
  struct fd_src *f = bs_calloc(1, sizeof *f);
  if (!f) {
    if (owns)
      close(fd);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  f->fd = fd;
  f->owns = owns;
  stamp_take(&f->st, &st);
  if (flags & BS_SRC_UNWATCHED)
    f->st.on = false;
  return src_make(s, &fd_ops, f, (uint64_t)st.st_size, name, err);
}

int bs_src_open(struct bs_src *s, const char *path, bs_err *err)
{
  zero(s);
  struct stat st;
  int fd = open_regular(path, &st);
  if (fd == -EINVAL)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "is %s, not a regular file: not opened",
                   bs_file_kind(st.st_mode));
  if (fd < 0)
    return bs_fail(err, -fd, BS_OFF_NONE, NULL, "cannot open it: %s", strerror(-fd));
  return bs_src_init_fd(s, fd, BS_SRC_OWN_FD, path, err);
}

/* ---- a shard: a file beside its index, fd from a bounded pool ----
 *
 * A set of thousands of shards must not hold an fd each (RLIMIT_NOFILE is
 * often 1024). The shards of one index share a pool of at most `cap` open
 * fds, least recently used closed first; an fd in use (pinned: a read, a
 * splice) is never closed, so the pool may go over cap by the number of
 * concurrent readers. A shard reopened must be the file stamped at its
 * first open (device, inode, size, mtime, ctime), else it counts as
 * changed: its reads fail with EIO. */

struct shard;

struct pool {
  pthread_mutex_t lock;
  size_t refs;               /* sources holding it: shards and the index */
  size_t cap, nopen;         /* (under lock) */
  struct shard *head, *tail; /* open shards, most recently used first (under lock) */
};

struct shard {
  struct pool *pool;
  struct stamp st;
  /* under pool->lock: */
  int fd; /* -1: closed */
  unsigned pins;
  struct shard *prev, *next;
  bool gone;     /* reopened and found another file: changed for good */
  char why[128]; /* (when gone) */
};

static size_t pool_cap(void)
{
  struct rlimit rl;
  size_t cap = BS_SHARD_FDS;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 8 < cap)
    cap = (size_t)(rl.rlim_cur / 8);
  return cap ? cap : 1;
}

static void pool_unref(struct pool *p)
{
  if (!p)
    return;
  pthread_mutex_lock(&p->lock);
  bool last = --p->refs == 0;
  pthread_mutex_unlock(&p->lock);
  if (last) {
    pthread_mutex_destroy(&p->lock);
    bs_free(p);
  }
}

static void lru_unlink(struct pool *p, struct shard *h)
{
  *(h->prev ? &h->prev->next : &p->head) = h->next;
  *(h->next ? &h->next->prev : &p->tail) = h->prev;
  h->prev = h->next = NULL;
}

static void lru_push(struct pool *p, struct shard *h)
{
  h->prev = NULL;
  h->next = p->head;
  *(p->head ? &p->head->prev : &p->tail) = h;
  p->head = h;
}

/* Close least recently used fds not in use until one more fits (under lock). */
static void pool_make_room(struct pool *p)
{
  struct shard *h = p->tail;
  while (p->nopen >= p->cap && h) {
    struct shard *prev = h->prev;
    if (!h->pins) {
      lru_unlink(p, h);
      close(h->fd);
      h->fd = -1;
      p->nopen--;
    }
    h = prev;
  }
}

/* Open the shard's file, checked against its stamp (under lock); -errno. */
static int shard_reopen(const struct bs_src *s, struct shard *h)
{
  if (h->gone)
    return -EIO;
  pool_make_room(h->pool);
  struct stat st;
  int fd = open_regular(s->name, &st);
  if (fd == -EINVAL || fd == -ENOENT) {
    if (fd == -EINVAL)
      snprintf(h->why, sizeof h->why, "it is %s now", bs_file_kind(st.st_mode));
    else
      snprintf(h->why, sizeof h->why, "it was removed");
    h->gone = true;
    return -EIO;
  }
  if (fd < 0)
    return fd; /* (EMFILE, EACCES...: maybe not for good) */
  if ((uint64_t)st.st_dev != h->st.dev || (uint64_t)st.st_ino != h->st.ino) {
    snprintf(h->why, sizeof h->why, "another file has its name now");
    h->gone = true;
  } else if (stamp_differs(&h->st, &st, h->why, sizeof h->why)) {
    h->gone = true;
  }
  if (h->gone) {
    close(fd);
    return -EIO;
  }
  h->fd = fd;
  h->pool->nopen++;
  lru_push(h->pool, h);
  return 0;
}

/* The shard's fd, open and pinned until shard_put; -errno. */
static int shard_get(const struct bs_src *s)
{
  struct shard *h = s->impl;
  struct pool *p = h->pool;
  pthread_mutex_lock(&p->lock);
  int rc = 0;
  if (h->fd < 0) {
    rc = shard_reopen(s, h);
  } else if (p->head != h) {
    lru_unlink(p, h);
    lru_push(p, h);
  }
  if (rc == 0) {
    h->pins++;
    rc = h->fd;
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

static void shard_put(const struct bs_src *s, int fd)
{
  (void)fd;
  struct shard *h = s->impl;
  pthread_mutex_lock(&h->pool->lock);
  h->pins--;
  pthread_mutex_unlock(&h->pool->lock);
}

static long shard_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  int fd = shard_get(s);
  if (fd < 0)
    return fd;
  long r = pread_full(fd, off, buf, n);
  shard_put(s, fd);
  return r;
}

static bool shard_changed(const struct bs_src *s, char *why, size_t n)
{
  struct shard *h = s->impl;
  int fd = shard_get(s);
  if (fd < 0) { /* gone, or a failure that may pass (EMFILE): the read reports that */
    pthread_mutex_lock(&h->pool->lock);
    bool gone = h->gone;
    if (gone)
      snprintf(why, n, "%s", h->why);
    pthread_mutex_unlock(&h->pool->lock);
    return gone;
  }
  bool ch = fd_differs(&h->st, fd, why, n);
  shard_put(s, fd);
  return ch;
}

static int shard_fd_get(const struct bs_src *s)
{
  int fd = shard_get(s);
  return fd < 0 ? -1 : fd;
}

static bool shard_ident(const struct bs_src *s, struct bs_src_ident *id)
{
  stamp_ident(&((const struct shard *)s->impl)->st, id);
  return true;
}

static int shard_sibling(const struct bs_src *s, const char *rel, struct bs_src *out, bs_err *err)
{
  struct shard *h = s->impl;
  char *path = beside(s->name, rel);
  if (!path)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  int rc = shard_open(&h->pool, path, out, err);
  bs_free(path);
  return rc;
}

static void shard_release(struct bs_src *s)
{
  struct shard *h = s->impl;
  if (!h)
    return;
  struct pool *p = h->pool;
  pthread_mutex_lock(&p->lock);
  if (h->fd >= 0) {
    lru_unlink(p, h);
    close(h->fd);
    p->nopen--;
  }
  pthread_mutex_unlock(&p->lock);
  pool_unref(p);
  bs_free(h);
}

static const struct bs_src_ops shard_ops = {
    .pread = shard_pread,
    .changed = shard_changed,
    .open_sibling = shard_sibling,
    .fd_get = shard_fd_get,
    .fd_put = shard_put,
    .ident = shard_ident,
    .release = shard_release,
};

/* A shard at path in *pool (created on first use, held by the caller),
 * open and stamped now. */
static int shard_open(struct pool **pool, const char *path, struct bs_src *out, bs_err *err)
{
  memset(out, 0, sizeof *out);
  if (!*pool) {
    struct pool *p = bs_calloc(1, sizeof *p);
    if (!p)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
      bs_free(p);
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "cannot create a lock");
    }
    p->refs = 1; /* the caller's */
    p->cap = pool_cap();
    *pool = p;
  }
  struct shard *h = bs_calloc(1, sizeof *h);
  if (!h)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  /* Opened and stamped as a held file, then its fd moves into the pool. */
  struct bs_src probe;
  if (bs_src_open(&probe, path, err) != 0) {
    bs_free(h);
    return -1;
  }
  struct fd_src *f = probe.impl; /* (a regular file: bs_src_open refuses others) */
  h->fd = f->fd;
  f->owns = false;
  h->st = f->st;
  uint64_t size = probe.size;
  bs_src_destroy(&probe);
  struct pool *p = h->pool = *pool;
  pthread_mutex_lock(&p->lock);
  p->refs++;
  pool_make_room(p);
  p->nopen++;
  lru_push(p, h);
  pthread_mutex_unlock(&p->lock);
  return src_make(out, &shard_ops, h, size, path, err);
}

/* ---- a file opened for each read ---- */

static long path_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  struct stat st;
  int fd = open_regular(s->name, &st); /* (a FIFO swapped in never blocks) */
  if (fd < 0)
    return fd;
  long r = pread_full(fd, off, buf, n);
  close(fd);
  return r;
}

static void no_release(struct bs_src *s)
{
  (void)s;
}

static const struct bs_src_ops path_ops = {
    .pread = path_pread,
    .release = no_release,
};

int bs_src_init_path(struct bs_src *s, const char *path, bs_err *err)
{
  zero(s);
  struct stat st;
  if (stat(path, &st) != 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode))
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "%s: not a regular file", path);
  return src_make(s, &path_ops, NULL, (uint64_t)st.st_size, path, err);
}

/* ---- a file beneath a held directory, opened for each read ---- */

struct at_src {
  int dirfd; /* borrowed */
  dev_t dev;
  ino_t ino;
  char name[]; /* in dirfd */
};

/* The file, opened beneath its directory (safe_open.h) and checked to be
 * the one found at init: -errno otherwise. */
static int at_open(const struct at_src *a, struct stat *st)
{
  bs_err e;
  bs_err_clear(&e);
  int fd = bs_safe_openat(a->dirfd, NULL, a->name, O_RDONLY, 0, BS_SAFE_REG, st, &e);
  if (fd < 0)
    return -(e.code ? e.code : EIO);
  if (st->st_dev != a->dev || st->st_ino != a->ino) {
    close(fd);
    return -EIO;
  }
  return fd;
}

static long at_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  struct stat st;
  int fd = at_open(s->impl, &st);
  if (fd < 0)
    return fd;
  long r = pread_full(fd, off, buf, n);
  close(fd);
  return r;
}

static bool at_changed(const struct bs_src *s, char *why, size_t n)
{
  const struct at_src *a = s->impl;
  struct stat st;
  if (fstatat(a->dirfd, a->name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    snprintf(why, n, "cannot stat it: %s", strerror(errno));
    return true;
  }
  if (st.st_dev != a->dev || st.st_ino != a->ino || (uint64_t)st.st_size != s->size) {
    snprintf(why, n, "it was replaced or its size changed");
    return true;
  }
  return false;
}

/* An fd of its own for a caller that moves whole ranges (sink.c's
 * copy_file_range): opened and checked as for a read, closed at fd_put. */
static int at_fd_get(const struct bs_src *s)
{
  struct stat st;
  int fd = at_open(s->impl, &st);
  return fd < 0 ? -1 : fd;
}

static void at_fd_put(const struct bs_src *s, int fd)
{
  (void)s;
  close(fd);
}

static void at_release(struct bs_src *s)
{
  bs_free(s->impl);
}

static const struct bs_src_ops at_ops = {
    .pread = at_pread,
    .fd_get = at_fd_get,
    .fd_put = at_fd_put,
    .changed = at_changed,
    .release = at_release,
};

int bs_src_init_at(struct bs_src *s, int dirfd, const char *dir, const char *name, bs_err *err)
{
  zero(s);
  size_t nl = strlen(name);
  struct at_src *a = bs_malloc(sizeof *a + nl + 1);
  char *shown = dir ? bs_path_join(dir, name) : bs_strdup(name);
  if (!a || !shown) {
    bs_free(a);
    bs_free(shown);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  a->dirfd = dirfd;
  memcpy(a->name, name, nl + 1);
  struct stat st;
  int fd = bs_safe_openat(dirfd, dir, name, O_RDONLY, 0, BS_SAFE_REG, &st, err);
  if (fd < 0) {
    bs_free(a);
    bs_free(shown);
    return -1;
  }
  close(fd);
  a->dev = st.st_dev;
  a->ino = st.st_ino;
  int rc = src_make(s, &at_ops, a, (uint64_t)st.st_size, shown, err); /* (frees a on failure) */
  bs_free(shown);
  return rc;
}

/* ---- memory ---- */

static long mem_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  memcpy(buf, (const uint8_t *)s->impl + off, n);
  return (long)n;
}

static const struct bs_src_ops mem_ops = {
    .pread = mem_pread,
    .release = no_release,
};

int bs_src_init_mem(struct bs_src *s, const void *mem, size_t n, const char *name, bs_err *err)
{
  zero(s);
  return src_make(s, &mem_ops, (void *)(uintptr_t)mem, n, name ? name : "<memory>", err);
}

/* ---- a borrowed view: every op is the lender's ---- */

static const struct bs_src *lender(const struct bs_src *s)
{
  return s->impl;
}

static long view_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  return bs_src_pread(lender(s), off, buf, n);
}

static bool view_changed(const struct bs_src *s, char *why, size_t n)
{
  return bs_src_changed(lender(s), why, n);
}

static int view_sibling(const struct bs_src *s, const char *rel, struct bs_src *out, bs_err *err)
{
  return bs_src_open_sibling(lender(s), rel, out, err);
}

static int view_fd_get(const struct bs_src *s)
{
  return bs_src_fd_get(lender(s));
}

static void view_fd_put(const struct bs_src *s, int fd)
{
  bs_src_fd_put(lender(s), fd);
}

static int view_view(const struct bs_src *s, uint64_t off, size_t n, struct bs_src_view *v)
{
  return bs_src_view(lender(s), off, n, v);
}

static void view_view_put(const struct bs_src *s, struct bs_src_view *v)
{
  bs_src_view_put(lender(s), v);
}

static bool view_ident(const struct bs_src *s, struct bs_src_ident *id)
{
  return bs_src_ident(lender(s), id);
}

static bool view_remote(const struct bs_src *s, const char **reopen, const char **validator)
{
  return bs_src_remote(lender(s), reopen, validator);
}

static const struct bs_src_ops view_ops = {
    .pread = view_pread,
    .changed = view_changed,
    .open_sibling = view_sibling,
    .fd_get = view_fd_get,
    .fd_put = view_fd_put,
    .view = view_view,
    .view_put = view_view_put,
    .ident = view_ident,
    .remote = view_remote,
    .release = no_release,
};

int bs_src_init_borrowed(struct bs_src *s, const struct bs_src *from, bs_err *err)
{
  zero(s);
  char why[128];
  if (bs_src_changed(from, why, sizeof why))
    return bs_fail(err, EIO, BS_OFF_NONE, NULL, "%s changed since it was opened: %s", from->name,
                   why);
  return src_make(s, &view_ops, (void *)(uintptr_t)from, from->size, from->name, err);
}
