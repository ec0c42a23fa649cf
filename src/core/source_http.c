/* A byte source on an HTTP(S) server: range requests through libcurl.
 *
 * One request at open (bytes=0-0) learns the size and pins the ETag (or,
 * without a strong one, Last-Modified); every later request carries
 * If-Match (If-Unmodified-Since) and is checked again on the answer, so an
 * object replaced on the server fails reads with EIO, never mixes bytes.
 * The opening request fetches the first 64 KiB (a header's start, kept).
 * Bytes come through a bounded cache of 1 MiB blocks shared by a source and
 * its siblings (shards); a request writes straight into fresh blocks that
 * the cache takes over. A read that is not (yet) sequential fetches what it
 * asked for; while a file is read on, read-ahead doubles up to 32 blocks
 * (at most half the cache) and goes out as parallel requests of 4 blocks on
 * a pool of threads (4 at once, 8 on a link with latency). A FUSE read is
 * answered from the blocks themselves (http_view: pinned, not copied). curl easy handles are not
 * thread-safe: each request takes one from a small pool (connections are reused through it). */
#include <assert.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "burnstore/source.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/http.h"
#include "core/remote.h"

enum {
  BLOCK = 1 << 20,        /* cache block */
  FIRST = 64 << 10,       /* the opening request's bytes (a header's start) */
  RA_MAX = 32,            /* read-ahead: at most this many blocks ahead */
  CHUNK = 4,              /* blocks of one read-ahead request */
  WORKERS = 4,            /* read-ahead requests at once (all sources) */
  WORKERS_FAR = 8,        /* the same on a link with latency (threads) */
  FAR_US = 5000,          /* a request's first byte later than this: latency */
  HANDLES_KEPT = 8,       /* idle curl handles kept for reuse */
  TRIES = 6,              /* attempts of one request (5 retries) */
  BACKOFF_MS = 200,       /* first retry's wait, doubled each time */
  RETRY_CAP_MS = 10000,   /* the longest wait (Retry-After included) */
  MAX_REDIRS = 8,         /* redirect hops followed */
  SKIP_MAX = 64 << 20,    /* a server ignoring Range: bytes skipped at most */
  CONNECT_TIMEOUT_S = 15, /* connection */
  LOW_SPEED_S = 30,       /* under 1 byte/s for this long: a stalled transfer */
  TIMEOUT_S = 60,         /* a read blocks at most this long (BURNSTORE_HTTP_TIMEOUT) */
  TIMEOUT_MAX_S = 3600,   /* the longest BURNSTORE_HTTP_TIMEOUT taken */
  FLYING = 32,            /* ranges in flight or queued, tracked (all sources) */
  BAD_MS = 2000,          /* a failed range fails again at once this long */
};
#define CACHE_DEFAULT ((uint64_t)64 << 20)

/* The last request's first byte came after FAR_US: WORKERS_FAR requests at
 * once cover the round trips (on loopback, 8 were slower than 4). */
static atomic_bool far_link;

/* ---- pure pieces (http.h) ---- */

static bool is_http(const char *s)
{
  return s && (strncasecmp(s, "http://", 7) == 0 || strncasecmp(s, "https://", 8) == 0);
}

bool bs_src_is_url(const char *s)
{
  return is_http(s) || (s && (strncasecmp(s, "hf://", 5) == 0 || strncasecmp(s, "s3://", 5) == 0));
}

