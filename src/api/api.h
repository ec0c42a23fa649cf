/* The inside of the public API's handles (include/burnstore.h), shared by
 * the files of src/api/: an API function checks its arguments, calls the
 * core, and turns a bs_err into the thread's last error. Nothing here is
 * exported. */
#ifndef BURNSTORE_API_API_H
#define BURNSTORE_API_API_H

#include "burnstore.h"
#include "core/catalog.h"
#include "core/edit.h"
#include "core/strmap.h"
#include "policy/xattr.h"

struct burnstore_tensor {
  const struct burnstore_checkpoint *ck;
  size_t i; /* its index in ck->cat.tensors */
};

struct burnstore_checkpoint {
  struct bs_catalog cat;
  char *name;                       /* what messages call it (bs_checkpoint_open) */
  struct burnstore_tensor *visible; /* the tensors the options keep, in order */
  size_t nvisible;
  struct bs_strmap by_key; /* presented key -> index into visible */
  char **paths;            /* per source: its absolute path when it is a regular file, else NULL */
  struct bs_edit edit;     /* a read-only mount's view (the root's metadata), for the xattrs */
  struct bs_xa_mount xa;
};

/* Record the thread's last error: code (an errno; 0 becomes EIO) and the
 * one line bs_err_format makes of err with `file` in front (may be NULL).
 * Returns the code. */
int bs_api_fail(const char *file, const bs_err *err);
/* The same from a printf format. */
int bs_api_failf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The start of a call that makes a handle: burnstore_init was called (and
 * not undone), and arg, which names `what` of function fn, is a non-empty
 * string. 0, or EINVAL (the thread's last error set). */
int bs_api_begin(const char *fn, const char *what, const char *arg);

/* The API's dtype of the core's, and back (false: none). */
burnstore_dtype bs_api_dtype(enum bs_dtype dt);
bool bs_api_core_dtype(burnstore_dtype dt, enum bs_dtype *out);

/* Copy value (n bytes) into buf by the header's buffer rule: *len = n;
 * size 0: nothing else; n >= size: ERANGE; else the bytes and a NUL. */
int bs_api_copy_out(const void *value, size_t n, char *buf, size_t size, size_t *len);

#endif
