/* Output targets: absolute paths, the per-user run directory, and the target
 * lock that every writer of a checkpoint takes (a writable mount, single file
 * or shard set, through output= or in place; `burnstore convert`;
 * `burnstore --finish`), so that two writers never race to replace one file.
 *
 * The lock is an exclusive flock on RUN/<FNV-1a of the target's key>.target,
 * where RUN is /run/burnstore for root and $XDG_RUNTIME_DIR/burnstore (else
 * /tmp/burnstore-UID) for others. The key is the canonical target: the
 * realpath of the target (or of its directory, for a file that does not exist
 * yet) + its base name, where every name of a set of files (an index and its
 * members) is the name of the single file the set replaces, as the writer
 * of the set says (bs_target_name_fn: the writers table's set_name). The lock
 * file names its holder (pid and what: a mountpoint, "convert", "--finish DIR")
 * for the refusal of the next writer. */
#ifndef BURNSTORE_TARGET_H
#define BURNSTORE_TARGET_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"

struct bs_catalog;

/* An absolute path without stat-ing the last component (which may be a mount
 * whose daemon hangs): realpath of the parent + the base name. Owned
 * (bs_free); NULL with errno set. */
char *bs_abs_path(const char *p);

/* bs_abs_path, and when the last component is a symlink, its target (a
 * chain followed, 40 hops at most) resolved the same way; never stats the
 * directory it ends at. Owned; NULL with errno. What a path that is a link
 * names: the file a writable mount (rw LINK, output=LINK) writes, so that
 * the link stays a link and the target lock is the file's. A link of
 * another user's (not the caller's nor root's) is not followed: the path
 * returned is that link's. */
char *bs_link_path(const char *p);
/* bs_link_path for a file to write: NULL with err (EPERM, one line naming
 * its owner) when it ends at another user's link, which could name any
 * file. */
char *bs_write_path(const char *p, bs_err *err);
/* bs_abs_path, and the chain of links at the last component followed (40
 * hops at most), each target resolved the same way, never stat-ing the
 * directory it ends at (which may be a mount whose daemon hangs); when
 * `trusted_only`, stopping at a link of another user's (bs_link_path).
 * Owned; NULL with errno. */
char *bs_follow_links(const char *p, bool trusted_only);

/* "dir/name" into buf (n bytes). 0, or -1 with err (ENAMETOOLONG) naming
 * dir and name when it does not fit: never a cut path, which could name
 * another file. */
BS_NODISCARD int bs_path_join_buf(char *buf, size_t n, const char *dir, const char *name,
                                  bs_err *err);

/* RUN into out: $BURNSTORE_RUN_DIR if set (an absolute path), else
 * /run/burnstore for root, else $XDG_RUNTIME_DIR/burnstore or
 * /tmp/burnstore-EUID; created 0700 if missing, and used only if it is a
 * real directory (not a symlink) of the effective user that no one else may
 * write to. 0, or -1 with err naming RUN and what is wrong with it. */
BS_NODISCARD int bs_run_dir(char *out, size_t n, bs_err *err);
/* RUN/<FNV-1a 64 of key, hex><suffix> into out (bs_run_dir's checks); 0, or
 * -1 with err (also ENAMETOOLONG), out "". */
BS_NODISCARD int bs_run_path(const char *key, const char *suffix, char *out, size_t n, bs_err *err);
/* RUN holds a file only while its holder lives: per mountpoint HASH.status
 * (the daemon's state, locked for its life), HASH.log and
 * HASH.status.progress; per target HASH.target. A holder removes its files
 * before it lets its lock go, and every mount removes those of holders that
 * are gone (bs_run_sweep). */
/* Open path (creating it 0600) with an exclusive flock, without blocking, on
 * the file the path names now (a lock file its holder removed meanwhile is
 * opened again). The fd, or -1 with errno (EWOULDBLOCK: it is held). */
int bs_run_lock(const char *path);
/* Whether `name` (relative to dirfd, or AT_FDCWD; a symbolic link is not
 * followed) still names fd's file (device and inode): a lock holder checks
 * that no one removed or replaced the name between its open and its lock. */
bool bs_fd_named(int dirfd, const char *name, int fd);
/* Remove path if it still names fd's file (fd holding its lock); true if it
 * did. */
bool bs_run_unlink(const char *path, int fd);
/* Whether path still names fd's file: while fd holds its lock, no one else
 * can hold that path's lock, so files named after it are still ours. */
bool bs_run_holds(const char *path, int fd);
/* Remove the files of holders that are gone: status and target files nobody
 * holds the lock of, logs and progress files without their status file. */
void bs_run_sweep(void);

/* `mode` with only the permission bits every file among the first n
 * sources of cat grants (a sharded checkpoint: its index and each shard),
 * stat'ed by name now; a source that is no file, or is gone, is skipped. */
unsigned bs_sources_mode(const struct bs_catalog *cat, size_t n, unsigned mode);

/* How a writer names a target for its lock: true with the one name every
 * file of a set stands under in out (n bytes) when `base` (a base name) is
 * one of the set's names; false: base is its own. */
typedef bool (*bs_target_name_fn)(const char *base, char *out, size_t n);

/* The canonical key of `target` (see above) with the sets' naming `name`
 * (NULL: none). Owned; NULL with err set. */
char *bs_target_key(const char *target, bs_target_name_fn name, bs_err *err);

/* Take the target lock of `target` (key: bs_target_key with `name`; a
 * writer takes it through bs_writer_lock, writers.h) for `holder`: an
 * absolute mountpoint for a mount, else a word naming the writer
 * ("convert", "--finish DIR"). A holder
 * that just ended (a daemon finishing its write-back) is waited for about a
 * second. Returns the lock's fd (the caller closes it when its write is
 * done; a forked daemon inherits it), or -1 with EBUSY and one line naming
 * the holder, its pid and what to do in err. */
BS_NODISCARD int bs_target_lock(const char *target, bs_target_name_fn name, const char *holder,
                                bs_err *err);
/* Let the lock go: remove its file (found by the fd's own name, if it is
 * still this fd's: the target's key may have changed meanwhile, as when a
 * write replaced a symlink), close fd. */
void bs_target_unlock(int fd);
/* Rewrite the holder record: after a fork (the daemon's real pid), and once
 * a mount's session has ended (`unmounted`: the refusal of the next writer
 * then says the daemon is writing back, not that the target is mounted). */
void bs_target_lock_update(int fd, const char *target, const char *holder, bool unmounted);

#endif
