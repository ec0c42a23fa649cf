/* The write-back of a writable mount and its recovery, without FUSE: choosing
 * the writer from the output path (shards included), the staging directory
 * (mkdtemp'd and flock'd for its owner's life), running a write-back (output
 * catalog -> INDEX, fsynced -> writer through the atomic sink), and what a
 * write-back that did not end leaves: `burnstore --list-staging DIR` lists a
 * staging directory, `burnstore --finish DIR` replays its INDEX under the
 * target lock (target.h). The FUSE layer calls bs_wb_run at unmount; the CLI
 * calls the rest; unit tests drive all of it on temporary directories. */
#ifndef BURNSTORE_WRITEBACK_H
#define BURNSTORE_WRITEBACK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/edit.h"
#include "formats/writers.h"

/* The one output -> writer rule (mounts and convert): the writer of path's
 * extension; with max_shard_size, a SafeTensors output is written as a
 * shard set (NAME.safetensors or NAME.safetensors.index.json). `label` names
 * the path in messages as the user gave it ("output=x.pth", "x.pth"). NULL
 * with EINVAL and one line: no extension, an extension no writer has (with
 * the list of those it has), max_shard_size= on another format. */
const struct bs_writer *bs_wb_writer(const char *path, const char *label, uint64_t max_shard_size,
                                     bs_err *err);
/* max_shard_size applied to a writer already chosen (an rw mount in place
 * keeps the format it holds): SafeTensors becomes the shard set. NULL with
 * EINVAL when w writes no SafeTensors. */
const struct bs_writer *bs_wb_sharded(const struct bs_writer *w, uint64_t max_shard_size,
                                      bs_err *err);

/* ---- The staging directory ----------------------------------------------------------------
 * `tmpl` is a mkdtemp template (".../burnstore-XXXXXX"), changed in place into
 * the directory's path. Created exclusively; its "lock" file is flock'd while
 * *lock stays open, which tells --finish and other daemons that its owner is
 * alive. 0, or -errno with nothing left behind. */
int bs_staging_create(char *tmpl, int *dirfd, int *lock);
/* Remove the staging directories of dead daemons that hold nothing (only
 * their lock file: no staged data, no INDEX, no log), or whose write-back
 * had completed (DONE: a line to `notes` says so), among the siblings named
 * like the template `tmpl` (DIR/PREFIXXXXXXX). Directories with data are kept
 * for --list-staging / --finish; one of another user's (or that others may
 * write) is left alone, with a line to `notes` (may be NULL). Nothing in
 * them is followed or blocks (core/safe_open.h). */
void bs_staging_sweep(const char *tmpl, FILE *notes);
/* Remove a staging directory the caller created and holds the lock of, once
 * nothing in it is needed (bs_stage_dir_remove: DONE naming `target` first,
 * so that a kill during the removal leaves it removable); closes both fds
 * and sets them to -1. A no-op unless both are open. */
void bs_staging_remove(const char *dir, const char *target, int *dirfd, int *lock);

/* ---- One write-back ----------------------------------------------------------------------- */
struct bs_wb {
  const char *target;             /* absolute path written */
  const struct bs_writer *writer; /* its format */
  struct bs_write_opts opts;
  const char *source;         /* the checkpoint's absolute path, recorded in the INDEX */
  const struct bs_edit *edit; /* the tree and its entries; edit->src: the source catalog */
  bool keep_hidden;           /* keep the source tensors the key options hid (rw in place) */
  /* -o output_as=: every floating tensor written as output_as (F32, F16 or
   * BF16; bs_catalog_decode_as at write-back). The INDEX records the
   * tensors as stored and the option, so --finish converts them too. */
  bool has_output_as;
  enum bs_dtype output_as;
  /* The staging directory: created by bs_staging_create, or its template,
   * created here (once the output catalog is built) with *staging_fd < 0. */
  char *staging;
  int *staging_fd, *staging_lock;
};

/* Build the output catalog, save its INDEX (fsynced) into the staging
 * directory, run the writer onto the target atomically. 0 with *report: the
 * writer's notes (owned, bs_free; NULL when none). -1 with err: the target is
 * untouched and the staging directory is kept with its INDEX, for
 * `burnstore --finish` (if the output catalog could not be built, an INDEX
 * marked incomplete lists the staged files, for --list-staging). The
 * staging files are named by bs_entry.stage ("%llu"). The caller removes
 * the staging directory (bs_staging_remove) after a success. */
BS_NODISCARD int bs_wb_run(const struct bs_wb *wb, char **report, bs_err *err);

/* Start the mount's staging journal (journal.h) in its staging directory
 * (created already): BASE = the INDEX of the output catalog as mounted, one
 * ORIGIN per file of the tree. The caller sets wb->edit->journal to it and
 * closes it after the write-back. NULL with err (the mount goes on without). */
BS_NODISCARD struct bs_journal *bs_wb_journal_start(const struct bs_wb *wb, bs_err *err);

/* ---- Staging directories left behind ------------------------------------------------------ */

/* Print what staging directory `dir` (the caller's or root's, writable by
 * its owner alone: another user's is refused naming its owner) holds to `out`: target, format,
 * daemon pid (running or gone), the checkpoint, then one line per tensor: key, dtype, shape, bytes,
 * where (tab-separated). 0; 1 when it has no INDEX (its raw files are listed: they cannot be
 * finished); -1 with err. */
BS_NODISCARD int bs_wb_list(const char *dir, FILE *out, bs_err *err);

struct bs_wb_finished {
  char *target;        /* owned (bs_free): what was written, or NULL */
  size_t tensors;      /* how many */
  bool already;        /* the target already held the result: nothing written */
  bool completed;      /* its write-back had completed (DONE): the directory was removed;
                        * target: the one DONE names, or NULL */
  bool empty;          /* it held nothing but its lock: removed */
  bool kept;           /* on failure: the writer failed, the staging directory is kept */
  bool salvaged;       /* written from a damaged journal's records before the damage; the
                        * staging directory is kept (the dropped records' staged files) */
  char *notes;         /* owned (bs_free): lines to show, or NULL: a torn tail ignored, a
                        * journal no longer durable, what a salvage dropped */
  const char *err_dir; /* on failure: the directory err is about (prefix it), or NULL */
};
#define BS_WB_SALVAGE 1u /* --finish --salvage: a damaged journal's records before the damage */
/* Complete the write-back whose INDEX staging directory `dir` holds (its daemon
 * was killed, or its writer failed; without an INDEX, from its JOURNAL):
 * refused while the daemon lives, for an incomplete INDEX, while another
 * writer holds the target lock, for a directory of another user's (or that
 * others may write), for a damaged journal (journal_replay.h) unless
 * `flags` has BS_WB_SALVAGE, or when the checkpoint the INDEX copies from
 * changed (ESTALE; unless the target already is the result, then the
 * directory is just removed). A directory whose write-back completed
 * (DONE: a kill cut its removal short) is removed. On success the directory
 * is removed (not after a salvage). res is zeroed first; free res->target and res->notes
 * either way. */
BS_NODISCARD int bs_wb_finish(const char *dir, unsigned flags, struct bs_wb_finished *res,
                              bs_err *err);

#endif
