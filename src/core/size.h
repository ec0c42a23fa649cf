/* The one size grammar of burnstore's options: http_cache=, max_shard_size=
 * and $BURNSTORE_HTTP_CACHE (docs/user-guide.md, "Sizes"). */
#ifndef BURNSTORE_SIZE_H
#define BURNSTORE_SIZE_H

#include <stdint.h>

#include "core/err.h"

/* A size: up to 19 digits, then a unit or none (bytes). Units, in any case:
 *   K, M, G, T        binary: 2^10, 2^20, 2^30, 2^40 bytes ("64M");
 *   KiB, MiB, GiB, TiB binary too ("64MiB");
 *   KB, MB, GB, TB    decimal: 10^3, 10^6, 10^9, 10^12 bytes, as Hugging
 *                     Face writes max_shard_size ("5GB"); ending in a lower-case
 *                     b ("5Gb") they count bits, as it reads them (bytes / 8);
 *   B                 bytes.
 * 0 and *out, or -1 (not a size, or over 2^64 - 1). A size of 0 is the
 * caller's to refuse. */
BS_NODISCARD int bs_parse_size(const char *s, uint64_t *out);

#endif
