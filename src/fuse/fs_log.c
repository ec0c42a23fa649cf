/* The per-mount log (see fs_log.h): fuse_log lines to stderr in the
 * foreground, to syslog, and to a file in the runtime directory, so a
 * refusal reaches the user also where there is no syslog (containers). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "core/err.h"
#include "core/safe_open.h"
#include "fs.h"
#include "fs_log.h"

/* The log file grows to at most this; then one last line says so. */
#define LOG_CAP (1u << 20)

/* fuse_set_log_func takes no context pointer: the one log of the process. */
static struct {
  int fd;
  bool to_stderr; /* until the daemon detaches (always with -f) */
  _Atomic unsigned long used;
} lg = {.fd = -1};

static const char prefix[] = "burnstore: ";

static void log_func(enum fuse_log_level level, const char *fmt, va_list ap)
{
  char msg[1024];
  va_list ap2;
  va_copy(ap2, ap);
  vsnprintf(msg, sizeof msg, fmt, ap2);
  va_end(ap2);
  if (level > FUSE_LOG_INFO) { /* libfuse's debug lines: stderr only, as they are */
    if (lg.to_stderr)
      fputs(msg, stderr);
    return;
  }
  /* One line, its control characters (an ETag's escapes) replaced. */
  size_t len = strlen(msg);
  if (len && msg[len - 1] == '\n')
    msg[--len] = '\0';
  bs_text_clean(msg);
  if (lg.to_stderr)
    fprintf(stderr, "%s\n", msg);
  const char *text = strncmp(msg, prefix, sizeof prefix - 1) == 0 ? msg + sizeof prefix - 1 : msg;
  syslog((int)level, "%s", text);
  if (lg.fd < 0)
    return;
  char line[1200];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%SZ ", &tm);
  n += snprintf(line + n, sizeof line - (size_t)n, "%s\n", text);
  if (n >= (int)sizeof line)
    n = (int)sizeof line - 1, line[n - 1] = '\n';
  unsigned long before = atomic_fetch_add(&lg.used, (unsigned long)n);
  if (before + (unsigned long)n <= LOG_CAP) {
    if (write(lg.fd, line, (size_t)n) < 0) {
      /* the log is best effort: syslog and stderr have the line too */
    }
  } else if (before <= LOG_CAP) {
    static const char full[] = "(log full: later lines only in syslog)\n";
    if (write(lg.fd, full, sizeof full - 1) < 0) {
      /* as above */
    }
  }
}

/* The core's log (bs_log: a URL source's read failures) into this one. */
static void core_line(void *ctx, int level, const char *line)
{
  (void)ctx;
  fuse_log((enum fuse_log_level)level, "burnstore: %s\n", line);
}

int fs_log_open(const char *path)
{
  bs_log_set_sink(core_line, NULL);
  lg.to_stderr = true;
  openlog("burnstore", LOG_PID, LOG_USER);
  if (path[0]) {
    bs_err err;
    bs_err_clear(&err);
    lg.fd = bs_safe_open_path(path, O_RDWR | O_CREAT | O_TRUNC | O_APPEND, 0600,
                              BS_SAFE_REG | BS_SAFE_PRIVATE, &err);
    if (lg.fd < 0) {
      fuse_set_log_func(log_func);
      return -err.code;
    }
  }
  atomic_store(&lg.used, 0);
  fuse_set_log_func(log_func);
  return 0;
}

void fs_log_detach(void)
{
  lg.to_stderr = false;
}

void fs_log_close(void)
{
  bs_log_set_sink(NULL, NULL);
  fuse_set_log_func(NULL);
  if (lg.fd >= 0)
    close(lg.fd);
  lg.fd = -1;
}

static int copy_fd(int from, int to)
{
  char buf[65536];
  for (off_t off = 0;;) {
    ssize_t r = pread(from, buf, sizeof buf, off);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -errno;
    if (r == 0)
      return 0;
    for (ssize_t w = 0; w < r;) {
      ssize_t k = write(to, buf + w, (size_t)(r - w));
      if (k < 0 && errno == EINTR)
        continue;
      if (k < 0)
        return -errno;
      w += k;
    }
    off += r;
  }
}

int fs_log_save(int dirfd, const char *name, const char *last)
{
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_safe_openat(dirfd, NULL, name, O_WRONLY | O_CREAT | O_TRUNC, 0600,
                          BS_SAFE_REG | BS_SAFE_PRIVATE, NULL, &err);
  if (fd < 0)
    return -err.code;
  int rc = lg.fd >= 0 ? copy_fd(lg.fd, fd) : 0;
  if (rc == 0 && last) {
    char line[4200];
    int n = snprintf(line, sizeof line, "%s\n", last);
    if (n >= (int)sizeof line)
      n = (int)sizeof line - 1, line[n - 1] = '\n';
    if (write(fd, line, (size_t)n) != n)
      rc = -EIO;
  }
  if (fsync(fd) != 0 && rc == 0)
    rc = -errno;
  if (close(fd) != 0 && rc == 0)
    rc = -errno;
  return rc;
}

unsigned fs_log_print(int fd, FILE *f, const char *pre)
{
  int dfd = fd >= 0 ? dup(fd) : -1;
  FILE *in = dfd >= 0 ? fdopen(dfd, "r") : NULL;
  if (!in) {
    if (dfd >= 0)
      close(dfd);
    return 0;
  }
  rewind(in);
  char line[1300];
  unsigned n = 0;
  while (fgets(line, sizeof line, in)) {
    line[strcspn(line, "\n")] = '\0';
    fprintf(f, "%s%s\n", pre, bs_text_clean(line));
    n++;
  }
  fclose(in);
  return n;
}
