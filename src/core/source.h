/* A byte source: "read N bytes at offset" behind an ops table, so readers,
 * the catalog, the writers and the FUSE read path never know what holds the
 * bytes. Kinds today: a file (fd held), a memory buffer, a path opened per
 * read, a shard beside its index (fd from a bounded pool) and a borrowed
 * view of another source, and a file on an HTTP(S) server (source_http.c). */
#ifndef BURNSTORE_SRC_H
#define BURNSTORE_SRC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

struct bs_src;

/* Bytes a source holds in its own memory, lent without a copy (a reply
 * sent straight from them): up to BS_SRC_SPANS pieces, in order, pinned
 * until bs_src_view_put. `pin` is the kind's. */
#define BS_SRC_SPANS 4
struct bs_src_view {
  const void *p[BS_SRC_SPANS];
  size_t n[BS_SRC_SPANS];
  size_t count;
  uint64_t pin[BS_SRC_SPANS];
};

/* Who a file source was at open (a file-backed source's identity), for the
 * INDEX of a write-back and for "is this output file my source?". */
struct bs_src_ident {
  uint64_t dev, ino, size;
  int64_t mtime_sec;
  long mtime_nsec;
};

/* What a kind of source implements. Every op is thread-safe; `s->impl` is
 * the kind's own state. Optional ops may be NULL. */
struct bs_src_ops {
  /* Up to n bytes at off, where off < s->size and 0 < n <= s->size - off:
   * bytes read (short only at a real end of file) or -errno. Required. */
  long (*pread)(const struct bs_src *s, uint64_t off, void *buf, size_t n);
  /* Whether the bytes behind s changed since it was opened; why (n bytes,
   * never NULL here) says what. NULL: never changes. */
  bool (*changed)(const struct bs_src *s, char *why, size_t n);
  /* Open the source `rel` names relative to s (a shard beside its index)
   * into *out. NULL: this kind has no siblings (ENOTSUP). */
  int (*open_sibling)(const struct bs_src *s, const char *rel, struct bs_src *out, bs_err *err);
  /* An fd whose bytes at the source's offsets are the source's, kept open
   * until fd_put (for zero-copy splice), or -1 when there is none now.
   * NULL: never an fd (a network source); callers pread instead. */
  int (*fd_get)(const struct bs_src *s);
  void (*fd_put)(const struct bs_src *s, int fd);
  /* Lend the n bytes at off (off < s->size, 0 < n <= s->size - off, all
   * of them) in *v, pinned until view_put: 0, -EAGAIN when they cannot be
   * lent now (more than BS_SRC_SPANS pieces, a cache too small to keep
   * them: pread them instead), or -errno as pread. NULL: never. */
  int (*view)(const struct bs_src *s, uint64_t off, size_t n, struct bs_src_view *v);
  void (*view_put)(const struct bs_src *s, struct bs_src_view *v);
  /* The file's identity at open; false when the source is no file. */
  bool (*ident)(const struct bs_src *s, struct bs_src_ident *id);
  /* A remote source's URL and validator (bs_src_remote). NULL: not remote. */
  bool (*remote)(const struct bs_src *s, const char **reopen, const char **validator);
  /* Free s->impl (and what it holds). Required. */
  void (*release)(struct bs_src *s);
};

/* Caller storage (bs_src_*_init / bs_src_destroy); moving the struct (as a
 * catalog does) is fine: the kind's state lives behind impl. */
struct bs_src {
  const struct bs_src_ops *ops; /* NULL: zeroed, destroyed or moved from */
  void *impl;                   /* owned through ops->release */
  uint64_t size;                /* total bytes */
  char *name;                   /* owned; the path of a file, used in error messages */
  bool change_logged;           /* set once, atomically, by whoever reports a change */
};

/* Open `path` read-only and hold its fd. On failure *s is zeroed and err is
 * set (the message does not repeat the path: the caller prefixes it). */
