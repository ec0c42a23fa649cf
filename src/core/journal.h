/* The staging journal of a writable mount: an append-only file JOURNAL in
 * the staging directory, kept current while the mount lives, so that after
 * a kill -9 at any moment `burnstore --finish` rebuilds what the mount held
 * (keys, dtypes, shapes, param_ids, xattrs, metadata; the bytes are the
 * staging files) up to the last record on disk.
 *
 * Format (docs/robustness.md): the 8 bytes "BSJRNL1\n", then records
 *   u32 len | u64 FNV-1a of the payload | payload (len bytes)
 *   payload = u8 kind | u64 ino | u32 alen | a (alen bytes) | b (the rest)
 * all little-endian. The first record is BASE (a = the INDEX text of the
 * mount's output catalog as mounted, before any change; b = (inode, tensor)
 * u64 pairs: the ORIGIN of each file, which base tensor it shows; an ORIGIN
 * record says the same for one file), then one record per change of a file
 * (by its inode number, never reused): KEY (created or renamed: a = its
 * key), GONE (unlinked or replaced), STAGE (its bytes are now staging file
 * u64 a), DTYPE/SHAPE/PARAM_ID (a = the xattr text) and their clears,
 * XSET (a = name, b = value) and XRM, MSET/MRM (root metadata), and
 * UNSYNCED (a = u32 errno: an fdatasync failed here, so the journal stopped
 * being known to be on disk). Replay reads records in order; the first one
 * that is not whole is the end of the last append (a torn tail, ignored)
 * only when it is cut by the end of the file, or all that is left is zeros;
 * a damaged record with records after it is refused (journal_replay.h).
 *
 * Appends are one write(2) each (to the page cache: a killed daemon loses
 * none); a flusher thread fdatasyncs at most BS_JOURNAL_SYNC_MS after an
 * append, so a machine crash loses at most that window. At a clean
 * write-back the INDEX supersedes the journal. */
#ifndef BURNSTORE_JOURNAL_H
#define BURNSTORE_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define BS_JOURNAL_NAME "JOURNAL"
#define BS_JOURNAL_MAGIC "BSJRNL1\n"
#define BS_JOURNAL_MAGIC_LEN 8
#define BS_JOURNAL_HDR 12     /* u32 length + u64 checksum */
#define BS_JOURNAL_PAYLOAD 13 /* u8 kind + u64 inode + u32 alen */
#define BS_JOURNAL_SYNC_MS 1000
/* A record is at most this long (BASE is an INDEX, at most BS_STAGE_INDEX_MAX
 * bytes of policy/stage_index.h, plus its origins). */
#define BS_JOURNAL_RECORD_MAX ((256u << 20) + 4096u)

enum bs_jkind {
  BS_J_BASE = 1,
  BS_J_ORIGIN,
  BS_J_KEY,
  BS_J_GONE,
  BS_J_STAGE,
  BS_J_DTYPE,
  BS_J_DTYPE_CLR,
  BS_J_SHAPE,
  BS_J_SHAPE_CLR,
  BS_J_PARAM_ID,
  BS_J_PARAM_ID_CLR,
  BS_J_XSET,
  BS_J_XRM,
  BS_J_MSET,
  BS_J_MRM,
  BS_J_UNSYNCED,
  BS_J_KIND_END
};

struct bs_journal;

/* Create dirfd/JOURNAL (exclusively) holding the magic and the BASE record
 * (a = base, b = origins: olen / 16 little-endian (inode, tensor) u64 pairs,
 * each an ORIGIN), fdatasynced. NULL with err on failure (nothing left). */
BS_NODISCARD struct bs_journal *bs_journal_create(int dirfd, const void *base, size_t len,
                                                  const void *origins, size_t olen, bs_err *err);
/* Let appends start the flusher thread (in the process that serves: call
 * it after any fork). Until then appends are written but not synced. */
void bs_journal_begin(struct bs_journal *j);
/* Append one record. Thread-safe. A failed write (ENOSPC...) is logged once
 * (bs_log: the mount's log and syslog; stderr without a sink) and the
 * journal stops (the INDEX at unmount still works; only a kill loses the
 * names then). A failed fdatasync is logged once, recorded in the journal
 * (an UNSYNCED record) and kept for bs_journal_close: the journal goes on,
 * no longer known to be durable. */
void bs_journal_append(struct bs_journal *j, enum bs_jkind kind, uint64_t ino, const void *a,
                       size_t alen, const void *b, size_t blen);
void bs_journal_append_u64(struct bs_journal *j, enum bs_jkind kind, uint64_t ino, uint64_t v);
/* Records since the last fdatasync (tests). */
uint64_t bs_journal_pending(struct bs_journal *j);
/* fdatasync now. */
void bs_journal_sync(struct bs_journal *j);
/* Stop the flusher, sync, close, free. 0, or the errno of the first
 * fdatasync that failed while it was open (it stopped being durable then).
 * NULL is a no-op. */
int bs_journal_close(struct bs_journal *j);

/* Whether dirfd's JOURNAL records no change (BASE alone, or cut inside
 * it), or there is none: its staging directory holds nothing to finish. */
bool bs_journal_unchanged(int dirfd);

#endif
