/* The HTTP client of the byte source (http_client.h): every request on one
 * libcurl multi handle, driven by one thread (curl_multi_poll, woken by
 * curl_multi_wakeup), with a share handle for connections, DNS and TLS
 * sessions, as libcurl's own multi examples do. A request is a struct the
 * caller owns: submitted, it is started (and started again after a
 * retryable failure, with backoff) by the thread, which writes its body
 * straight into the caller's blocks and ends it at its deadline, when its
 * stop flag turns true, when it is cancelled, or with its answer; then it
 * calls the request's done callback, or wakes the caller waiting for it.
 * Waits use CLOCK_MONOTONIC. The thread starts with the first request: a
 * daemon stops it (bs_http_client_stop) before it forks, never in a fork
 * handler. */
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

#include "core/alloc.h"
#include "core/http_client.h"
#include "core/http_parse.h"

enum {
  TRIES = 6,              /* attempts of one request (5 retries) */
  BACKOFF_MS = 200,       /* first retry's wait, doubled each time */
  MAX_REDIRS = 8,         /* redirect hops followed */
  CONNECT_TIMEOUT_S = 15, /* connection */
  LOW_SPEED_S = 30,       /* under 1 byte/s for this long: a stalled transfer */
  FAR_US = 5000,          /* a request's first byte later than this: latency */
  TICK_MS = 250,          /* the thread looks at stop flags at least this often */
  EASY_KEPT = 32,         /* idle easy handles kept */
  MAX_CONNECTS = 64,      /* connections kept open */
  BUFFER = 512 << 10,     /* libcurl's receive buffer: fewer, larger body callbacks */
  RECV_KEPT = 16,         /* receive buffers kept for the next transfers */
};
_Static_assert(sizeof(((struct bs_http_req *)0)->errbuf) >= CURL_ERROR_SIZE, "errbuf");

enum { NEW, RUNNING, BACKING_OFF }; /* a request's state */

static struct {
  pthread_mutex_t lock;
  pthread_cond_t landed; /* (CLOCK_MONOTONIC) a request ended */
  CURLM *multi;
  CURLSH *share;
  pthread_mutex_t share_lock[CURL_LOCK_DATA_LAST];
  pthread_t thread;
  bool running, quit;      /* the thread runs; it is to end */
  struct bs_http_req *all; /* submitted, not ended */
  CURL *idle[EASY_KEPT];
  size_t nidle;
  uint64_t cancel_before; /* requests born before this end at once */
  CURLcode init_rc;
} cl = {.lock = PTHREAD_MUTEX_INITIALIZER, .init_rc = CURLE_FAILED_INIT};
static pthread_once_t cl_once = PTHREAD_ONCE_INIT;
static atomic_bool far_link;
static _Atomic uint64_t conn_rate;

uint64_t bs_http_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

bool bs_http_far_link(void)
{
  return atomic_load(&far_link);
}

uint64_t bs_http_conn_rate(void)
{
  return atomic_load(&conn_rate);
}

static void share_lock(CURL *c, curl_lock_data d, curl_lock_access a, void *ud)
{
  (void)c, (void)a, (void)ud;
  pthread_mutex_lock(&cl.share_lock[d]);
}

static void share_unlock(CURL *c, curl_lock_data d, void *ud)
{
  (void)c, (void)ud;
  pthread_mutex_unlock(&cl.share_lock[d]);
}

/* libcurl (7.88) allocates its receive buffer, BUFFER + 1 bytes, as each
 * transfer starts and frees it as it ends. Over the daemon's mmap threshold
 * (main.c) every request mapped 512 KiB afresh, each page faulted in and
 * zeroed by the kernel: an eighth of the bytes of a 4 MiB request, a tenth
 * of the daemon's CPU for a URL read. Those buffers come from RECV_KEPT
 * slots of one mapping made once, given back to it, never unmapped (the
 * slots' pages stay faulted in); any other allocation of libcurl's is
 * malloc's. A process that initialised libcurl before (a library's host)
 * keeps its own allocator: then libcurl mallocs them, as before. */
