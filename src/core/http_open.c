/* Opening an HTTP source (source_http.h): one request for the first 64
 * KiB learns the size and what every later answer must repeat, and keeps
 * those bytes as block 0's start. A server that gives no strong ETag is
 * refused (unless the site is `unvalidated`: then the size and whatever
 * validators it gives are compared), so is a size over 2^62, a compressed
 * answer and an empty file (each in its own words). An index's shards are
 * opened together (bs_http_open_siblings): their opening requests in flight
 * at once with one deadline for all, each handed to the caller in order as
 * soon as it is open (its opening block parsed before others push it out of
 * the cache), the first that fails ending them all. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/http_parse.h"
#include "core/siblings.h"
#include "core/source_http.h"

enum {
  SIBS_AT_ONCE = 32, /* shards' opening requests in flight at once */
};

struct batch;

/* One source being opened. */
struct opening {
  struct http *h;
  uint8_t *first; /* the opening request's body: block 0's start */
  struct bs_http_req req;
  struct batch *b; /* (NULL: opened alone) */
  bool ended;      /* (under b->lock) */
};

struct batch {
  pthread_mutex_t lock;
  pthread_cond_t ended; /* (CLOCK_MONOTONIC) an opening's request ended */
};

static void opening_ended(struct bs_http_req *r)
{
  struct opening *o = r->ud;
  pthread_mutex_lock(&o->b->lock);
  o->ended = true;
  pthread_cond_broadcast(&o->b->ended);
  pthread_mutex_unlock(&o->b->lock);
}

static void opening_free(struct opening *o)
{
  bs_free(o->first);
  bs_free(o->req.eff);
  bs_http_free(o->h);
  o->first = NULL;
  o->req.eff = NULL;
  o->h = NULL;
}

/* Start opening rm on sh (the caller's reference to sh and rm are taken
 * over, released on failure) with a request ending at `deadline`. 0, or -1
 * with err set. */
