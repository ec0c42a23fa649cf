/* The HTTP client of the byte source (http_client.h): range requests by
 * libcurl with retries and backoff, deadlines, redirects, TLS trust, the
 * Hub's token and S3's Signature V4. curl easy handles are not thread-safe:
 * each request takes one from a small pool (connections are reused through
 * it). */
#include <curl/curl.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/http_client.h"

enum {
  TRIES = 6,              /* attempts of one request (5 retries) */
  BACKOFF_MS = 200,       /* first retry's wait, doubled each time */
  RETRY_CAP_MS = 10000,   /* the longest wait (Retry-After included) */
  MAX_REDIRS = 8,         /* redirect hops followed */
  CONNECT_TIMEOUT_S = 15, /* connection */
  LOW_SPEED_S = 30,       /* under 1 byte/s for this long: a stalled transfer */
  TIMEOUT_S = 60,         /* a read blocks at most this long (BURNSTORE_HTTP_TIMEOUT) */
  FAR_US = 5000,          /* a request's first byte later than this: latency */
};
#define CACHE_DEFAULT ((uint64_t)64 << 20)

/* The last request's first byte came after FAR_US. */
static atomic_bool far_link;

bool bs_http_far_link(void)
{
  return atomic_load(&far_link);
}

static bool stopping(const atomic_bool *stop)
{
  return stop && atomic_load(stop);
}