/* Where the authority (after "scheme://") starts and ends in url. */
static bool authority(const char *url, const char **a, const char **e)
{
  const char *p = strstr(url, "://");
  if (!p || !is_http(url))
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

static bool parse_u64(const char **p, uint64_t *v)
{
  const char *s = *p;
  uint64_t x = 0;
  if (*s < '0' || *s > '9')
    return false;
  for (; *s >= '0' && *s <= '9'; s++)
    if (!bs_mul_u64(x, 10, &x) || !bs_add_u64(x, (uint64_t)(*s - '0'), &x))
      return false;
  *p = s;
  *v = x;
  return true;
}

int bs_http_content_range(const char *val, uint64_t *first, uint64_t *last, uint64_t *total)
{
  const char *p = val;
  while (*p == ' ' || *p == '\t')
    p++;
  if (strncasecmp(p, "bytes", 5) != 0)
    return -1;
  p += 5;
  while (*p == ' ')
    p++;
  if (!parse_u64(&p, first) || *p++ != '-' || !parse_u64(&p, last) || *p++ != '/')
    return -1;
  if (*p == '*') {
    *total = UINT64_MAX;
    p++;
  } else if (!parse_u64(&p, total)) {
    return -1;
  }
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
    p++;
  if (*p || *last < *first || (*total != UINT64_MAX && *last >= *total))
    return -1;
  return 0;
}

long bs_http_retry_after(const char *val, long cap_ms)
{
  const char *p = val;
  while (*p == ' ' || *p == '\t')
    p++;
  uint64_t s;
  if (!parse_u64(&p, &s))
    return -1;
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
    p++;
  if (*p)
    return -1;
  return s > (uint64_t)cap_ms / 1000 ? cap_ms : (long)s * 1000;
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

/* ---- the block cache ---- */

struct bs_http_block {
  uint64_t id, idx, used;
  uint8_t *data; /* NULL: a free slot */
  size_t len;
  unsigned pins; /* readers replying from data: neither evicted nor replaced */
};

int bs_http_cache_init(struct bs_http_cache *c, size_t block, uint64_t bytes)
{
  memset(c, 0, sizeof *c);
  c->block = block;
  /* (a lookup scans the slots: a bound keeps it a few microseconds) */
  uint64_t nb = bytes / block;
  c->nmax = nb == 0 ? 1 : nb > BS_HTTP_CACHE_BLOCKS_MAX ? BS_HTTP_CACHE_BLOCKS_MAX : (size_t)nb;
  c->b = bs_calloc(c->nmax, sizeof *c->b);
  if (!c->b || pthread_mutex_init(&c->lock, NULL) != 0) {
    bs_free(c->b);
    c->b = NULL;
    return -ENOMEM;
  }
  return 0;
}

void bs_http_cache_destroy(struct bs_http_cache *c)
{
  if (!c->b)
    return;
  for (size_t i = 0; i < c->nmax; i++)
    bs_free(c->b[i].data);
  for (size_t i = 0; i < c->nspare; i++)
    bs_free(c->spare[i]);
  bs_free(c->b);
  c->b = NULL;
  pthread_mutex_destroy(&c->lock);
}

static struct bs_http_block *cache_find(struct bs_http_cache *c, uint64_t id, uint64_t idx)
{
  for (size_t i = 0; i < c->nmax; i++)
    if (c->b[i].data && c->b[i].id == id && c->b[i].idx == idx)
      return &c->b[i];
  return NULL;
}

long bs_http_cache_get(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t off, void *dst,
                       size_t n)
{
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  long r = -1;
  if (b) {
    b->used = ++c->tick;
    size_t k = off < b->len ? b->len - off : 0;
    if (k > n)
      k = n;
    memcpy(dst, b->data + off, k);
    r = (long)k;
  }
  pthread_mutex_unlock(&c->lock);
  return r;
}

size_t bs_http_cache_prefix(struct bs_http_cache *c, uint64_t id, uint64_t idx, void *dst,
                            size_t max)
{
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  size_t k = 0;
  if (b) {
    k = b->len < max ? b->len : max;
    memcpy(dst, b->data, k);
  }
  pthread_mutex_unlock(&c->lock);
  return k;
}

bool bs_http_cache_has(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t len)
{
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  bool r = b && b->len >= len;
  pthread_mutex_unlock(&c->lock);
  return r;
}

bool bs_http_cache_put(struct bs_http_cache *c, uint64_t id, uint64_t idx, const void *data,
                       size_t len)
{
  if (len > c->block)
    return false;
  uint8_t *copy = bs_malloc(len ? len : 1);
  if (!copy)
    return false;
  memcpy(copy, data, len);
  bs_http_cache_put_owned(c, id, idx, copy, len);
  return true;
}

/* A block buffer given up (under c->lock): kept for reuse when it is a
 * whole block and there is room, else freed. */
static void spare_put(struct bs_http_cache *c, uint8_t *data, size_t len)
{
  if (len == c->block && c->nspare < BS_HTTP_SPARE)
    c->spare[c->nspare++] = data;
  else
    bs_free(data);
}

uint8_t *bs_http_cache_block(struct bs_http_cache *c)
{
  pthread_mutex_lock(&c->lock);
  uint8_t *b = c->nspare ? c->spare[--c->nspare] : NULL;
  pthread_mutex_unlock(&c->lock);
  return b ? b : bs_malloc(c->block);
}

void bs_http_cache_put_owned(struct bs_http_cache *c, uint64_t id, uint64_t idx, uint8_t *data,
                             size_t len)
{
  if (len > c->block) {
    bs_free(data);
    return;
  }
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  /* As long already (another reader's), or shorter but pinned (its bytes
   * are being sent): keep it. */
  if (b && (b->len >= len || b->pins)) {
    b->used = ++c->tick;
    spare_put(c, data, len);
    pthread_mutex_unlock(&c->lock);
    return;
  }
  if (!b) { /* a free slot, else the least recently used that is not pinned */
    for (size_t i = 0; i < c->nmax; i++) {
      struct bs_http_block *x = &c->b[i];
      if (!x->data) {
        b = x;
        break;
      }
      if (!x->pins && (!b || x->used < b->used))
        b = x;
    }
    if (!b) { /* every block pinned: this one is not kept */
      spare_put(c, data, len);
      pthread_mutex_unlock(&c->lock);
      return;
    }
  }
  if (!b->data)
    c->n++;
  else
    spare_put(c, b->data, b->len);
  *b = (struct bs_http_block){.id = id, .idx = idx, .used = ++c->tick, .data = data, .len = len};
  pthread_mutex_unlock(&c->lock);
}

bool bs_http_cache_pin(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t off, size_t n,
                       const uint8_t **p)
{
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  bool ok = b && off <= b->len && n <= b->len - off;
  if (ok) {
    b->used = ++c->tick;
    b->pins++;
    *p = b->data + off;
  }
  pthread_mutex_unlock(&c->lock);
  return ok;
}

void bs_http_cache_unpin(struct bs_http_cache *c, uint64_t id, uint64_t idx)
{
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  assert(b && b->pins > 0); /* (a pinned block stays) */
  if (b && b->pins)
    b->pins--;
  pthread_mutex_unlock(&c->lock);
}

void bs_http_cache_unused(struct bs_http_cache *c, uint8_t *data, size_t len)
{
  pthread_mutex_lock(&c->lock);
  spare_put(c, data, len);
  pthread_mutex_unlock(&c->lock);
}

size_t bs_http_cache_bytes(struct bs_http_cache *c)
{
  pthread_mutex_lock(&c->lock);
  size_t t = 0;
  for (size_t i = 0; i < c->nmax; i++)
    if (c->b[i].data)
      t += c->b[i].len;
  pthread_mutex_unlock(&c->lock);
  return t;
}

/* ---- what a source and its siblings share: the cache, the handles ---- */

struct shared {
  pthread_mutex_t lock;
  size_t refs;              /* (under lock) */
  CURL *idle[HANDLES_KEPT]; /* (under lock) */
  size_t nidle;             /* (under lock) */
  uint64_t next_id;         /* (under lock) */
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
  bool as_is; /* hf://, s3://: the path sent as written (CURLOPT_PATH_AS_IS) */
};

static void shared_unref(struct shared *sh)
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

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);

static void curl_global(void)
{
  curl_global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

int bs_http_parse_cache(const char *v, uint64_t *bytes)
{
  const char *p = v;
  uint64_t n, mul = 1;
  if (!v || !parse_u64(&p, &n))
    return -1;
  switch (*p) {
  case 'k':
  case 'K':
    mul = 1 << 10;
    p++;
    break;
  case 'm':
  case 'M':
    mul = 1 << 20;
    p++;
    break;
  case 'g':
  case 'G':
    mul = 1 << 30;
    p++;
    break;
  default: break;
  }
  if (*p && strcmp(p, "iB") != 0 && strcmp(p, "B") != 0)
    return -1;
  if (!bs_mul_u64(n, mul, &n) || n < BLOCK || n > (uint64_t)BS_HTTP_CACHE_BLOCKS_MAX * BLOCK)
    return -1;
  *bytes = n;
  return 0;
}

int bs_http_parse_timeout(const char *v, long *seconds)
{
  const char *p = v;
  uint64_t n;
  if (!v || !parse_u64(&p, &n) || *p || n == 0 || n > TIMEOUT_MAX_S)
    return -1;
  *seconds = (long)n;
  return 0;
}

/* The credentials of rm's kind: the Hub's token, S3's keys (from the
 * environment), an HTTP server's BURNSTORE_HTTP_TOKEN. false: no memory. */
static bool shared_creds(struct shared *sh, const struct bs_http_opts *o,
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
                   TIMEOUT_MAX_S);
  return 0;
}

static struct shared *shared_new(const struct bs_http_opts *o, const struct bs_remote *rm,
                                 uint64_t cache, long timeout_s)
{
  struct shared *sh = bs_calloc(1, sizeof *sh);
  if (!sh)
    return NULL;
  if (pthread_mutex_init(&sh->lock, NULL) != 0) {
    bs_free(sh);
    return NULL;
  }
  sh->refs = 1;
  sh->timeout_s = timeout_s;
  sh->as_is = rm->kind != BS_REMOTE_HTTP;
  const char *bundle = getenv("CURL_CA_BUNDLE"), *dir = getenv("SSL_CERT_DIR");
  const char *file = getenv("SSL_CERT_FILE");
  if ((bundle && *bundle && !(sh->cainfo = bs_strdup(bundle))) ||
      (!bundle && dir && *dir && !(sh->capath = bs_strdup(dir))) ||
      (!bundle && file && *file && !(sh->cainfo = bs_strdup(file)))) {
    shared_unref(sh);
    return NULL;
  }
  if (bs_http_cache_init(&sh->cache, BLOCK, cache)) {
    shared_unref(sh);
    return NULL;
  }
  if (!shared_creds(sh, o, rm)) {
    shared_unref(sh);
    return NULL;
  }
  return sh;
}

static CURL *handle_get(struct shared *sh)
{
  pthread_mutex_lock(&sh->lock);
  CURL *c = sh->nidle ? sh->idle[--sh->nidle] : NULL;
  pthread_mutex_unlock(&sh->lock);
  return c ? c : curl_easy_init();
}

static void handle_put(struct shared *sh, CURL *c)
{
  pthread_mutex_lock(&sh->lock);
  if (sh->nidle < HANDLES_KEPT) {
    sh->idle[sh->nidle++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&sh->lock);
  if (c)
    curl_easy_cleanup(c);
}

/* ---- one source ---- */

struct http {
  struct shared *sh;
  struct bs_remote rm; /* what was asked for: hf://, s3:// or http(s):// */
  char *url;           /* rm.url, with what credentials it holds: never printed */
  char *reopen;        /* bs_remote_reopen(&rm) once open (NULL: none) */
  uint64_t id;
  char pin[256];       /* "If-Match: ..." or "If-Unmodified-Since: ..." */
  char etag[200];      /* the pinned ETag ("" if none) */
  atomic_bool gone;    /* the object changed: every read fails */
  atomic_bool closing; /* released: running requests stop, none starts */
  uint64_t size;       /* the object's (s->size) */
  const char *name;    /* s->name (it outlives every fetch: release waits) */
  pthread_mutex_t lock;
  char why[256];    /* (under lock, once gone) */
  uint64_t seq_end; /* where reading got to (read-ahead) (under lock) */
  unsigned run;     /* reads in a row that went on from seq_end (under lock) */
  uint64_t ahead;   /* read-ahead asked for up to this block (under lock) */
  /* The last failed read's range, and until when (CLOCK_MONOTONIC ms) a
   * read that overlaps it fails at once, unlogged: the kernel reads a
   * range again after an error (a line and the retries once). The range
   * the reader asked for: a read of the next tensor in the same block
   * fetches again, and logs its own failure (under lock) */
  uint64_t bad_from, bad_to, bad_until;
  char *eff;     /* where url redirects to, or NULL (under lock) */
  bool eff_auth; /* eff is on url's host: the token goes there too (under lock) */
};

static bool closing(const struct http *h)
{
  return h && atomic_load(&h->closing);
}

/* The object changed: every later read fails; why is kept for `changed`. */
static void mark_gone(struct http *h, const char *why)
{
  pthread_mutex_lock(&h->lock);
  if (!atomic_load(&h->gone))
    snprintf(h->why, sizeof h->why, "%.*s", (int)sizeof h->why - 1, why);
  atomic_store(&h->gone, true);
  pthread_mutex_unlock(&h->lock);
}

/* Where a request's body goes: byte i of the range at seg[(base + i) /
 * BLOCK] + (base + i) % BLOCK (one buffer of at most BLOCK bytes: one
 * segment, base 0). */
struct dst {
  uint8_t *const *seg;
  size_t base;
};

/* One request's answer. */
struct xfer {
  struct dst to;
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

static size_t on_header(char *line, size_t size, size_t nitems, void *ud)
{
  struct xfer *x = ud;
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
  struct xfer *x = ud;
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
    size_t at = x->to.base + x->got, in = at % BLOCK, m = BLOCK - in;
    if (m > k - done)
      m = k - done;
    memcpy(x->to.seg[at / BLOCK] + in, data + used + done, m);
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

static uint64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct req {
  struct xfer x;
  CURL *c;
  uint64_t first; /* asked for */
  bool started;
  const struct http *h; /* (NULL: the opening request) */
  uint64_t deadline;    /* CLOCK_MONOTONIC ms */
};

/* libcurl calls this at least once a second, also while no byte comes:
 * a released source's requests end, and so does one past its deadline. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  const struct req *r = ud;
  return closing(r->h) || now_ms() >= r->deadline;
}

/* Why a request of h (NULL: the opening one) stops now: -ECANCELED (h
 * released), -EIO (past the deadline; msg, holding the last attempt's
 * failure or "", says so), or 0 (it goes on). */
static int stopped(const struct shared *sh, const struct http *h, uint64_t now, uint64_t deadline,
                   char *msg, size_t mn)
{
  if (closing(h)) {
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
static void wait_ms(const struct http *h, long ms, uint64_t deadline)
{
  uint64_t end = now_ms() + (uint64_t)ms;
  if (end > deadline)
    end = deadline;
  for (uint64_t t = now_ms(); t < end && !closing(h); t = now_ms())
    sleep_ms(end - t < 100 ? (long)(end - t) : 100);
}

/* Only a success's body is ours (an error page is drained). A 200 to a
 * range request is the whole object: ours starts `first` bytes in, skipped
 * up to SKIP_MAX (beyond, the transfer stops: refused). */
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
      if (r->first > SKIP_MAX)
        return 0;
      r->x.skip = r->first;
    }
  }
  return on_body(data, size, nmemb, &r->x);
}

/* GET bytes first..first+n-1 of url into buf's blocks (n >= 1), conditional on
 * h's pin (h NULL: the opening request, which learns it). 0, or -errno
 * with msg (n bytes) saying why, credentials left out. */
static int http_get(struct shared *sh, const struct http *h, const char *url, bool auth,
                    uint64_t first, const struct dst *buf, size_t n, struct xfer *out, char **eff,
                    uint64_t deadline, char *msg, size_t mn)
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
  if (h && h->pin[0] && (t = curl_slist_append(hdrs, h->pin)))
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
    uint64_t now = now_ms();
    if ((rc = stopped(sh, h, now, deadline, msg, mn)) != 0)
      break;
    rc = -EIO;
    long low = sh->timeout_s < LOW_SPEED_S ? sh->timeout_s : LOW_SPEED_S;
    struct req r = {.c = c, .first = first, .h = h, .deadline = deadline};
    r.x.to = *buf;
    r.x.cap = n;
    r.x.retry_ms = -1;
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, bs_remote_redir_protocols(url));
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, (long)MAX_REDIRS);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, sh->as_is ? 1L : 0L);
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
    char *to = NULL; /* (a redirect refused: where it led) */
    if (cc == CURLE_UNSUPPORTED_PROTOCOL &&
        curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &to) == CURLE_OK &&
        bs_remote_redir_refused(url, to, msg, mn)) {
      rc = -EPERM;
      break;
    }
    if (cc != CURLE_OK && !done_early) {
      snprintf(msg, mn, "%s", cerr[0] ? cerr : curl_easy_strerror(cc));
      rc = -EIO;
      /* (stopped by on_progress, or by CURLOPT_TIMEOUT_MS: the loop's
       * start says which) */
      if (cc == CURLE_ABORTED_BY_CALLBACK || cc == CURLE_OPERATION_TIMEDOUT) {
        if (cc == CURLE_ABORTED_BY_CALLBACK)
          msg[0] = '\0';
        if ((rc = stopped(sh, h, now_ms(), deadline, msg, mn)) != 0)
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
    wait_ms(h, ms, deadline);
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
static void origin_of(const char *url, char *out, size_t n)
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

/* Reads go where the opening request's redirects led (one round trip, not
 * a redirect each time); the token only to the origin it was given for:
 * the same scheme (never http when the URL is https), host and port. */
static void set_eff(struct http *h, char *eff)
{
  char a[300], b[300];
  origin_of(h->url, a, sizeof a);
  origin_of(eff ? eff : h->url, b, sizeof b);
  pthread_mutex_lock(&h->lock);
  bs_free(h->eff);
  h->eff = eff;
  h->eff_auth = a[0] && strcasecmp(a, b) == 0;
  pthread_mutex_unlock(&h->lock);
}

/* A range request for [off, off+n) into buf's blocks, checked: exactly
 * those bytes of the pinned object. A 200 (the server ignores Range) is
 * read from its body when off is small enough; else refused. 0 or -errno;
 * a failure other than a changed object is logged unless quiet (read-ahead:
 * the reader that needs the bytes asks again and logs). */
static int fetch(struct http *h, uint64_t off, const struct dst *buf, size_t n, uint64_t deadline,
                 bool quiet)
{
  if (atomic_load(&h->gone))
    return -EIO;
  struct xfer x = {0};
  char msg[256];
  pthread_mutex_lock(&h->lock);
  char *eff = h->eff ? bs_strdup(h->eff) : NULL;
  bool auth = h->eff_auth, had_eff = h->eff != NULL;
  pthread_mutex_unlock(&h->lock);
  int rc = had_eff && !eff ? -ENOMEM
                           : http_get(h->sh, h, eff ? eff : h->url, eff ? auth : true, off, buf, n,
                                      &x, NULL, deadline, msg, sizeof msg);
  if (eff && (rc == -EACCES || rc == -ENOENT || x.status == 410)) {
    /* The redirect's target expired (a signed CDN URL): from the URL again. */
    char *again = NULL;
    rc = http_get(h->sh, h, h->url, true, off, buf, n, &x, &again, deadline, msg, sizeof msg);
    set_eff(h, again);
  }
  bs_free(eff);
  if (rc != 0 && x.status == 200 && off > SKIP_MAX)
    snprintf(msg, sizeof msg,
             "the server ignores Range requests (HTTP 200) and the bytes are "
             "%llu bytes into its answer",
             (unsigned long long)off);
  if (rc == 0 && x.status == 206 &&
      (!x.have_range || x.first != off || x.last != off + n - 1 ||
       (x.total != UINT64_MAX && x.total != h->size))) {
    snprintf(msg, sizeof msg, "the server answered another range than asked");
    rc = x.total != h->size ? -ESTALE : -EIO;
  }
  if (rc == 0 && h->etag[0] && x.etag[0] && strcmp(x.etag, h->etag) != 0) {
    snprintf(msg, sizeof msg, "its ETag changed from %s", h->etag);
    rc = -ESTALE;
  }
  if (rc == 0 && x.got != n) {
    snprintf(msg, sizeof msg, "short body: %zu of %zu bytes", x.got, n);
    rc = -EIO;
  }
  if (rc == -ESTALE) {
    mark_gone(h, msg);
    return -EIO;
  }
  if (rc != 0 && rc != -ECANCELED && !quiet) {
    bs_log(BS_LOG_ERR, "%s: read of %zu bytes at offset %llu failed: %s", h->name, n,
           (unsigned long long)off, msg);
  }
  return rc;
}

/* A read of [off, off + n) overlaps the last failed read's range, recently:
 * it fails at once. */
static bool bad_now(struct http *h, uint64_t off, size_t n)
{
  pthread_mutex_lock(&h->lock);
  bool bad = off < h->bad_to && off + n > h->bad_from && now_ms() < h->bad_until;
  pthread_mutex_unlock(&h->lock);
  return bad;
}

/* A read failed with rc: its range (the reader's, not the fetch's, which
 * reaches into the next tensor's bytes) fails at once for BAD_MS. */
static int bad_note(struct http *h, uint64_t off, size_t n, int rc)
{
  if (rc == -ECANCELED || atomic_load(&h->gone))
    return rc;
  pthread_mutex_lock(&h->lock);
  h->bad_from = off;
  h->bad_to = off + n;
  h->bad_until = now_ms() + BAD_MS;
  pthread_mutex_unlock(&h->lock);
  return rc;
}

/* ---- fetches in flight, and the read-ahead threads ----
 *
 * Every range being fetched, or queued for a read-ahead thread, is in
 * `fly` (all sources of the process: one pool of threads), so that a
 * reader that needs one of its blocks waits for it instead of asking the
 * server again. A fetch writes the body straight into fresh block buffers
 * that the cache then takes over (no copy between them). Threads start at
 * the first read-ahead; a fork (the daemon's, after the source is opened)
 * waits for the running fetches and the child starts its own threads. */

struct fly {
  struct http *h;
  uint64_t from, to; /* blocks [from, to) */
  uint64_t seq;      /* queue order */
  bool on, queued;   /* in use; waiting for a thread (else being fetched) */
};

static pthread_mutex_t fly_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fly_landed = PTHREAD_COND_INITIALIZER; /* a fetch ended */
static pthread_cond_t fly_work = PTHREAD_COND_INITIALIZER;   /* a fetch queued */
static struct fly fly[FLYING];                               /* (under fly_lock) */
static uint64_t fly_seq;                                     /* (under fly_lock) */
static int fly_threads;                                      /* (under fly_lock) */
static int fly_busy; /* read-ahead threads fetching (under fly_lock) */

static bool fly_running(const struct http *h)
{
  for (int i = 0; i < FLYING; i++)
    if (fly[i].on && !fly[i].queued && (!h || fly[i].h == h))
      return true;
  return false;
}

static void fork_prepare(void)
{
  pthread_mutex_lock(&fly_lock);
  while (fly_running(NULL))
    pthread_cond_wait(&fly_landed, &fly_lock);
}

static void fork_parent(void)
{
  pthread_mutex_unlock(&fly_lock);
}

static void fork_child(void)
{
  /* The threads stayed in the parent; what was queued for them is dropped
   * (a reader asks again). The condition variables may hold the parent's
   * waiters: new ones. */
  for (int i = 0; i < FLYING; i++)
    fly[i].on = false;
  fly_threads = fly_busy = 0;
  pthread_cond_init(&fly_landed, NULL);
  pthread_cond_init(&fly_work, NULL);
  pthread_mutex_unlock(&fly_lock);
}

/* Whether block idx of h is in flight (under fly_lock); *cut lowers to the
 * first block in flight above idx (a new fetch stops there). */
static bool in_flight(const struct http *h, uint64_t idx, uint64_t *cut)
{
  for (int i = 0; i < FLYING; i++) {
    if (!fly[i].on || fly[i].h != h)
      continue;
    if (idx >= fly[i].from && idx < fly[i].to)
      return true;
    if (fly[i].from > idx && fly[i].from < *cut)
      *cut = fly[i].from;
  }
  return false;
}

/* A free entry of fly, taken (under fly_lock); -1 when all are in use. */
static int fly_take(struct http *h, uint64_t from, uint64_t to, bool queued)
{
  for (int i = 0; i < FLYING; i++) {
    if (fly[i].on)
      continue;
    fly[i] = (struct fly){
        .h = h, .from = from, .to = to, .seq = ++fly_seq, .on = true, .queued = queued};
    return i;
  }
  return -1;
}

/* Fetch [start, end) of h, which lies in blocks idx.. (start in block
 * idx), into fresh blocks that go to the cache; what the cache holds of
 * block idx's start is copied in first, and not fetched again. Bytes [at,
 * at + dn) of what was fetched are also copied to dst (dn may be 0). 0 or
 * -errno. */
static int fetch_into_cache(struct http *h, uint64_t idx, uint64_t start, uint64_t end, uint64_t at,
                            uint8_t *dst, size_t dn, uint64_t deadline, bool quiet)
{
  struct bs_http_cache *c = &h->sh->cache;
  uint64_t b0 = idx * BLOCK;
  size_t nb = (size_t)((end - 1) / BLOCK - idx + 1);
  uint8_t *seg[RA_MAX + 64];
  uint8_t **segs = nb <= sizeof seg / sizeof *seg ? seg : bs_calloc(nb, sizeof *segs);
  if (!segs)
    return -ENOMEM;
  int rc = 0;
  size_t made = 0;
  for (; made < nb; made++) {
    uint64_t bs = b0 + made * (uint64_t)BLOCK, be = bs + BLOCK < end ? bs + BLOCK : end;
    if (!(segs[made] = be - bs == BLOCK ? bs_http_cache_block(c) : bs_malloc((size_t)(be - bs)))) {
      rc = -ENOMEM;
      break;
    }
  }
  /* What the cache holds of block idx's start (a prefix) is not asked for
   * again; short of start, from the block's start. */
  if (rc == 0) {
    uint64_t e0 = b0 + BLOCK < end ? b0 + BLOCK : end;
    size_t p = bs_http_cache_prefix(c, h->id, idx, segs[0], (size_t)(e0 - b0));
    start = p >= start - b0 ? b0 + p : b0;
  }
  if (rc == 0 && start < end) {
    struct dst d = {.seg = segs, .base = (size_t)(start - b0)};
    rc = fetch(h, start, &d, (size_t)(end - start), deadline, quiet);
  }
  for (size_t i = 0; rc == 0 && i < dn;) { /* the reader's bytes */
    uint64_t p = at + i - b0;
    size_t in = (size_t)(p % BLOCK), m = BLOCK - in;
    if (m > dn - i)
      m = dn - i;
    memcpy(dst + i, segs[p / BLOCK] + in, m);
    i += m;
  }
  for (size_t i = 0; i < made; i++) {
    uint64_t bs = b0 + i * (uint64_t)BLOCK, be = bs + BLOCK < end ? bs + BLOCK : end;
    if (rc == 0)
      bs_http_cache_put_owned(c, h->id, idx + i, segs[i], (size_t)(be - bs));
    else
      bs_http_cache_unused(c, segs[i], (size_t)(be - bs));
  }
  if (segs != seg)
    bs_free(segs);
  return rc;
}

static void *fly_thread(void *arg)
{
  (void)arg;
  pthread_mutex_lock(&fly_lock);
  for (;;) {
    int j = -1;
    for (int i = 0; i < FLYING; i++)
      if (fly[i].on && fly[i].queued && (j < 0 || fly[i].seq < fly[j].seq))
        j = i;
    if (j < 0 || fly_busy >= (atomic_load(&far_link) ? WORKERS_FAR : WORKERS)) {
      pthread_cond_wait(&fly_work, &fly_lock);
      continue;
    }
    fly[j].queued = false;
    fly_busy++;
    struct http *h = fly[j].h;
    uint64_t from = fly[j].from, to = fly[j].to;
    pthread_mutex_unlock(&fly_lock);
    uint64_t end = to * BLOCK < h->size ? to * BLOCK : h->size;
    uint64_t deadline = now_ms() + (uint64_t)h->sh->timeout_s * 1000;
    (void)fetch_into_cache(h, from, from * BLOCK, end, 0, NULL, 0, deadline, true);
    pthread_mutex_lock(&fly_lock);
    fly[j].on = false;
    fly_busy--;
    pthread_cond_broadcast(&fly_landed);
    pthread_cond_signal(&fly_work); /* (a thread held back by the limit) */
  }
  return NULL;
}

/* Queue read-ahead of blocks [from, from + count) of h that are neither
 * held nor in flight, in requests of up to CHUNK blocks. */
static void read_ahead(struct http *h, uint64_t from, uint64_t count)
{
  struct bs_http_cache *c = &h->sh->cache;
  const uint64_t nblocks = (h->size + BLOCK - 1) / BLOCK;
  uint64_t to = from + count < nblocks ? from + count : nblocks;
  pthread_mutex_lock(&h->lock);
  if (h->ahead > from)
    from = h->ahead;
  /* whole requests: the window moves on by a block a block read, and a
   * request a block would pay a round trip a block */
  bool go = from < to && (to - from >= (count < CHUNK ? count : CHUNK) || to == nblocks);
  if (go)
    h->ahead = to;
  pthread_mutex_unlock(&h->lock);
  if (!go)
    return;
  pthread_mutex_lock(&fly_lock);
  while (fly_threads < WORKERS_FAR) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&t, &at, fly_thread, NULL);
    pthread_attr_destroy(&at);
    if (e != 0)
      break;
    fly_threads++;
  }
  bool queued = false;
  for (uint64_t b = from; fly_threads > 0 && b < to;) {
    uint64_t cut = to, last = b == nblocks - 1 ? h->size - b * BLOCK : BLOCK;
    if (in_flight(h, b, &cut) || bs_http_cache_has(c, h->id, b, (size_t)last)) {
      b++;
      continue;
    }
    uint64_t e = b + 1;
    while (e < cut && e - b < CHUNK && !bs_http_cache_has(c, h->id, e, 1))
      e++;
    if (fly_take(h, b, e, true) < 0)
      break;
    queued = true;
    b = e;
  }
  if (queued)
    pthread_cond_broadcast(&fly_work);
  pthread_mutex_unlock(&fly_lock);
}