static int open_begin(struct opening *o, struct bs_http_site *sh, struct bs_remote *rm,
                      uint64_t deadline, bs_err *err)
{
  struct http *h = bs_calloc(1, sizeof *h);
  pthread_condattr_t ca;
  bool locks = false;
  if (h && pthread_condattr_init(&ca) == 0) {
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    locks = pthread_cond_init(&h->landed, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (locks && pthread_mutex_init(&h->lock, NULL) != 0) {
      pthread_cond_destroy(&h->landed);
      locks = false;
    }
  }
  if (!locks) {
    bs_free(h);
    bs_remote_free(rm);
    bs_http_site_unref(sh);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  h->sh = sh;
  pthread_mutex_lock(&sh->lock);
  h->id = ++sh->next_id;
  pthread_mutex_unlock(&sh->lock);
  h->rm = *rm;
  memset(rm, 0, sizeof *rm);
  h->url = h->rm.url;
  o->h = h;
  if (!(o->first = bs_malloc(BS_HTTP_FIRST))) {
    opening_free(o);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  uint64_t span = (uint64_t)sh->timeout_s * 1000;
  o->req = (struct bs_http_req){.site = sh,
                                .url = h->url,
                                .auth = true,
                                .want_eff = true,
                                .first = 0,
                                .n = BS_HTTP_FIRST,
                                .to = {.seg = &o->first},
                                .born = deadline > span ? deadline - span : 0,
                                .deadline = deadline,
                                .stop = &h->closing,
                                .done = o->b ? opening_ended : NULL,
                                .ud = o};
  int e = bs_http_submit(&o->req);
  if (e != 0) {
    opening_free(o);
    return bs_fail(err, EIO, BS_OFF_NONE, NULL, "cannot start the HTTP client: %s", strerror(-e));
  }
  return 0;
}

/* What is wrong with the validators of the opening answer x (NULL: a
 * strong ETag, nothing), in words. */
static const char *no_strong(const struct bs_http_xfer *x, char *buf, size_t n)
{
  if (x->etag_n && bs_http_etag_strong(x->etag, x->etag_n))
    return NULL;
  const char *lm = x->lastmod[0] ? " and Last-Modified" : "";
  if (x->etag_n > BS_HTTP_ETAG_MAX)
    snprintf(buf, n, "its ETag is %zu bytes long, over %d%s", x->etag_n, BS_HTTP_ETAG_MAX, lm);
  else if (x->etag_n && strncmp(x->etag, "W/", 2) == 0)
    snprintf(buf, n, "only a weak ETag%s", lm);
  else if (x->etag_n)
    snprintf(buf, n, "an ETag that is not one: a quoted string of printable characters%s", lm);
  else if (x->lastmod[0])
    snprintf(buf, n, "only Last-Modified");
  else
    snprintf(buf, n, "neither an ETag nor Last-Modified");
  return buf;
}

/* The opening request has ended: its answer checked and the source made
 * (s), or h freed and -1 with err set. */
static int open_end(struct opening *o, struct bs_src *s, bs_err *err)
{
  struct http *h = o->h;
  const struct bs_http_xfer *x = &o->req.x;
  int e = o->req.rc;
  char why[160];
  int rc = -1;
  memset(s, 0, sizeof *s);
  bs_http_set_eff(h, o->req.eff);
  o->req.eff = NULL;
  if (x->status == 416) {
    rc = bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                 "the file is empty (0 bytes: HTTP 416 to a range from its first byte)");
  } else if (x->status == 412) {
    rc = bs_fail(err, EIO, BS_OFF_NONE, NULL,
                 "HTTP 412 (precondition failed) to the opening request, which sets none");
  } else if (e != 0) {
    rc = bs_fail(err, e == -ESTALE || e == -ECANCELED ? EIO : -e, BS_OFF_NONE, NULL, "%s",
                 o->req.msg);
  } else if (!(x->status == 206 && x->have_range && x->total != UINT64_MAX)) {
    rc = bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
                 "the server does not answer Range requests with their size (HTTP %ld, no "
                 "Content-Range): cannot read it by ranges",
                 x->status);
  } else if (x->total > BS_HTTP_SIZE_MAX) {
    rc = bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                 "the server gives its size as %llu bytes, over 2^62: refused (no checkpoint "
                 "is that large)",
                 (unsigned long long)x->total);
  } else if (x->first != 0 || x->last >= BS_HTTP_FIRST) {
    rc = bs_fail(err, EIO, BS_OFF_NONE, NULL,
                 "the server answered another range than asked (bytes %llu-%llu for bytes 0-%d)",
                 (unsigned long long)x->first, (unsigned long long)x->last, BS_HTTP_FIRST - 1);
  } else if (x->got != x->last + 1) {
    rc = bs_fail(err, EIO, BS_OFF_NONE, NULL, "short body: %zu of %llu bytes", x->got,
                 (unsigned long long)(x->last - x->first + 1));
  } else if (no_strong(x, why, sizeof why) && !h->sh->unvalidated) {
    rc = bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
                 "the server gives no strong ETag (%s): reads could mix two versions; -o "
                 "unvalidated (BURNSTORE_HTTP_UNVALIDATED=1) compares sizes and Last-Modified "
                 "instead",
                 why);
  } else if (h->rm.kind == BS_REMOTE_HF && x->commit[0] &&
             bs_remote_hf_pin(&h->rm, x->commit) != 0) {
    /* (the Hub: the commit its revision resolved to is asked from now on, a
     * sibling inherits it, so a branch that moves mid-mount mixes nothing) */
    rc = bs_fail(err, EIO, BS_OFF_NONE, NULL,
                 "the Hub's X-Repo-Commit is no commit hash (40 or 64 hex digits)");
  } else {
    rc = 0;
  }
  h->url = h->rm.url;
  h->strong = rc == 0 && !no_strong(x, why, sizeof why);
  size_t pn = BS_HTTP_ETAG_MAX + sizeof x->lastmod + 32;
  if (rc == 0 && (h->pin = bs_malloc(pn))) {
    if (h->strong)
      snprintf(h->pin, pn, "If-Match: %s", x->etag);
    else if (x->lastmod[0])
      snprintf(h->pin, pn, "If-Unmodified-Since: %s", x->lastmod);
    else
      h->pin[0] = '\0';
  }
  char *name = rc == 0 ? bs_strdup(h->rm.name) : NULL;
  if (rc == 0 && (!h->pin || !name ||
                  (x->etag_n && x->etag_n <= BS_HTTP_ETAG_MAX && !(h->etag = bs_strdup(x->etag))) ||
                  (x->lastmod[0] && !(h->lastmod = bs_strdup(x->lastmod)))))
    rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (rc == 0 && h->strong && h->lastmod) { /* (a strong ETag is what is compared) */
    bs_free(h->lastmod);
    h->lastmod = NULL;
  }
  if (rc != 0) {
    bs_free(name);
    opening_free(o);
    return -1;
  }
  h->reopen = bs_remote_reopen(&h->rm); /* (NULL: credentials in it, or no memory) */
  h->size = x->total;
  h->name = name;
  bs_http_cache_put_owned(&h->sh->cache, h->id, 0, o->first, x->got);
  o->first = NULL;
  o->h = NULL;
  s->ops = &bs_http_ops;
  s->impl = h;
  s->size = h->size;
  s->name = name;
  return 0;
}

