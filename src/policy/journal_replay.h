/* The staging journal's replay (core/journal.h has its format and writer):
 * what a JOURNAL describes, rebuilt as an editable catalog over its BASE, and
 * `burnstore --finish` of a staging directory without an INDEX. Policy: it
 * uses the staging INDEX and the writers' tables. */
#ifndef BURNSTORE_JOURNAL_REPLAY_H
#define BURNSTORE_JOURNAL_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/edit.h"
#include "core/err.h"
#include "core/journal.h"
#include "policy/stage_index.h"

/* ---- Replay ---------------------------------------------------------------------------------
 * What a journal describes: its BASE index (parsed, sources not attached),
 * and an editable catalog over it (ed.src = &base.cat, a flat tree of the
 * live files, one entry each). */
#define BS_JREPLAY_NONE UINT64_MAX
/* Bytes checksummed while looking for a valid record after a bad one:
 * past it, what follows counts as damage (never as a torn tail). */
#define BS_JREPLAY_SCAN_BUDGET (256u << 20)

/* Records are read in order (record 1 is BASE); the first that is not whole
 * and valid ends the replay, and what it is decides:
 * - the torn tail of the last append (a kill, or a machine crash): fewer
 *   bytes left than a record header, a record whose length runs past the
 *   end of the file with no valid record anywhere in the bytes after it, or
 *   only zeros left. Ignored: the state is what precedes it (`torn` bytes).
 * - damage: anything else (a complete record whose checksum fails, an
 *   impossible length, or a cut one with a valid record after it: records
 *   were written after it). `damaged`: the state is what precedes it, and
 *   --finish refuses it unless told to salvage. */
struct bs_jreplay {
  struct bs_stage_index base;
  struct bs_tree tree;
  struct bs_edit ed;
  bool ed_init;
  size_t records; /* records applied (BASE included) */
  uint64_t torn;  /* bytes ignored at the tail (see above) */
  bool damaged;
  size_t damage_rec;      /* the damaged record's number */
  uint64_t damage_off;    /* its offset */
  uint64_t damage_next;   /* a valid record's offset after it, or BS_JREPLAY_NONE */
  const char *damage_why; /* static text */
  size_t unsynced_rec;    /* the first UNSYNCED record (journal.h): its number, */
  uint64_t unsynced_off;  /* offset (BS_JREPLAY_NONE: none) */
  int unsynced_errno;     /* and the errno it records */
  uint64_t *inos;         /* owned: the live files' inos, in the tree's order */
  size_t nfiles;
};

/* Parse and apply a journal (untrusted: every length is checked). Fails on
 * a bad magic or BASE, a record that contradicts the state (a change of an
 * unknown file), a bad dtype or shape text. Staged entries get size 0:
 * bs_journal_rebuild sizes them from their files. Destroy r either way. */
BS_NODISCARD int bs_journal_replay(const void *data, size_t len, struct bs_jreplay *r, bs_err *err);
void bs_jreplay_destroy(struct bs_jreplay *r);

/* The records a damaged journal's replay dropped, one line each into out:
 * the damaged one (number, offset, why), then every valid record found
 * after it (offset, what it did). 0, or -1 (out of memory). */
BS_NODISCARD int bs_jreplay_dropped(const void *data, size_t len, const struct bs_jreplay *r,
                                    const char *dir, struct bs_buf *out);

/* Whether the JOURNAL of a dead daemon's staging directory records no
 * change: there is none, or it holds BASE alone (or BASE cut by a kill at
 * mount). A damaged BASE with records after it is something to finish, so
 * the sweep at mount keeps its directory. */
bool bs_journal_nothing_to_finish(const struct bs_stage_dir *stg);

/* --finish of a staging directory without an INDEX: replay its JOURNAL
 * (beneath the held directory; a FIFO or a link is refused, never opened),
 * re-attach the checkpoint (ESTALE when it changed since the mount), build
 * the output catalog and its INDEX text into *index, saved as the
 * directory's INDEX (fsynced) too. A damaged journal (above) is refused
 * (EBADMSG, one line naming the record and its offset) unless `salvage`:
 * then the INDEX is what precedes the damage, never saved, *salvaged is
 * set and notes lists what was dropped. notes also gets a line for a torn
 * tail ignored and for a journal that stopped being durable. 0; 1: there
 * is no JOURNAL; -1 with err. The caller holds the directory's lock. */
BS_NODISCARD int bs_journal_rebuild(const struct bs_stage_dir *stg, bool salvage,
                                    struct bs_buf *index, struct bs_buf *notes, bool *salvaged,
                                    bs_err *err);

#endif
