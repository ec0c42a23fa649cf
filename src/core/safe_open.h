/* Opening what burnstore did not just create (docs/robustness.md, "Files
 * another user can reach"): staging directories and what they hold, journals,
 * lock files, old indexes and shards, run-directory files, logs. One rule:
 *
 * - a directory is opened once and held; every name inside it is reached
 *   relative to that fd (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 *   RESOLVE_NO_MAGICLINKS; where the kernel has no openat2, one O_NOFOLLOW
 *   openat per component), never by its path again;
 * - every open is O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC (a FIFO or a device
 *   never blocks it), and the descriptor is fstat-checked: the expected
 *   type, owned by the caller (euid) or root, and, where that matters
 *   (directories that hold state, journals), writable by its owner alone;
 * - a refusal is one line naming the file and what is wrong with it:
 *   "DIR/NAME: owned by uid 65534 (nobody), not by you: not used".
 *
 * unlink and rename take plain names in a held directory (nothing to
 * resolve: the last component is never followed). */
#ifndef BURNSTORE_SAFE_OPEN_H
#define BURNSTORE_SAFE_OPEN_H

#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "core/err.h"

/* What the file must be (`want`: one type, plus flags). */
#define BS_SAFE_REG 1u       /* a regular file */
#define BS_SAFE_DIR 2u       /* a directory */
#define BS_SAFE_ANY_OWNER 4u /* whoever owns it (a directory the user named: /tmp) */
#define BS_SAFE_PRIVATE 8u   /* neither its group nor others may write it */

/* A plain file name: not empty, not "." or "..", no '/', no control
 * characters, at most NAME_MAX bytes. */
bool bs_plain_name(const char *name);

/* "a FIFO", "a symbolic link", "a directory"...: what st_mode says it is. */
const char *bs_file_kind(mode_t m);

/* "uid 65534 (nobody)" into buf (the name left out when there is none). */
void bs_safe_owner(uid_t uid, char *buf, size_t n);

/* Whether st is what `want` asks for; -1 with err naming DIR/NAME (name may
 * be NULL: dir alone) and what it is or who owns it. */
BS_NODISCARD int bs_safe_check(const struct stat *st, unsigned want, const char *dir,
                               const char *name, bs_err *err);

/* Open the directory `path` and check it (BS_SAFE_DIR is implied): its last
 * component is not followed, unless `want` has BS_SAFE_ANY_OWNER (a
 * directory the user named, such as an output's: theirs to reach through a
 * link). The fd, or -1 with err (the code is errno's: ENOENT when there is
 * none). */
BS_NODISCARD int bs_safe_open_dir(const char *path, unsigned want, bs_err *err);

/* Open `name` beneath the held directory dirfd (`dir` names it in
 * messages): a relative path without "..", normally a plain name. flags are
 * open(2)'s (O_CREAT: mode; an existing file is checked the same way: use
 * O_EXCL for a file that must be new); O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC
 * are added, and O_NONBLOCK is cleared again once a regular file is open.
 * `st` (may be NULL) gets the fstat. The fd, or -1 with err: ENOENT when
 * there is none, ELOOP for a symbolic link, EXDEV for a path out of dir,
 * EINVAL/ENOTDIR for the wrong type, EPERM for another owner or a mode
 * others may write. */
BS_NODISCARD int bs_safe_openat(int dirfd, const char *dir, const char *name, int flags,
                                mode_t mode, unsigned want, struct stat *st, bs_err *err);

/* bs_safe_openat of the last component of `path` beneath its parent
 * directory (opened as given: a directory the caller chose or checked, as
 * the run directory), for files named by a whole path (the run directory's
 * status, log, progress and lock files). The fd, or -1 with err. */
BS_NODISCARD int bs_safe_open_path(const char *path, int flags, mode_t mode, unsigned want,
                                   bs_err *err);

/* A new private directory (0700) beneath dirfd: `name` ends in "XXXXXX",
 * which becomes random characters (as mkdtemp). The new directory's fd
 * (checked: a directory of the caller's, writable by it alone), or -1 with
 * err; nothing is left behind. */
BS_NODISCARD int bs_safe_mkdtempat(int dirfd, const char *dir, char *name, bs_err *err);

/* unlinkat / renameat of single names in dirfd: 0, or -1 with errno (EINVAL
 * for an empty name, ".", "..", or one holding a '/'). */
int bs_safe_unlinkat(int dirfd, const char *name, int flags);
int bs_safe_renameat(int dirfd, const char *from, const char *to);
/* Remove `name` (a single name; a directory with AT_REMOVEDIR) if it still is
 * the file `was` describes (device and inode): 0, or -1 with errno (ESTALE
 * when the name is another file now). */
int bs_safe_unlink_same(int dirfd, const char *name, const struct stat *was, int flags);

/* A directory stream over a held directory fd (a dup of it, from its first
 * entry); closedir it. NULL with errno. */
DIR *bs_safe_dirstream(int dirfd);

/* Raise the soft RLIMIT_NOFILE to the hard limit (a write of thousands of
 * staged files). 0, or -1 with errno. */
int bs_raise_nofile(void);

#endif
