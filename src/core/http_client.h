/* The HTTP client of the byte source: range requests on one libcurl multi
 * handle driven by one thread (http_client.c), and the sites they are made
 * for (http_site.c: a source and its siblings' cache, credentials and
 * tunables). */
#ifndef BURNSTORE_CORE_HTTP_CLIENT_H
#define BURNSTORE_CORE_HTTP_CLIENT_H

#include <curl/system.h> /* curl_off_t */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/http_cache.h"
#include "core/remote.h"
#include "core/source.h"

#define BS_HTTP_SKIP_MAX ((uint64_t)64 << 20) /* a server ignoring Range: bytes skipped at most */
#define BS_HTTP_ETAG_MAX 256                  /* the longest ETag kept (and compared) */
#define BS_HTTP_RETRY_CAP_MS 10000L           /* the longest wait to retry (Retry-After too) */

/* What a source and its siblings share. */
struct bs_http_site {
  pthread_mutex_t lock;
  size_t refs;      /* (under lock) */
  uint64_t next_id; /* (under lock) */
  struct bs_http_cache cache;
  char *auth; /* "Authorization: Bearer ..." or NULL */
  /* s3: Signature V4 (sigv4 "" when unsigned: no AWS_ACCESS_KEY_ID) */
  char sigv4[96];
  char *aws_id, *aws_secret, *aws_token; /* aws_token: "x-amz-security-token: ..." */
  const char *deny_hint;                 /* what a 401/403 suggests */
  long timeout_s;                        /* how long a read may block (BURNSTORE_HTTP_TIMEOUT) */
  bool unvalidated;                      /* a server without a strong ETag is read */
  bool as_is; /* hf://, s3://: the path sent as written (CURLOPT_PATH_AS_IS) */
  /* The CAs TLS trusts, as the curl tool takes them: CURL_CA_BUNDLE, else
   * SSL_CERT_DIR and SSL_CERT_FILE (NULL: libcurl's default, the system's) */
  char *cainfo, *capath;
  atomic_size_t ahead; /* read-ahead blocks in flight, of all its sources */
};

/* A site for rm (its credentials from o or the environment; the cache
 * size, the timeout and `unvalidated` from o, else $BURNSTORE_HTTP_CACHE,
 * $BURNSTORE_HTTP_TIMEOUT and $BURNSTORE_HTTP_UNVALIDATED, a variable set to
 * something else an error naming it). One reference. 0, or -1 with err set. */
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

/* An answer: its status, the headers the source checks, the body's bytes. */
struct bs_http_xfer {
  long status;
  size_t got;                      /* body bytes of the range written to the destination */
  bool have_range;                 /* a Content-Range "bytes FIRST-LAST/TOTAL" */
  uint64_t first, last, total;     /* (TOTAL "*": UINT64_MAX) */
  uint64_t length;                 /* Content-Length; UINT64_MAX: none */
  char etag[BS_HTTP_ETAG_MAX + 1]; /* "" when none, or longer than BS_HTTP_ETAG_MAX: */
  size_t etag_n;                   /* its length as sent (0: none) */
  char lastmod[64];                /* "" when none (or longer) */
  char encoding[32];               /* Content-Encoding other than identity ("" when none) */
  unsigned seen;                   /* (the headers above given, a bit each) */
  char twice[16];                  /* a header given twice with two values ("" when none) */
  char commit[72];                 /* the first answer's X-Repo-Commit (the Hub) */
  long retry_ms;                   /* Retry-After; -1: none */
};

struct bs_http_req;
/* Called on the client's thread when r has ended (r->rc, r->msg, r->x and
 * r->eff are set); it must not block. The last time the client touches r. */
typedef void (*bs_http_done_fn)(struct bs_http_req *r);

/* One request (caller storage, zeroed, then filled; untouched by the
 * caller until it has ended). */
