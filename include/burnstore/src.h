/* A byte source: "read N bytes at offset" over a file descriptor or a memory
 * buffer. Readers parse through it, so unit tests need no files. */
#ifndef BURNSTORE_SRC_H
#define BURNSTORE_SRC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "burnstore/err.h"

#pragma GCC visibility push(default) /* the API (err.h) */

struct bs_src {
  int fd;             /* -1 for a memory source */
  bool owns_fd;       /* close(fd) in bs_src_destroy */
  const uint8_t *mem; /* borrowed; NULL for an fd source */
  uint64_t size;      /* total bytes */
  char *name;         /* owned; used in error messages */
  /* A regular file's identity at open, for bs_src_changed (fd sources). */
  bool stamped;
  uint64_t st_size;
  struct timespec st_mtim, st_ctim;
  bool change_logged; /* set once, atomically, by whoever reports a change */
  bool lazy;          /* fd -1: `name` is opened for each read (bs_src_init_path) */
};

/* Open `path` read-only. On failure *s is zeroed (fd -1) and err is set
 * (the message does not repeat the path: the caller prefixes it). */
BS_NODISCARD int bs_src_open(struct bs_src *s, const char *path, bs_err *err);
/* Wrap an fd (takes ownership if owns). Size from fstat. */
BS_NODISCARD int bs_src_init_fd(struct bs_src *s, int fd, bool owns, const char *name, bs_err *err);
/* A file opened for each read and closed after it, so that a catalog can
 * name many files (one per staged tensor) without holding an fd each. Size
 * from stat now; the file must not change while the source is used. */
BS_NODISCARD int bs_src_init_path(struct bs_src *s, const char *path, bs_err *err);
/* Wrap memory; `mem` is borrowed and must outlive the source. */
BS_NODISCARD int bs_src_init_mem(struct bs_src *s, const void *mem, size_t n, const char *name,
                                 bs_err *err);
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
 * -errno. Thread-safe (pread). */
long bs_src_pread(const struct bs_src *s, uint64_t off, void *buf, size_t n);
void bs_src_destroy(struct bs_src *s); /* safe on a zeroed or half-built source */

/* Whether the file of an fd source changed since it was opened, by one
 * fstat: its size or mtime differ, or its ctime while the file still has a
 * name (deleting it, or renaming another file over it, changes the old
 * inode's ctime and link count but not its bytes, which stay readable
 * through our fd). A ctime change alone is also a chmod, a hard link or a
 * rename of the file itself: it cannot be told from an edit that restored
 * the mtime, so it counts. Memory sources never change. On true, why (if
 * not NULL) says what changed. Thread-safe. */
bool bs_src_changed(const struct bs_src *s, char *why, size_t n);
/* A source borrowing from's fd or memory (not owned), with from's stamp,
 * so bs_src_changed keeps comparing with the file as first opened. Fails
 * (EIO, naming what changed) if the file already changed. */
BS_NODISCARD int bs_src_init_borrowed(struct bs_src *s, const struct bs_src *from, bs_err *err);

#pragma GCC visibility pop

#endif
