/* Format detection from magic bytes and the readers of every format. Each
 * reader turns the bytes of cat->srcs[src] into catalog entries, validating
 * the whole file once; after that the catalog is trusted. */
#ifndef BURNSTORE_FORMATS_H
#define BURNSTORE_FORMATS_H

#include <stdbool.h>

#include "burnstore/catalog.h"

enum bs_kind {
  BS_KIND_UNKNOWN,
  BS_KIND_BURNPACK,
  BS_KIND_SAFETENSORS,
  BS_KIND_PT_ZIP,
  BS_KIND_PT_LEGACY,
  BS_KIND_PT_TAR,
  BS_KIND_COUNT
};

/* Tell the container from its first bytes (never from a file name). */
BS_NODISCARD int bs_sniff(const struct bs_src *src, enum bs_kind *kind, bs_err *err);

struct bs_open_opts {
  bool strict; /* PyTorch: refuse unknown pickle GLOBALs instead of skipping them */
};

/* Sniff and read `src` (ownership moves into the catalog, *src is zeroed,
 * also on failure). On failure the catalog is left empty. */
BS_NODISCARD int bs_open_any(struct bs_catalog *cat, struct bs_src *src,
                             const struct bs_open_opts *opts, bs_err *err);

BS_NODISCARD int bs_bpk_read(struct bs_catalog *cat, uint32_t src, bs_err *err);
BS_NODISCARD int bs_st_read(struct bs_catalog *cat, uint32_t src, bs_err *err);
BS_NODISCARD int bs_pth_read(struct bs_catalog *cat, uint32_t src, enum bs_kind kind,
                             const struct bs_open_opts *opts, bs_err *err);

#endif
