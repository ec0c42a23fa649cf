/* Progress of a write-back, for `burnstore -u` on a terminal. The daemon
 * writes "DONE TOTAL" into STATUS.progress (beside the status file) at most
 * ten times a second while its writer runs, for write-backs of 256 MiB or
 * more (BURNSTORE_PROGRESS_MIN=BYTES changes that, for tests); the waiter
 * polls it while it waits for the daemon's lock and draws a progress line
 * (progress.c) when stderr is a terminal. The file is created empty with
 * the status file and removed with it; the waiter opens it before it
 * unmounts, so it reads the last figures after the daemon has gone. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "core/progress.h"
#include "core/safe_open.h"
#include "core/sink.h"
#include "fs_views.h"

#define PROGRESS_PATH_MAX (PATH_MAX + 16)

/* STATUS.progress into path; false (path "") if it would not fit: never a
 * cut path, which could name another file. */
static bool progress_path(const char *status_path, char path[PROGRESS_PATH_MAX])
{
  int n = snprintf(path, PROGRESS_PATH_MAX, "%s.progress", status_path);
  if (n < 0 || n >= PROGRESS_PATH_MAX) {
    path[0] = '\0';
    return false;
  }
  return true;
}

/* The progress file of the run directory: never through a link, never a
 * FIFO (core/safe_open.h). */
static int progress_file(const char *path, int flags)
{
  bs_err err;
  bs_err_clear(&err);
  return bs_safe_open_path(path, flags, 0600, BS_SAFE_REG, &err);
}

void fs_progress_remove(const char *status_path)
{
  char path[PROGRESS_PATH_MAX];
  if (progress_path(status_path, path))
    unlink(path);
}

static struct {
  int fd;
  uint64_t done, total;
  struct timespec last;
} wb = {.fd = -1};

static void put(void)
{
  char line[64];
  int n = snprintf(line, sizeof line, "%20" PRIu64 " %20" PRIu64 "\n", wb.done, wb.total);
  if (n > 0 && pwrite(wb.fd, line, (size_t)n, 0) < 0) {
    /* informative only */
  }
}

static void observe(void *ctx, uint64_t n)
{
  (void)ctx;
  wb.done += n;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if ((now.tv_sec - wb.last.tv_sec) * 1000000000L + (now.tv_nsec - wb.last.tv_nsec) < 100000000L)
    return;
  wb.last = now;
  put();
}

void fs_progress_init(const char *status_path)
{
  char path[PROGRESS_PATH_MAX];
  if (!progress_path(status_path, path))
    return;
  int fd = progress_file(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (fd >= 0)
    close(fd);
}

int fs_progress_open(const char *status_path)
{
  char path[PROGRESS_PATH_MAX];
  return progress_path(status_path, path) ? progress_file(path, O_RDONLY) : -1;
}

void fs_progress_begin(struct fs *fs, const char *status_path)
{
  char path[PROGRESS_PATH_MAX];
  if (!progress_path(status_path, path))
    return;
  uint64_t total = 0;
  for (uint64_t ino = BS_TREE_ROOT; ino < fs->tree.n; ino++) {
    const struct bs_node *nd = &fs->tree.nodes[ino];
    const struct bs_entry *e = bs_tree_user(&fs->tree, ino);
    if (nd->live && !nd->is_dir && e)
      total += e->size;
  }
  if (total < bs_progress_min() || total == 0)
    return;
  wb.fd = progress_file(path, O_WRONLY | O_CREAT);
  if (wb.fd < 0)
    return;
  wb.done = 0;
  wb.total = total;
  clock_gettime(CLOCK_MONOTONIC, &wb.last);
  put();
  bs_sink_set_observer(observe, NULL);
}

void fs_progress_end(void)
{
  bs_sink_set_observer(NULL, NULL);
  if (wb.fd < 0)
    return;
  if (wb.done < wb.total)
    wb.done = wb.total; /* headers and padding are not counted: never end below 100% */
  put();
  close(wb.fd);
  wb.fd = -1;
}

static bool read_progress(int fd, uint64_t *done, uint64_t *total)
{
  if (fd < 0)
    return false;
  char buf[64];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  unsigned long long d, t;
  if (sscanf(buf, "%llu %llu", &d, &t) != 2)
    return false;
  *done = d;
  *total = t;
  return true;
}

void fs_progress_wait(int fd, int pfd, int mode)
{
  bool tty = mode == BS_PROGRESS_AUTO ? isatty(2) : mode == BS_PROGRESS_ON;
  struct bs_progress p = {0};
  bool shown = false;
  for (;;) {
    if (flock(fd, tty ? LOCK_EX | LOCK_NB : LOCK_EX) == 0)
      break;
    if (errno == EINTR)
      continue;
    if (errno != EWOULDBLOCK) /* (no progress shown: blocked above) */
      break;
    uint64_t d, t;
    if (read_progress(pfd, &d, &t)) {
      if (!shown) {
        bs_progress_start(&p, "write-back", t, 2, tty ? BS_PROGRESS_ON : BS_PROGRESS_OFF);
        shown = true;
      }
      bs_progress_set(&p, d);
    }
    struct timespec ts = {0, 100000000L};
    nanosleep(&ts, NULL);
  }
  uint64_t d, t;
  if (tty && read_progress(pfd, &d, &t)) {
    if (!shown)
      bs_progress_start(&p, "write-back", t, 2, tty ? BS_PROGRESS_ON : BS_PROGRESS_OFF);
    bs_progress_set(&p, d);
    bs_progress_end(&p);
  }
}