BS_NODISCARD int bs_src_open(struct bs_src *s, const char *path, bs_err *err);
enum {
  BS_SRC_OWN_FD = 1,    /* close the fd in bs_src_destroy (and on failure) */
  BS_SRC_UNWATCHED = 2, /* a file only we write (a temp file): no change detection */
};
/* Wrap an fd (flags: BS_SRC_*). Size from fstat. */
BS_NODISCARD int bs_src_init_fd(struct bs_src *s, int fd, unsigned flags, const char *name,
                                bs_err *err);
/* A file opened for each read and closed after it, so that a catalog can
 * name many files (one per staged tensor) without holding an fd each. Size
 * from stat now; the file must not change while the source is used. */
BS_NODISCARD int bs_src_init_path(struct bs_src *s, const char *path, bs_err *err);
/* The file `name` beneath the held directory dirfd (borrowed: it must
 * outlive the source), opened for each read as any file burnstore did not
 * just create (no symbolic link followed, a regular file of the caller's or
 * root's) and checked to be the file found now (device, inode), so that a
 * catalog can name many files without holding an fd each, and nothing
 * reached by a path another user could redirect. `dir` names dirfd in
 * s->name ("DIR/NAME") and in messages (NULL: the name alone). */
BS_NODISCARD int bs_src_init_at(struct bs_src *s, int dirfd, const char *dir, const char *name,
                                bs_err *err);
/* Wrap memory; `mem` is borrowed and must outlive the source. */
BS_NODISCARD int bs_src_init_mem(struct bs_src *s, const void *mem, size_t n, const char *name,
                                 bs_err *err);
/* A view of `from` (same bytes, same change detection, nothing owned):
 * `from` must outlive s and not move. Fails (EIO, naming what changed) if
 * from already changed. */
BS_NODISCARD int bs_src_init_borrowed(struct bs_src *s, const struct bs_src *from, bs_err *err);
/* The source `rel` (relative, no "..": the caller checked) names beside s,
 * e.g. a shard beside its index. Fails with ENOTSUP for a kind without
 * siblings (memory). */
BS_NODISCARD int bs_src_open_sibling(const struct bs_src *s, const char *rel, struct bs_src *out,
                                     bs_err *err);
/* Whether `s` is an http://, https://, hf:// (the Hugging Face Hub) or
 * s3:// URL (a remote source, bs_src_init_http). */
bool bs_src_is_url(const char *s);
/* The URL without what may be a secret: "user:pass@" and the query string
 * (a presigned URL's signature) become "***" (a copy to bs_free; NULL: no
 * memory). What errors, logs and the mount table show of a URL. */
char *bs_http_redact(const char *url);
/* Options of a remote source (zeroed: the defaults). */
struct bs_http_opts {
  uint64_t
      cache_bytes;    /* block cache of it and its siblings; 0: $BURNSTORE_HTTP_CACHE, or 64 MiB */
  long timeout_s;     /* how long a read may block; 0: $BURNSTORE_HTTP_TIMEOUT, or 60 s */
  const char *bearer; /* "Authorization: Bearer" token; NULL: $BURNSTORE_HTTP_TOKEN */
  /* Read a server that gives no strong ETag (only a weak one, only
   * Last-Modified, one too long to keep, none), comparing the size and
   * Last-Modified of every answer instead; false: $BURNSTORE_HTTP_UNVALIDATED
   * (1), else such a server is refused at open. */
  bool unvalidated;
};
/* The syntax of BURNSTORE_HTTP_CACHE and -o http_cache=: a size (core/size.h:
 * 256M, 256MiB, 300MB...), 1 MiB to 16 GiB;
 * of BURNSTORE_HTTP_TIMEOUT and -o http_timeout=: whole seconds, 1 to 3600.
 * 0, or -1 when v is not one. */
