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
 * asked for; while a file is read on, read-ahead (http_ahead.c) doubles up
 * to 32 blocks (at most half the cache) and goes out as parallel requests.
 * A FUSE read is answered from the blocks themselves (http_view: pinned,
 * not copied). The requests themselves: http_client.c. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "burnstore/source.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/http_parse.h"
#include "core/source_http.h"

enum {
  FIRST = 64 << 10, /* the opening request's bytes (a header's start) */
  BAD_MS = 2000,    /* a failed range fails again at once this long */
};

/* The object changed: every later read fails; why is kept for `changed`. */
static void mark_gone(struct http *h, const char *why)
{
  pthread_mutex_lock(&h->lock);
  if (!atomic_load(&h->gone))
    snprintf(h->why, sizeof h->why, "%.*s", (int)sizeof h->why - 1, why);
  atomic_store(&h->gone, true);
  pthread_mutex_unlock(&h->lock);
}

/* Reads go where the opening request's redirects led (one round trip, not
 * a redirect each time); the token only to the origin it was given for:
 * the same scheme (never http when the URL is https), host and port. */
static void set_eff(struct http *h, char *eff)
{
  char a[300], b[300];
  bs_http_origin(h->url, a, sizeof a);
  bs_http_origin(eff ? eff : h->url, b, sizeof b);
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
int bs_http_fetch(struct http *h, uint64_t off, const struct bs_http_dst *buf, size_t n,
                  uint64_t deadline, bool quiet)
{
  if (atomic_load(&h->gone))
    return -EIO;
  struct bs_http_xfer x = {0};
  char msg[256];
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
    set_eff(h, again);
  }
  bs_free(eff);
  if (rc != 0 && x.status == 200 && off > BS_HTTP_SKIP_MAX)
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
    fprintf(stderr, "burnstore: %s: read of %zu bytes at offset %llu failed: %s\n", h->name, n,
            (unsigned long long)off, msg);
  }
  return rc;
}

/* A read of [off, off + n) overlaps the last failed read's range, recently:
 * it fails at once. */
static bool bad_now(struct http *h, uint64_t off, size_t n)
{
  pthread_mutex_lock(&h->lock);
  bool bad = off < h->bad_to && off + n > h->bad_from && bs_http_now_ms() < h->bad_until;
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
  h->bad_until = bs_http_now_ms() + BAD_MS;
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
  const uint64_t deadline = bs_http_now_ms() + (uint64_t)h->sh->timeout_s * 1000;
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
     * end of its last block. */
    size_t k2 = 0;
    /* (after a few waits that did not bring the block, fetch anyway: the
     * cache may be too small to keep what others fetched, or theirs failed) */
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
  const uint64_t deadline = bs_http_now_ms() + (uint64_t)h->sh->timeout_s * 1000;
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
  snprintf(why, n, "%s", h->why);
  pthread_mutex_unlock(&h->lock);
  return true;
}

static int open_shared(struct bs_src *s, struct bs_http_site *sh, struct bs_remote *rm,
                       bs_err *err);

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
  return open_shared(out, h->sh, &rm, err);
}

static void http_free(struct http *h)
{
  if (!h)
    return;
  /* No read-ahead of h queued any more, none running: a running one ends
   * within a second (on_progress sees closing). */
  atomic_store(&h->closing, true);
  bs_http_ahead_forget(h);
  bs_http_site_unref(h->sh);
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
static int open_shared(struct bs_src *s, struct bs_http_site *sh, struct bs_remote *rm, bs_err *err)
{
  memset(s, 0, sizeof *s);
  char *name = bs_strdup(rm->name);
  struct http *h = bs_calloc(1, sizeof *h);
  if (!name || !h || pthread_mutex_init(&h->lock, NULL) != 0) {
    bs_free(name);
    bs_free(h);
    bs_remote_free(rm);
    bs_http_site_unref(sh);
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
  struct bs_http_xfer x;
  char msg[256];
  char *eff = NULL;
  struct bs_http_dst d = {.seg = &first};
  int e = bs_http_get(sh, NULL, NULL, url, true, 0, &d, FIRST, &x, &eff,
                      bs_http_now_ms() + (uint64_t)sh->timeout_s * 1000, msg, sizeof msg);
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
  struct bs_http_site *sh;
  if (bs_http_site_open(opts, &rm, &sh, err) != 0) {
    bs_remote_free(&rm);
    return -1;
  }
  return open_shared(s, sh, &rm, err);
}
