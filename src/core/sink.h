/* Where a writer's bytes go. A writer serializes once, into a bs_sink, which
 * is memory (tests, sizes), an fd, or the temp file of an atomic file commit
 * (temp beside the target, fsync, rename, fsync of the directory).
 *
 * Temp files are named ".NAME.burnstore-tmp-XXXXXX" beside the target NAME
 * and hold an exclusive flock while they exist, so a writer that died (kill -9)
 * is told from a live one: opening a target removes the temp files of that
 * target whose lock can be taken, never one a live writer holds. */
#ifndef BURNSTORE_SINK_H
#define BURNSTORE_SINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

struct bs_buf {
  uint8_t *data; /* owned (bs_malloc) */
  size_t len, cap;
};
void bs_buf_destroy(struct bs_buf *b); /* frees data; safe on a zeroed buf, and twice */
/* Append n bytes (the buffer grows geometrically). 0, or -1 when out of memory. */
BS_NODISCARD int bs_buf_put(struct bs_buf *b, const void *d, size_t n);

struct bs_sink {
  struct bs_buf *mem; /* borrowed: the memory sink's buffer, or NULL for an fd sink */
  int fd;             /* borrowed: the fd sink's fd (written at its current offset) */
  const char *name;   /* borrowed: names the output in messages */
  uint64_t pos;       /* bytes put so far */
  /* An atomic commit's temp file (written from offset 0) is pushed to the
   * disk window by window as it is written (sync_file_range), and waited
   * for 128 MiB behind the writer, so its final fsync has little left to
   * do; the observer then counts bytes once they are on disk. `started`: bytes whose write-out was
   * started; `told`: bytes reported to the observer. */
  bool behind;
  uint64_t started, told;
};

/* A sink that appends to `buf` (which the caller owns and frees). */
void bs_sink_init_mem(struct bs_sink *k, struct bs_buf *buf, const char *name);
/* A sink that write()s to `fd` (not closed by the sink). */
void bs_sink_init_fd(struct bs_sink *k, int fd, const char *name);

/* Put n bytes. ENOSPC and other write errors name the output and the byte. */
BS_NODISCARD int bs_sink_put(struct bs_sink *k, const void *d, size_t n, bs_err *err);

struct bs_catalog;
struct bs_tensor;
/* The buffer a writer streams tensors through: min(biggest, BS_SINK_CHUNK)
 * bytes (at least one) into *cap; NULL with err set when out of memory.
 * Freed with bs_free. */
#define BS_SINK_CHUNK (1u << 20)
uint8_t *bs_sink_chunk(uint64_t biggest, size_t *cap, bs_err *err);
/* Write tensor t of cat (its bytes as bs_tensor_read gives them, in chunks of
 * buf[cap]) to k; a short or failed read is an error naming the tensor. */
BS_NODISCARD int bs_sink_put_tensor(const struct bs_catalog *cat, const struct bs_tensor *t,
                                    uint8_t *buf, size_t cap, struct bs_sink *k, bs_err *err);
/* The same, and *crc (a running CRC-32 as zlib's crc32 computes it; start
 * with 0) takes in every byte written; crc may be NULL. */
BS_NODISCARD int bs_sink_put_tensor_crc(const struct bs_catalog *cat, const struct bs_tensor *t,
                                        uint8_t *buf, size_t cap, struct bs_sink *k, uint32_t *crc,
                                        bs_err *err);
BS_NODISCARD int bs_sink_zeros(struct bs_sink *k, uint64_t n, bs_err *err);
/* A hint that `n` more bytes follow: a memory sink allocates them now (so
 * ENOMEM comes before any work); an fd sink does nothing. */
BS_NODISCARD int bs_sink_reserve(struct bs_sink *k, uint64_t n, bs_err *err);
/* A process-wide observer of fd sinks (the progress lines): called with ctx
 * and a byte count after every write to an fd sink, or, for an atomic
 * commit's temp file, as its bytes reach the disk (the last ones after its
 * fsync), so that a progress line reaches 100% only when the data is
 * durable. NULL: none. Set it before writers run; it must be cheap. */
void bs_sink_set_observer(void (*fn)(void *ctx, uint64_t n), void *ctx);

/* ---- Atomic file commit --------------------------------------------------------------------
 *
 * One file:   bs_atomic_open, write to a.sink, bs_atomic_commit (or bs_atomic_abort).
 * N files as a set (the sharded writer): open and write each, bs_atomic_sync each (any
 * failure: abort all, every target untouched), then hand them to the set's journal
 * (core/set_journal.h), which renames them after its commit record and releases them.
 *
 * A replaced target keeps its permission bits; a new one gets 0644 minus the umask. */
struct bs_atomic {
  char *path;          /* owned: the target */
  char *tmp;           /* owned: the temp file beside it */
  int fd;              /* the temp file while it is written; -1 after bs_atomic_sync */
  int lock_fd;         /* the same open file, holding the flock until publish or abort */
  struct bs_sink sink; /* an fd sink on `fd`, named after the target: write here */
};

/* Remove stale temp files of `path` (whose lock can be taken), then create
 * and lock a new temp file. On failure `a` is left closed (abort is a no-op). */
BS_NODISCARD int bs_atomic_open(struct bs_atomic *a, const char *path, bs_err *err);
/* The same; a new `path` gets permission bits `mode` & 0666 (the umask
 * applies; bs_atomic_open: 0644), an existing one keeps its own mode. */
BS_NODISCARD int bs_atomic_open_mode(struct bs_atomic *a, const char *path, unsigned mode,
                                     bs_err *err);
/* Phase 1: fsync and close the temp file's data (the lock stays held). */
BS_NODISCARD int bs_atomic_sync(struct bs_atomic *a, bs_err *err);
/* After bs_atomic_sync, for a member of a set whose journal and target lock
 * keep every other writer and cleaner away: let the temp file's own lock go,
 * so that a set holds no fd per file while it waits for its commit. */
void bs_atomic_unlock(struct bs_atomic *a);
/* Phase 2: rename the temp file over the target, fsync the directory, release. */
BS_NODISCARD int bs_atomic_publish(struct bs_atomic *a, bs_err *err);
/* sync + publish. On failure the temp file is removed and the target is untouched. */
BS_NODISCARD int bs_atomic_commit(struct bs_atomic *a, bs_err *err);
/* Remove the temp file (if any) and release everything; the target is untouched.
 * Safe on a zeroed, failed, committed or aborted bs_atomic. */
void bs_atomic_abort(struct bs_atomic *a);
/* Release a synced file whose temp file someone else renames (the set journal):
 * closes and frees, never removes the temp file. Safe where abort is. */
void bs_atomic_release(struct bs_atomic *a);
/* For a writer that failed: make err's message name the target, abort, return -1. */
int bs_atomic_fail(struct bs_atomic *a, bs_err *err);

/* Remove the temp files of `path` left by writers that died. Returns how many
 * were removed (errors are skipped: cleaning is best effort). */
int bs_atomic_clean_stale(const char *path);

#pragma GCC visibility pop

#endif
