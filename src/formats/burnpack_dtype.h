/* Burnpack's dtypes as its CBOR spells them, shared by its reader
 * (burnpack.c) and writer (burnpack_write.c): the plain names and Bool
 * storages, and the QFloat scheme map (formats.h: bs_qfloat_layout). */
#ifndef BURNSTORE_BPK_DTYPE_H
#define BURNSTORE_BPK_DTYPE_H

#include "core/dtype.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

/* Burnpack's spelling: the plain dtype name Burn writes ("F32", "Flex32"),
 * or NULL (Bool variants, QFLOAT and types Burn lacks); and the storage of
 * a Bool ({"Bool": "Native" | "U8" | "U32"}), or NULL. */
const char *bs_dtype_bpk_name(enum bs_dtype dt);
const char *bs_dtype_bpk_bool(enum bs_dtype dt);
/* Parse those (a bare "Bool", as burn <= 0.20 wrote, is BOOL). 0, or -1. */
int bs_dtype_from_bpk_name(const char *name, enum bs_dtype *out);
int bs_dtype_from_bpk_bool(const char *storage, enum bs_dtype *out);

#pragma GCC visibility pop

#endif
