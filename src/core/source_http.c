/* A byte source on an HTTP(S) server: range requests (http_client.c).
 *
 * At open (http_open.c) one request for the first 64 KiB learns the size
 * and pins the strong ETag (or, under `unvalidated`, what validators the
 * server gives); every later request carries If-Match, and every answer is
 * compared with what was pinned (bs_http_check: its ETag, its size), so an
 * object replaced on the server fails reads with EIO whatever the server
 * did with If-Match, never mixes bytes. Bytes come through a bounded cache
 * of 1 MiB blocks shared by a source and its siblings (shards); a request
 * writes straight into fresh blocks that the cache takes over. A read that
 * is not (yet) sequential fetches what it asked for; while a file is read
 * on, read-ahead (http_ahead.c) goes out as parallel requests. A FUSE read
 * is answered from the blocks themselves (http_view: pinned, not copied). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/http_parse.h"
#include "core/source.h"
#include "core/source_http.h"

enum {
  BAD_MS = 2000, /* a failed range fails again at once this long */
};

uint64_t bs_http_deadline(const struct http *h)
{
  uint64_t d = bs_http_now_ms() + (uint64_t)h->sh->timeout_s * 1000;
  uint64_t od = atomic_load(&h->open_deadline);
  return od && od < d ? od : d;
}

/* s (up to n bytes of it) with control characters shown as '?'
 * (bs_text_clean): what a server sent, in a message. */
static const char *shown(const char *s, size_t n, char *out, size_t on)
{
  snprintf(out, on, "%.*s", (int)(n < on ? n : on - 1), s);
  return bs_text_clean(out);
}

/* The object changed: every later read fails; why is kept for `changed`. */
static void mark_gone(struct http *h, const char *why)
{
  pthread_mutex_lock(&h->lock);
  if (!atomic_load(&h->gone)) {
    h->why = bs_strdup(why);
    atomic_store(&h->gone, true);
  }
  pthread_mutex_unlock(&h->lock);
}

/* Whether a validator of the answer (v, n bytes as sent) is the pinned
 * one; msg says how it differs. */
static bool same(const char *what, const char *pinned, const char *v, size_t n, char *msg,
                 size_t mn)
{
  char a[100], b[100];
  if (n == 0) {
    snprintf(msg, mn, "an answer came without its %s (%s)", what,
             shown(pinned, strlen(pinned), a, sizeof a));
    return false;
  }
  if (strlen(v) == n && strcmp(v, pinned) == 0)
    return true;
  snprintf(msg, mn, "its %s changed from %s to %s%s", what,
           shown(pinned, strlen(pinned), a, sizeof a), shown(v, n, b, sizeof b),
           strlen(v) != n ? "..." : "");
  return false;
}

int bs_http_check(struct http *h, uint64_t off, size_t n, const struct bs_http_xfer *x, int rc,
                  char *msg, size_t mn)
{
  if (rc != 0 && x->status == 200 && off > BS_HTTP_SKIP_MAX)
    snprintf(msg, mn,
             "the server ignores Range requests (HTTP 200) and the bytes are %llu bytes into "
             "its answer",
             (unsigned long long)off);
  if (rc == -ESTALE) /* (a 412 or 416: the server says it changed) */
    mark_gone(h, msg);
  if (rc != 0)
    return rc;
  /* the size: a 206's Content-Range total, a 200's length */
  uint64_t total = x->status == 206 && x->have_range ? x->total
                   : x->status == 200                ? x->length
                                                     : UINT64_MAX;
  if (!h->strong && ((x->status == 206 && x->have_range && total == UINT64_MAX) ||
                     (x->status == 200 && total == UINT64_MAX))) {
    /* (unvalidated: the size is one of the few things compared) */
    snprintf(msg, mn, "an answer came without its size (%llu bytes)", (unsigned long long)h->size);
    rc = -ESTALE;
  } else if (total != UINT64_MAX && total != h->size) {
    snprintf(msg, mn, "its size changed from %llu to %llu bytes", (unsigned long long)h->size,
             (unsigned long long)total);
    rc = -ESTALE;
  } else if (x->status == 206 && (!x->have_range || x->first != off || x->last != off + n - 1)) {
    snprintf(msg, mn, "the server answered another range than asked");
    return -EIO;
  } else if (h->etag && !same("ETag", h->etag, x->etag, x->etag_n, msg, mn)) {
    rc = -ESTALE;
  } else if (h->lastmod && !same("Last-Modified", h->lastmod, x->lastmod,
                                 x->lastmod[0] ? strlen(x->lastmod) : 0, msg, mn)) {
    rc = -ESTALE;
  } else if (x->got != n) {
    snprintf(msg, mn, "short body: %zu of %zu bytes", x->got, n);
    return -EIO;
  }
  if (rc == -ESTALE) {
    char why[300];
    mark_gone(h, msg); /* ("its ETag changed ...": what `changed` says) */
    snprintf(why, sizeof why, "the object changed on the server: %s", msg);
    snprintf(msg, mn, "%s", why);
  }
  return rc;
}