void bs_http_site_unref(struct bs_http_site *sh)
{
  if (!sh)
    return;
  pthread_mutex_lock(&sh->lock);
  bool last = --sh->refs == 0;
  pthread_mutex_unlock(&sh->lock);
  if (!last)
    return;
  for (size_t i = 0; i < sh->nidle; i++)
    curl_easy_cleanup(sh->idle[i]);
  bs_http_cache_destroy(&sh->cache);
  bs_free(sh->cainfo);
  bs_free(sh->capath);
  char *secrets[] = {sh->auth, sh->aws_id, sh->aws_secret, sh->aws_token};
  for (size_t i = 0; i < sizeof secrets / sizeof *secrets; i++)
    if (secrets[i]) {
      memset(secrets[i], 0, strlen(secrets[i]));
      bs_free(secrets[i]);
    }
  pthread_mutex_destroy(&sh->lock);
  bs_free(sh);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_global_rc = CURLE_FAILED_INIT;

static void curl_global(void)
{
  curl_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* The credentials of rm's kind: the Hub's token, S3's keys (from the
 * environment), an HTTP server's BURNSTORE_HTTP_TOKEN. false: no memory. */
static bool site_creds(struct bs_http_site *sh, const struct bs_http_opts *o,
                       const struct bs_remote *rm)
{
  char *tok = NULL;
  sh->deny_hint = "a token: BURNSTORE_HTTP_TOKEN";
  if (o && o->bearer) {
    tok = bs_strdup(o->bearer);
  } else if (rm->kind == BS_REMOTE_HF) {
    tok = bs_hf_token();
    sh->deny_hint = "a gated or private repository needs a token: HF_TOKEN, or $HF_HOME/token";
  } else if (rm->kind == BS_REMOTE_HTTP && getenv("BURNSTORE_HTTP_TOKEN")) {
    tok = bs_strdup(getenv("BURNSTORE_HTTP_TOKEN"));
  }
  bool want = tok && *tok;
  if (want) {
    size_t n = strlen(tok) + 32;
    if ((sh->auth = bs_malloc(n)))
      snprintf(sh->auth, n, "Authorization: Bearer %s", tok);
  }
  if (tok) {
    memset(tok, 0, strlen(tok));
    bs_free(tok);
  }
  if (want && !sh->auth)
    return false;
  if (rm->kind != BS_REMOTE_S3)
    return true;
  sh->deny_hint = "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and "
                  "AWS_REGION";
  const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
  const char *session = getenv("AWS_SESSION_TOKEN");
  if (!id || !*id) /* unsigned requests: a public bucket */
    return true;
  memcpy(sh->sigv4, rm->sigv4, sizeof sh->sigv4);
  if (!(sh->aws_id = bs_strdup(id)) || !(sh->aws_secret = bs_strdup(secret ? secret : "")))
    return false;
  if (session && *session) {
    size_t n = strlen(session) + 32;
    if (!(sh->aws_token = bs_malloc(n)))
      return false;
    snprintf(sh->aws_token, n, "x-amz-security-token: %s", session);
  }
  return true;
}

/* The cache size and read timeout: opts', else $BURNSTORE_HTTP_CACHE's and
 * $BURNSTORE_HTTP_TIMEOUT's, else the defaults. A variable that is set to
 * something else is an error naming it (it was taken as the default). */
static int tunables(const struct bs_http_opts *o, uint64_t *cache, long *timeout_s, bs_err *err)
{
  const char *v;
  *cache = CACHE_DEFAULT;
  *timeout_s = TIMEOUT_S;
  if (o && o->cache_bytes)
    *cache = o->cache_bytes;
  else if ((v = getenv("BURNSTORE_HTTP_CACHE")) && bs_http_parse_cache(v, cache) != 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "BURNSTORE_HTTP_CACHE='%.40s' is not a cache size (1M to 16G; K, M, G "
                   "binary, e.g. 256M)",
                   v);
  if (o && o->timeout_s)
    *timeout_s = o->timeout_s;
  else if ((v = getenv("BURNSTORE_HTTP_TIMEOUT")) && bs_http_parse_timeout(v, timeout_s) != 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "BURNSTORE_HTTP_TIMEOUT='%.40s' is not whole seconds from 1 to %d", v,
                   BS_HTTP_TIMEOUT_MAX_S);
  return 0;
}

static struct bs_http_site *site_new(const struct bs_http_opts *o, const struct bs_remote *rm,
                                     uint64_t cache, long timeout_s)
{
  struct bs_http_site *sh = bs_calloc(1, sizeof *sh);
  if (!sh)
    return NULL;
  if (pthread_mutex_init(&sh->lock, NULL) != 0) {
    bs_free(sh);
    return NULL;
  }
  sh->refs = 1;
  sh->timeout_s = timeout_s;
  const char *bundle = getenv("CURL_CA_BUNDLE"), *dir = getenv("SSL_CERT_DIR");
  const char *file = getenv("SSL_CERT_FILE");
  if ((bundle && *bundle && !(sh->cainfo = bs_strdup(bundle))) ||
      (!bundle && dir && *dir && !(sh->capath = bs_strdup(dir))) ||
      (!bundle && file && *file && !(sh->cainfo = bs_strdup(file)))) {
    bs_http_site_unref(sh);
    return NULL;
  }
  if (bs_http_cache_init(&sh->cache, BS_HTTP_BLOCK, cache)) {
    bs_http_site_unref(sh);
    return NULL;
  }
  if (!site_creds(sh, o, rm)) {
    bs_http_site_unref(sh);
    return NULL;
  }
  return sh;
}

static CURL *handle_get(struct bs_http_site *sh)
{
  pthread_mutex_lock(&sh->lock);
  CURL *c = sh->nidle ? sh->idle[--sh->nidle] : NULL;
  pthread_mutex_unlock(&sh->lock);
  return c ? c : curl_easy_init();
}

static void handle_put(struct bs_http_site *sh, CURL *c)
{
  pthread_mutex_lock(&sh->lock);
  if (sh->nidle < BS_HTTP_HANDLES_KEPT) {
    sh->idle[sh->nidle++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&sh->lock);
  if (c)
    curl_easy_cleanup(c);
}

static size_t on_header(char *line, size_t size, size_t nitems, void *ud)
{
  struct bs_http_xfer *x = ud;
  size_t n = size * nitems;
  const char *v;
  size_t vn;
  if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) { /* a new answer (after a redirect) */
    x->have_range = false;
    x->etag[0] = x->lastmod[0] = '\0';
    x->retry_ms = -1;
  } else if (bs_http_header_is(line, n, "Content-Range", &v, &vn)) {
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%.*s", (int)(vn < sizeof tmp ? vn : sizeof tmp - 1), v);
    x->have_range = bs_http_content_range(tmp, &x->first, &x->last, &x->total) == 0;
  } else if (bs_http_header_is(line, n, "ETag", &v, &vn)) {
    if (vn < sizeof x->etag)
      snprintf(x->etag, sizeof x->etag, "%.*s", (int)vn, v);
  } else if (bs_http_header_is(line, n, "Last-Modified", &v, &vn)) {
    if (vn < sizeof x->lastmod)
      snprintf(x->lastmod, sizeof x->lastmod, "%.*s", (int)vn, v);
  } else if (bs_http_header_is(line, n, "X-Repo-Commit", &v, &vn)) {
    if (!x->commit[0]) /* (the Hub's answer, not its CDN's after the redirect) */
      snprintf(x->commit, sizeof x->commit, "%.*s",
               (int)(vn < sizeof x->commit ? vn : sizeof x->commit - 1), v);
  } else if (bs_http_header_is(line, n, "Retry-After", &v, &vn)) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%.*s", (int)(vn < sizeof tmp ? vn : sizeof tmp - 1), v);
    x->retry_ms = bs_http_retry_after(tmp, RETRY_CAP_MS);
  }
  return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
  struct bs_http_xfer *x = ud;
  size_t n = size * nmemb, used = 0;
  if (x->skip) {
    size_t k = x->skip < n ? (size_t)x->skip : n;
    x->skip -= k;
    used = k;
  }
  size_t room = x->cap - x->got, k = n - used;
  if (k > room) {
    x->overflow = true;
    k = room;
  }
  for (size_t done = 0; done < k;) { /* straight into the blocks */
    size_t at = x->to.base + x->got, in = at % BS_HTTP_BLOCK, m = BS_HTTP_BLOCK - in;
    if (m > k - done)
      m = k - done;
    memcpy(x->to.seg[at / BS_HTTP_BLOCK] + in, data + used + done, m);
    done += m;
    x->got += m;
  }
  /* Our range is complete: stop a body that goes on (a 200 to a range). */
  return x->got == x->cap && used + k < n ? 0 : n;
}

