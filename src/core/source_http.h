/* The HTTP byte source's own state, shared by its two files:
 * source_http.c (open, the bs_src operations, a checked range request) and
 * http_ahead.c (the ranges in flight, read-ahead). */
#ifndef BURNSTORE_CORE_SOURCE_HTTP_H
#define BURNSTORE_CORE_SOURCE_HTTP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/http_client.h"
#include "core/remote.h"

enum {
  BS_HTTP_RA_MAX = 32, /* read-ahead: at most this many blocks ahead */
};

struct http {
  struct bs_http_site *sh;
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

/* A range request for [off, off+n) into buf's blocks, checked: exactly
 * those bytes of the pinned object (source_http.c). */
int bs_http_fetch(struct http *h, uint64_t off, const struct bs_http_dst *buf, size_t n,
                  uint64_t deadline, bool quiet);

/* http_ahead.c: a read of [off, off + n) begins: the read-ahead depth in
 * blocks, *blk_end the end of the read's last block (within the file). */
uint64_t bs_http_read_begins(struct http *h, uint64_t off, size_t n, uint64_t *blk_end);
/* The reader's miss at `at` (block idx): fetch [at, end) (the part from
 * idx's start the cache does not hold), copying what the read needs (up to
 * dn bytes) to dst; *copied says how much. 0 or -errno; 1 when another
 * fetch had block idx in flight and may_wait: it waited until that fetch
 * ended (the caller looks in the cache again). */
int bs_http_fetch_miss(struct http *h, uint64_t at, uint64_t end, uint8_t *dst, size_t dn,
                       size_t *copied, bool may_wait, uint64_t deadline);
/* h is being released: its queued read-ahead dropped, its running fetches
 * waited for (they end within a second: h->closing is set). */
void bs_http_ahead_forget(struct http *h);

#endif