void bs_http_set_eff(struct http *h, char *eff)
{
  /* Reads go where the opening request's redirects led (one round trip,
   * not a redirect each time); the token only to the origin it was given
   * for: the same scheme (never http when the URL is https), host, port. */
  char a[300], b[300];
  bs_http_origin(h->url, a, sizeof a);
  bs_http_origin(eff ? eff : h->url, b, sizeof b);
  pthread_mutex_lock(&h->lock);
  bs_free(h->eff);
  h->eff = eff;
  h->eff_auth = a[0] && strcasecmp(a, b) == 0;
  pthread_mutex_unlock(&h->lock);
}

static void log_fail(const struct http *h, size_t n, uint64_t off, const char *msg)
{
  bs_log(BS_LOG_ERR, "%s: read of %zu bytes at offset %llu failed: %s", h->name, n,
         (unsigned long long)off, msg);
}

int bs_http_fetch(struct http *h, uint64_t off, const struct bs_http_dst *buf, size_t n,
                  uint64_t deadline, bool quiet)
{
  if (atomic_load(&h->gone))
    return -EIO;
  struct bs_http_xfer x = {0};
  char msg[300];
  pthread_mutex_lock(&h->lock);
  char *eff = h->eff ? bs_strdup(h->eff) : NULL;
  bool auth = h->eff_auth, had_eff = h->eff != NULL;
  pthread_mutex_unlock(&h->lock);
  int rc = had_eff && !eff
               ? -ENOMEM
               : bs_http_get(h->sh, &h->closing, h->pin, eff ? eff : h->url, eff ? auth : true, off,
                             buf, n, &x, NULL, deadline, msg, sizeof msg);
  if (eff && (rc == -EACCES || rc == -ENOENT || x.status == 410)) {
    /* The redirect's target expired (a signed CDN URL): from the URL again. */
    char *again = NULL;
    rc = bs_http_get(h->sh, &h->closing, h->pin, h->url, true, off, buf, n, &x, &again, deadline,
                     msg, sizeof msg);
    bs_http_set_eff(h, again);
  }
  bs_free(eff);
  rc = bs_http_check(h, off, n, &x, rc, msg, sizeof msg);
  if (rc == -ESTALE)
    return -EIO; /* (logged once, where the source's change is noticed) */
  if (rc != 0 && rc != -ECANCELED && !quiet)
    log_fail(h, n, off, msg);
  return rc;
}

/* A read of [off, off + n) overlaps a recently failed read's range: it
 * fails at once. */
static bool bad_now(struct http *h, uint64_t off, size_t n)
{
  uint64_t now = bs_http_now_ms();
  bool bad = false;
  pthread_mutex_lock(&h->lock);
  for (int i = 0; h->bad && i < BS_HTTP_BAD && !bad; i++)
    bad = off < h->bad[i].to && off + n > h->bad[i].from && now < h->bad[i].until;
  pthread_mutex_unlock(&h->lock);
  return bad;
}

/* A read failed with rc: its range (the reader's, not the fetch's, which
 * reaches into the next tensor's bytes) fails at once for BAD_MS. */
static int bad_note(struct http *h, uint64_t off, size_t n, int rc)
{
  if (rc == -ECANCELED)
    return -EIO;
  if (atomic_load(&h->gone))
    return rc;
  pthread_mutex_lock(&h->lock);
  if (h->bad || (h->bad = bs_calloc(BS_HTTP_BAD, sizeof *h->bad))) {
    unsigned i = h->bad_next++ % BS_HTTP_BAD;
    h->bad[i] = (struct bs_http_bad){off, off + n, bs_http_now_ms() + BAD_MS};
  }
  pthread_mutex_unlock(&h->lock);
  return rc;
}

