/* An index's shards opened beside it, all at once where that helps (a
 * remote index: their first requests in flight together, one deadline for
 * all), each handed to the caller in order as soon as it is open. */
#ifndef BURNSTORE_CORE_SIBLINGS_H
#define BURNSTORE_CORE_SIBLINGS_H

#include <stddef.h>

#include "core/err.h"
#include "core/source.h"

/* Called with shard i (in order), which it takes over (*s is its to keep
 * or destroy); 0, or -1 with err set (the whole opening stops). */
typedef int (*bs_sibling_ready_fn)(void *ud, size_t i, struct bs_src *s, bs_err *err);

/* Open rel[0..n) beside `index` (bs_src_open_sibling), calling ready for
 * each in turn (which may move *index: it is not looked at again). 0; -1 with err set: by ready
 * (*failed is SIZE_MAX), or by opening shard *failed (err does not name it: the caller does). */
int bs_src_open_siblings(const struct bs_src *index, const char *const *rel, size_t n,
                         bs_sibling_ready_fn ready, void *ud, size_t *failed, bs_err *err);

/* The same for an HTTP source (http_open.c): the first requests of up to
 * 32 shards in flight at once, every one of them ending by one deadline
 * (one BURNSTORE_HTTP_TIMEOUT from now, the reads of their headers too),
 * the first to fail ending the others. */
int bs_http_open_siblings(const struct bs_src *index, const char *const *rel, size_t n,
                          bs_sibling_ready_fn ready, void *ud, size_t *failed, bs_err *err);

#endif
