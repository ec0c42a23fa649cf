/* A progress line on a terminal: bytes, rate, ETA, redrawn at most 5 times a
 * second on stderr. Shown only when stderr is a terminal and the total is
 * over a threshold (256 MiB; BURNSTORE_PROGRESS_MIN=BYTES changes it, for
 * tests). No FUSE. */
#ifndef BURNSTORE_PROGRESS_H
#define BURNSTORE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct bs_progress {
  bool on;
  const char *what;
  uint64_t total, done;
  double start, last; /* monotonic seconds */
};

/* The smallest total shown: 256 MiB, or BURNSTORE_PROGRESS_MIN. */
uint64_t bs_progress_min(void);
/* Decide whether to show progress for `total` bytes on fd (2: stderr). */
void bs_progress_start(struct bs_progress *p, const char *what, uint64_t total, int fd);
void bs_progress_add(struct bs_progress *p, uint64_t n);
/* Draw the line once for `done` of `total` (the -u waiter's updates). */
void bs_progress_set(struct bs_progress *p, uint64_t done);
/* Finish the line (a newline), if it was shown. */
void bs_progress_end(struct bs_progress *p);

#endif
