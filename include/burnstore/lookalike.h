/* What a file that no reader accepts looks like, when that is known: a
 * compressed file, Burn's older recorder files (.mpk, .mpk.gz), GGUF, HDF5,
 * NumPy. Used to word the "unknown format" error; it never decides a format. */
#ifndef BURNSTORE_LOOKALIKE_H
#define BURNSTORE_LOOKALIKE_H

#include <stddef.h>
#include <stdint.h>

/* `head`: the first n bytes of the file (16 are enough); `path`: its name
 * (may be NULL), for the extension. Returns a static one-line explanation
 * ("unknown format: ... "), or NULL when nothing is recognised. Only heads
 * no burnstore reader starts with are recognised. */
const char *bs_sniff_lookalike(const uint8_t *head, size_t n, const char *path);

#endif