int bs_http_open(struct bs_src *s, struct bs_http_site *sh, struct bs_remote *rm, bs_err *err)
{
  memset(s, 0, sizeof *s);
  struct opening o = {0};
  uint64_t deadline = bs_http_now_ms() + (uint64_t)sh->timeout_s * 1000;
  if (open_begin(&o, sh, rm, deadline, err) != 0)
    return -1;
  bs_http_wait(&o.req);
  return open_end(&o, s, err);
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
  return bs_http_open(s, sh, &rm, err);
}

/* The batch's openings that have started end, and are freed. */
static void batch_drain(struct batch *b, struct opening *w, size_t nw)
{
  pthread_mutex_lock(&b->lock);
  for (size_t i = 0; i < nw; i++)
    if (w[i].h && !w[i].ended)
      bs_http_cancel(&w[i].req);
  for (size_t i = 0; i < nw; i++)
    while (w[i].h && !w[i].ended)
      pthread_cond_wait(&b->ended, &b->lock);
  pthread_mutex_unlock(&b->lock);
  for (size_t i = 0; i < nw; i++)
    if (w[i].h)
      opening_free(&w[i]);
}

int bs_http_open_siblings(const struct bs_src *index, const char *const *rel, size_t n,
                          bs_sibling_ready_fn ready, void *ud, size_t *failed, bs_err *err)
{
  const struct http *ih = index->impl;
  struct batch b;
  pthread_condattr_t ca;
  *failed = SIZE_MAX;
  if (pthread_condattr_init(&ca) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int e = pthread_cond_init(&b.ended, &ca);
  pthread_condattr_destroy(&ca);
  if (e != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  pthread_mutex_init(&b.lock, NULL);
  /* a window of openings: shard i in w[i % nw] */
  size_t nw = n < SIBS_AT_ONCE ? n : SIBS_AT_ONCE;
  struct opening *w = bs_calloc(nw ? nw : 1, sizeof *w);
  const uint64_t deadline = bs_http_now_ms() + (uint64_t)ih->sh->timeout_s * 1000;
  size_t next = 0, done = 0;
  int rc = w ? 0 : bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  while (rc == 0 && done < n) {
    for (; next < n && next - done < nw; next++) { /* the window filled */
      struct opening *o = &w[next % nw];
      struct bs_remote rm;
      char msg[160];
      *o = (struct opening){.b = &b};
      if (bs_remote_shard_check(&ih->rm, rel[next], msg, sizeof msg) != 0) {
        rc = bs_fail(err, EACCES, BS_OFF_NONE, NULL, "%s", msg);
      } else if (bs_remote_sibling(&ih->rm, rel[next], &rm) != 0) {
        rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      } else {
        bs_http_site_ref(ih->sh);
        rc = open_begin(o, ih->sh, &rm, deadline, err);
      }
      if (rc != 0) {
        *failed = next;
        break;
      }
      atomic_store(&o->h->open_deadline, deadline);
    }
    if (rc != 0)
      break;
    /* the next in order once it is open; any that failed ends them all */
    struct opening *o = &w[done % nw];
    size_t bad = SIZE_MAX;
    pthread_mutex_lock(&b.lock);
    for (;;) {
      for (size_t i = done; i < next && bad == SIZE_MAX; i++)
        if (w[i % nw].ended && (w[i % nw].req.rc != 0 || w[i % nw].req.x.status != 206))
          bad = i;
      if (bad != SIZE_MAX || o->ended)
        break;
      pthread_cond_wait(&b.ended, &b.lock); /* (the requests end by the deadline) */
    }
    pthread_mutex_unlock(&b.lock);
    struct bs_src s;
    if (bad != SIZE_MAX) {
      *failed = bad;
      rc = open_end(&w[bad % nw], &s, err);
      if (rc == 0) { /* (not a failure after all: an answer open_end takes) */
        bs_src_destroy(&s);
        rc = bs_fail(err, EIO, BS_OFF_NONE, NULL, "HTTP %ld", w[bad % nw].req.x.status);
      }
      break;
    }
    uint64_t od = deadline;
    struct http *h = o->h;
    if (open_end(o, &s, err) != 0) {
      *failed = done;
      rc = -1;
      break;
    }
    /* parsed now, its opening block still in the cache, within the deadline */
    rc = ready(ud, done, &s, err);
    if (rc == 0) /* (h is the catalog's now; on failure it may be gone) */
      atomic_compare_exchange_strong(&h->open_deadline, &od, 0);
    done++;
  }
  if (w)
    batch_drain(&b, w, nw);
  bs_free(w);
  pthread_cond_destroy(&b.ended);
  pthread_mutex_destroy(&b.lock);
  return rc;
}
