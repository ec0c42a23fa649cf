/* The mount table and fusermount3: what the daemon, `burnstore -u` and
 * `burnstore status` ask of them, in one place (one reader of
 * /proc/self/mountinfo, one spawner of fusermount3). */
#ifndef BURNSTORE_FS_MOUNTS_H
#define BURNSTORE_FS_MOUNTS_H

#include <stdbool.h>
#include <stddef.h>

/* A mountpoint as the mount table names it: absolute, every link followed
 * (the kernel mounts on the target), never stat'ed (a mount whose daemon
 * may hang). Owned (bs_free); NULL with errno set. */
char *fs_mountpoint_path(const char *p);

/* Is `mnt` (fs_mountpoint_path's form) a mountpoint in /proc/self/mountinfo?
 * (true if the table cannot be read: nobody waits for ever on a guess) */
bool fs_is_mounted(const char *mnt);

/* -o readahead= (fs_readahead.c): the "MAJOR:MINOR" of the mount on mnt
 * (the last one: the mount on top) into out; false when there is none. */
bool fs_bdi_of(const char *mnt, char *out, size_t n);

/* fusermount3 -u [-q] MNT (quiet: -q and its stderr to /dev/null), waited
 * for: its exit status, 127 when it cannot be run (not installed), -1 when
 * it could not be waited for. */
int fs_fusermount_u(const char *mnt, bool quiet);

#endif