/* The reader's miss at `at` (block idx): fetch [at, end) (the part from
 * idx's start the cache does not hold), copying what the read needs (up to
 * dn bytes) to dst; *copied says how much. 0 or -errno; 1 when another
 * fetch had block idx in flight and may_wait: it waited until that fetch
 * ended (the caller looks in the cache again). */
static int fetch_miss(struct http *h, uint64_t at, uint64_t end, uint8_t *dst, size_t dn,
                      size_t *copied, bool may_wait, uint64_t deadline)
{
  uint64_t idx = at / BLOCK, last = (end - 1) / BLOCK, cut = last + 1;
  pthread_mutex_lock(&fly_lock);
  if (in_flight(h, idx, &cut) && may_wait) {
    bool late = false;
    do { /* (another fetch landing wakes this one too) */
      uint64_t now = now_ms();
      if ((late = now >= deadline))
        break;
      struct timespec ts; /* (fly_landed waits on CLOCK_REALTIME) */
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t ns = (uint64_t)ts.tv_nsec + (deadline - now) * 1000000;
      ts.tv_sec += (time_t)(ns / 1000000000);
      ts.tv_nsec = (long)(ns % 1000000000);
      pthread_cond_timedwait(&fly_landed, &fly_lock, &ts);
    } while (in_flight(h, idx, &cut));
    pthread_mutex_unlock(&fly_lock);
    if (!late)
      return 1;
    bs_log(BS_LOG_ERR,
           "%s: read at offset %llu failed: no answer within %ld s "
           "(BURNSTORE_HTTP_TIMEOUT) to the read-ahead request holding it",
           h->name, (unsigned long long)at, h->sh->timeout_s);
    return -EIO;
  }
  int slot = fly_take(h, idx, cut, false);
  pthread_mutex_unlock(&fly_lock);
  if (cut * BLOCK < end)
    end = cut * BLOCK;
  if (dn > end - at)
    dn = (size_t)(end - at);
  int rc = fetch_into_cache(h, idx, at, end, at, dst, dn, deadline, false);
  *copied = rc == 0 ? dn : 0;
  pthread_mutex_lock(&fly_lock);
  if (slot >= 0)
    fly[slot].on = false;
  pthread_cond_broadcast(&fly_landed);
  pthread_mutex_unlock(&fly_lock);
  return rc;
}