struct bs_http_req {
  /* What to ask: bytes [first, first + n) of url (n >= 1) into `to`, with
   * pin ("If-Match: ..."; NULL: none) sent; auth: the site's credentials
   * go along. born: when the read it serves began, deadline: when it must
   * have ended (CLOCK_MONOTONIC ms, bs_http_now_ms); it also ends soon after
   * *stop turns true (NULL: never). want_eff: learn where redirects led. */
  struct bs_http_site *site;
  const char *url, *pin;
  bool auth, want_eff;
  uint64_t first;
  size_t n;
  struct bs_http_dst to;
  uint64_t born, deadline;
  const atomic_bool *stop;
  bs_http_done_fn done; /* NULL: the caller waits (bs_http_wait) */
  void *ud;
  /* The outcome: 0, or -errno with msg saying why (credentials left out):
   * -ESTALE a 412 or 416, -EACCES 401/403, -ENOENT 404, -ECANCELED
   * stopped, -EIO the rest. x: the last answer. eff: where the redirects
   * led when that is elsewhere (bs_malloc'd, the caller's to free). */
  int rc;
  char msg[256];
  struct bs_http_xfer x;
  char *eff;
  /* The client's own. */
  void *easy, *hdrs;
  char errbuf[256]; /* (CURL_ERROR_SIZE) */
  int attempt, state;
  long backoff;
  uint64_t next_try, skip;
  uint64_t body_base; /* bytes received before this answer's body */
  bool cancel, ended, started, err_cut;
  struct bs_http_req *next;
};

/* libcurl, once. 0, or -1 with err set. */
int bs_http_client_init(bs_err *err);
/* Start r (the client's thread starts with the first request); r->done
 * (or bs_http_wait) tells when it has ended. 0; -errno (r not started, no
 * callback) when the thread cannot be started or r's read was cancelled by
 * bs_http_cancel_all. */
int bs_http_submit(struct bs_http_req *r);
/* Wait until r (submitted, no done callback) has ended. */
void bs_http_wait(struct bs_http_req *r);
/* End r soon with -ECANCELED, if it has not ended (its done is called). */
void bs_http_cancel(struct bs_http_req *r);
/* Have the client look at the stop flags now (one was set). */
void bs_http_wake(void);
/* End every request whose read began before now (-ECANCELED), and refuse
 * such reads' later requests: the mount ended, its readers are gone. */
void bs_http_cancel_all(void);
/* Stop the client's thread, ending what is in flight (-ECANCELED): before
 * a fork not followed by exec (the daemon's), so that the child starts its
 * own thread at its first request. Connections stay open. */
void bs_http_client_stop(void);

/* A request made and waited for: bytes [first, first + n) of url into
 * buf's blocks, ending at the deadline or soon after *stop. 0 or -errno
 * (as r->rc), msg (mn bytes) saying why; *out the answer; *eff (when eff is
 * not NULL) where the redirects led, if elsewhere. */
int bs_http_get(struct bs_http_site *sh, const atomic_bool *stop, const char *pin, const char *url,
                bool auth, uint64_t first, const struct bs_http_dst *buf, size_t n,
                struct bs_http_xfer *out, char **eff, uint64_t deadline, char *msg, size_t mn);
/* http_answer.c: libcurl's header and write callbacks of a request (ud:
 * the bs_http_req), on the client's thread. */
size_t bs_http_on_header(char *line, size_t size, size_t nitems, void *ud);
size_t bs_http_on_body(char *data, size_t size, size_t nmemb, void *ud);
int bs_http_on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                        curl_off_t ulnow);
/* CLOCK_MONOTONIC in milliseconds. */
uint64_t bs_http_now_ms(void);
/* Whether the last answer's first byte took over 5 ms (a link with latency). */
bool bs_http_far_link(void);
/* The transfer rate of the last answers, one connection's (bytes a
 * second, an average; 0: none yet). */
uint64_t bs_http_conn_rate(void);

#endif