#define RECV_SLOT ((size_t)BUFFER + 4096) /* (BUFFER + 1 bytes, in whole pages) */
static struct {
  pthread_mutex_t lock;
  uint8_t *base;             /* RECV_KEPT slots; NULL: none */
  uint8_t *free_[RECV_KEPT]; /* slots not in use */
  size_t nfree;
} rb = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool rb_slot(const void *p)
{
  return rb.base && (const uint8_t *)p >= rb.base &&
         (const uint8_t *)p < rb.base + RECV_KEPT * RECV_SLOT;
}

static void *rb_malloc(size_t n)
{
  uint8_t *p = NULL;
  if (n == (size_t)BUFFER + 1) {
    pthread_mutex_lock(&rb.lock);
    if (rb.nfree)
      p = rb.free_[--rb.nfree];
    pthread_mutex_unlock(&rb.lock);
  }
  return p ? p : malloc(n);
}

static void rb_free(void *p)
{
  if (!rb_slot(p)) {
    free(p);
    return;
  }
  pthread_mutex_lock(&rb.lock);
  rb.free_[rb.nfree++] = p; /* (each slot given out once: room for it) */
  pthread_mutex_unlock(&rb.lock);
}

static void *rb_realloc(void *p, size_t n)
{
  if (!rb_slot(p))
    return realloc(p, n);
  void *q = malloc(n ? n : 1);
  if (!q)
    return NULL;
  memcpy(q, p, n < RECV_SLOT ? n : RECV_SLOT);
  rb_free(p);
  return q;
}

static void *rb_calloc(size_t n, size_t size)
{
  return calloc(n, size);
}

static char *rb_strdup(const char *s)
{
  return strdup(s);
}

static CURLcode global_init(void)
{
  void *m = mmap(NULL, RECV_KEPT * RECV_SLOT, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m != MAP_FAILED) {
    rb.base = m;
    for (size_t i = 0; i < RECV_KEPT; i++)
      rb.free_[rb.nfree++] = rb.base + (RECV_KEPT - 1 - i) * RECV_SLOT;
  }
  return curl_global_init_mem(CURL_GLOBAL_DEFAULT, rb_malloc, rb_free, rb_realloc, rb_strdup,
                              rb_calloc);
}