/* A read of [off, off + n): note where reading got to, start read-ahead;
 * the read-ahead depth in blocks, *blk_end the end of the read's last
 * block (within the file). */
static uint64_t read_begins(struct http *h, uint64_t off, size_t n, uint64_t *blk_end)
{
  struct bs_http_cache *c = &h->sh->cache;
  const uint64_t near = (uint64_t)RA_MAX * BLOCK;
  /* Reading on from where reading got to (the kernel's parallel read-ahead
   * arrives a little out of order) grows the read-ahead from the second
   * read past the first (a header, read as its size then the rest, gets no
   * more than it asked for); a jump resets it. */
  pthread_mutex_lock(&h->lock);
  bool on = h->seq_end && off + near >= h->seq_end && off <= h->seq_end + near;
  h->run = !on ? 0 : off + n > h->seq_end ? h->run + 1 : h->run;
  if (!on)
    h->ahead = 0;
  if (!on || off + n > h->seq_end)
    h->seq_end = off + n;
  uint64_t ra = h->run < 2 ? 0 : h->run - 2 >= 5 ? RA_MAX : 1u << (h->run - 2);
  pthread_mutex_unlock(&h->lock);
  if (ra > c->nmax / 2) /* never so far ahead that it evicts itself */
    ra = c->nmax / 2;
  uint64_t need_end = off + n; /* the read's blocks, whole, then ra more */
  uint64_t be = (need_end + BLOCK - 1) / BLOCK * BLOCK;
  if (be > h->size)
    be = h->size;
  if (ra)
    read_ahead(h, be / BLOCK, ra);
  *blk_end = be;
  return ra;
}

