/* The progress line (see progress.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/progress.h"

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void human(char *buf, size_t n, double b)
{
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4)
    b /= 1024, i++;
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

uint64_t bs_progress_min(void)
{
  const char *env = getenv("BURNSTORE_PROGRESS_MIN");
  return env && *env ? strtoull(env, NULL, 10) : 256ull << 20;
}

int bs_progress_flag(const char *arg)
{
  if (strcmp(arg, "--progress") == 0)
    return BS_PROGRESS_ON;
  if (strcmp(arg, "--no-progress") == 0)
    return BS_PROGRESS_OFF;
  return BS_PROGRESS_AUTO;
}

void bs_progress_start(struct bs_progress *p, const char *what, uint64_t total, int fd, int mode)
{
  uint64_t min = bs_progress_min();
  p->what = what;
  p->total = total;
  p->done = 0;
  p->start = p->last = now();
  p->tty = isatty(fd);
  bool want = mode == BS_PROGRESS_AUTO ? p->tty : mode == BS_PROGRESS_ON;
  p->on = want && total >= min && total > 0;
}

static void draw(struct bs_progress *p, bool final)
{
  double t = now();
  if (!final && t - p->last < (p->tty ? 0.2 : 1.0))
    return;
  p->last = t;
  double el = t - p->start;
  double rate = el > 0 ? (double)p->done / el : 0;
  char d[32], tot[32], r[32], eta[32] = "";
  human(d, sizeof d, (double)p->done);
  human(tot, sizeof tot, (double)p->total);
  human(r, sizeof r, rate);
  if (!final && rate > 0 && p->total > p->done) {
    unsigned s = (unsigned)((double)(p->total - p->done) / rate);
    snprintf(eta, sizeof eta, "  ETA %u:%02u", s / 60, s % 60);
  } else if (final) {
    snprintf(eta, sizeof eta, "  in %.1f s", el);
  }
  unsigned pct = p->total ? (unsigned)(p->done * 100 / p->total) : 100;
  /* Not a terminal (a log): a line each, no cursor control. */
  fprintf(stderr, "%s%s %s / %s %3u%%  %s/s%s%s", p->tty ? "\r" : "", p->what, d, tot,
          pct > 100 ? 100 : pct, r, eta, p->tty ? "\033[K" : "\n");
  fflush(stderr);
}

void bs_progress_add(struct bs_progress *p, uint64_t n)
{
  if (!p->on)
    return;
  p->done += n;
  draw(p, false);
}

void bs_progress_set(struct bs_progress *p, uint64_t done)
{
  if (!p->on)
    return;
  p->done = done;
  draw(p, false);
}

void bs_progress_end(struct bs_progress *p)
{
  if (!p->on)
    return;
  if (p->done < p->total)
    p->done = p->total;
  draw(p, true);
  if (p->tty)
    fputc('\n', stderr);
  p->on = false;
}
