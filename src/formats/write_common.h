/* What every writer shares, below the writers table (writers.h): the options
 * of one write, a new target's mode, the name rule and the refusal hint of
 * the rows' name_ok and can_write. The writers call these and nothing of
 * writers.c, which calls the writers: no circle. */
#ifndef BURNSTORE_WRITE_COMMON_H
#define BURNSTORE_WRITE_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/err.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

/* Options of one write-back (recorded in the staging INDEX). */
struct bs_write_opts {
  uint64_t max_shard_size; /* a set's row (write_set): bytes per member; 0: keep the target's */
  /* A new target's permission bits (& 0666, the umask applies), as cp
   * keeps its source's: set from the source when there is one. has_mode
   * false: 0644. An existing target always keeps its own mode. */
  bool has_mode;
  unsigned mode;
};

/* The permission bits a new target of a write with options o (may be NULL) gets. */
unsigned bs_write_new_mode(const struct bs_write_opts *o);

/* A format's metadata rules prepared once from a source catalog (the
 * writers table's meta_rules column). Opaque; the row's. */
struct bs_meta_rules;

/* The rule the name_ok of every row shares: `name` is valid UTF-8 of at
 * most `max` bytes, and not empty unless empty_ok. `why` ends the message
 * ("its names are JSON strings"). 0, or -1 with err (EINVAL). */
BS_NODISCARD int bs_writer_name_text(const char *name, size_t max, bool empty_ok, const char *why,
                                     bs_err *err);

/* For a refusal: how to write a dtype whose bytes are those of a common one
 * ("; its bytes are F32: set user.burnstore.dtype to F32 to write them" for
 * FLEX32, the same with BOOL for BOOL_U8), "" for any other. */
const char *bs_writer_alias_hint(enum bs_dtype dt);

#pragma GCC visibility pop

#endif
