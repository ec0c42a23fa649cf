/* The HTTP source's block cache (http_cache.h). */
#include <assert.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "core/alloc.h"
#include "core/http_cache.h"

/* A slot: a block held (data not NULL), in its hash bucket's chain and
 * in the recency list (slot numbers + 1; 0: none). */
struct bs_http_block {
  uint64_t id, idx;
  uint8_t *data; /* NULL: a free slot */
  size_t len;
  unsigned pins;         /* readers replying from data: neither evicted nor replaced */
  uint32_t chain;        /* the next slot of its hash bucket */
  uint32_t newer, older; /* the recency list */
};

enum { HUGE = 2 << 20 }; /* a huge page (x86-64, arm64 with 4 KiB pages) */

/* The arena of 2 * nmax blocks, when it can be mapped (its size checked
 * against SIZE_MAX first); without it, blocks are bs_malloc'd as before. */
static void arena_map(struct bs_http_cache *c)
{
  size_t n = c->nmax * 2;
  if (c->block == 0 || n > (SIZE_MAX - 2 * HUGE) / c->block)
    return;
  size_t len = n * c->block, map_len = len + HUGE;
  void *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED)
    return;
  uintptr_t a = ((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1);
#ifdef MADV_HUGEPAGE
  madvise((void *)a, len / HUGE * HUGE, MADV_HUGEPAGE); /* (a hint: 4 KiB pages without) */
#endif
  c->map = m;
  c->map_len = map_len;
  c->arena = (uint8_t *)a;
  c->narena = n;
}

static bool in_arena(const struct bs_http_cache *c, const uint8_t *p)
{
  return c->arena && p >= c->arena && p < c->arena + c->narena * c->block;
}

/* The tables and the arena (the blocks outside it are the caller's to free). */
static void free_tables(struct bs_http_cache *c)
{
  bs_free(c->b);
  bs_free(c->bucket);
  bs_free(c->spare);
  if (c->map)
    munmap(c->map, c->map_len);
  c->b = NULL;
}

int bs_http_cache_init(struct bs_http_cache *c, size_t block, uint64_t bytes)
{
  memset(c, 0, sizeof *c);
  c->block = block;
  uint64_t nb = bytes / block;
  c->nmax = nb == 0 ? 1 : nb > BS_HTTP_CACHE_BLOCKS_MAX ? BS_HTTP_CACHE_BLOCKS_MAX : (size_t)nb;
  size_t nb2 = 1;
  while (nb2 < c->nmax * 2) /* (nmax <= 16384: no overflow) */
    nb2 *= 2;
  c->hmask = nb2 - 1;
  arena_map(c);
  c->b = bs_calloc(c->nmax, sizeof *c->b);
  c->bucket = bs_calloc(nb2, sizeof *c->bucket);
  c->spare = bs_calloc(c->arena ? c->narena : c->nmax, sizeof *c->spare);
  if (!c->b || !c->bucket || !c->spare || pthread_mutex_init(&c->lock, NULL) != 0) {
    free_tables(c);
    return -ENOMEM;
  }
  return 0;
}

void bs_http_cache_destroy(struct bs_http_cache *c)
{
  if (!c->b)
    return;
  for (size_t i = 0; i < c->nmax; i++)
    if (!in_arena(c, c->b[i].data))
      bs_free(c->b[i].data);
  for (size_t i = 0; i < c->nspare; i++)
    if (!in_arena(c, c->spare[i]))
      bs_free(c->spare[i]);
  free_tables(c);
  pthread_mutex_destroy(&c->lock);
}

static uint32_t *bucket_of(struct bs_http_cache *c, uint64_t id, uint64_t idx)
{
  uint64_t h = (id * 0x9E3779B97F4A7C15ull) ^ (idx * 0xC2B2AE3D27D4EB4Full);
  h ^= h >> 29;
  return &c->bucket[(size_t)h & c->hmask];
}

static struct bs_http_block *cache_find(struct bs_http_cache *c, uint64_t id, uint64_t idx)
{
  for (uint32_t s = *bucket_of(c, id, idx); s; s = c->b[s - 1].chain)
    if (c->b[s - 1].id == id && c->b[s - 1].idx == idx)
      return &c->b[s - 1];
  return NULL;
}

static uint32_t slot_of(struct bs_http_cache *c, struct bs_http_block *b)
{
  return (uint32_t)(b - c->b) + 1;
}

static void unlist(struct bs_http_cache *c, struct bs_http_block *b)
{
  if (b->newer)
    c->b[b->newer - 1].older = b->older;
  else
    c->newest = b->older;
  if (b->older)
    c->b[b->older - 1].newer = b->newer;
  else
    c->oldest = b->newer;
  b->newer = b->older = 0;
}

