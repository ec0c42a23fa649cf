/* A mountpoint's runtime files (fs_mount.h): the status file the daemon
 * holds locked from before it mounts until it exits, and writes "running",
 * then "ok" or the error, into (`burnstore -u` waits on its lock and prints
 * it); its log; and `burnstore status`, which reads both. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <syslog.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/safe_open.h"
#include "core/target.h"
#include "fs_log.h"
#include "fs_mount.h"
#include "fs_mounts.h"
#include "fs_views.h"

/* 0, or -1 having printed why the run directory cannot be used. */
static int status_path(const char *mnt, char *out, size_t n)
{
  bs_err err;
  bs_err_clear(&err);
  if (bs_run_path(mnt, ".status", out, n, &err) == 0)
    return 0;
  fprintf(stderr, PROG ": %s\n", err.msg);
  return -1;
}

/* The status file (spath) and the log (lpath, "" when it cannot be named)
 * of mountpoint mnt, both PATH_MAX bytes. 0, or -1 having printed why. */
int fs_mount_files(const char *mnt, char *spath, char *lpath)
{
  if (status_path(mnt, spath, PATH_MAX) != 0)
    return -1;
  bs_err err;
  bs_err_clear(&err);
  if (bs_run_path(mnt, ".log", lpath, PATH_MAX, &err) != 0)
    lpath[0] = '\0';
  return 0;
}

char *fs_mountpoint_files(const char *mountpoint, char *spath, char *lpath)
{
  char *mnt = fs_mountpoint_path(mountpoint);
  if (!mnt) {
    fprintf(stderr, PROG ": %s: %s\n", mountpoint, strerror(errno));
    return NULL;
  }
  if (fs_mount_files(mnt, spath, lpath) != 0) {
    bs_free(mnt);
    return NULL;
  }
  return mnt;
}

void fs_status_write(int fd, const char *text)
{
  if (fd < 0)
    return;
  if (ftruncate(fd, 0) == 0 && pwrite(fd, text, strlen(text), 0) == (ssize_t)strlen(text))
    fsync(fd);
}

/* A write-back result line: always to syslog (openlog in main), and to
 * stderr while in the foreground. */
void fs_report(bool daemonized, int prio, const char *line)
{
  syslog(prio, "%s", line);
  if (!daemonized)
    fprintf(stderr, PROG ": %s\n", line);
}

void fs_status_running(int sfd, const struct fs *fs, const char *mnt)
{
  char text[3 * PATH_MAX + 256];
  int n = snprintf(text, sizeof text, "running\npid %ld\nmountpoint %s\nstaging %s\ntarget %s\n",
                   (long)getpid(), mnt, fs->writable ? fs->staging : "-",
                   fs->writable ? fs->output : "-");
  if (fs->unvalidated && n > 0 && (size_t)n < sizeof text)
    snprintf(text + n, sizeof text - (size_t)n,
             "unvalidated its server gives no strong ETag: -o unvalidated reads it comparing each "
             "answer's size and Last-Modified\n");
  fs_status_write(sfd, text);
}

/* "ok", then the report: what was written (or that nothing changed), and
 * one line per file written as a U8 blob. Also to syslog, line by line. */
