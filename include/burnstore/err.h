/* One error type for the whole core: an errno-style code, the byte offset in
 * the file where the problem is, the tensor key if any, and a message. */
#ifndef BURNSTORE_ERR_H
#define BURNSTORE_ERR_H

#include <stddef.h>
#include <stdint.h>

#define BS_NODISCARD __attribute__((warn_unused_result))
#define BS_OFF_NONE UINT64_MAX /* the error is not about a place in the file */

/* The API: what the public headers declare between push(default) and pop is
 * exported from libburnstore.so, whose objects are built with
 * -fvisibility=hidden; everything else (the private headers beside the code)
 * stays inside the library. */
#pragma GCC visibility push(default)

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

#pragma GCC visibility pop

#endif
