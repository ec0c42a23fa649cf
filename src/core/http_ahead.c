/* The HTTP source's ranges in flight and its read-ahead (source_http.h).
 *
 * Every range of a source being fetched is on its `fly` list, so that a
 * reader that needs one of its blocks waits for it instead of asking the
 * server again. A reader's own miss is fetched while it waits; read-ahead
 * requests are submitted to the client and land on its thread (ahead_done),
 * each writing its body straight into fresh block buffers that the cache
 * then takes over (no copy between them). How many go out at once follows
 * the link: a request carries about 20 ms of one connection's measured
 * rate (4 blocks on loopback, one where each connection is capped, as
 * object stores cap one), so that a slow link gets more connections for the
 * same window; the window itself stays within half the cache, with every
 * source of the site counted. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/source_http.h"

enum {
  RA_MAX = 32,        /* read-ahead: at most this many blocks ahead */
  CHUNK = 4,          /* blocks of one read-ahead request, at most */
  CHUNK_MS = 20,      /* what one request carries: this long at one connection's rate */
  SEGS_ON_STACK = 96, /* a reader's fetch of up to this many blocks needs no allocation */
};

struct fly {
  struct fly *next;
  struct http *h;
  uint64_t from, to; /* blocks [from, to) */
  uint64_t seq;
  bool ahead;     /* a read-ahead request (req, seg, eff below), else a reader's own fetch */
  uint64_t start; /* (ahead) the first byte asked: block from's start, or past its prefix */
  struct bs_http_req req;
  char *eff;      /* (ahead) where it is asked */
  uint8_t *seg[]; /* (ahead) to - from block buffers */
};

/* The entry holding block idx of h (under h->lock); *cut lowers to the
 * first block in flight above idx (a new fetch stops there). */
static struct fly *in_flight(const struct http *h, uint64_t idx, uint64_t *cut)
{
  struct fly *hit = NULL;
  for (struct fly *f = h->fly; f; f = f->next) {
    if (idx >= f->from && idx < f->to)
      hit = f;
    else if (f->from > idx && f->from < *cut)
      *cut = f->from;
  }
  return hit;
}

static bool flying(const struct http *h, uint64_t seq)
{
  for (struct fly *f = h->fly; f; f = f->next)
    if (f->seq == seq)
      return true;
  return false;
}

/* f off h's list, and its waiters woken (under h->lock). */
static void landed(struct http *h, struct fly *f)
{
  for (struct fly **p = &h->fly; *p; p = &(*p)->next)
    if (*p == f) {
      *p = f->next;
      break;
    }
  pthread_cond_broadcast(&h->landed);
}

static uint64_t block_end(const struct http *h, uint64_t idx)
{
  uint64_t b0 = idx * BS_HTTP_BLOCK;
  return h->size - b0 < BS_HTTP_BLOCK ? h->size : b0 + BS_HTTP_BLOCK;
}

/* The end of block idx's bytes, or end if that comes first. */
static uint64_t upto(const struct http *h, uint64_t idx, uint64_t end)
{
  uint64_t be = block_end(h, idx);
  return be < end ? be : end;
}

/* Fetch [start, end) of h, which lies in blocks idx.. (start in block
 * idx), into fresh blocks that go to the cache; what the cache holds of
 * block idx's start is copied in first, and not fetched again. Bytes [at,
 * at + dn) of what was fetched are also copied to dst (dn may be 0). 0 or
 * -errno. */
static int fetch_into_cache(struct http *h, uint64_t idx, uint64_t start, uint64_t end, uint64_t at,
                            uint8_t *dst, size_t dn, uint64_t deadline)
{
  struct bs_http_cache *c = &h->sh->cache;
  uint64_t b0 = idx * BS_HTTP_BLOCK;
  size_t nb = (size_t)((end - 1) / BS_HTTP_BLOCK - idx + 1);
  uint8_t *seg[SEGS_ON_STACK];
  uint8_t **segs = nb <= SEGS_ON_STACK ? seg : bs_calloc(nb, sizeof *segs);
  if (!segs)
    return -ENOMEM;
  int rc = 0;
  size_t made = 0;
  for (; made < nb; made++) {
    uint64_t bs = (idx + made) * BS_HTTP_BLOCK, be = upto(h, idx + made, end);
    if (!(segs[made] =
              be - bs == BS_HTTP_BLOCK ? bs_http_cache_block(c) : bs_malloc((size_t)(be - bs)))) {
      rc = -ENOMEM;
      break;
    }
  }
  /* What the cache holds of block idx's start (a prefix) is not asked for
   * again; short of start, from the block's start. */
  if (rc == 0) {
    size_t p = bs_http_cache_prefix(c, h->id, idx, segs[0], (size_t)(upto(h, idx, end) - b0));
    start = p >= start - b0 ? b0 + p : b0;
  }
  if (rc == 0 && start < end) {
    struct bs_http_dst d = {.seg = segs, .base = (size_t)(start - b0)};
    rc = bs_http_fetch(h, start, &d, (size_t)(end - start), deadline, false);
  }
  for (size_t i = 0; rc == 0 && i < dn;) { /* the reader's bytes */
    uint64_t p = at + i - b0;
    size_t in = (size_t)(p % BS_HTTP_BLOCK), m = BS_HTTP_BLOCK - in;
    if (m > dn - i)
      m = dn - i;
    memcpy(dst + i, segs[p / BS_HTTP_BLOCK] + in, m);
    i += m;
  }
  for (size_t i = 0; i < made; i++) { /* (the last may be a prefix: up to end) */
    size_t len = (size_t)(upto(h, idx + i, end) - (idx + i) * BS_HTTP_BLOCK);
    if (rc == 0)
      bs_http_cache_put_owned(c, h->id, idx + i, segs[i], len);
    else
      bs_http_cache_unused(c, segs[i], len);
  }
  if (segs != seg)
    bs_free(segs);
  return rc;
}