static bool retryable(CURLcode rc)
{
  switch (rc) {
  case CURLE_COULDNT_CONNECT:
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_PARTIAL_FILE:
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM: return true;
  default: return false;
  }
}

static void sleep_ms(long ms)
{
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

uint64_t bs_http_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct req {
  struct bs_http_xfer x;
  CURL *c;
  uint64_t first; /* asked for */
  bool started;
  const atomic_bool *stop; /* (NULL: the opening request) */
  uint64_t deadline;       /* CLOCK_MONOTONIC ms */
};

/* libcurl calls this at least once a second, also while no byte comes:
 * a released source's requests end, and so does one past its deadline. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  const struct req *r = ud;
  return stopping(r->stop) || bs_http_now_ms() >= r->deadline;
}

/* Why a request of h (NULL: the opening one) stops now: -ECANCELED (h
 * released), -EIO (past the deadline; msg, holding the last attempt's
 * failure or "", says so), or 0 (it goes on). */
static int stopped(const struct bs_http_site *sh, const atomic_bool *stop, uint64_t now,
                   uint64_t deadline, char *msg, size_t mn)
{
  if (stopping(stop)) {
    snprintf(msg, mn, "cancelled: the source was closed");
    return -ECANCELED;
  }
  if (now < deadline)
    return 0;
  char last[160];
  snprintf(last, sizeof last, "%s", msg);
  snprintf(msg, mn, "no answer within %ld s (BURNSTORE_HTTP_TIMEOUT)%s%s", sh->timeout_s,
           last[0] ? ": " : "", last);
  return -EIO;
}

/* Wait ms, or less: until the deadline, or h is released. */
static void wait_ms(const atomic_bool *stop, long ms, uint64_t deadline)
{
  uint64_t end = bs_http_now_ms() + (uint64_t)ms;
  if (end > deadline)
    end = deadline;
  for (uint64_t t = bs_http_now_ms(); t < end && !stopping(stop); t = bs_http_now_ms())
    sleep_ms(end - t < 100 ? (long)(end - t) : 100);
}

/* Only a success's body is ours (an error page is drained). A 200 to a
 * range request is the whole object: ours starts `first` bytes in, skipped
 * up to BS_HTTP_SKIP_MAX (beyond, the transfer stops: refused). */
static size_t on_body_checked(char *data, size_t size, size_t nmemb, void *ud)
{
  struct req *r = ud;
  long code = 0;
  curl_easy_getinfo(r->c, CURLINFO_RESPONSE_CODE, &code);
  if (code != 200 && code != 206)
    return size * nmemb;
  if (!r->started) {
    r->started = true;
    if (code == 200) {
      if (r->first > BS_HTTP_SKIP_MAX)
        return 0;
      r->x.skip = r->first;
    }
  }
  return on_body(data, size, nmemb, &r->x);
}

int bs_http_get(struct bs_http_site *sh, const atomic_bool *stop, const char *pin, const char *url,
                bool auth, uint64_t first, const struct bs_http_dst *buf, size_t n,
                struct bs_http_xfer *out, char **eff, uint64_t deadline, char *msg, size_t mn)
{
  memset(out, 0, sizeof *out);
  CURL *c = handle_get(sh);
  if (!c) {
    snprintf(msg, mn, "cannot create an HTTP handle");
    return -ENOMEM;
  }
  char range[64];
  snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)first,
           (unsigned long long)(first + n - 1));
  struct curl_slist *hdrs = NULL, *t;
  if (auth && sh->auth && (t = curl_slist_append(hdrs, sh->auth)))
    hdrs = t;
  if (pin && pin[0] && (t = curl_slist_append(hdrs, pin)))
    hdrs = t;
  /* S3: libcurl signs (SigV4). libcurl 7.88 adds no x-amz-content-sha256
   * itself, and signs the value given here as the payload's hash. */
  bool sign = auth && sh->sigv4[0];
  if (sign && (t = curl_slist_append(hdrs, "x-amz-content-sha256: UNSIGNED-PAYLOAD")))
    hdrs = t;
  if (sign && sh->aws_token && (t = curl_slist_append(hdrs, sh->aws_token)))
    hdrs = t;
  /* libcurl drops only its own auth at a redirect to another host, never a
   * header given here: with the session token in them, none is followed. */
  bool follow = !(sign && sh->aws_token);
  int rc = -EIO;
  long wait = BACKOFF_MS;
  msg[0] = '\0';
  for (int attempt = 1; attempt <= TRIES; attempt++) {
    uint64_t now = bs_http_now_ms();
    if ((rc = stopped(sh, stop, now, deadline, msg, mn)) != 0)
      break;
    rc = -EIO;
    long low = sh->timeout_s < LOW_SPEED_S ? sh->timeout_s : LOW_SPEED_S;
    struct req r = {.c = c, .first = first, .stop = stop, .deadline = deadline};
    r.x.to = *buf;
    r.x.cap = n;
    r.x.retry_ms = -1;
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, (long)MAX_REDIRS);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_S);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, low);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(deadline - now));
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &r);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body_checked);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "burnstore");
    if (sh->cainfo)
      curl_easy_setopt(c, CURLOPT_CAINFO, sh->cainfo);
    if (sh->capath)
      curl_easy_setopt(c, CURLOPT_CAPATH, sh->capath);
    if (sign) {
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sh->sigv4);
      curl_easy_setopt(c, CURLOPT_USERNAME, sh->aws_id);
      curl_easy_setopt(c, CURLOPT_PASSWORD, sh->aws_secret);
    }
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L << 10); /* fewer, larger body callbacks */
    CURLcode cc = curl_easy_perform(c);
    curl_off_t ttfb = 0; /* (a reused connection's: the round trip and the server) */
    if (cc == CURLE_OK && curl_easy_getinfo(c, CURLINFO_STARTTRANSFER_TIME_T, &ttfb) == CURLE_OK)
      atomic_store(&far_link, ttfb > FAR_US);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    *out = r.x;
    out->status = code;
    bool done_early = cc == CURLE_WRITE_ERROR && r.x.got == n;
    if (cc != CURLE_OK && !done_early) {
      snprintf(msg, mn, "%s", cerr[0] ? cerr : curl_easy_strerror(cc));
      rc = -EIO;
      /* (stopped by on_progress, or by CURLOPT_TIMEOUT_MS: the loop's
       * start says which) */
      if (cc == CURLE_ABORTED_BY_CALLBACK || cc == CURLE_OPERATION_TIMEDOUT) {
        if (cc == CURLE_ABORTED_BY_CALLBACK)
          msg[0] = '\0';
        if ((rc = stopped(sh, stop, bs_http_now_ms(), deadline, msg, mn)) != 0)
          break;
        rc = -EIO;
      }
      if (retryable(cc) && attempt < TRIES)
        goto retry;
      break;
    }
    if (code == 412 || code == 416) {
      snprintf(msg, mn, "the object changed on the server (HTTP %ld to a conditional request)",
               code);
      rc = -ESTALE;
      break;
    }
    if (code == 429 || code >= 500) {
      snprintf(msg, mn, "HTTP %ld", code);
      rc = -EIO;
      if (attempt < TRIES)
        goto retry;
      break;
    }
    if (code == 401 || code == 403) {
      snprintf(msg, mn, "HTTP %ld: access denied (%s)", code, sh->deny_hint);
      rc = -EACCES;
      break;
    }
    if (code == 404) {
      snprintf(msg, mn, "HTTP 404: no such file on the server");
      rc = -ENOENT;
      break;
    }
    if (!follow && code >= 300 && code < 400) {
      snprintf(msg, mn,
               "HTTP %ld: a redirect, not followed with AWS_SESSION_TOKEN set (the token would go "
               "to the redirect's host)",
               code);
      rc = -EIO;
      break;
    }
    if (code != 200 && code != 206) {
      snprintf(msg, mn, "HTTP %ld", code);
      rc = -EIO;
      break;
    }
    rc = 0;
    break;
  retry:;
    long ms = r.x.retry_ms >= 0 ? r.x.retry_ms : wait;
    wait_ms(stop, ms, deadline);
    wait = wait * 2 > RETRY_CAP_MS ? RETRY_CAP_MS : wait * 2;
  }
  if (rc == 0 && eff) { /* where the redirects led */
    char *e = NULL;
    if (curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &e) == CURLE_OK && e && strcmp(e, url) != 0)
      *eff = bs_strdup(e);
  }
  curl_slist_free_all(hdrs);
  handle_put(sh, c);
  return rc;
}

/* The origin of an http(s) URL, "scheme://host:port" (the port written
 * out: 80 or 443 when none is), without user-info, into out. */

void bs_http_site_ref(struct bs_http_site *sh)
{
  pthread_mutex_lock(&sh->lock);
  sh->refs++;
  pthread_mutex_unlock(&sh->lock);
}

int bs_http_site_open(const struct bs_http_opts *o, const struct bs_remote *rm,
                      struct bs_http_site **out, bs_err *err)
{
  *out = NULL;
  pthread_once(&curl_once, curl_global);
  if (curl_global_rc != CURLE_OK)
    return bs_fail(err, EIO, BS_OFF_NONE, NULL, "cannot initialise libcurl: %s",
                   curl_easy_strerror(curl_global_rc));
  uint64_t cache;
  long timeout_s;
  if (tunables(o, &cache, &timeout_s, err) != 0)
    return -1;
  if (!(*out = site_new(o, rm, cache, timeout_s)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  return 0;
}