static void client_once(void)
{
  pthread_condattr_t ca;
  if ((cl.init_rc = global_init()) != CURLE_OK)
    return;
  cl.init_rc = CURLE_OUT_OF_MEMORY;
  if (pthread_condattr_init(&ca) != 0)
    return;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int e = pthread_cond_init(&cl.landed, &ca);
  pthread_condattr_destroy(&ca);
  if (e != 0 || !(cl.multi = curl_multi_init()) || !(cl.share = curl_share_init()))
    return;
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
    pthread_mutex_init(&cl.share_lock[i], NULL);
  curl_share_setopt(cl.share, CURLSHOPT_LOCKFUNC, share_lock);
  curl_share_setopt(cl.share, CURLSHOPT_UNLOCKFUNC, share_unlock);
  curl_share_setopt(cl.share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
  curl_share_setopt(cl.share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(cl.share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  curl_multi_setopt(cl.multi, CURLMOPT_MAXCONNECTS, (long)MAX_CONNECTS);
  cl.init_rc = CURLE_OK;
}

int bs_http_client_init(bs_err *err)
{
  pthread_once(&cl_once, client_once);
  if (cl.init_rc != CURLE_OK)
    return bs_fail(err, EIO, BS_OFF_NONE, NULL, "cannot initialise libcurl: %s",
                   curl_easy_strerror(cl.init_rc));
  return 0;
}

/* ---- requests, on the client's thread (under cl.lock) ---- */

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

/* S3's session token goes in a header, which libcurl would send to a
 * redirect's host too: with it, no redirect is followed. */
static bool follows(const struct bs_http_req *r)
{
  return !(r->auth && r->site->sigv4[0] && r->site->aws_token);
}

/* Start r's next attempt: an easy handle set up and added to the multi. */
static int attempt(struct bs_http_req *r, uint64_t now)
{
  struct bs_http_site *sh = r->site;
  CURL *c = r->easy ? r->easy : cl.nidle ? cl.idle[--cl.nidle] : curl_easy_init();
  if (!c)
    return -ENOMEM;
  r->easy = c;
  if (!r->hdrs) {
    struct curl_slist *h = NULL, *t;
    bool ok = true;
#define ADD(s) (ok = ok && (t = curl_slist_append(h, (s))) != NULL, h = ok ? t : h)
    if (r->auth && sh->auth)
      ADD(sh->auth);
    if (r->pin && r->pin[0])
      ADD(r->pin);
    /* S3: libcurl signs (SigV4). libcurl 7.88 adds no x-amz-content-sha256
     * itself, and signs the value given here as the payload's hash. */
    if (r->auth && sh->sigv4[0])
      ADD("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (r->auth && sh->sigv4[0] && sh->aws_token)
      ADD(sh->aws_token);
#undef ADD
    if (!ok) {
      curl_slist_free_all(h);
      return -ENOMEM;
    }
    r->hdrs = h;
  }
  char range[64];
  snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)r->first,
           (unsigned long long)(r->first + r->n - 1));
  long low = sh->timeout_s < LOW_SPEED_S ? sh->timeout_s : LOW_SPEED_S;
  r->attempt++;
  r->started = r->err_cut = false;
  r->skip = r->body_base = 0;
  r->errbuf[0] = '\0';
  r->x = (struct bs_http_xfer){.length = UINT64_MAX, .retry_ms = -1};
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_SHARE, cl.share);
  curl_easy_setopt(c, CURLOPT_PRIVATE, r);
  curl_easy_setopt(c, CURLOPT_URL, r->url);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, bs_remote_redir_protocols(r->url));
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, follows(r) ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, (long)MAX_REDIRS);
  curl_easy_setopt(c, CURLOPT_PATH_AS_IS, sh->as_is ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  /* A name still being resolved when the request ends (its deadline, a
   * cancel) leaves its resolver thread behind, detached: else libcurl joins
   * it, and the client's one thread (every request) waits for getaddrinfo. */
  curl_easy_setopt(c, CURLOPT_QUICK_EXIT, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_S);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, low);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(r->deadline - now));
  curl_easy_setopt(c, CURLOPT_RANGE, range);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, (struct curl_slist *)r->hdrs);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, bs_http_on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, bs_http_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, bs_http_on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, r);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->errbuf);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "burnstore");
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, (long)BUFFER);
  if (sh->cainfo)
    curl_easy_setopt(c, CURLOPT_CAINFO, sh->cainfo);
  if (sh->capath)
    curl_easy_setopt(c, CURLOPT_CAPATH, sh->capath);
  if (r->auth && sh->sigv4[0]) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sh->sigv4);
    curl_easy_setopt(c, CURLOPT_USERNAME, sh->aws_id);
    curl_easy_setopt(c, CURLOPT_PASSWORD, sh->aws_secret);
  }
  if (curl_multi_add_handle(cl.multi, c) != CURLM_OK)
    return -ENOMEM;
  r->state = RUNNING;
  return 0;
}

/* r leaves the multi and the list; its easy handle is kept or freed (its
 * error buffer unset first: it is r's) and it goes on `ended`. */
static void end(struct bs_http_req *r, int rc, struct bs_http_req **ended)
{
  r->rc = rc;
  CURL *c = r->easy;
  if (c) {
    if (r->state == RUNNING)
      curl_multi_remove_handle(cl.multi, c);
    if (rc == 0 && r->want_eff) { /* where the redirects led */
      char *e = NULL;
      if (curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &e) == CURLE_OK && e &&
          strcmp(e, r->url) != 0)
        r->eff = bs_strdup(e);
    }
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_setopt(c, CURLOPT_SHARE, NULL);
    if (cl.nidle < EASY_KEPT)
      cl.idle[cl.nidle++] = c;
    else
      curl_easy_cleanup(c);
    r->easy = NULL;
  }
  curl_slist_free_all(r->hdrs);
  r->hdrs = NULL;
  for (struct bs_http_req **p = &cl.all; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      break;
    }
  r->next = *ended;
  *ended = r;
}