static long http_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  struct http *h = s->impl;
  struct bs_http_cache *c = &h->sh->cache;
  uint64_t blk_end, need_end = off + n;
  if (bad_now(h, off, n))
    return -EIO;
  uint64_t ra = read_begins(h, off, n, &blk_end);
  size_t got = 0;
  int waits = 0;
  const uint64_t deadline = now_ms() + (uint64_t)h->sh->timeout_s * 1000;
  while (got < n) {
    if (atomic_load(&h->gone))
      return -EIO;
    uint64_t at = off + got, idx = at / BLOCK;
    long k = bs_http_cache_get(c, h->id, idx, (size_t)(at % BLOCK), (uint8_t *)buf + got, n - got);
    if (k > 0) {
      got += (size_t)k;
      continue;
    }
    /* A miss: from here to the read's end (no read-ahead yet), or to the
     * end of its last block. */
    size_t k2 = 0;
    /* (after a few waits that did not bring the block, fetch anyway: the
     * cache may be too small to keep what others fetched, or theirs failed) */
    int rc = fetch_miss(h, at, ra ? blk_end : need_end, (uint8_t *)buf + got, n - got, &k2,
                        waits < 4, deadline);
    if (rc == 1) {
      waits++;
      continue;
    }
    if (rc != 0)
      return bad_note(h, off, n, rc);
    got += k2;
    waits = 0;
  }
  return (long)got;
}

