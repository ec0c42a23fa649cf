/* The staging journal's replay (core/journal.h has its format and writer):
 * what a JOURNAL describes, rebuilt as an editable catalog over its BASE, and
 * `burnstore --finish` of a staging directory without an INDEX. Policy: it
 * uses the staging INDEX and the writers' tables. */
#ifndef BURNSTORE_JOURNAL_REPLAY_H
#define BURNSTORE_JOURNAL_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "burnstore/err.h"
#include "core/edit.h"
#include "core/journal.h"
#include "policy/stage_index.h"

/* ---- Replay ---------------------------------------------------------------------------------
 * What a journal describes: its BASE index (parsed, sources not attached),
 * and an editable catalog over it (ed.src = &base.cat, a flat tree of the
 * live files, one entry each). */
struct bs_jreplay {
  struct bs_stage_index base;
  struct bs_tree tree;
  struct bs_edit ed;
  bool ed_init;
  size_t records; /* records applied */
  uint64_t torn;  /* bytes ignored at the tail (cut or bad checksum) */
  uint64_t *inos; /* owned: the live files' inos, in the tree's order */
  size_t nfiles;
};

/* Parse and apply a journal (untrusted: every length is checked). Fails on
 * a bad magic or BASE, a record that contradicts the state (a change of an
 * unknown file), a bad dtype or shape text. Staged entries get size 0:
 * bs_journal_rebuild sizes them from their files. Destroy r either way. */
BS_NODISCARD int bs_journal_replay(const void *data, size_t len, struct bs_jreplay *r, bs_err *err);
void bs_jreplay_destroy(struct bs_jreplay *r);

/* --finish of a staging directory without an INDEX: replay its JOURNAL
 * (beneath the held directory; a FIFO or a link is refused, never opened),
 * re-attach the checkpoint (ESTALE when it changed since the mount), build
 * the output catalog and save it as dir/INDEX (fsynced). 0: INDEX written;
 * 1: there is no JOURNAL; -1 with err. The caller holds the directory's
 * lock. */
BS_NODISCARD int bs_journal_rebuild(const struct bs_stage_dir *stg, bs_err *err);

#endif