static void timed_out(struct bs_http_req *r, const char *last)
{
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%.159s", last);
  snprintf(r->msg, sizeof r->msg, "no answer within %ld s (BURNSTORE_HTTP_TIMEOUT)%s%s",
           r->site->timeout_s, tmp[0] ? ": " : "", tmp);
}

/* Back off before the next attempt, or end r when none would start before
 * its deadline (msg already says what failed). */
static void retry(struct bs_http_req *r, uint64_t now, struct bs_http_req **ended)
{
  long ms = r->x.retry_ms >= 0 ? r->x.retry_ms : r->backoff;
  r->backoff = r->backoff * 2 > BS_HTTP_RETRY_CAP_MS ? BS_HTTP_RETRY_CAP_MS : r->backoff * 2;
  if (r->attempt >= TRIES) {
    end(r, -EIO, ended);
    return;
  }
  if (now + (uint64_t)ms >= r->deadline) {
    timed_out(r, r->msg);
    end(r, -EIO, ended);
    return;
  }
  curl_multi_remove_handle(cl.multi, r->easy);
  r->state = BACKING_OFF;
  r->next_try = now + (uint64_t)ms;
}

/* r's transfer ended with cc: its answer classified; r ends, or backs off. */
static void finished(struct bs_http_req *r, CURLcode cc, uint64_t now, struct bs_http_req **ended)
{
  CURL *c = r->easy;
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  r->x.status = code;
  curl_off_t ttfb = 0, total = 0, got = 0;
  if (cc == CURLE_OK && curl_easy_getinfo(c, CURLINFO_STARTTRANSFER_TIME_T, &ttfb) == CURLE_OK) {
    atomic_store(&far_link, ttfb > FAR_US);
    if (curl_easy_getinfo(c, CURLINFO_TOTAL_TIME_T, &total) == CURLE_OK &&
        curl_easy_getinfo(c, CURLINFO_SIZE_DOWNLOAD_T, &got) == CURLE_OK && got >= 256 << 10 &&
        total > ttfb) {
      uint64_t rate = (uint64_t)got * 1000000 / (uint64_t)(total - ttfb), old = conn_rate;
      atomic_store(&conn_rate, old ? (old * 3 + rate) / 4 : rate);
    }
  }
  char *to = NULL; /* (a redirect refused: where it led) */
  if (cc == CURLE_UNSUPPORTED_PROTOCOL &&
      curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &to) == CURLE_OK &&
      bs_remote_redir_refused(r->url, to, r->msg, sizeof r->msg)) {
    end(r, -EPERM, ended);
    return;
  }
  bool ours_done = cc == CURLE_WRITE_ERROR && r->x.got == r->n && !r->x.encoding[0];
  if (cc != CURLE_OK && !ours_done && !r->err_cut) {
    if (cc == CURLE_WRITE_ERROR && r->x.encoding[0]) {
      snprintf(r->msg, sizeof r->msg,
               "the server sent the bytes with Content-Encoding: %s (compressed, not the "
               "file's bytes): refused",
               r->x.encoding);
      end(r, -EIO, ended);
      return;
    }
    /* (libcurl 7.88 says only "Out of memory" of a header line over its
     * 100 KiB bound: a server's, most likely) */
    snprintf(r->msg, sizeof r->msg, "%s",
             r->errbuf[0]                ? r->errbuf
             : cc == CURLE_OUT_OF_MEMORY ? "a header line of the answer is over 100 KiB (or out of "
                                           "memory)"
                                         : curl_easy_strerror(cc));
    if (cc == CURLE_OPERATION_TIMEDOUT && now + 50 >= r->deadline) {
      timed_out(r, r->msg);
      end(r, -EIO, ended);
    } else if (retryable(cc)) {
      retry(r, now, ended);
    } else {
      end(r, -EIO, ended);
    }
    return;
  }
  int rc = -EIO;
  if (code == 412 || code == 416) {
    snprintf(r->msg, sizeof r->msg,
             "the object changed on the server (HTTP %ld to a conditional request)", code);
    rc = -ESTALE;
  } else if (code == 429 || code >= 500) {
    snprintf(r->msg, sizeof r->msg, "HTTP %ld", code);
    retry(r, now, ended);
    return;
  } else if (code == 401 || code == 403) {
    snprintf(r->msg, sizeof r->msg, "HTTP %ld: access denied (%s)", code, r->site->deny_hint);
    rc = -EACCES;
  } else if (code == 404) {
    snprintf(r->msg, sizeof r->msg, "HTTP 404: no such file on the server");
    rc = -ENOENT;
  } else if (!follows(r) && code >= 300 && code < 400) {
    snprintf(r->msg, sizeof r->msg,
             "HTTP %ld: a redirect, not followed with AWS_SESSION_TOKEN set (the token would go "
             "to the redirect's host)",
             code);
  } else if (code >= 300 && code < 400 && r->err_cut) {
    snprintf(r->msg, sizeof r->msg,
             "HTTP %ld: a redirect whose body goes on past 64 KiB: not followed", code);
  } else if (code != 200 && code != 206) {
    snprintf(r->msg, sizeof r->msg, "HTTP %ld", code);
  } else if (r->x.encoding[0]) {
    snprintf(r->msg, sizeof r->msg,
             "the server sent the bytes with Content-Encoding: %s (compressed, not the file's "
             "bytes): refused",
             r->x.encoding);
  } else if (r->x.twice[0]) {
    snprintf(r->msg, sizeof r->msg, "the answer gives two %s headers that differ: refused",
             r->x.twice);
  } else {
    r->msg[0] = '\0';
    rc = 0;
  }
  end(r, rc, ended);
}

