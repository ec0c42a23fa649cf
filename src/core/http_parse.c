/* The HTTP source's pure pieces (http_parse.h): URLs, headers, options.
 * No libcurl here: remote.c and the unit tests use these alone. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/http_parse.h"
#include "core/size.h"
#include "core/source.h"

bool bs_http_is_http(const char *s)
{
  return s && (strncasecmp(s, "http://", 7) == 0 || strncasecmp(s, "https://", 8) == 0);
}

bool bs_src_is_url(const char *s)
{
  return bs_http_is_http(s) ||
         (s && (strncasecmp(s, "hf://", 5) == 0 || strncasecmp(s, "s3://", 5) == 0));
}

/* Where the authority (after "scheme://") starts and ends in url. */
static bool authority(const char *url, const char **a, const char **e)
{
  const char *p = strstr(url, "://");
  if (!p || !bs_http_is_http(url))
    return false;
  *a = p + 3;
  *e = *a + strcspn(*a, "/?#");
  return true;
}

char *bs_http_redact(const char *url)
{
  /* any scheme bs_src_is_url takes: an hf:// or s3:// URL given with
   * user-info or a query is named in errors too */
  const char *a = strstr(url, "://"), *e;
  if (!a || !bs_src_is_url(url))
    return bs_strdup(url);
  a += 3;
  e = a + strcspn(a, "/?#");
  const char *at = NULL;
  for (const char *p = a; p < e; p++)
    if (*p == '@')
      at = p;
  size_t qn = strcspn(e, "?#");
  size_t n = strlen(url) + 8;
  char *out = bs_malloc(n);
  if (!out)
    return NULL;
  snprintf(out, n, "%.*s%s%.*s%.*s%s", (int)(a - url), url, at ? "***@" : "",
           (int)(e - (at ? at + 1 : a)), at ? at + 1 : a, (int)qn, e, e[qn] == '?' ? "?***" : "");
  return out;
}

char *bs_http_resolve(const char *base, const char *rel)
{
  const char *a, *e;
  if (!authority(base, &a, &e))
    return NULL;
  size_t end = (size_t)(e - base) + strcspn(e, "?#"); /* the path ends here */
  size_t dir = (size_t)(e - base);                    /* after the last '/' of the path */
  for (size_t i = dir; i < end; i++)
    if (base[i] == '/')
      dir = i + 1;
  bool slash = dir == (size_t)(e - base); /* no path: "http://host" */
  size_t rn = strlen(rel);
  char *out = bs_malloc(dir + rn + 2);
  if (!out)
    return NULL;
  memcpy(out, base, dir);
  if (slash)
    out[dir++] = '/';
  memcpy(out + dir, rel, rn + 1);
  return out;
}

/* Decimal digits at *p (before e) into *v, *p past them; false: none, or
 * over 2^64 - 1. */
static bool digits(const char **p, const char *e, uint64_t *v)
{
  const char *s = *p;
  uint64_t x = 0;
  if (s >= e || *s < '0' || *s > '9')
    return false;
  for (; s < e && *s >= '0' && *s <= '9'; s++)
    if (!bs_mul_u64(x, 10, &x) || !bs_add_u64(x, (uint64_t)(*s - '0'), &x))
      return false;
  *p = s;
  *v = x;
  return true;
}

static bool parse_u64(const char **p, uint64_t *v)
{
  return digits(p, *p + strlen(*p), v);
}

static const char *blanks(const char *p, const char *e)
{
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
    p++;
  return p;
}

int bs_http_content_range(const char *val, size_t n, uint64_t *first, uint64_t *last,
                          uint64_t *total)
{
  const char *e = val + n, *p = blanks(val, e);
  if ((size_t)(e - p) < 5 || strncasecmp(p, "bytes", 5) != 0)
    return -1;
  p = blanks(p + 5, e);
  if (!digits(&p, e, first) || p >= e || *p++ != '-' || !digits(&p, e, last) || p >= e ||
      *p++ != '/')
    return -1;
  if (p < e && *p == '*') {
    *total = UINT64_MAX;
    p++;
  } else if (!digits(&p, e, total)) {
    return -1;
  }
  if (blanks(p, e) != e || *last < *first || (*total != UINT64_MAX && *last >= *total))
    return -1;
  return 0;
}

bool bs_http_number(const char *val, size_t n, uint64_t *v)
{
  const char *e = val + n, *p = blanks(val, e);
  return digits(&p, e, v) && blanks(p, e) == e;
}

long bs_http_retry_after(const char *val, size_t n, long cap_ms)
{
  uint64_t s;
  if (!bs_http_number(val, n, &s))
    return -1;
  return s > (uint64_t)cap_ms / 1000 ? cap_ms : (long)s * 1000;
}

bool bs_http_etag_strong(const char *v, size_t n)
{
  if (n < 2 || v[0] != '"' || v[n - 1] != '"')
    return false;
  for (size_t i = 1; i + 1 < n; i++) { /* etagc: %x21 / %x23-7E / obs-text */
    unsigned char ch = (unsigned char)v[i];
    if (ch < 0x21 || ch == '"' || ch == 0x7f)
      return false;
  }
  return true;
}

bool bs_http_header_is(const char *line, size_t n, const char *name, const char **v, size_t *vn)
{
  size_t k = strlen(name);
  if (n <= k || line[k] != ':' || strncasecmp(line, name, k) != 0)
    return false;
  const char *b = line + k + 1, *e = line + n;
  while (b < e && (*b == ' ' || *b == '\t'))
    b++;
  while (e > b && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t'))
    e--;
  *v = b;
  *vn = (size_t)(e - b);
  return true;
}

void bs_http_origin(const char *url, char *out, size_t n)
{
  const char *a, *e;
  out[0] = '\0';
  if (!authority(url, &a, &e))
    return;
  for (const char *p = a; p < e; p++)
    if (*p == '@')
      a = p + 1;
  bool tls = strncasecmp(url, "https://", 8) == 0;
  const char *colon = NULL; /* the port's, not an IPv6 address's */
  for (const char *p = a; p < e; p++)
    if (*p == ':')
      colon = p;
    else if (*p == ']')
      colon = NULL;
  if (colon && colon + 1 < e)
    snprintf(out, n, "%s://%.*s", tls ? "https" : "http", (int)(e - a), a);
  else
    snprintf(out, n, "%s://%.*s:%s", tls ? "https" : "http", (int)((colon ? colon : e) - a), a,
             tls ? "443" : "80");
}

int bs_http_parse_cache(const char *v, uint64_t *bytes)
{
  uint64_t n;
  if (!v || bs_parse_size(v, &n) != 0 || n < BS_HTTP_BLOCK ||
      n > (uint64_t)BS_HTTP_CACHE_BLOCKS_MAX * BS_HTTP_BLOCK)
    return -1;
  *bytes = n;
  return 0;
}

int bs_http_parse_timeout(const char *v, long *seconds)
{
  const char *p = v;
  uint64_t n;
  if (!v || !parse_u64(&p, &n) || *p || n == 0 || n > BS_HTTP_TIMEOUT_MAX_S)
    return -1;
  *seconds = (long)n;
  return 0;
}
