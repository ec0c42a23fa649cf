/* The mount program (bs_mount_main, fs_main.c) and its parts, each its own
 * file: the command line (fs_args.c), opening SOURCE and every refusal
 * before mounting (fs_prepare.c), a mountpoint's runtime files and
 * `burnstore status` (fs_status.c), `burnstore -u` (fs_unmount.c). The
 * FUSE ops (fs.h) know none of this. */
#ifndef BURNSTORE_FS_MOUNT_H
#define BURNSTORE_FS_MOUNT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"
#include "fs.h"
#include "policy/open.h"

#define PROG "burnstore"
enum {
  READAHEAD_URL = 1024, /* KiB: a URL mount's read-ahead (-o readahead=) */
  READAHEAD_MAX = 65536 /* KiB: the largest -o readahead= (64 MiB) */
};
/* A URL mount: the kernel's READs in flight at once (its default: 12), and
 * libfuse's workers (its default: 10), more than that (serve). */
enum { URL_BACKGROUND = 48, URL_WORKERS = 64 };

/* The command line (fs_args.c). */
struct args {
  const char *source, *mountpoint;
  bool foreground, debug, single, unmount, verbose;
  int progress; /* BS_PROGRESS_*: -u --progress, --no-progress */
  bool ro, rw, flat, direct_io, nojournal;
  long readahead_kb; /* -o readahead=KIB; -1: not given */
  bool has_uid, has_gid;
  uint32_t uid, gid, umask; /* -o uid=, gid=, umask= */
  char *output, *staging;   /* owned */
  uint64_t max_shard_size;  /* 0: none */
  char fuse_extra[2048];
  int npy;                      /* FS_NPY_*: -o npy, npy=only */
  const struct bs_writer *view; /* -o view=: the row of the one file shown; NULL: none */
  const char *output_as;        /* -o output_as=DT, as given (NULL: none) */
  /* How SOURCE is opened (policy/open.h): key options, strict, adapter=,
   * as=, and for a URL http_cache=, http_timeout=, unvalidated */
  struct bs_open_spec open;
};

/* Parse argv into a (zeroed first); -h and -V print and exit 0, a usage
 * error prints one line and exits 2. cli_usage: the CLI's subcommands, for
 * --help. */
void fs_args_parse(struct args *a, int argc, char **argv, const char *cli_usage);
void fs_args_destroy(struct args *a);
/* "burnstore: WHAT (see burnstore --help)" on stderr, exit 2. */
void fs_die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "burnstore: FILE: offset..: what" (bs_err_format) on stderr; returns 1. */
int fs_fail_line(const char *file, const bs_err *err);

/* Open and validate SOURCE through the one open path, refuse what cannot
 * work before mounting, build the tree (fs_prepare.c). 0, or 1 (printed). */
int fs_prepare(struct fs *fs, struct args *a);

/* A mountpoint's runtime files (fs_status.c): the status file (spath) and
 * the log (lpath, "" when it cannot be named) of mountpoint mnt, both
 * PATH_MAX bytes. 0, or -1 having printed why. */
int fs_mount_files(const char *mnt, char *spath, char *lpath);
/* The mountpoint a user gave (fs_mountpoint_path: owned) and its runtime
 * files (fs_mount_files); NULL having printed why. */
char *fs_mountpoint_files(const char *mountpoint, char *spath, char *lpath);
/* A file of the run directory (status, log), opened as any file burnstore
 * did not just create: never through a link, never blocking on a FIFO.
 * The fd, or -1 with errno. */
int fs_run_file(const char *path, int flags);
/* The status file's text (fd -1: nothing), replaced and fsynced. */
void fs_status_write(int fd, const char *text);
/* A write-back result line: always to syslog, and to stderr while in the
 * foreground. */
void fs_report(bool daemonized, int prio, const char *line);
/* "running": the daemon's pid, mountpoint, staging, target (and whether it
 * reads unvalidated). */
void fs_status_running(int sfd, const struct fs *fs, const char *mnt);
/* "ok" and the write-back's report (also to syslog, line by line). */
void fs_status_ok(int sfd, const struct fs *fs, const char *mnt, bool daemonized, bool wrote);
/* burnstore status MOUNTPOINT. The exit status. */
int fs_status_main(int argc, char **argv);

/* burnstore -u MOUNTPOINT (fs_unmount.c): unmount, wait for the write-back,
 * print its result. The exit status. */
int fs_unmount_main(const char *mountpoint, bool verbose, int progress);

#endif