int bs_http_parse_cache(const char *v, uint64_t *bytes);
int bs_http_parse_timeout(const char *v, long *seconds);
/* A file on an HTTP(S) server, read by range requests (libcurl); also
 * hf://[datasets/|spaces/]ORG/REPO[@REVISION]/PATH (the Hub's resolve URL at
 * $HF_ENDPOINT, its token from HF_TOKEN or $HF_HOME/token, the revision
 * pinned to the first answer's X-Repo-Commit) and s3://BUCKET/KEY (signed
 * with Signature V4 from the AWS_* variables; AWS_ENDPOINT_URL path style).
 * One request now learns its size and pins its strong ETag; every later
 * request is conditional on it and every answer must repeat it and the
 * size, so a changed object fails reads with EIO (bs_src_changed says why),
 * never mixes bytes. A server without a strong ETag is refused unless
 * opts->unvalidated (then the size and Last-Modified are compared). A size
 * over 2^62 is refused. Redirects followed, TLS
 * verified, retries with backoff on connection errors, 5xx and 429. s->name
 * is bs_http_redact(url) (hf:// and s3:// as given); errors do not repeat
 * it (the caller prefixes it). */
BS_NODISCARD int bs_src_init_http(struct bs_src *s, const char *url,
                                  const struct bs_http_opts *opts, bs_err *err);
/* A remote source's identity, what a staging INDEX records so that
 * --finish opens the same bytes or refuses: *reopen the URL that opens it
 * again (an hf:// URL at its pinned commit; NULL when the URL holds
 * credentials, which are never written down), *validator what its reads are
 * conditional on ("If-Match: ETAG" or "If-Unmodified-Since: DATE"; "" when
 * the server gave neither). Both live as long as s. false: s is not remote. */
bool bs_src_remote(const struct bs_src *s, const char **reopen, const char **validator);
void bs_src_destroy(struct bs_src *s); /* safe on a zeroed or half-built source */

/* Read exactly n bytes at off. Reading past the end is an EINVAL error that
 * names the offset ("truncated"); an I/O failure is EIO. */
BS_NODISCARD int bs_src_read(const struct bs_src *s, uint64_t off, void *buf, size_t n,
                             bs_err *err);
/* Read exactly n bytes at off into a new bs_malloc'd buffer (*out; at least
 * one byte is allocated, so n may be 0). The range is checked against the
 * source before anything is allocated, so an untrusted n cannot make us
 * allocate more than the file holds. On failure *out is NULL. */
BS_NODISCARD int bs_src_read_alloc(const struct bs_src *s, uint64_t off, uint64_t n, uint8_t **out,
                                   bs_err *err);
/* Read up to n bytes at off into buf; returns bytes read (short at EOF) or
 * -errno. Thread-safe. */
long bs_src_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n);
/* Why a read of s (bs_src_pread, bs_tensor_read) just failed with -code on
 * this thread, for the caller's one-line message: the line the source
 * logged about it (bs_log_take: "URL: read of N bytes at offset O failed:
 * HTTP 503"), else what changed behind s, else strerror(code). Returns buf. */
const char *bs_src_why(const struct bs_src *s, int code, char *buf, size_t n);

/* Whether the bytes behind s changed since it was opened. For a file: by
 * one fstat, its size or mtime differ, or its ctime while the file still
 * has a name (deleting it, or renaming another file over it, changes the
 * old inode's ctime and link count but not its bytes, which stay readable
 * through our fd). A ctime change alone is also a chmod, a hard link or a
 * rename of the file itself: it cannot be told from an edit that restored
 * the mtime, so it counts. A file reopened on demand (a shard) must be the
 * same inode with the same stamp. Memory never changes. On true, why (if
 * not NULL) says what changed. Thread-safe. */
bool bs_src_changed(const struct bs_src *s, char *why, size_t n);

/* An fd to splice the source's bytes from (same offsets), held until
 * bs_src_fd_put; -1 when the source has none (read with bs_src_pread). */
int bs_src_fd_get(const struct bs_src *s);
void bs_src_fd_put(const struct bs_src *s, int fd); /* no-op for fd -1 */
/* The n bytes at off lent without a copy (the source's ops->view): 0 with
 * v filled (release with bs_src_view_put), -EAGAIN or -ENOTSUP (read with
 * bs_src_pread instead), or -errno. Thread-safe. */
int bs_src_view(const struct bs_src *s, uint64_t off, size_t n, struct bs_src_view *v);
void bs_src_view_put(const struct bs_src *s, struct bs_src_view *v);
/* The file's identity at open; false when the source is not a file. */
bool bs_src_ident(const struct bs_src *s, struct bs_src_ident *id);

#pragma GCC visibility pop

#endif
