#include "burnstore/src.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"

static void zero(struct bs_src *s)
{
  memset(s, 0, sizeof *s);
  s->fd = -1;
}

int bs_src_init_fd(struct bs_src *s, int fd, bool owns, const char *name, bs_err *err)
{
  zero(s);
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
  s->name = bs_strdup(name);
  if (!s->name) {
    if (owns)
      close(fd);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  s->fd = fd;
  s->owns_fd = owns;
  s->size = (uint64_t)st.st_size;
  s->stamped = S_ISREG(st.st_mode);
  s->st_size = (uint64_t)st.st_size;
  s->st_mtim = st.st_mtim;
  s->st_ctim = st.st_ctim;
  return 0;
}

int bs_src_open(struct bs_src *s, const char *path, bs_err *err)
{
  zero(s);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "cannot open: %s", strerror(e));
  }
  return bs_src_init_fd(s, fd, true, path, err);
}

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
  s->name = bs_strdup(path);
  if (!s->name)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  s->lazy = true;
  s->size = (uint64_t)st.st_size;
  return 0;
}

int bs_src_init_mem(struct bs_src *s, const void *mem, size_t n, const char *name, bs_err *err)
{
  zero(s);
  s->name = bs_strdup(name ? name : "<memory>");
  if (!s->name)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  s->mem = mem;
  s->size = n;
  return 0;
}

long bs_src_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  if (off >= s->size || n == 0)
    return 0;
  if (n > s->size - off)
    n = (size_t)(s->size - off);
  if (n > (size_t)INT32_MAX)
    n = (size_t)INT32_MAX;
  if (s->mem) {
    memcpy(buf, s->mem + off, n);
    return (long)n;
  }
  if (off > INT64_MAX)
    return -EINVAL;
  int fd = s->fd;
  if (s->lazy && (fd = open(s->name, O_RDONLY | O_CLOEXEC)) < 0)
    return -errno;
  size_t got = 0;
  long ret = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      ret = got ? 0 : -errno;
      break;
    }
    if (r == 0)
      break;
    got += (size_t)r;
  }
  if (s->lazy)
    close(fd);
  return ret ? ret : (long)got;
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
    if (r < 0)
      return bs_fail(err, EIO, off + got, NULL, "read error: %s", strerror((int)-r));
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

void bs_src_destroy(struct bs_src *s)
{
  if (!s)
    return;
  if (s->owns_fd && s->fd >= 0)
    close(s->fd);
  bs_free(s->name);
  zero(s);
}

static bool ts_eq(struct timespec a, struct timespec b)
{
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

bool bs_src_changed(const struct bs_src *s, char *why, size_t n)
{
  if (!s->stamped || s->fd < 0)
    return false;
  char tmp[1];
  if (!why || n == 0) {
    why = tmp;
    n = sizeof tmp;
  }
  struct stat st;
  if (fstat(s->fd, &st) != 0) {
    snprintf(why, n, "cannot stat it: %s", strerror(errno));
    return true;
  }
  if ((uint64_t)st.st_size != s->st_size) {
    snprintf(why, n, "its size changed from %llu to %llu bytes", (unsigned long long)s->st_size,
             (unsigned long long)st.st_size);
    return true;
  }
  if (!ts_eq(st.st_mtim, s->st_mtim)) {
    snprintf(why, n, "it was modified (its mtime changed)");
    return true;
  }
  if (st.st_nlink > 0 && !ts_eq(st.st_ctim, s->st_ctim)) {
    snprintf(why, n, "its inode changed (ctime: an edit, or a chmod, link or rename of the file)");
    return true;
  }
  return false;
}

int bs_src_init_borrowed(struct bs_src *s, const struct bs_src *from, bs_err *err)
{
  zero(s);
  char why[128];
  if (bs_src_changed(from, why, sizeof why))
    return bs_fail(err, EIO, BS_OFF_NONE, NULL, "%s changed since it was opened: %s", from->name,
                   why);
  s->name = bs_strdup(from->name);
  if (!s->name)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  s->fd = from->fd;
  s->mem = from->mem;
  s->size = from->size;
  s->stamped = from->stamped;
  s->st_size = from->st_size;
  s->st_mtim = from->st_mtim;
  s->st_ctim = from->st_ctim;
  return 0;
}
