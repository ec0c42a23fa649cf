/* NumPy's .npy format: the header burnstore serves before a tensor's bytes
 * (the .npy views of a mount, `burnstore cat --npy`) and the parser for .npy
 * files written into a writable mount. No FUSE, no I/O.
 *
 * A header is the magic "\x93NUMPY", a version (1.0; 2.0 when the dict does
 * not fit a 16-bit length), the dict's length, then the Python dict literal
 * {'descr': ..., 'fortran_order': False, 'shape': (...), } padded with spaces
 * and a '\n' so that the data starts at a multiple of 64 bytes. */
#ifndef BURNSTORE_NPY_H
#define BURNSTORE_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/checked.h"
#include "core/dtype.h"
#include "core/err.h"

/* The largest header we build or accept (numpy's own limit for reading is
 * 10,000 bytes by default; a 64-dimension shape needs under 1,500). */
#define BS_NPY_MAX_HEADER 65536u

/* The NumPy descr a dtype is served as: "<f4", "|b1"... NULL when the dtype
 * has no byte-per-element layout NumPy can read (F6, F4, QFLOAT). *exact is
 * false when NumPy gets a stand-in of the same width (BF16 as "<u2", the F8
 * types as "|u1", Burn's Bool(U32) as "<u4"): the true dtype stays in the
 * user.burnstore.dtype xattr. exact may be NULL. */
const char *bs_npy_descr(enum bs_dtype dt, bool *exact);

/* Build the header of a tensor into buf (at most cap bytes). *len gets its
 * length, a multiple of 64. EINVAL for a dtype without descr, ENAMETOOLONG
 * if cap (or BS_NPY_MAX_HEADER) is too small. */
BS_NODISCARD int bs_npy_header(enum bs_dtype dt, uint32_t rank, const uint64_t *shape, char *buf,
                               size_t cap, size_t *len, bs_err *err);
/* The header's length alone (0 for a dtype without descr). */
size_t bs_npy_header_len(enum bs_dtype dt, uint32_t rank, const uint64_t *shape);

struct bs_npy_info {
  size_t header_len; /* bytes before the data */
  enum bs_dtype dtype;
  uint32_t rank;
  uint64_t shape[BS_MAX_RANK];
  bool fortran_order;
  uint64_t nbytes; /* product(shape) * element size, checked */
};

/* Whether the file name (or key) s of n bytes is NAME.npy with NAME not
 * empty: what np.save writes for tensor NAME, written back as NAME. */
bool bs_npy_name(const char *s, size_t n);
/* Is this the start of a .npy file (the 6-byte magic)? */
bool bs_npy_is_npy(const uint8_t *p, size_t n);
/* Parse the header at the start of p[0..n). Every field is checked: the
 * magic, a version of 1, 2 or 3, the length within n and BS_NPY_MAX_HEADER,
 * the dict (descr, fortran_order, shape, each once, nothing else), a
 * little-endian or byte-sized descr burnstore has a dtype for, the shape's
 * rank and product. Fails with EINVAL and a message naming the byte; EAGAIN
 * when n is too short to hold the whole header (give more bytes). */
BS_NODISCARD int bs_npy_parse(const uint8_t *p, size_t n, struct bs_npy_info *out, bs_err *err);

#endif
