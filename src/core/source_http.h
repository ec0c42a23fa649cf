/* The HTTP byte source's own state, shared by its files: http_open.c (open,
 * one source or an index's shards at once), source_http.c (the bs_src
 * operations, a checked range request) and http_ahead.c (the ranges in
 * flight, read-ahead). */
#ifndef BURNSTORE_CORE_SOURCE_HTTP_H
#define BURNSTORE_CORE_SOURCE_HTTP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/http_client.h"
#include "core/remote.h"
#include "core/source.h"

enum {
  BS_HTTP_FIRST = 64 << 10, /* the opening request's bytes (a header's start) */
  BS_HTTP_BAD = 64,         /* failed ranges remembered, a source (one a stuck reader) */
};
#define BS_HTTP_SIZE_MAX ((uint64_t)1 << 62) /* the largest object taken */

struct fly; /* http_ahead.c: a range in flight */

struct http {
  struct bs_http_site *sh;
  struct bs_remote rm; /* what was asked for: hf://, s3:// or http(s):// */
  char *url;           /* rm.url, with what credentials it holds: never printed */
  char *reopen;        /* bs_remote_reopen(&rm) once open (NULL: none) */
  uint64_t id;         /* its blocks' key in the cache */
  uint64_t size;       /* the object's (s->size), at most BS_HTTP_SIZE_MAX */
  const char *name;    /* s->name (it outlives every fetch: release waits) */
  /* What every answer must repeat, pinned at open: the strong ETag (strong),
   * or under `unvalidated` whatever ETag and Last-Modified the server gave
   * (NULL: none), and the size. pin: the header every request carries
   * ("If-Match: ETAG", "If-Unmodified-Since: DATE" or ""). */
  char *etag, *lastmod, *pin;
  bool strong;
  atomic_bool gone;    /* the object changed: every read fails */
  atomic_bool closing; /* released: running requests stop, none starts */
  /* While an index's shards are opened together: their one deadline, which
   * the reads of its header keep too (CLOCK_MONOTONIC ms; 0: none). */
  _Atomic uint64_t open_deadline;
  pthread_mutex_t lock;
  pthread_cond_t landed; /* (CLOCK_MONOTONIC) a range in flight landed */
  char *why;             /* (under lock, once gone) */
  uint64_t seq_end;      /* where reading got to (read-ahead) (under lock) */
  unsigned run;          /* reads in a row that went on from seq_end (under lock) */
  uint64_t ahead;        /* read-ahead asked for up to this block (under lock) */
  /* Failed reads' ranges, and until when (CLOCK_MONOTONIC ms) a read that
   * overlaps one fails at once, unlogged: the kernel reads a range again
   * after an error, each of many readers stuck on one tensor too. The
   * ranges the readers asked for: a read of the next tensor in the same
   * block fetches again, and logs its own failure (under lock). */
  struct bs_http_bad {
    uint64_t from, to, until;
  } * bad; /* BS_HTTP_BAD of them, allocated at the first failure */
  unsigned bad_next;
  char *eff;        /* where url redirects to, or NULL (under lock) */
  bool eff_auth;    /* eff is on url's origin: the token goes there too (under lock) */
  struct fly *fly;  /* ranges in flight (under lock) */
  uint64_t fly_seq; /* (under lock) */
};

/* source_http.c */
extern const struct bs_src_ops bs_http_ops;
/* The deadline of a read beginning now (CLOCK_MONOTONIC ms). */
uint64_t bs_http_deadline(const struct http *h);
/* Whether an answer to [off, off+n) is exactly those bytes of the pinned
 * object: rc (the request's) kept, or -EIO (not those bytes), or -ESTALE
 * (the object changed: h is marked gone, and why); msg says why. */
int bs_http_check(struct http *h, uint64_t off, size_t n, const struct bs_http_xfer *x, int rc,
                  char *msg, size_t mn);
/* A range request for [off, off+n) into buf's blocks, checked: exactly
 * those bytes of the pinned object. 0 or -errno; a failure other than a
 * changed object is logged unless quiet. */
int bs_http_fetch(struct http *h, uint64_t off, const struct bs_http_dst *buf, size_t n,
                  uint64_t deadline, bool quiet);
/* Reads go where the opening request's redirects led (eff, taken over; NULL:
 * the URL itself). */
void bs_http_set_eff(struct http *h, char *eff);
/* h freed: its requests ended first (h->closing set, they are cancelled). */
void bs_http_free(struct http *h);

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
/* h is being released: its read-ahead cancelled and waited for. */
void bs_http_ahead_forget(struct http *h);

/* http_open.c: open rm on sh (whose reference the caller passes in,
 * released on failure; rm is the source's from now on, freed on failure). */
int bs_http_open(struct bs_src *s, struct bs_http_site *sh, struct bs_remote *rm, bs_err *err);

#endif
