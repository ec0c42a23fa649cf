/* One error type for the whole core: an errno-style code, the byte offset in
 * the file where the problem is, the tensor key if any, and a message. */
#ifndef BURNSTORE_ERR_H
#define BURNSTORE_ERR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BS_NODISCARD __attribute__((warn_unused_result))
#define BS_OFF_NONE UINT64_MAX /* the error is not about a place in the file */

/* Internal: the headers under src/ (core/, formats/, policy/) are shared by
 * the library, the daemon, the CLI and the tests, and neither installed nor
 * exported: libburnstore.so exports only include/burnstore.h (the API,
 * src/api/), each of whose declarations says so. The declarations of the
 * headers the API's code includes are hidden (push(hidden), as here), as
 * -fvisibility=hidden makes everything else. */
#pragma GCC visibility push(hidden)

typedef struct bs_err {
  int code;     /* 0 = no error; else an errno: EINVAL, ENOTSUP, ENOMEM, EIO, EFBIG... */
  uint64_t off; /* byte offset in the source, or BS_OFF_NONE */
  char key[128];
  char msg[256];
} bs_err;

/* Record a failure and return -1. The first failure wins: an error already
 * set is never overwritten, so the detailed message from deep down survives.
 * `e` may be NULL; `key` may be NULL. */
int bs_fail(bs_err *e, int code, uint64_t off, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

void bs_err_clear(bs_err *e);

/* "FILE: offset 0x1a2: tensor 'enc.w': MSG" (parts that are unknown are left
 * out), one line: control characters (from names in the file) become '?'.
 * `file` may be NULL. Returns buf. */
const char *bs_err_format(const bs_err *e, const char *file, char *buf, size_t n);

/* Text that came from a file or a server (a tensor name, an ETag) made safe
 * for a terminal, a log line or syslog, in place: every control character
 * (C0, DEL, and C1 written as UTF-8, U+0080..U+009F, which some terminals
 * obey as escapes) becomes '?'. Returns s. Every line burnstore prints or
 * logs goes through it (bs_err_format, bs_log, the daemon's log, the
 * CLI's errors). */
char *bs_text_clean(char *s);

/* The process's log: failures found where no caller gets a bs_err (a URL
 * source's read failing under a FUSE read), at syslog's levels. */
enum { BS_LOG_ERR = 3, BS_LOG_WARNING = 4, BS_LOG_INFO = 6 };
#define BS_LOG_LINE 512 /* a line's bytes, at most (longer is cut) */
/* Where lines go: fn(ctx, level, line), line one line without its newline,
 * bs_text_clean'd, without the "burnstore: " prefix. NULL (the default):
 * "burnstore: LINE" on stderr. Set before threads log (the daemon points it
 * at the mount's log). */
typedef void (*bs_log_fn)(void *ctx, int level, const char *line);
void bs_log_set_sink(bs_log_fn fn, void *ctx);
void bs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A failure's reason reaches its caller too: the last BS_LOG_ERR line a
 * thread logged is kept (per thread) until bs_log_take or bs_log_flush.
 * With hold on (per thread: the CLI's), such a line is not sent to the sink
 * at once: the caller that reports the failure takes it into its own one
 * line; one nobody took goes out at the next bs_log_flush (or before the
 * thread's next held line). */
void bs_log_hold(bool on);
/* This thread's kept line into buf (n > 0), forgotten; false when none. */
bool bs_log_take(char *buf, size_t n);
/* A held line nobody took goes to the sink now; the kept line is
 * forgotten (a new operation starts: bs_src_pread calls it). */
void bs_log_flush(void);

#pragma GCC visibility pop

#endif
