/* UTF-8 as the formats we write define it (RFC 3629): no overlong forms, no
 * surrogates, nothing past U+10FFFF. One checker for every reader and writer. */
#ifndef BURNSTORE_UTF8_H
#define BURNSTORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence at s (at most `left` bytes, left > 0),
 * or 0 if the bytes there are not one. */
size_t bs_utf8_len(const uint8_t *s, size_t left);
/* Whether s[0..n) is valid UTF-8. If not and bad is not NULL, *bad gets the
 * offset of the first byte that does not start a valid sequence. */
bool bs_utf8_valid(const void *s, size_t n, size_t *bad);
/* `name` for a message: bytes that are not valid UTF-8 as \xNN, cut to fit
 * n. Returns buf. */
const char *bs_name_printable(const char *name, char *buf, size_t n);

#endif
