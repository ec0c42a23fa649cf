/* A progress line: bytes, rate, ETA, redrawn at most 5 times a second on a
 * terminal (in place), once a second elsewhere (a line each). Shown when the
 * total is over a threshold (256 MiB; BURNSTORE_PROGRESS_MIN=BYTES changes
 * it, for tests) and stderr is a terminal, unless --progress or
 * --no-progress said otherwise. No FUSE. */
#ifndef BURNSTORE_PROGRESS_H
#define BURNSTORE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

enum { BS_PROGRESS_AUTO = 0, BS_PROGRESS_ON = 1, BS_PROGRESS_OFF = -1 };

struct bs_progress {
  bool on, tty;
  const char *what;
  uint64_t total, done;
  double start, last; /* monotonic seconds */
};

/* The smallest total shown: 256 MiB, or BURNSTORE_PROGRESS_MIN. */
uint64_t bs_progress_min(void);
/* BS_PROGRESS_ON for "--progress", BS_PROGRESS_OFF for "--no-progress", else
 * BS_PROGRESS_AUTO (not a progress flag). */
int bs_progress_flag(const char *arg);
/* Decide whether to show progress for `total` bytes on fd (2: stderr):
 * mode BS_PROGRESS_AUTO asks isatty(fd). */
void bs_progress_start(struct bs_progress *p, const char *what, uint64_t total, int fd, int mode);
void bs_progress_add(struct bs_progress *p, uint64_t n);
/* Draw the line once for `done` of `total` (the -u waiter's updates). */
void bs_progress_set(struct bs_progress *p, uint64_t done);
/* Finish the line (a newline), if it was shown. */
void bs_progress_end(struct bs_progress *p);

#endif
