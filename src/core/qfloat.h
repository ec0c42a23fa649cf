/* Burn's QFloat schemes that burnstore decodes (docs/user-guide.md,
 * "Decoded views"): symmetric 8-bit values (Q8S), one byte each (Native
 * store), one per-tensor scale and no blocks. Their bytes (burn-std's
 * QuantizedBytes): the numel values as i8, then the scale, little-endian, of
 * the scale dtype; a value is q * scale in F32. Other schemes (packed
 * stores, blocks, Q4/Q2, the float values, two-level scales) stay opaque.
 * A dtype description, read in the core (as ggml's block layouts are) because
 * the catalog's decoded reads need it and the core includes no format. */
#ifndef BURNSTORE_CORE_QFLOAT_H
#define BURNSTORE_CORE_QFLOAT_H

#include <stddef.h>
#include <stdint.h>

#include "burnstore/dtype.h"

/* The scale dtype (F32, F16 or BF16) of the QFloat dtype CBOR `raw` (the
 * {"QFloat": {...}} map as the Burnpack holds it: the current 5-entry
 * scheme or the v0.20-0.21 one), if it is a scheme decoded here; else
 * BS_DT_COUNT. */
enum bs_dtype bs_qfloat_q8s_scale(const uint8_t *raw, size_t len);

#endif