static void http_view_put(const struct bs_src *s, struct bs_src_view *v)
{
  struct http *h = s->impl;
  for (size_t i = 0; i < v->count; i++)
    bs_http_cache_unpin(&h->sh->cache, h->id, v->pin[i]);
  v->count = 0;
}

/* The bytes lent from the cache blocks themselves (pinned), fetched first
 * as http_pread fetches them; -EAGAIN when they do not stay in the cache
 * long enough to be pinned (a cache smaller than what is in flight). */
static int http_view(const struct bs_src *s, uint64_t off, size_t n, struct bs_src_view *v)
{
  struct http *h = s->impl;
  struct bs_http_cache *c = &h->sh->cache;
  const uint64_t first = off / BLOCK, last = (off + n - 1) / BLOCK;
  v->count = 0;
  if (last - first >= BS_SRC_SPANS)
    return -EAGAIN;
  uint64_t blk_end, need_end = off + n;
  if (bad_now(h, off, n))
    return -EIO;
  uint64_t ra = read_begins(h, off, n, &blk_end);
  const uint64_t deadline = now_ms() + (uint64_t)h->sh->timeout_s * 1000;
  int waits = 0, fetches = 0;
  for (;;) {
    if (atomic_load(&h->gone))
      return -EIO;
    uint64_t miss = UINT64_MAX;
    for (uint64_t idx = first; idx <= last; idx++) {
      uint64_t b0 = idx * BLOCK, from = off > b0 ? off : b0;
      uint64_t to = need_end < b0 + BLOCK ? need_end : b0 + BLOCK;
      const uint8_t *p;
      if (!bs_http_cache_pin(c, h->id, idx, (size_t)(from - b0), (size_t)(to - from), &p)) {
        miss = from;
        break;
      }
      v->p[v->count] = p;
      v->n[v->count] = (size_t)(to - from);
      v->pin[v->count++] = idx;
    }
    if (miss == UINT64_MAX)
      return 0;
    http_view_put(s, v);
    if (fetches >= 3) /* fetched, and evicted before it was pinned */
      return -EAGAIN;
    size_t k = 0;
    int rc = fetch_miss(h, miss, ra ? blk_end : need_end, NULL, 0, &k, waits < 4, deadline);
    if (rc == 1) {
      waits++;
      continue;
    }
    if (rc != 0)
      return bad_note(h, off, n, rc);
    waits = 0;
    fetches++;
  }
}

