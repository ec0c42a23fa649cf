/* burnstore -u MOUNTPOINT (fs_mount.h): unmount with fusermount3, then
 * block on the daemon's status file until its write-back has finished
 * (with a progress line on a terminal, fs_progress.c), and print its
 * result: exit 0 only if it succeeded. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/target.h"
#include "fs_log.h"
#include "fs_mount.h"
#include "fs_mounts.h"
#include "fs_views.h"

int fs_unmount_main(const char *mountpoint, bool verbose, int progress)
{
  char spath[PATH_MAX], lpath[PATH_MAX];
  char *mnt = fs_mountpoint_files(mountpoint, spath, lpath);
  if (!mnt)
    return 1;
  int fd = fs_run_file(spath, O_RDWR);
  /* The daemon removes them as it exits: read them through these fds. */
  int lfd = fd >= 0 && lpath[0] ? fs_run_file(lpath, O_RDONLY) : -1;
  int pfd = fd >= 0 ? fs_progress_open(spath) : -1;
  /* Already unmounted (umount, fusermount3 -u) while its daemon still
   * writes back: just wait for it. Once it has exited nothing of it is left
   * to wait for nor to report: exit 1, as umount(8) and fusermount3 -u do
   * for a path that is not mounted, saying where its result went. */
  if (fd < 0 && !fs_is_mounted(mnt)) {
    fprintf(stderr,
            PROG ": %s is not mounted, and no burnstore of it is left to wait for (after umount "
                 "or fusermount3 -u a write-back reports to syslog, and a failed one also to the "
                 "log of the staging directory it keeps)\n",
            mnt);
    bs_free(mnt);
    return 1;
  }
  int rc = fs_is_mounted(mnt) ? fs_fusermount_u(mnt, false) : 0;
  if (rc != 0 && fd >= 0 && !fs_is_mounted(mnt))
    rc = 0; /* the daemon unmounted by itself meanwhile (SIGTERM) */
  if (rc != 0) {
    if (fd >= 0)
      close(fd);
    if (lfd >= 0)
      close(lfd);
    if (pfd >= 0)
      close(pfd);
    fprintf(stderr, PROG ": cannot unmount %s (fusermount3 -u failed%s)\n", mnt,
            rc == 127 ? ": not installed" : "; busy?");
    bs_free(mnt);
    return 1;
  }
  if (fd < 0) {
    bs_free(mnt);
    return 0; /* not one of ours, or already finished */
  }
  /* Blocks until the daemon has written back and exited (with a progress
   * line on a terminal, fs_progress.c). */
  fs_progress_wait(fd, pfd, progress);
  if (pfd >= 0)
    close(pfd);
  /* The status: a few lines, plus one per U8 blob of the report (bounded). */
  struct stat sst;
  size_t cap = fstat(fd, &sst) == 0 && sst.st_size > 0 ? (size_t)sst.st_size + 1 : 4096;
  if (cap > (16u << 20))
    cap = 16u << 20;
  char *buf = bs_calloc(1, cap);
  if (!buf) {
    fprintf(stderr, PROG ": out of memory\n");
    close(fd);
    if (lfd >= 0)
      close(lfd);
    bs_free(mnt);
    return 1;
  }
  ssize_t n = pread(fd, buf, cap - 1, 0);
  if (n < 0)
    n = 0;
  buf[n] = '\0';
  int ret;
  if (strncmp(buf, "ok", 2) == 0) {
    ret = 0;
    /* The report: files written as U8 blobs and notes always, everything
     * with -v. */
    for (char *line = buf + 3, *nl; line < buf + n && (nl = strchr(line, '\n')); line = nl + 1) {
      *nl = '\0';
      bool blob = strstr(line, "written as U8") != NULL || strncmp(line, "note: ", 6) == 0;
      if (blob || (verbose && strncmp(line, "pid ", 4) != 0))
        fprintf(blob ? stderr : stdout, PROG ": %s\n", line);
    }
  } else if (strncmp(buf, "error\n", 6) == 0) {
    char *pidline = strstr(buf + 6, "\npid ");
    if (pidline)
      pidline[1] = '\0';
    fprintf(stderr, PROG ": %s", buf + 6);
    ret = 1;
  } else {
    fprintf(stderr,
            PROG ": the daemon of %s exited without finishing its write-back (killed?)%s%s\n", mnt,
            buf[0] ? "; its last status:\n" : "", buf);
    ret = 1;
    /* What it could not remove itself: the log and progress files first,
     * while the status file we hold locked still names them as ours (a new
     * daemon of this mountpoint waits for that lock before it makes its
     * own), then the status file. */
    if (bs_run_holds(spath, fd)) {
      if (lpath[0])
        unlink(lpath);
      fs_progress_remove(spath);
      bs_run_unlink(spath, fd);
    }
  }
  /* The refusals of the session (its log), with the report. */
  if (verbose)
    fs_log_print(lfd, stdout, PROG ": log: ");
  if (lfd >= 0)
    close(lfd);
  close(fd);
  bs_free(buf);
  bs_free(mnt);
  return ret;
}