void fs_status_ok(int sfd, const struct fs *fs, const char *mnt, bool daemonized, bool wrote)
{
  size_t rlen = fs->report ? strlen(fs->report) : 0;
  size_t cap = rlen + 3 * PATH_MAX + 256;
  char *text = bs_malloc(cap);
  if (!text) {
    fs_status_write(sfd, "ok\n");
    return;
  }
  int n;
  if (wrote)
    n = snprintf(text, cap, "ok\nwrote %s (mount %s)\n", fs->output, mnt);
  else if (fs->writable)
    n = snprintf(text, cap, "ok\nnothing changed: %s not rewritten (mount %s)\n", fs->output, mnt);
  else
    n = snprintf(text, cap, "ok\nread-only mount %s ended\n", mnt);
  if (n > 0 && (size_t)n < cap && rlen)
    n += snprintf(text + n, cap - (size_t)n, "%s%s", fs->report,
                  fs->report[rlen - 1] == '\n' ? "" : "\n");
  if (n > 0 && (size_t)n < cap)
    snprintf(text + n, cap - (size_t)n, "pid %ld\n", (long)getpid());
  fs_status_write(sfd, text);
  if (fs->writable) {
    /* Every line but "ok" and "pid", to syslog (at most 100 blob lines). */
    unsigned blobs = 0;
    for (char *line = text + 3, *nl; *line; line = nl + 1) {
      nl = strchr(line, '\n');
      if (!nl)
        break;
      *nl = '\0';
      if (strncmp(line, "pid ", 4) != 0) {
        if (strncmp(line, "wrote ", 6) == 0 || strncmp(line, "nothing ", 8) == 0)
          syslog(LOG_INFO, "write-back %s", line);
        else if (++blobs <= 100)
          fs_report(daemonized, LOG_WARNING, line);
      }
    }
    if (blobs > 100) {
      char more[64];
      snprintf(more, sizeof more, "... and %u more files written as U8", blobs - 100);
      fs_report(daemonized, LOG_WARNING, more);
    }
  }
  bs_free(text);
}

/* A file of the run directory (status, log), opened as any file burnstore
 * did not just create: never through a link, never blocking on a FIFO. */
int fs_run_file(const char *path, int flags)
{
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_safe_open_path(path, flags, 0, BS_SAFE_REG, &err);
  if (fd < 0)
    errno = err.code;
  return fd;
}

/* burnstore status MOUNTPOINT: which daemon serves it, for what, and what
 * it logged (refusals, changed sources). Exit 0 while a daemon serves it. */
int fs_status_main(int argc, char **argv)
{
  if (argc == 3 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0)) {
    fputs("usage: burnstore status MOUNTPOINT\n"
          "The daemon serving MOUNTPOINT (pid, staging directory, target) and every line it\n"
          "logged: refusals (a setfattr or write it refused, and why), changed sources, signals.\n"
          "Exit status 0 while a burnstore daemon serves it, 1 otherwise.\n",
          stdout);
    return 0;
  }
  if (argc != 3 || argv[2][0] == '-')
    fs_die_usage("status takes one MOUNTPOINT");
  char spath[PATH_MAX], lpath[PATH_MAX];
  char *mnt = fs_mountpoint_files(argv[2], spath, lpath);
  if (!mnt)
    return 1;
  int fd = fs_run_file(spath, O_RDONLY);
  bool alive = fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0;
  char buf[3 * PATH_MAX + 256] = "";
  ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
  buf[n > 0 ? n : 0] = '\0';
  if (fd >= 0)
    close(fd);
  if (!alive) {
    fprintf(stderr, PROG ": %s: no burnstore daemon serves it%s\n", mnt,
            fs_is_mounted(mnt) ? " (it is mounted, but not by a burnstore daemon of this user)"
                               : "");
    bs_free(mnt);
    return 1;
  }
  long pid = 0;
  const char *pp = strstr(buf, "\npid ");
  if (pp)
    pid = strtol(pp + 5, NULL, 10);
  printf("%s: served by burnstore pid %ld (%s)\n", mnt, pid,
         fs_is_mounted(mnt) ? "mounted" : "unmounted, writing back or exiting");
  for (char *line = buf, *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
    *nl = '\0';
    if ((strncmp(line, "staging ", 8) == 0 || strncmp(line, "target ", 7) == 0) &&
        strcmp(strchr(line, ' ') + 1, "-") != 0)
      printf("%s\n", line);
    else if (strncmp(line, "unvalidated ", 12) == 0)
      printf("unvalidated: %s\n", line + 12);
  }
  int lfd = fs_run_file(lpath, O_RDONLY);
  printf("log %s:\n", lpath);
  if (fs_log_print(lfd, stdout, "  ") == 0)
    printf("  (nothing logged)\n");
  if (lfd >= 0)
    close(lfd);
  bs_free(mnt);
  return 0;
}