/* A read-ahead request ended (on the client's thread): its blocks to the
 * cache, checked as every answer is, or given back. */
static void ahead_done(struct bs_http_req *r)
{
  struct fly *f = r->ud;
  struct http *h = f->h;
  struct bs_http_cache *c = &h->sh->cache;
  char msg[300];
  snprintf(msg, sizeof msg, "%s", r->msg);
  int rc = bs_http_check(h, f->start, r->n, &r->x, r->rc, msg, sizeof msg);
  for (uint64_t i = f->from; i < f->to; i++) {
    uint8_t *b = f->seg[i - f->from];
    size_t len = (size_t)(block_end(h, i) - i * BS_HTTP_BLOCK);
    if (rc == 0)
      bs_http_cache_put_owned(c, h->id, i, b, len);
    else
      bs_http_cache_unused(c, b, len);
  }
  atomic_fetch_sub(&h->sh->ahead, (size_t)(f->to - f->from));
  bs_free(r->eff);
  pthread_mutex_lock(&h->lock);
  if (rc != 0 && h->ahead > f->from) /* (not a hole the window moved past: asked again) */
    h->ahead = f->from;
  landed(h, f);
  pthread_mutex_unlock(&h->lock);
  bs_free(f->eff);
  bs_free(f);
}

/* Send a read-ahead request for blocks [b, e) of h (under h->lock). false:
 * it could not go (no memory, the client refused it). */
static bool ahead_send(struct http *h, uint64_t b, uint64_t e, uint64_t now)
{
  struct bs_http_cache *c = &h->sh->cache;
  size_t nb = (size_t)(e - b);
  struct fly *f = bs_calloc(1, sizeof *f + nb * sizeof *f->seg);
  if (!f || (h->eff && !(f->eff = bs_strdup(h->eff)))) {
    bs_free(f);
    return false;
  }
  size_t made = 0;
  for (; made < nb; made++) {
    uint64_t len = block_end(h, b + made) - (b + made) * BS_HTTP_BLOCK;
    if (!(f->seg[made] = len == BS_HTTP_BLOCK ? bs_http_cache_block(c) : bs_malloc((size_t)len)))
      break;
  }
  uint64_t b0 = b * BS_HTTP_BLOCK, end = block_end(h, e - 1);
  size_t p =
      made == nb ? bs_http_cache_prefix(c, h->id, b, f->seg[0], (size_t)(block_end(h, b) - b0)) : 0;
  *f = (struct fly){.h = h,
                    .from = b,
                    .to = e,
                    .seq = ++h->fly_seq,
                    .ahead = true,
                    .start = b0 + p,
                    .eff = f->eff};
  f->req = (struct bs_http_req){.site = h->sh,
                                .url = f->eff ? f->eff : h->url,
                                .pin = h->pin,
                                .auth = f->eff ? h->eff_auth : true,
                                .first = f->start,
                                .n = (size_t)(end - f->start),
                                .to = {.seg = f->seg, .base = (size_t)p},
                                .born = now,
                                .deadline = now + (uint64_t)h->sh->timeout_s * 1000,
                                .stop = &h->closing,
                                .done = ahead_done,
                                .ud = f};
  if (made < nb || f->start >= end || bs_http_submit(&f->req) != 0) {
    for (size_t i = 0; i < made; i++)
      bs_http_cache_unused(c, f->seg[i], (size_t)(block_end(h, b + i) - (b + i) * BS_HTTP_BLOCK));
    bs_free(f->eff);
    bs_free(f);
    return false;
  }
  atomic_fetch_add(&h->sh->ahead, nb);
  f->next = h->fly;
  h->fly = f;
  return true;
}

/* Read-ahead of blocks [from, from + count) of h that are neither held
 * nor in flight, in requests of up to `chunk` blocks, while the site's
 * read-ahead stays within half its cache. */
