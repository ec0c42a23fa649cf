/* The commit protocol of an output made of several files (a shard set: its
 * shards and the index that names them), so that a kill at any point leaves
 * either the old set or the new set whole once recovered (docs/robustness.md).
 *
 * A journal ".INDEXNAME.burnstore-journal" beside the index, flock'd by its
 * writer for the whole write, records the set before anything is replaced:
 *   burnstore-set-journal 1
 *   index NAME                (the index file, renamed last of the new files)
 *   new NAME ...              (every file of the new set)
 *   old NAME ...              (files of the old set, removed once the index is in)
 *   prepared                  (fsynced before any temp file exists)
 *   rename TMP FINAL ...      (appended once every temp file is fsynced)
 *   commit HEX                (FNV-1a of all bytes before it: the commit point)
 * Fields are TAB-separated; names are plain names in the index's directory.
 * Without a valid commit record, recovery rolls back (removes the dead temp
 * files of the new names); with one it rolls forward (renames what is left,
 * the index last, then removes the old files). Either way the journal goes
 * last. */
#ifndef BURNSTORE_SET_JOURNAL_H
#define BURNSTORE_SET_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"
#include "core/sink.h"

struct bs_set {
  int dirfd;          /* the index's directory */
  int fd;             /* the journal, flock'd while the set is written */
  char *dir;          /* owned: the directory, for messages and paths */
  char *jname;        /* owned: the journal's name in dir */
  char *index;        /* owned: the index's name in dir */
  const char *suffix; /* borrowed (static): how every member's name ends */
  struct bs_buf jb;   /* what the journal holds so far */
};

/* The set of every call is named by its index's path and the suffix that
 * ends the name of each of its members (the writer's: the files a journal
 * may name new or old, so a journal cannot make recovery touch any other
 * file of the directory). */

/* Complete or roll back an interrupted write of the set whose index is
 * `index_path`, as its journal says. 0 when nothing was pending or it was
 * recovered (*did, if not NULL, says whether anything was). A live writer
 * that has not committed leaves the old set whole: 0, nothing done. One that
 * has committed is waited for (a few seconds: it only renames), then EBUSY.
 * A journal that cannot be applied is kept: -1, naming it. */
BS_NODISCARD int bs_set_recover(const char *index_path, const char *suffix, bool *did, bs_err *err);

/* Start writing a set: recover a pending journal (EBUSY while another writer
 * holds it), then create and lock an empty journal, which keeps other writers
 * of the set out until commit or abort (read the old index after this). */
BS_NODISCARD int bs_set_begin(struct bs_set *s, const char *index_path, const char *suffix,
                              bs_err *err);
/* Record the new files `newf` (names in the index's directory, the index
 * among them) and the old files `oldf` to remove once the index is in;
 * fsynced with the directory before the caller creates any temp file. On
 * failure the set is aborted. */
BS_NODISCARD int bs_set_prepare(struct bs_set *s, const char *const *newf, size_t nnew,
                                const char *const *oldf, size_t nold, bs_err *err);
/* The commit: `files` are synced atomic files (bs_atomic_sync) of targets in
 * the directory, the index last. Records their renames, fsyncs the commit
 * record, then renames them (the index last, after a directory fsync),
 * removes the old files and the journal. The atomic files are released
 * whatever happens: after the commit record their temp files belong to the
 * journal, and a failure later is completed by the next bs_set_recover. */
BS_NODISCARD int bs_set_commit(struct bs_set *s, struct bs_atomic *files, size_t n, bs_err *err);
/* Roll back before the commit (the caller has aborted its atomic files):
 * removes the journal. Safe on a zeroed, committed or aborted bs_set. */
void bs_set_abort(struct bs_set *s);

/* A journal's records. Names point into `copy` (owned); every one is a plain
 * name (no '/', not "." or "..", no control characters), old ones shard
 * names, renames' temps ".NAME.burnstore-tmp-..." and finals among newf. */
struct bs_set_rename {
  const char *tmp, *final;
};
struct bs_set_plan {
  char *copy;
  const char *index; /* NULL until the "index" record */
  const char **newf, **oldf;
  size_t nnew, nold, cnew, cold;
  struct bs_set_rename *ren;
  size_t nren, cren;
  bool prepared;  /* its "prepared" record is there: temp files may exist */
  bool committed; /* a valid commit record: roll forward */
};
/* Parse a journal's bytes (untrusted). A journal cut or malformed before its
 * "prepared" record created nothing: 0 with prepared false. After it, a
 * record burnstore does not write is EINVAL naming `where` and the line, and
 * p is empty; a commit record cut or with a wrong checksum leaves committed
 * false. */
BS_NODISCARD int bs_set_plan_parse(const char *where, const char *suffix, const void *text,
                                   size_t n, struct bs_set_plan *p, bs_err *err);
void bs_set_plan_destroy(struct bs_set_plan *p); /* safe on a zeroed or destroyed plan */

/* A name the set may own: a plain file name (no '/', not hidden, no control
 * characters) ending in `suffix` (ASCII case ignored). */
bool bs_set_is_member(const char *name, const char *suffix);

#endif
