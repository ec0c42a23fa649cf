/* The HTTP source's ranges in flight and its read-ahead (source_http.h).
 *
 * Every range being fetched, or queued for a read-ahead thread, is in
 * `fly` (all sources of the process: one pool of threads), so that a
 * reader that needs one of its blocks waits for it instead of asking the
 * server again. A fetch writes the body straight into fresh block buffers
 * that the cache then takes over (no copy between them). Threads start at
 * the first read-ahead; a fork (the daemon's, after the source is opened)
 * waits for the running fetches and the child starts its own threads. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/source_http.h"

enum {
  CHUNK = 4,       /* blocks of one read-ahead request */
  WORKERS = 4,     /* read-ahead requests at once (all sources) */
  WORKERS_FAR = 8, /* the same on a link with latency (threads) */
  FLYING = 32,     /* ranges in flight or queued, tracked (all sources) */
};

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

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_register(void)
{
  pthread_atfork(fork_prepare, fork_parent, fork_child);
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
  uint64_t b0 = idx * BS_HTTP_BLOCK;
  size_t nb = (size_t)((end - 1) / BS_HTTP_BLOCK - idx + 1);
  uint8_t *seg[BS_HTTP_RA_MAX + 64];
  uint8_t **segs = nb <= sizeof seg / sizeof *seg ? seg : bs_calloc(nb, sizeof *segs);
  if (!segs)
    return -ENOMEM;
  int rc = 0;
  size_t made = 0;
  for (; made < nb; made++) {
    uint64_t bs = b0 + made * (uint64_t)BS_HTTP_BLOCK,
             be = bs + BS_HTTP_BLOCK < end ? bs + BS_HTTP_BLOCK : end;
    if (!(segs[made] =
              be - bs == BS_HTTP_BLOCK ? bs_http_cache_block(c) : bs_malloc((size_t)(be - bs)))) {
      rc = -ENOMEM;
      break;
    }
  }
  /* What the cache holds of block idx's start (a prefix) is not asked for
   * again; short of start, from the block's start. */
  if (rc == 0) {
    uint64_t e0 = b0 + BS_HTTP_BLOCK < end ? b0 + BS_HTTP_BLOCK : end;
    size_t p = bs_http_cache_prefix(c, h->id, idx, segs[0], (size_t)(e0 - b0));
    start = p >= start - b0 ? b0 + p : b0;
  }
  if (rc == 0 && start < end) {
    struct bs_http_dst d = {.seg = segs, .base = (size_t)(start - b0)};
    rc = bs_http_fetch(h, start, &d, (size_t)(end - start), deadline, quiet);
  }
  for (size_t i = 0; rc == 0 && i < dn;) { /* the reader's bytes */
    uint64_t p = at + i - b0;
    size_t in = (size_t)(p % BS_HTTP_BLOCK), m = BS_HTTP_BLOCK - in;
    if (m > dn - i)
      m = dn - i;
    memcpy(dst + i, segs[p / BS_HTTP_BLOCK] + in, m);
    i += m;
  }
  for (size_t i = 0; i < made; i++) {
    uint64_t bs = b0 + i * (uint64_t)BS_HTTP_BLOCK,
             be = bs + BS_HTTP_BLOCK < end ? bs + BS_HTTP_BLOCK : end;
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
    if (j < 0 || fly_busy >= (bs_http_far_link() ? WORKERS_FAR : WORKERS)) {
      pthread_cond_wait(&fly_work, &fly_lock);
      continue;
    }
    fly[j].queued = false;
    fly_busy++;
    struct http *h = fly[j].h;
    uint64_t from = fly[j].from, to = fly[j].to;
    pthread_mutex_unlock(&fly_lock);
    uint64_t end = to * BS_HTTP_BLOCK < h->size ? to * BS_HTTP_BLOCK : h->size;
    uint64_t deadline = bs_http_now_ms() + (uint64_t)h->sh->timeout_s * 1000;
    (void)fetch_into_cache(h, from, from * BS_HTTP_BLOCK, end, 0, NULL, 0, deadline, true);
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
  const uint64_t nblocks = (h->size + BS_HTTP_BLOCK - 1) / BS_HTTP_BLOCK;
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
  pthread_once(&fork_once, fork_register);
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
    uint64_t cut = to, last = b == nblocks - 1 ? h->size - b * BS_HTTP_BLOCK : BS_HTTP_BLOCK;
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
int bs_http_fetch_miss(struct http *h, uint64_t at, uint64_t end, uint8_t *dst, size_t dn,
                       size_t *copied, bool may_wait, uint64_t deadline)
{
  uint64_t idx = at / BS_HTTP_BLOCK, last = (end - 1) / BS_HTTP_BLOCK, cut = last + 1;
  pthread_mutex_lock(&fly_lock);
  if (in_flight(h, idx, &cut) && may_wait) {
    bool late = false;
    do { /* (another fetch landing wakes this one too) */
      uint64_t now = bs_http_now_ms();
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
    fprintf(stderr,
            "burnstore: %s: read at offset %llu failed: no answer within %ld s "
            "(BURNSTORE_HTTP_TIMEOUT) to the read-ahead request holding it\n",
            h->name, (unsigned long long)at, h->sh->timeout_s);
    return -EIO;
  }
  int slot = fly_take(h, idx, cut, false);
  pthread_mutex_unlock(&fly_lock);
  if (cut * BS_HTTP_BLOCK < end)
    end = cut * BS_HTTP_BLOCK;
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
uint64_t bs_http_read_begins(struct http *h, uint64_t off, size_t n, uint64_t *blk_end)
{
  struct bs_http_cache *c = &h->sh->cache;
  const uint64_t near = (uint64_t)BS_HTTP_RA_MAX * BS_HTTP_BLOCK;
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
  uint64_t ra = h->run < 2 ? 0 : h->run - 2 >= 5 ? BS_HTTP_RA_MAX : 1u << (h->run - 2);
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
  pthread_mutex_lock(&fly_lock);
  for (int i = 0; i < FLYING; i++)
    if (fly[i].on && fly[i].queued && fly[i].h == h)
      fly[i].on = false;
  while (fly_running(h))
    pthread_cond_wait(&fly_landed, &fly_lock);
  pthread_mutex_unlock(&fly_lock);
}