/* Every request looked at: stopped, cancelled or late ones end, new ones
 * and those whose backoff is over start. The wait until the next look. */
static long look(uint64_t now, struct bs_http_req **ended)
{
  long wait = TICK_MS;
  for (struct bs_http_req *r = cl.all, *next; r; r = next) {
    next = r->next;
    if (cl.quit || r->cancel || (r->stop && atomic_load(r->stop)) || r->born < cl.cancel_before) {
      snprintf(r->msg, sizeof r->msg, "cancelled: the source was closed");
      end(r, -ECANCELED, ended);
      continue;
    }
    if (now >= r->deadline) {
      timed_out(r, r->state == BACKING_OFF ? r->msg : r->errbuf);
      end(r, -EIO, ended);
      continue;
    }
    if (r->state == NEW || (r->state == BACKING_OFF && now >= r->next_try)) {
      int e = attempt(r, now);
      if (e != 0) {
        snprintf(r->msg, sizeof r->msg, "cannot start an HTTP request: %s", strerror(-e));
        end(r, e, ended);
        continue;
      }
    }
    long left = (long)((r->state == BACKING_OFF ? r->next_try : r->deadline) - now);
    if (left < wait)
      wait = left;
  }
  return wait < 0 ? 0 : wait;
}

/* The ended requests told (outside cl.lock: a done callback takes its
 * owner's locks, which are held around bs_http_submit). */
static void tell(struct bs_http_req *ended)
{
  bool waiters = false;
  for (struct bs_http_req *r = ended, *next; r; r = next) {
    next = r->next;
    r->next = NULL;
    if (r->done) {
      r->ended = true;
      r->done(r); /* (r may be freed from here on) */
      continue;
    }
    pthread_mutex_lock(&cl.lock);
    r->ended = true;
    pthread_mutex_unlock(&cl.lock);
    waiters = true;
  }
  if (waiters) {
    pthread_mutex_lock(&cl.lock);
    pthread_cond_broadcast(&cl.landed);
    pthread_mutex_unlock(&cl.lock);
  }
}

static void *loop(void *arg)
{
  (void)arg;
  pthread_mutex_lock(&cl.lock);
  for (;;) {
    struct bs_http_req *ended = NULL;
    uint64_t now = bs_http_now_ms();
    long wait = look(now, &ended);
    bool quit = cl.quit;
    pthread_mutex_unlock(&cl.lock);
    tell(ended);
    if (quit)
      break;
    int still;
    curl_multi_perform(cl.multi, &still);
    ended = NULL;
    CURLMsg *m;
    int left;
    pthread_mutex_lock(&cl.lock);
    now = bs_http_now_ms();
    while ((m = curl_multi_info_read(cl.multi, &left)))
      if (m->msg == CURLMSG_DONE) {
        struct bs_http_req *r = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        CURLcode cc = m->data.result; /* (m is invalid once the handle is removed) */
        if (r)
          finished(r, cc, now, &ended);
      }
    bool more = ended || cl.quit;
    pthread_mutex_unlock(&cl.lock);
    tell(ended);
    if (!more)
      curl_multi_poll(cl.multi, NULL, 0, wait > 0 ? (int)wait : 0, NULL);
    pthread_mutex_lock(&cl.lock);
  }
  return NULL;
}

