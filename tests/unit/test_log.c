/* The core's log (err.h, issue 31): bs_text_clean, the one function every
 * printed or logged line goes through (C0, DEL and C1 as UTF-8 become '?');
 * bs_log to a sink; a failure's line kept per thread for the caller that
 * reports it (bs_log_take), held (not printed) while bs_log_hold is on, and
 * never lost (the next held line or bs_log_flush sends it). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/err.h"

Test(log, clean)
{
  char s[] = "a\x1b[31mb\x07\t\n\r\x7f|\xc2\x9b|\xc2\x80|\xc2\x9f|\xc2\xa0|\xc3\xa9|~";
  cr_expect_str_eq(bs_text_clean(s), "a?[31mb?????|??|??|??|\xc2\xa0|\xc3\xa9|~");
  char t[] = "\xc2"; /* (a lead byte at the end) */
  cr_expect_str_eq(bs_text_clean(t), "\xc2");
  bs_err e;
  bs_err_clear(&e);
  bs_fail(&e, 5, BS_OFF_NONE, "k\x1b", "etag \"\xc2\x9b\x1b[2J\"");
  char buf[200];
  cr_expect_str_eq(bs_err_format(&e, "f\n", buf, sizeof buf), "f?: tensor 'k?': etag \"???[2J\"");
}

static char got[8][BS_LOG_LINE];
static int ngot, levels[8];

static void sink(void *ctx, int level, const char *line)
{
  cr_assert_eq(ctx, (void *)&ngot);
  if (ngot < 8) {
    levels[ngot] = level;
    snprintf(got[ngot++], sizeof got[0], "%s", line);
  }
}

Test(log, sink_hold_take_flush)
{
  bs_log_set_sink(sink, &ngot);
  ngot = 0;
  bs_log(BS_LOG_WARNING, "w %d\n", 1);
  bs_log(BS_LOG_ERR, "e \x1b[31m%s", "x");
  cr_assert_eq(ngot, 2);
  cr_expect_str_eq(got[0], "w 1"); /* (its newline dropped) */
  cr_expect_eq(levels[0], BS_LOG_WARNING);
  cr_expect_str_eq(got[1], "e ?[31mx");
  char buf[BS_LOG_LINE];
  cr_expect(bs_log_take(buf, sizeof buf)); /* also kept when sent */
  cr_expect_str_eq(buf, "e ?[31mx");
  cr_expect(!bs_log_take(buf, sizeof buf));

  bs_log_hold(true);
  bs_log(BS_LOG_ERR, "held 1");
  bs_log(BS_LOG_INFO, "info");
  cr_expect_eq(ngot, 3); /* only the info */
  cr_expect_str_eq(got[2], "info");
  cr_expect(bs_log_take(buf, sizeof buf));
  cr_expect_str_eq(buf, "held 1");
  bs_log_flush(); /* taken: nothing to send */
  cr_expect_eq(ngot, 3);
  bs_log(BS_LOG_ERR, "held 2");
  bs_log(BS_LOG_ERR, "held 3"); /* nobody took 2: it goes out now */
  cr_expect_eq(ngot, 4);
  cr_expect_str_eq(got[3], "held 2");
  bs_log_flush();
  cr_expect_eq(ngot, 5);
  cr_expect_str_eq(got[4], "held 3");
  cr_expect(!bs_log_take(buf, sizeof buf)); /* flushed: forgotten */
  bs_log(BS_LOG_ERR, "held 4");
  bs_log_hold(false); /* sends what is held */
  cr_expect_eq(ngot, 6);
  cr_expect_str_eq(got[5], "held 4");
  bs_log_set_sink(NULL, NULL);
}

/* Each thread keeps its own line: a failure on one thread is never the
 * reason taken on another. */
static void quiet(void *ctx, int level, const char *line)
{
  (void)ctx, (void)level, (void)line;
}

static void *one(void *arg)
{
  long id = (long)arg;
  bs_log_hold(id % 2 == 0);
  for (int i = 0; i < 2000; i++) {
    char want[64], buf[BS_LOG_LINE];
    snprintf(want, sizeof want, "thread %ld line %d", id, i);
    bs_log(BS_LOG_ERR, "%s", want);
    if (!bs_log_take(buf, sizeof buf) || strcmp(buf, want) != 0)
      return (void *)1;
  }
  bs_log_hold(false);
  return NULL;
}

Test(log, per_thread)
{
  bs_log_set_sink(quiet, NULL);
  pthread_t t[4];
  for (long i = 0; i < 4; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, one, (void *)i), 0);
  for (int i = 0; i < 4; i++) {
    void *rc;
    pthread_join(t[i], &rc);
    cr_expect_null(rc, "thread %d took another's line", i);
  }
  bs_log_set_sink(NULL, NULL);
}
