/* The HTTP source's block cache: fixed-size blocks of many sources, least
 * recently used evicted first, bounded. Pure (no network), unit-tested. */
#ifndef BURNSTORE_CORE_HTTP_CACHE_H
#define BURNSTORE_CORE_HTTP_CACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/http_parse.h"

/* A cache of fixed-size blocks of many sources (keyed by a source id and a
 * block index), least recently used evicted first: it never holds more than
 * `nmax` blocks of `block` bytes. Thread-safe. */
struct bs_http_block;
struct bs_http_cache {
  pthread_mutex_t lock;
  size_t block, nmax, n; /* block size, slots, slots used (0..n-1) */
  size_t bytes;          /* the blocks' sizes */
  struct bs_http_block *b;
  /* A hash of (id, idx) to the slots (chained: slot + 1, 0 ends), and the
   * slots by recency (newest first): a lookup and an eviction cost a few
   * steps, not a scan of the slots. */
  uint32_t *bucket;
  size_t hmask;
  uint32_t newest, oldest;
  /* Buffers of evicted whole blocks, for the next fetch: a fresh 1 MiB
   * allocation is a fresh mapping, every page of it faulted in and zeroed
   * by the kernel, each time (an eighth of a URL read's CPU when only 16
   * were kept). As many as the cache has slots: the memory stays within
   * twice the cache, what is in flight included. */
  uint8_t **spare; /* nmax of them (narena with an arena: only its blocks) */
  size_t nspare;
  /* Whole blocks come first from one mapping of twice the cache (reserved:
   * its pages exist once written), aligned and advised for huge pages: the
   * first fill faults in 2 MiB at a time, not 4 KiB (256 faults a block),
   * and a reply sent from a block pins one huge page, not 256 pages. Its
   * blocks go back to the spares, never to the system, until destroy. */
  uint8_t *arena;            /* NULL: none (the blocks are bs_malloc'd) */
  size_t narena, arena_used; /* its blocks; how many were handed out yet */
  void *map;                 /* (the mapping, for munmap) */
  size_t map_len;
};
/* bytes / block slots, at least 1, at most BS_HTTP_CACHE_BLOCKS_MAX. 0 or -ENOMEM. */
int bs_http_cache_init(struct bs_http_cache *c, size_t block, uint64_t bytes);
void bs_http_cache_destroy(struct bs_http_cache *c);
/* Copy up to n bytes at `off` within block (id, idx) into dst: the bytes
 * copied (the block may be short: the file's last), or -1 on a miss. */
long bs_http_cache_get(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t off, void *dst,
                       size_t n);
/* Store a copy of block (id, idx), len <= block bytes. false: no memory.
 * A block shorter than `block` is the block's first len bytes (the file's
 * last block, or a prefix: a get past its end misses). A block already held
 * at least as long is kept. */
bool bs_http_cache_put(struct bs_http_cache *c, uint64_t id, uint64_t idx, const void *data,
                       size_t len);
/* The same, taking data (bs_malloc'd) over without a copy: freed when the
 * block is evicted, or at once when it is not kept. */
void bs_http_cache_put_owned(struct bs_http_cache *c, uint64_t id, uint64_t idx, uint8_t *data,
                             size_t len);
/* A buffer of `block` bytes for a block to fetch (a spare one, else
 * bs_malloc'd), NULL without memory; it goes back through put_owned or
 * unused. */
uint8_t *bs_http_cache_block(struct bs_http_cache *c);
/* A buffer from bs_http_cache_block (or bs_malloc'd, len bytes) not put:
 * kept as a spare or freed. */
void bs_http_cache_unused(struct bs_http_cache *c, uint8_t *data, size_t len);
/* Copy up to max bytes from the start of block (id, idx) into dst: the
 * bytes copied, 0 when it is not held. */
size_t bs_http_cache_prefix(struct bs_http_cache *c, uint64_t id, uint64_t idx, void *dst,
                            size_t max);
/* Pin block (id, idx) if it holds bytes [off, off + n) of it: *p points
 * at them until bs_http_cache_unpin (a reply sent straight from the
 * block). A pinned block is neither evicted nor replaced by a longer one;
 * when every block is pinned a new one is not kept. false: a miss. */
bool bs_http_cache_pin(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t off, size_t n,
                       const uint8_t **p);
void bs_http_cache_unpin(struct bs_http_cache *c, uint64_t id, uint64_t idx);
/* Whether block (id, idx) is held with at least len bytes. */
bool bs_http_cache_has(struct bs_http_cache *c, uint64_t id, uint64_t idx, size_t len);
/* Bytes held now (the blocks' sizes). */
size_t bs_http_cache_bytes(struct bs_http_cache *c);

#endif
