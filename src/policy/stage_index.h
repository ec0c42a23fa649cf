/* The INDEX of a staging directory: a text description of a write-back's
 * output catalog (every tensor's key, dtype, shape, param_id and where its
 * bytes are: a staging file, or the source checkpoint + offset/length), the
 * root metadata, the target path and format. A write-back saves it (fsynced)
 * before its writer starts, so that `burnstore --finish` can redo the write
 * from the staging directory alone after the daemon was killed.
 *
 * Format (docs/robustness.md): UTF-8 text, one record per line, fields
 * separated by TAB; strings are percent-escaped (bytes <= 0x20, '%', 0x7f as
 * %XX). Lines starting with '#' are comments. The first record is
 * "burnstore-staging-index 2", the last "end N" (N = tensor + file records),
 * so a cut INDEX is refused. Version 2 names its staging directory
 * ("staging NAME"), so an INDEX or JOURNAL copied into another one is
 * refused; version 1 (burnstore 0.1.0) did not, and is still read. */
#ifndef BURNSTORE_STAGE_INDEX_H
#define BURNSTORE_STAGE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "core/edit.h"
#include "core/sink.h"
#include "formats/formats.h" /* enum bs_format */

#define BS_STAGE_INDEX_NAME "INDEX"
#define BS_STAGE_LOCK_NAME "lock"
#define BS_STAGE_LOG_NAME "log"         /* a failed write-back's log: why it failed */
#define BS_STAGE_DONE_NAME "DONE"       /* the write-back completed: nothing here is needed */
#define BS_STAGE_INDEX_MAX (256u << 20) /* bytes of INDEX we are willing to load */

/* The checkpoint the clean tensors' bytes come from, as it was at mount. */
struct bs_stage_checkpoint {
  char *path;  /* NULL: none (a new file); remote: the URL that opens it again */
  bool remote; /* a URL (record "remote"): size and each source's validator
                * identify it, not dev/ino/mtime */
  uint64_t size, dev, ino;
  int64_t mtime_sec;
  long mtime_nsec;
  bool strict; /* the bs_open_opts it was opened with */
};

/* A staged file the output catalog does not describe (an INDEX written after
 * the catalog could not be built: listing only, --finish refuses it). */
struct bs_stage_file {
  char *file; /* name inside the staging directory */
  char *key;
  enum bs_dtype dtype;
  bool has_shape;
  uint32_t rank;
  uint64_t *shape;
};

struct bs_stage_src {
  bool stage;      /* a file of the staging directory (else: of the checkpoint) */
  char *file;      /* stage only: its name in the staging directory */
  char *validator; /* a remote checkpoint's: bs_src_remote's, never "" */
  uint64_t size;
};

struct bs_stage_index {
  long pid;
  char *target;
  char *staging; /* the staging directory's name (its last component); NULL in an
                    INDEX of version 1, which names none */
  enum bs_format format;
  uint64_t max_shard_size; /* the write's bs_write_opts (0: none) */
  bool has_output_as;      /* "output_as DT": the tensors are written as DT (writeback.h) */
  enum bs_dtype output_as;
  bool has_mode; /* and its mode for a new target (an INDEX of */
  unsigned mode; /* before the record has none) */
  struct bs_stage_checkpoint ck;
  struct bs_stage_src *srcs; /* what out.srcs must be, in order */
  size_t nsrcs, ncksrcs;     /* ncksrcs: the first ones come from the checkpoint */
  struct bs_catalog cat;     /* tensors + metadata; srcs attached by _attach */
  char *incomplete;          /* NULL, or why the catalog is partial */
  struct bs_stage_file *files;
  size_t nfiles;
};

void bs_stage_index_init(struct bs_stage_index *idx);
void bs_stage_index_destroy(struct bs_stage_index *idx);

/* Serialize. `idx` gives pid, target, format, ck, ncksrcs, incomplete and
 * files; `out` the tensors, metadata and sources (sources from ncksrcs on
 * must be files named `staging`/NAME). */
BS_NODISCARD int bs_stage_index_format(const struct bs_stage_index *idx,
                                       const struct bs_catalog *out, const char *staging,
                                       struct bs_buf *buf, bs_err *err);
/* Write buf as dirfd/INDEX: INDEX.tmp, fsync, rename, fsync the directory.
 * Any failure (ENOSPC...) is returned with a message; no 0-byte INDEX stays. */
BS_NODISCARD int bs_stage_index_save(int dirfd, const struct bs_buf *buf, bs_err *err);

/* Parse an INDEX (untrusted: every number and reference is checked). */
BS_NODISCARD int bs_stage_index_parse(const void *text, size_t len, struct bs_stage_index *idx,
                                      bs_err *err);
/* Read INDEX beneath the held staging directory (at most BS_STAGE_INDEX_MAX
 * bytes; a regular file of the caller's or root's that no one else may
 * write), parse it and check it was written there (bs_stage_index_check_dir).
 * ENOENT when there is none. */
BS_NODISCARD int bs_stage_index_load(const struct bs_stage_dir *stg, struct bs_stage_index *idx,
                                     bs_err *err);
/* Whether idx, read from stg's file `what` (INDEX, JOURNAL), was written for
 * stg: the staging directory it names must be stg's (its name now, through
 * the held fd). One copied from another staging directory would write that
 * one's target with this one's staged bytes: refused (EINVAL) in one line
 * naming both directories. An INDEX of version 1 names none: taken as it is. */
BS_NODISCARD int bs_stage_index_check_dir(const struct bs_stage_index *idx,
                                          const struct bs_stage_dir *stg, const char *what,
                                          bs_err *err);
/* Open the byte sources into idx->cat: the checkpoint (refused with ESTALE
 * if its size, mtime or inode changed, or it reads differently) and the
 * staging files beneath stg (their sizes must match; opened per read). */
BS_NODISCARD int bs_stage_index_attach(struct bs_stage_index *idx, const struct bs_stage_dir *stg,
                                       bs_err *err);

/* Remove a staging directory whose lock the caller holds (dirfd: the
 * directory, `dir` its path) once nothing in it is needed (its write-back
 * committed, or there was nothing to write): first DONE (naming `target`,
 * which may be NULL) is created and the directory fsynced, so that a kill
 * during the removal leaves a directory --finish and the next mount's sweep
 * know they may remove; then the JOURNAL and the INDEX, its other files,
 * DONE, the lock file, and the directory itself (by its name in its
 * parent, if that still is this directory). The caller closes its fds. */
void bs_stage_dir_remove(int dirfd, const char *dir, const char *target);
/* Whether the held staging directory holds DONE (a regular file of the
 * caller's or root's): its write-back completed, and a kill cut its removal
 * short. The target DONE names goes into target (n bytes; "" if none). */
bool bs_stage_done(const struct bs_stage_dir *stg, char *target, size_t n);

#endif
