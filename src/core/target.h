/* Output targets: absolute paths, the per-user run directory, and the target
 * lock that every writer of a checkpoint takes (a writable mount, single file
 * or shard set, through output= or in place; `burnstore convert`;
 * `burnstore --finish`), so that two writers never race to replace one file.
 *
 * The lock is an exclusive flock on RUN/<FNV-1a of the target's key>.target,
 * where RUN is /run/burnstore for root and $XDG_RUNTIME_DIR/burnstore (else
 * /tmp/burnstore-UID) for others. The key is the canonical target: the
 * realpath of the target (or of its directory, for a file that does not exist
 * yet) + its base name, where every name of a SafeTensors set
 * (NAME.safetensors, NAME.safetensors.index.json, NAME-0000K-of-0000N.safetensors)
 * is NAME.safetensors: the set replaces a single file of that name. The lock
 * file names its holder (pid and what: a mountpoint, "convert", "--finish DIR")
 * for the refusal of the next writer. */
#ifndef BURNSTORE_TARGET_H
#define BURNSTORE_TARGET_H

#include <stdbool.h>
#include <stddef.h>

#include "burnstore/err.h"

struct bs_catalog;

/* An absolute path without stat-ing the last component (which may be a mount
 * whose daemon hangs): realpath of the parent + the base name. Owned
 * (bs_free); NULL with errno set. */
char *bs_abs_path(const char *p);

/* RUN/<FNV-1a 64 of key, hex><suffix> into out. RUN: /run/burnstore for
 * root, else $XDG_RUNTIME_DIR/burnstore or /tmp/burnstore-EUID; created 0700
 * if missing, and used only if it is a real directory (not a symlink) of
 * the effective user that no one else may write to. 0, or -1 with err
 * naming RUN and what is wrong with it (or ENAMETOOLONG). */
BS_NODISCARD int bs_run_path(const char *key, const char *suffix, char *out, size_t n, bs_err *err);

/* `mode` with only the permission bits every file among the first n
 * sources of cat grants (a sharded checkpoint: its index and each shard),
 * stat'ed by name now; a source that is no file, or is gone, is skipped. */
unsigned bs_sources_mode(const struct bs_catalog *cat, size_t n, unsigned mode);

/* Is `mnt` (absolute) a mountpoint in /proc/self/mounts? (true if unreadable) */
bool bs_is_mounted(const char *mnt);

/* The canonical key of `target` (see above). Owned; NULL with err set. */
char *bs_target_key(const char *target, bs_err *err);

/* Take the target lock of `target` for `holder`: an absolute mountpoint for a
 * mount, else a word naming the writer ("convert", "--finish DIR"). A holder
 * that just ended (a daemon finishing its write-back) is waited for about a
 * second. Returns the lock's fd (the caller closes it when its write is
 * done; a forked daemon inherits it), or -1 with EBUSY and one line naming
 * the holder, its pid and what to do in err. */
BS_NODISCARD int bs_target_lock(const char *target, const char *holder, bs_err *err);
/* Rewrite the holder record after a fork (the daemon's real pid). */
void bs_target_lock_update(int fd, const char *target, const char *holder);

#endif
