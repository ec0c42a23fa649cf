#include "burnstore/err.h"

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
  for (char *p = buf; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
  return buf;
}
