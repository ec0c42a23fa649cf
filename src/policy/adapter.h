/* The PyTorch-to-Burn adapter view (-o adapter=pytorch): what burn-store's
 * PyTorchToBurnAdapter does on load, done on the catalog, lazily. burn-store
 * decides by the Burn module type, which no file stores; the mount decides
 * by the names and shapes in the file:
 *
 *  - Linear: a 2-D `P.weight` whose sibling `P.bias` is 1-D with length
 *    equal to the weight's first dimension. Its shape [out, in] becomes
 *    [in, out] through strides (no byte is copied or held: reads gather).
 *  - Norm (BatchNorm, LayerNorm, GroupNorm, RmsNorm): a 1-D `P.weight`; it
 *    is renamed `P.gamma`, and its sibling `P.bias` (1-D, same length)
 *    `P.beta`, the names Burn's norm modules have.
 *
 * adapter_linear=REGEX and adapter_norm=REGEX (repeatable) name the weights
 * explicitly instead (matched, unanchored, against the presented key of the
 * `weight` tensor); given, they replace the rule for their kind. No FUSE. */
#ifndef BURNSTORE_ADAPTER_H
#define BURNSTORE_ADAPTER_H

#include <stdbool.h>

#include "core/catalog.h"
#include "core/err.h"
#include "core/keys.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

struct bs_adapter {
  bool pytorch;
  struct bs_keyopts linear, norm; /* their include lists: the explicit regexes */
};

void bs_adapter_init(struct bs_adapter *a);
void bs_adapter_destroy(struct bs_adapter *a);
/* One option item: adapter=pytorch, adapter_linear=REGEX, adapter_norm=REGEX.
 * 0, 1 if the item is no adapter option (err untouched), -1 on error. */
BS_NODISCARD int bs_adapter_add_item(struct bs_adapter *a, const char *item, bs_err *err);
/* Is anything asked for? (adapter_linear= without adapter=pytorch is an
 * error reported by bs_adapter_apply.) */
bool bs_adapter_any(const struct bs_adapter *a);
/* Apply to the visible tensors of cat (after bs_keys_apply): transpose the
 * Linear weights (2-D, byte-sized dtypes) and rename the norm parameters.
 * A renamed key that another visible tensor already has: EEXIST naming both.
 * *ntrans and *nren (may be NULL) get the counts. On error cat may be half
 * adapted: the caller gives up on it. */
BS_NODISCARD int bs_adapter_apply(struct bs_catalog *cat, const struct bs_adapter *a,
                                  size_t *ntrans, size_t *nren, bs_err *err);

#pragma GCC visibility pop

#endif