int bs_http_submit(struct bs_http_req *r)
{
  pthread_once(&cl_once, client_once);
  if (cl.init_rc != CURLE_OK)
    return -EIO;
  pthread_mutex_lock(&cl.lock);
  int e = 0;
  if (r->born < cl.cancel_before) {
    e = -ECANCELED;
  } else if (!cl.running) {
    cl.quit = false;
    if ((e = -pthread_create(&cl.thread, NULL, loop, NULL)) == 0)
      cl.running = true;
  }
  if (e == 0) {
    r->state = NEW;
    r->attempt = 0;
    r->backoff = BACKOFF_MS;
    r->ended = r->cancel = false;
    r->rc = 0;
    r->msg[0] = '\0';
    r->eff = NULL;
    r->next = cl.all;
    cl.all = r;
  }
  pthread_mutex_unlock(&cl.lock);
  if (e == 0)
    curl_multi_wakeup(cl.multi);
  return e;
}

void bs_http_wait(struct bs_http_req *r)
{
  pthread_mutex_lock(&cl.lock);
  while (!r->ended)
    pthread_cond_wait(&cl.landed, &cl.lock);
  pthread_mutex_unlock(&cl.lock);
}

void bs_http_cancel(struct bs_http_req *r)
{
  pthread_mutex_lock(&cl.lock);
  r->cancel = true;
  pthread_mutex_unlock(&cl.lock);
  bs_http_wake();
}

void bs_http_wake(void)
{
  if (cl.multi)
    curl_multi_wakeup(cl.multi);
}

void bs_http_cancel_all(void)
{
  pthread_mutex_lock(&cl.lock);
  cl.cancel_before = bs_http_now_ms() + 1;
  pthread_mutex_unlock(&cl.lock);
  bs_http_wake();
}

void bs_http_client_stop(void)
{
  pthread_mutex_lock(&cl.lock);
  bool running = cl.running;
  cl.quit = true;
  pthread_mutex_unlock(&cl.lock);
  if (!running)
    return;
  bs_http_wake();
  pthread_join(cl.thread, NULL);
  pthread_mutex_lock(&cl.lock);
  cl.running = false;
  pthread_mutex_unlock(&cl.lock);
}

int bs_http_get(struct bs_http_site *sh, const atomic_bool *stop, const char *pin, const char *url,
                bool auth, uint64_t first, const struct bs_http_dst *buf, size_t n,
                struct bs_http_xfer *out, char **eff, uint64_t deadline, char *msg, size_t mn)
{
  struct bs_http_req *r = bs_calloc(1, sizeof *r);
  if (!r) {
    snprintf(msg, mn, "out of memory");
    return -ENOMEM;
  }
  uint64_t span = (uint64_t)sh->timeout_s * 1000;
  *r = (struct bs_http_req){.site = sh,
                            .url = url,
                            .pin = pin,
                            .auth = auth,
                            .want_eff = eff,
                            .first = first,
                            .n = n,
                            .to = *buf,
                            .stop = stop,
                            .born = deadline > span ? deadline - span : 0,
                            .deadline = deadline};
  int rc = bs_http_submit(r);
  if (rc == 0) {
    bs_http_wait(r);
    rc = r->rc;
    snprintf(msg, mn, "%s", r->msg);
  } else {
    snprintf(msg, mn, "%s",
             rc == -ECANCELED ? "cancelled: the source was closed"
                              : "cannot start the HTTP client's thread");
  }
  *out = r->x;
  if (eff)
    *eff = r->eff;
  else
    bs_free(r->eff);
  bs_free(r);
  return rc;
}
