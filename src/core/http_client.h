/* The HTTP client of the byte source: a range request with retries,
 * deadlines, redirects and credentials, its answer's headers parsed. */
#ifndef BURNSTORE_CORE_HTTP_CLIENT_H
#define BURNSTORE_CORE_HTTP_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "burnstore/err.h"
#include "burnstore/source.h"
#include "core/http_cache.h"
#include "core/remote.h"

#define BS_HTTP_HANDLES_KEPT 8                /* idle curl handles kept for reuse */
#define BS_HTTP_SKIP_MAX ((uint64_t)64 << 20) /* a server ignoring Range: bytes skipped at most */

/* What a source and its siblings share: the cache, the handles, the
 * credentials and the tunables. */
struct bs_http_site {
  pthread_mutex_t lock;
  size_t refs;                      /* (under lock) */
  void *idle[BS_HTTP_HANDLES_KEPT]; /* idle curl handles (under lock) */
  size_t nidle;                     /* (under lock) */
  uint64_t next_id;                 /* (under lock) */
  struct bs_http_cache cache;
  char *auth; /* "Authorization: Bearer ..." or NULL */
  /* s3: Signature V4 (sigv4 "" when unsigned: no AWS_ACCESS_KEY_ID) */
  char sigv4[96];
  char *aws_id, *aws_secret, *aws_token; /* aws_token: "x-amz-security-token: ..." */
  const char *deny_hint;                 /* what a 401/403 suggests */
  long timeout_s;                        /* how long a read may block (BURNSTORE_HTTP_TIMEOUT) */
  /* The CAs TLS trusts, as the curl tool takes them: CURL_CA_BUNDLE, else
   * SSL_CERT_DIR and SSL_CERT_FILE (NULL: libcurl's default, the system's) */
  char *cainfo, *capath;
};

/* A site for rm (its credentials from o or the environment; the cache
 * size and the timeout from o, else $BURNSTORE_HTTP_CACHE and
 * $BURNSTORE_HTTP_TIMEOUT, a variable set to something else an error naming
 * it). One reference. 0, or -1 with err set. */
int bs_http_site_open(const struct bs_http_opts *o, const struct bs_remote *rm,
                      struct bs_http_site **out, bs_err *err);
void bs_http_site_ref(struct bs_http_site *sh);
void bs_http_site_unref(struct bs_http_site *sh); /* (NULL: nothing) */

/* Where a request's body goes: byte i of the range at seg[(base + i) /
 * BS_HTTP_BLOCK] + (base + i) % BS_HTTP_BLOCK (one buffer of at most a block:
 * one segment, base 0). */
struct bs_http_dst {
  uint8_t *const *seg;
  size_t base;
};

/* One request's answer. */
struct bs_http_xfer {
  struct bs_http_dst to;
  size_t cap, got;
  uint64_t skip; /* a 200 to a range request: body bytes before ours */
  long status;
  bool have_range;
  uint64_t first, last, total;
  char etag[200], lastmod[64];
  long retry_ms;
  bool overflow;   /* more body than asked for */
  char commit[72]; /* the first answer's X-Repo-Commit (the Hub) */
};

/* GET bytes first..first+n-1 of url into buf's blocks (n >= 1), with pin
 * ("If-Match: ..."; NULL or "": none) sent; auth: the site's credentials
 * go along. Ends at the deadline (CLOCK_MONOTONIC ms) and soon after *stop
 * turns true. *eff (when eff is not NULL): where the redirects led, if
 * anywhere else (bs_malloc'd). 0, or -errno with msg (mn bytes) saying
 * why, credentials left out: -ESTALE a 412 or 416, -EACCES, -ENOENT, -EIO,
 * -ECANCELED (stopped). */
int bs_http_get(struct bs_http_site *sh, const atomic_bool *stop, const char *pin, const char *url,
                bool auth, uint64_t first, const struct bs_http_dst *buf, size_t n,
                struct bs_http_xfer *out, char **eff, uint64_t deadline, char *msg, size_t mn);
/* CLOCK_MONOTONIC in milliseconds. */
uint64_t bs_http_now_ms(void);
/* Whether the last answer's first byte took over 5 ms (a link with latency). */
bool bs_http_far_link(void);

#endif