/* b becomes the most recently used. */
static void touch(struct bs_http_cache *c, struct bs_http_block *b)
{
  uint32_t s = slot_of(c, b);
  if (c->newest == s)
    return;
  if (b->newer || b->older || c->oldest == s)
    unlist(c, b);
  b->older = c->newest;
  if (c->newest)
    c->b[c->newest - 1].newer = s;
  c->newest = s;
  if (!c->oldest)
    c->oldest = s;
}

/* b leaves its bucket and the recency list (its data stays the caller's). */
static void forget(struct bs_http_cache *c, struct bs_http_block *b)
{
  uint32_t s = slot_of(c, b);
  for (uint32_t *p = bucket_of(c, b->id, b->idx); *p; p = &c->b[*p - 1].chain)
    if (*p == s) {
      *p = b->chain;
      break;
    }
  b->chain = 0;
  unlist(c, b);
}

long bs_http_cache_get(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t off, void *dst,
                       size_t n)
{
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  if (!b) {
    pthread_mutex_unlock(&c->lock);
    return -1;
  }
  touch(c, b);
  size_t k = off < b->len ? b->len - off : 0;
  if (k > n)
    k = n;
  const uint8_t *p = b->data + off;
  b->pins++; /* (copied outside the lock: other readers are not held up) */
  pthread_mutex_unlock(&c->lock);
  memcpy(dst, p, k);
  pthread_mutex_lock(&c->lock);
  b->pins--;
  pthread_mutex_unlock(&c->lock);
  return (long)k;
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

/* A block buffer given up (under c->lock): the arena's go back to the
 * spares (room for every one of them: nothing else goes there); without
 * an arena, a whole block is kept for reuse when there is room; the rest
 * is freed. */
static void spare_put(struct bs_http_cache *c, uint8_t *data, size_t len)
{
  if (in_arena(c, data)) {
    if (c->nspare < c->narena) /* (always: each of its blocks is given back once) */
      c->spare[c->nspare++] = data;
  } else if (!c->arena && len == c->block && c->nspare < c->nmax)
    c->spare[c->nspare++] = data;
  else
    bs_free(data);
}

uint8_t *bs_http_cache_block(struct bs_http_cache *c)
{
  pthread_mutex_lock(&c->lock);
  uint8_t *b = c->nspare                   ? c->spare[--c->nspare]
               : c->arena_used < c->narena ? c->arena + c->arena_used++ * c->block
                                           : NULL;
  pthread_mutex_unlock(&c->lock);
  return b ? b : bs_malloc(c->block);
}

void bs_http_cache_put_owned(struct bs_http_cache *c, uint64_t id, uint64_t idx, uint8_t *data,
                             size_t len)
{
  pthread_mutex_lock(&c->lock);
  if (len > c->block) { /* (not kept: spare_put frees it, or an arena block goes back) */
    spare_put(c, data, len);
    pthread_mutex_unlock(&c->lock);
    return;
  }
  struct bs_http_block *b = cache_find(c, id, idx);
  /* As long already (another reader's), or shorter but pinned (its bytes
   * are being sent): keep it. */
  if (b && (b->len >= len || b->pins)) {
    touch(c, b);
    spare_put(c, data, len);
    pthread_mutex_unlock(&c->lock);
    return;
  }
  if (b) { /* shorter, not pinned: replaced in place */
    spare_put(c, b->data, b->len);
    c->bytes -= b->len;
    b->data = data;
    b->len = len;
    c->bytes += len;
    touch(c, b);
    pthread_mutex_unlock(&c->lock);
    return;
  }
  if (c->n < c->nmax) { /* a free slot */
    b = &c->b[c->n++];
  } else { /* the least recently used that is not pinned */
    for (uint32_t s = c->oldest; s && !b; s = c->b[s - 1].newer)
      if (!c->b[s - 1].pins)
        b = &c->b[s - 1];
    if (!b) { /* every block pinned: this one is not kept */
      spare_put(c, data, len);
      pthread_mutex_unlock(&c->lock);
      return;
    }
    forget(c, b);
    spare_put(c, b->data, b->len);
    c->bytes -= b->len;
  }
  *b = (struct bs_http_block){.id = id, .idx = idx, .data = data, .len = len};
  c->bytes += len;
  uint32_t *head = bucket_of(c, id, idx);
  b->chain = *head;
  *head = slot_of(c, b);
  touch(c, b);
  pthread_mutex_unlock(&c->lock);
}

bool bs_http_cache_pin(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t off, size_t n,
                       const uint8_t **p)
{
  pthread_mutex_lock(&c->lock);
  struct bs_http_block *b = cache_find(c, id, idx);
  bool ok = b && off <= b->len && n <= b->len - off;
  if (ok) {
    touch(c, b);
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
  size_t t = c->bytes;
  pthread_mutex_unlock(&c->lock);
  return t;
}
