/* The HTTP source's block cache (http_cache.h). */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "core/alloc.h"
#include "core/http_cache.h"

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
