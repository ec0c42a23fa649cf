#include "core/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int bs_fail(bs_err *e, int code, uint64_t off, const char *key, const char *fmt, ...)
{
  if (!e || e->code != 0)
    return -1;
  e->code = code ? code : 5 /* EIO */;
  e->off = off;
  e->key[0] = '\0';
  if (key)
    snprintf(e->key, sizeof e->key, "%s", key);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return -1;
}

void bs_err_clear(bs_err *e)
{
  if (!e)
    return;
  memset(e, 0, sizeof *e);
  e->off = BS_OFF_NONE;
}

const char *bs_err_format(const bs_err *e, const char *file, char *buf, size_t n)
{
  size_t used = 0;
  buf[0] = '\0';
#define ADD(...)                                                                                   \
  do {                                                                                             \
    if (used < n) {                                                                                \
      int w = snprintf(buf + used, n - used, __VA_ARGS__);                                         \
      if (w > 0)                                                                                   \
        used += (size_t)w;                                                                         \
    }                                                                                              \
  } while (0)
  if (file && *file)
    ADD("%s: ", file);
  if (e->off != BS_OFF_NONE)
    ADD("offset 0x%llx: ", (unsigned long long)e->off);
  if (e->key[0])
    ADD("tensor '%s': ", e->key);
  ADD("%s", e->msg[0] ? e->msg : "unknown error");
#undef ADD
  /* One line: a name from a hostile file may hold a newline. */
  return bs_text_clean(buf);
}

char *bs_text_clean(char *s)
{
  for (unsigned char *p = (unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f)
      *p = '?';
    else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) /* U+0080..U+009F */
      *p = '?', *++p = '?';
  }
  return s;
}

/* ---- the log ---- */

static bs_log_fn sink_fn; /* (NULL: stderr) */
static void *sink_ctx;
/* This thread's last BS_LOG_ERR line ("" when none), and whether it has
 * not been sent to the sink yet (hold). */
static _Thread_local char kept[BS_LOG_LINE];
static _Thread_local bool kept_held, hold;

void bs_log_set_sink(bs_log_fn fn, void *ctx)
{
  __atomic_store_n(&sink_ctx, ctx, __ATOMIC_RELAXED);
  __atomic_store_n(&sink_fn, fn, __ATOMIC_RELEASE);
}

static void emit(int level, const char *line)
{
  bs_log_fn fn = __atomic_load_n(&sink_fn, __ATOMIC_ACQUIRE);
  if (fn) {
    fn(__atomic_load_n(&sink_ctx, __ATOMIC_RELAXED), level, line);
    return;
  }
  /* (one write: lines of several threads do not interleave) */
  char out[BS_LOG_LINE + 16];
  int n = snprintf(out, sizeof out, "burnstore: %s\n", line);
  if (n > 0)
    fwrite(out, 1, (size_t)n < sizeof out ? (size_t)n : sizeof out - 1, stderr);
}

void bs_log(int level, const char *fmt, ...)
{
  char line[BS_LOG_LINE];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  if (len && line[len - 1] == '\n') /* (a trailing newline, by habit) */
    line[len - 1] = '\0';
  bs_text_clean(line);
  if (level <= BS_LOG_ERR) {
    bs_log_flush(); /* (a held line nobody took is not lost) */
    memcpy(kept, line, sizeof kept);
    kept_held = hold;
    if (hold)
      return;
  }
  emit(level, line);
}

void bs_log_hold(bool on)
{
  if (!on)
    bs_log_flush();
  hold = on;
}

bool bs_log_take(char *buf, size_t n)
{
  if (!kept[0])
    return false;
  snprintf(buf, n, "%s", kept);
  kept[0] = '\0';
  kept_held = false;
  return true;
}

void bs_log_flush(void)
{
  if (kept_held)
    emit(BS_LOG_ERR, kept);
  kept[0] = '\0';
  kept_held = false;
}