static void read_ahead(struct http *h, uint64_t from, uint64_t count)
{
  struct bs_http_cache *c = &h->sh->cache;
  const uint64_t nblocks = (h->size + BS_HTTP_BLOCK - 1) / BS_HTTP_BLOCK;
  uint64_t to = from + count < nblocks ? from + count : nblocks;
  /* a request carries about CHUNK_MS of one connection's rate: 4 blocks on
   * a fast link (fewer requests), 1 on a capped one (more at once) */
  uint64_t rate = bs_http_conn_rate(),
           chunk = rate ? rate / 1000 * CHUNK_MS / BS_HTTP_BLOCK : CHUNK;
  chunk = chunk < 1 ? 1 : chunk > CHUNK ? CHUNK : chunk;
  uint64_t now = bs_http_now_ms();
  size_t budget = c->nmax / 2;
  pthread_mutex_lock(&h->lock);
  if (h->ahead > from)
    from = h->ahead;
  /* whole requests: the window moves on by a block a block read, and a
   * request a block would pay a round trip a block (unless the link wants
   * them: then they are what keeps it busy) */
  bool go = from < to && (to - from >= (count < chunk ? count : chunk) || to == nblocks);
  for (uint64_t b = from; go && b < to && !atomic_load(&h->closing);) {
    uint64_t cut = to;
    if (in_flight(h, b, &cut) ||
        bs_http_cache_has(c, h->id, b, (size_t)(block_end(h, b) - b * BS_HTTP_BLOCK))) {
      h->ahead = ++b;
      continue;
    }
    uint64_t e = b + 1;
    while (e < cut && e - b < chunk && !bs_http_cache_has(c, h->id, e, 1))
      e++;
    if (atomic_load(&h->sh->ahead) + (size_t)(e - b) > budget || !ahead_send(h, b, e, now))
      break;
    h->ahead = b = e;
  }
  pthread_mutex_unlock(&h->lock);
}

int bs_http_fetch_miss(struct http *h, uint64_t at, uint64_t end, uint8_t *dst, size_t dn,
                       size_t *copied, bool may_wait, uint64_t deadline)
{
  uint64_t idx = at / BS_HTTP_BLOCK, last = (end - 1) / BS_HTTP_BLOCK, cut = last + 1;
  pthread_mutex_lock(&h->lock);
  struct fly *f = in_flight(h, idx, &cut);
  if (f && may_wait) {
    uint64_t seq = f->seq, now;
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000),
                          .tv_nsec = (long)(deadline % 1000) * 1000000};
    while ((now = bs_http_now_ms()) < deadline && flying(h, seq))
      pthread_cond_timedwait(&h->landed, &h->lock, &ts); /* (CLOCK_MONOTONIC) */
    pthread_mutex_unlock(&h->lock);
    if (now < deadline)
      return 1;
    bs_log(BS_LOG_ERR,
           "%s: read at offset %llu failed: no answer within %ld s (BURNSTORE_HTTP_TIMEOUT) to "
           "the request holding it",
           h->name, (unsigned long long)at, h->sh->timeout_s);
    return -EIO;
  }
  /* the reader's own fetch: on the list (a stub without blocks of its own)
   * while it runs, for other readers to wait for */
  struct fly *own = bs_calloc(1, sizeof *own);
  if (own) {
    *own = (struct fly){.h = h, .from = idx, .to = cut, .seq = ++h->fly_seq, .next = h->fly};
    h->fly = own;
  }
  pthread_mutex_unlock(&h->lock);
  if (cut * BS_HTTP_BLOCK < end)
    end = cut * BS_HTTP_BLOCK;
  if (dn > end - at)
    dn = (size_t)(end - at);
  int rc = fetch_into_cache(h, idx, at, end, at, dst, dn, deadline);
  *copied = rc == 0 ? dn : 0;
  pthread_mutex_lock(&h->lock);
  if (own)
    landed(h, own);
  pthread_mutex_unlock(&h->lock);
  bs_free(own);
  return rc;
}

uint64_t bs_http_read_begins(struct http *h, uint64_t off, size_t n, uint64_t *blk_end)
{
  struct bs_http_cache *c = &h->sh->cache;
  const uint64_t near = (uint64_t)RA_MAX * BS_HTTP_BLOCK;
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
  uint64_t be = (need_end + BS_HTTP_BLOCK - 1) / BS_HTTP_BLOCK * BS_HTTP_BLOCK;
  if (be > h->size)
    be = h->size;
  if (ra)
    read_ahead(h, be / BS_HTTP_BLOCK, ra);
  *blk_end = be;
  return ra;
}

void bs_http_ahead_forget(struct http *h)
{
  pthread_mutex_lock(&h->lock);
  for (struct fly *f = h->fly; f; f = f->next)
    if (f->ahead)
      bs_http_cancel(&f->req);
  while (h->fly)
    pthread_cond_wait(&h->landed, &h->lock);
  pthread_mutex_unlock(&h->lock);
}
