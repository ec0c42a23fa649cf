/* The per-mount log: RUN/HASH.log beside the daemon's status file (see
 * core/target.h for the runtime directory and how long its files live). */
#ifndef BURNSTORE_FS_LOG_H
#define BURNSTORE_FS_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Every fuse_log line of the daemon (refusals, changed sources, signals)
 * goes to stderr until the daemon detaches (always with -f), to syslog, and
 * is appended to the log file (bounded), where `burnstore status MNT` and
 * `burnstore -u -v MNT` read it. */

/* Create (truncate) the log file and route fuse_log to it. 0 or -errno. */
int fs_log_open(const char *path);
/* The daemon has detached (its stderr is /dev/null): the log file and
 * syslog only. */
void fs_log_detach(void);
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
