/* Opening a checkpoint for reading, once for every front end: SOURCE (a
 * URL: an HTTP source; a directory: the shard set's index in it; else a
 * file, after the recovery of a set write a kill interrupted), its format
 * (bs_open_any), then what the options make of it: key options, the
 * adapter, as=. The mount (src/fuse/fs_prepare.c), the CLI, the
 * staging INDEX's --finish and the library's API (src/api/) open through
 * it. Also the write options of the CLI, the mount and the API. No FUSE. */
#ifndef BURNSTORE_POLICY_OPEN_H
#define BURNSTORE_POLICY_OPEN_H

#include <stdbool.h>

#include "core/catalog.h"
#include "core/keys.h"
#include "core/source.h"
#include "formats/formats.h"
#include "policy/adapter.h"

/* The options that change what a reader sees. Caller storage:
 * bs_open_spec_init, bs_open_spec_add_item / _parse, bs_open_spec_destroy. */
struct bs_open_spec {
  struct bs_keyopts keys;    /* include=, exclude=, remap=, top_level_key=, contiguous_indices */
  struct bs_adapter adapter; /* adapter=pytorch, adapter_linear=, adapter_norm= */
  struct bs_open_opts open;  /* strict */
  struct bs_http_opts http;  /* http_cache=, http_timeout=, unvalidated (a URL only) */
  bool has_as;               /* as=F32|F16|BF16 */
  enum bs_dtype as;
};

void bs_open_spec_init(struct bs_open_spec *s);
void bs_open_spec_destroy(struct bs_open_spec *s); /* safe on a zeroed or half-built spec */

/* One option item ("name" or "name=value"): 0 when it was one of the
 * above (taken), 1 when it is no open option (s and err untouched: the
 * caller's own, or unknown), -1 with err (EINVAL naming the item and what
 * is wrong with its value). */
BS_NODISCARD int bs_open_spec_add_item(struct bs_open_spec *s, const char *item, bs_err *err);
/* A whole option string (bs_opts_split's syntax; NULL: none): every item
 * must be an open option (else EINVAL "unknown option"). 0, or -1 with err. */
BS_NODISCARD int bs_open_spec_parse(struct bs_open_spec *s, const char *optstr, bs_err *err);

/* Open `source` into cat (bs_catalog_init'd by the caller, empty) with spec
 * s (NULL: none). *name gets what messages call the checkpoint (bs_malloc'd:
 * a URL without user-info and query, the index a directory holds, else
 * source), also on failure (NULL only when out of memory); err does not
 * repeat it (bs_err_format(err, *name, ...)). http options on a source that
 * is no URL are refused (EINVAL). On failure cat is left empty. */
BS_NODISCARD int bs_checkpoint_open(struct bs_catalog *cat, const char *source,
                                    const struct bs_open_spec *s, char **name, bs_err *err);

/* The options of a write: one item, as bs_open_spec_add_item (0 taken, 1
 * not a write option, -1 with err): max_shard_size=SIZE (core/size.h's
 * grammar: 5GB, 500MB, 2GiB, 64M, bytes; not 0). */
BS_NODISCARD int bs_write_spec_add_item(uint64_t *max_shard_size, const char *item, bs_err *err);
/* A whole option string of them (the API's; NULL: none). 0, or -1 with err
 * (EINVAL naming the item). */
BS_NODISCARD int bs_write_spec_parse(const char *optstr, uint64_t *max_shard_size, bs_err *err);

#endif
