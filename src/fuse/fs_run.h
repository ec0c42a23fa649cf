/* The runtime directory and the per-mount log.
 *
 * The runtime directory is /run/burnstore for root, $XDG_RUNTIME_DIR/burnstore
 * or /tmp/burnstore-UID otherwise. Per mountpoint it holds HASH.status (the
 * daemon's state, locked by the daemon for its life), HASH.log (the refusals
 * the daemon logged) and HASH.status.progress (during a write-back); per
 * writable target HASH.target (its lock). A file lives only as long as its
 * daemon: the daemon removes its files when it exits, and every start
 * removes the files of daemons that are gone (whose lock nobody holds). */
#ifndef BURNSTORE_FS_RUN_H
#define BURNSTORE_FS_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The runtime directory (created 0700 if missing) into out[n]. */
void fs_run_dir(char *out, size_t n);
/* DIR/<FNV-1a 64 of key, hex><suffix>; out[0] = '\0' if it does not fit. */
void fs_run_path(const char *key, const char *suffix, char *out, size_t n);
/* Open path (creating it 0600) with an exclusive flock, without blocking,
 * on the file the path names now (a lock file its holder removed meanwhile
 * is opened again). The fd, or -1 with errno (EWOULDBLOCK: it is held). */
int fs_run_lock(const char *path);
/* Remove path if it still names fd's file (fd holding the lock); true if
 * it did. */
bool fs_run_unlink(const char *path, int fd);
/* Remove the runtime files of daemons that are gone: status files, their
 * logs and progress files, and target locks that nobody holds. */
void fs_run_sweep(void);

/* Remove the staging directories of dead daemons that hold nothing (only
 * their lock file: no staged data, no INDEX, no log) among the siblings
 * named like `template` (a mkdtemp template, DIR/PREFIXXXXXXX). Directories
 * with data are kept for --list-staging / --finish. */
void fs_run_sweep_staging(const char *template);

/* ---- The per-mount log (fs_log.c) ----
 * Every fuse_log line of the daemon (refusals, changed sources, signals)
 * goes to stderr in the foreground, to syslog, and is appended to the log
 * file (bounded), where `burnstore status MNT` and `burnstore -u -v MNT`
 * read it. */

/* Create (truncate) the log file and route fuse_log to it. 0 or -errno. */
int fs_log_open(const char *path, bool foreground);
/* Stop writing to the log file (fuse_log goes back to stderr only). */
void fs_log_close(void);
/* Copy the log's lines, then `last` (a line without its newline, or NULL),
 * into the file `name` of directory dirfd (the staging directory a failed
 * write-back keeps). 0 or -errno. */
int fs_log_save(int dirfd, const char *name, const char *last);
/* Print the log lines read from fd (from its start) to f, each after
 * `prefix`. Returns how many. */
unsigned fs_log_print(int fd, FILE *f, const char *prefix);

#endif
