/* Memory the core hands over: what a call documents as bs_malloc'd
 * (bs_shape_json's string, bs_src_read_alloc's buffer) is the caller's, to
 * release with bs_free. */
#ifndef BURNSTORE_MEM_H
#define BURNSTORE_MEM_H

#include "burnstore/err.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

void bs_free(void *p); /* bs_free(NULL) is a no-op */

#pragma GCC visibility pop

#endif
