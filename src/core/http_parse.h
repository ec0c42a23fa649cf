/* The HTTP source's pure pieces (no network, no libcurl), shared with
 * remote.c and unit-tested alone: URLs (which are ours, the name shown of
 * one, a sibling beside one, the origin a token may go to), the headers the
 * client reads, and the syntax of the source's options. */
#ifndef BURNSTORE_CORE_HTTP_PARSE_H
#define BURNSTORE_CORE_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BS_HTTP_BLOCK ((size_t)1 << 20) /* a cache block */
#define BS_HTTP_CACHE_BLOCKS_MAX 16384  /* 16 GiB of 1 MiB blocks */
#define BS_HTTP_TIMEOUT_MAX_S 3600      /* the longest BURNSTORE_HTTP_TIMEOUT taken */

/* Whether s is an http:// or https:// URL (any case). */
bool bs_http_is_http(const char *s);
/* `rel` (a relative name, no "..": the caller checked) beside the file that
 * `base` names: its last path segment replaced; the query and fragment of
 * base dropped. bs_malloc'd; NULL: no memory, or base is no http(s) URL. */
char *bs_http_resolve(const char *base, const char *rel);
/* The origin of an http(s) URL, "scheme://host:port" (the port written
 * out: 80 or 443 when none is), without user-info, into out ("" when url
 * is no http(s) URL). */
void bs_http_origin(const char *url, char *out, size_t n);
/* val[0..n) is "bytes FIRST-LAST/TOTAL" (TOTAL may be "*": UINT64_MAX),
 * of any length. 0, or -1 when it is not one (or LAST < FIRST, or LAST >=
 * TOTAL, or a number over 2^64 - 1). */
int bs_http_content_range(const char *val, size_t n, uint64_t *first, uint64_t *last,
                          uint64_t *total);
/* val[0..n) is a decimal number (blanks around it allowed) that fits. */
bool bs_http_number(const char *val, size_t n, uint64_t *v);
/* Retry-After (val[0..n)) in milliseconds, at most cap_ms: delta seconds
 * only (an HTTP date, or garbage: -1, the caller backs off on its own). */
long bs_http_retry_after(const char *val, size_t n, long cap_ms);
/* val[0..n) is a strong entity-tag (RFC 9110 8.8.3): '"', then printable
 * bytes other than '"' (no control character, no blank), then '"'. A weak
 * one (W/"...") is not. */
bool bs_http_etag_strong(const char *v, size_t n);
/* A header line "Name: value\r\n": whether it is `name` (any case); *v and
 * *vn the value without surrounding blanks. */
bool bs_http_header_is(const char *line, size_t n, const char *name, const char **v, size_t *vn);

#endif