static bool http_changed(const struct bs_src *s, char *why, size_t n)
{
  struct http *h = s->impl;
  if (!atomic_load(&h->gone))
    return false;
  pthread_mutex_lock(&h->lock);
  snprintf(why, n, "%s", h->why);
  pthread_mutex_unlock(&h->lock);
  return true;
}

static int open_shared(struct bs_src *s, struct shared *sh, struct bs_remote *rm, bs_err *err);

static int http_sibling(const struct bs_src *s, const char *rel, struct bs_src *out, bs_err *err)
{
  struct http *h = s->impl;
  struct bs_remote rm;
  char msg[160];
  if (bs_remote_shard_check(&h->rm, rel, msg, sizeof msg) != 0)
    return bs_fail(err, EACCES, BS_OFF_NONE, NULL, "%s", msg);
  if (bs_remote_sibling(&h->rm, rel, &rm) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  pthread_mutex_lock(&h->sh->lock);
  h->sh->refs++;
  pthread_mutex_unlock(&h->sh->lock);
  return open_shared(out, h->sh, &rm, err);
}

static void http_free(struct http *h)
{
  if (!h)
    return;
  /* No read-ahead of h queued any more, none running: a running one ends
   * within a second (on_progress sees closing). */
  atomic_store(&h->closing, true);
  pthread_mutex_lock(&fly_lock);
  for (int i = 0; i < FLYING; i++)
    if (fly[i].on && fly[i].queued && fly[i].h == h)
      fly[i].on = false;
  while (fly_running(h))
    pthread_cond_wait(&fly_landed, &fly_lock);
  pthread_mutex_unlock(&fly_lock);
  shared_unref(h->sh);
  bs_remote_free(&h->rm);
  bs_free(h->reopen);
  bs_free(h->eff);
  pthread_mutex_destroy(&h->lock);
  bs_free(h);
}

static void http_release(struct bs_src *s)
{
  http_free(s->impl);
}

static bool http_remote(const struct bs_src *s, const char **reopen, const char **validator)
{
  const struct http *h = s->impl;
  if (reopen)
    *reopen = h->reopen;
  if (validator)
    *validator = h->pin;
  return true;
}

static const struct bs_src_ops http_ops = {
    .pread = http_pread,
    .view = http_view,
    .view_put = http_view_put,
    .changed = http_changed,
    .open_sibling = http_sibling,
    .remote = http_remote,
    .release = http_release,
};

/* Open rm on sh (whose reference the caller passes in, released on failure;
 * rm is the source's from now on, freed on failure). */
static int open_shared(struct bs_src *s, struct shared *sh, struct bs_remote *rm, bs_err *err)
{
  memset(s, 0, sizeof *s);
  char *name = bs_strdup(rm->name);
  struct http *h = bs_calloc(1, sizeof *h);
  if (!name || !h || pthread_mutex_init(&h->lock, NULL) != 0) {
    bs_free(name);
    bs_free(h);
    bs_remote_free(rm);
    shared_unref(sh);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  h->sh = sh;
  pthread_mutex_lock(&sh->lock);
  h->id = ++sh->next_id;
  pthread_mutex_unlock(&sh->lock);
  int rc = -1;
  uint64_t size = 0;
  uint8_t *first = NULL;
  h->rm = *rm;
  memset(rm, 0, sizeof *rm);
  h->url = h->rm.url;
  const char *url = h->url;
  /* The first FIRST bytes: the size (Content-Range), the ETag to pin, and
   * the start of a header, kept as block 0's first bytes. */
  if (!(first = bs_malloc(FIRST))) {
    rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  struct xfer x;
  char msg[256];
  char *eff = NULL;
  struct dst d = {.seg = &first};
  int e = http_get(sh, NULL, url, true, 0, &d, FIRST, &x, &eff,
                   now_ms() + (uint64_t)sh->timeout_s * 1000, msg, sizeof msg);
  set_eff(h, eff);
  if (e != 0) {
    rc = bs_fail(err, e == -ESTALE ? EIO : -e, BS_OFF_NONE, NULL, "%s", msg);
    goto out;
  }
  if (x.status == 206 && x.have_range && x.total != UINT64_MAX && x.first == 0 &&
      x.got == x.last + 1) {
    size = x.total;
  } else if (x.status == 206 && x.have_range && x.total != UINT64_MAX) {
    rc = bs_fail(err, EIO, BS_OFF_NONE, NULL, "short body: %zu of %llu bytes", x.got,
                 (unsigned long long)(x.last - x.first + 1));
    goto out;
  } else {
    rc = bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
                 "the server does not answer Range requests with their size (HTTP %ld, no "
                 "Content-Range): cannot read it by ranges",
                 x.status);
    goto out;
  }
  /* The Hub: the commit its revision resolved to is asked from now on (a
   * sibling inherits it), so a branch that moves mid-mount mixes nothing. */
  if (h->rm.kind == BS_REMOTE_HF && x.commit[0]) {
    if (bs_remote_hf_pin(&h->rm, x.commit) != 0) {
      rc = bs_fail(err, EIO, BS_OFF_NONE, NULL,
                   "the Hub's X-Repo-Commit is no commit hash (40 or 64 hex digits)");
      goto out;
    }
    h->url = h->rm.url;
  }
  if (x.etag[0] && strncmp(x.etag, "W/", 2) != 0) {
    snprintf(h->etag, sizeof h->etag, "%s", x.etag);
    snprintf(h->pin, sizeof h->pin, "If-Match: %s", x.etag);
  } else if (x.lastmod[0]) {
    snprintf(h->pin, sizeof h->pin, "If-Unmodified-Since: %s", x.lastmod);
  }
  h->reopen = bs_remote_reopen(&h->rm); /* (NULL: credentials in it, or no memory) */
  rc = 0;
out:
  if (rc != 0) {
    bs_free(first);
    bs_free(name);
    http_free(h);
    return rc;
  }
  h->size = size;
  h->name = name;
  bs_http_cache_put_owned(&sh->cache, h->id, 0, first, x.got);
  s->ops = &http_ops;
  s->impl = h;
  s->size = size;
  s->name = name;
  return 0;
}

int bs_src_init_http(struct bs_src *s, const char *url, const struct bs_http_opts *opts,
                     bs_err *err)
{
  memset(s, 0, sizeof *s);
  struct bs_remote_env env;
  struct bs_remote rm;
  char msg[160];
  bs_remote_env_load(&env);
  if (bs_remote_parse(url, &env, &rm, msg, sizeof msg) != 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "%s", msg);
  pthread_once(&curl_once, curl_global);
  if (curl_global_rc != CURLE_OK) {
    bs_remote_free(&rm);
    return bs_fail(err, EIO, BS_OFF_NONE, NULL, "cannot initialise libcurl: %s",
                   curl_easy_strerror(curl_global_rc));
  }
  uint64_t cache;
  long timeout_s;
  if (tunables(opts, &cache, &timeout_s, err) != 0) {
    bs_remote_free(&rm);
    return -1;
  }
  struct shared *sh = shared_new(opts, &rm, cache, timeout_s);
  if (!sh) {
    bs_remote_free(&rm);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  return open_shared(s, sh, &rm, err);
}