static long http_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n)
{
  struct http *h = s->impl;
  struct bs_http_cache *c = &h->sh->cache;
  uint64_t blk_end, need_end = off + n;
  if (bad_now(h, off, n))
    return -EIO;
  uint64_t ra = bs_http_read_begins(h, off, n, &blk_end);
  size_t got = 0;
  int waits = 0;
  const uint64_t deadline = bs_http_deadline(h);
  while (got < n) {
    if (atomic_load(&h->gone))
      return -EIO;
    uint64_t at = off + got, idx = at / BS_HTTP_BLOCK;
    long k = bs_http_cache_get(c, h->id, idx, (size_t)(at % BS_HTTP_BLOCK), (uint8_t *)buf + got,
                               n - got);
    if (k > 0) {
      got += (size_t)k;
      continue;
    }
    /* A miss: from here to the read's end (no read-ahead yet), or to the
     * end of its last block. (After a few waits that did not bring the
     * block, fetch anyway: the cache may be too small to keep what others
     * fetched, or theirs failed.) */
    size_t k2 = 0;
    int rc = bs_http_fetch_miss(h, at, ra ? blk_end : need_end, (uint8_t *)buf + got, n - got, &k2,
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
  const uint64_t first = off / BS_HTTP_BLOCK, last = (off + n - 1) / BS_HTTP_BLOCK;
  v->count = 0;
  if (last - first >= BS_SRC_SPANS)
    return -EAGAIN;
  uint64_t blk_end, need_end = off + n;
  if (bad_now(h, off, n))
    return -EIO;
  uint64_t ra = bs_http_read_begins(h, off, n, &blk_end);
  const uint64_t deadline = bs_http_deadline(h);
  int waits = 0, fetches = 0;
  for (;;) {
    if (atomic_load(&h->gone))
      return -EIO;
    uint64_t miss = UINT64_MAX;
    for (uint64_t idx = first; idx <= last; idx++) {
      uint64_t b0 = idx * BS_HTTP_BLOCK, from = off > b0 ? off : b0;
      uint64_t to = need_end < b0 + BS_HTTP_BLOCK ? need_end : b0 + BS_HTTP_BLOCK;
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
    int rc = bs_http_fetch_miss(h, miss, ra ? blk_end : need_end, NULL, 0, &k, waits < 4, deadline);
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
  snprintf(why, n, "%s", h->why ? h->why : "it changed on the server");
  pthread_mutex_unlock(&h->lock);
  return true;
}

static int http_sibling(const struct bs_src *s, const char *rel, struct bs_src *out, bs_err *err)
{
  struct http *h = s->impl;
  struct bs_remote rm;
  char msg[160];
  if (bs_remote_shard_check(&h->rm, rel, msg, sizeof msg) != 0)
    return bs_fail(err, EACCES, BS_OFF_NONE, NULL, "%s", msg);
  if (bs_remote_sibling(&h->rm, rel, &rm) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  bs_http_site_ref(h->sh);
  return bs_http_open(out, h->sh, &rm, err);
}

void bs_http_free(struct http *h)
{
  if (!h)
    return;
  /* No read-ahead of h in flight any more: cancelled, and waited for. */
  atomic_store(&h->closing, true);
  bs_http_wake();
  bs_http_ahead_forget(h);
  bs_http_site_unref(h->sh);
  bs_remote_free(&h->rm);
  bs_free(h->reopen);
  bs_free(h->eff);
  bs_free(h->etag);
  bs_free(h->lastmod);
  bs_free(h->pin);
  bs_free(h->why);
  bs_free(h->bad);
  pthread_cond_destroy(&h->landed);
  pthread_mutex_destroy(&h->lock);
  bs_free(h);
}

static void http_release(struct bs_src *s)
{
  bs_http_free(s->impl);
}

static bool http_remote(const struct bs_src *s, const char **reopen, const char **validator)
{
  const struct http *h = s->impl;
  if (reopen)
    *reopen = h->reopen;
  if (validator)
    *validator = h->pin ? h->pin : "";
  return true;
}

const struct bs_src_ops bs_http_ops = {
    .pread = http_pread,
    .view = http_view,
    .view_put = http_view_put,
    .changed = http_changed,
    .open_sibling = http_sibling,
    .remote = http_remote,
    .release = http_release,
};
