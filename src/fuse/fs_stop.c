/* Stopping a writable mount on SIGTERM, SIGINT or SIGHUP without losing
 * written data.
 *
 * With the write-back cache on, a write(2) returns once its bytes are in
 * the kernel's page cache; the kernel sends them to the daemon later (at
 * the latest when the file is closed). libfuse's own handlers end the
 * session loop at once and detach the mount lazily, so dirty pages still in
 * the kernel, and the close of a file that was still open, never reach the
 * daemon. Here the handler only wakes a thread, which, while the loop goes
 * on serving:
 *   1. syncfs(2) on the mount: the kernel writes every dirty page back to
 *      the daemon (served by the loop) and waits for it;
 *   2. unmounts without detaching (umount2 as root, else fusermount3 -u),
 *      retrying for a grace period while files are still open: a writer
 *      that closes in time has its last pages sent by the close. The kernel
 *      then ends the session and the loop returns by itself;
 *   3. if the mount stays busy: syncfs again, then ends the loop as libfuse
 *      would (the caller unmounts lazily). Only what a still-open file
 *      writes after that is lost, as with any filesystem torn down under
 *      its writers.
 * The caller writes back after the loop, as for `burnstore -u`. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "fs_mounts.h"

static int stop_pipe[2] = {-1, -1};
static pthread_t stop_thread, main_thread;
static struct fuse_session *stop_se;
static char *stop_mnt;
static const int stop_signals[] = {SIGTERM, SIGINT, SIGHUP};

static void on_signal(int sig)
{
  int saved = errno;
  char c = (char)sig;
  if (write(stop_pipe[1], &c, 1) < 0) {
    /* nothing to do in a handler */
  }
  errno = saved;
}

static void on_wake(int sig)
{
  (void)sig; /* interrupts the loop's wait: it then sees the session ended */
}

static void sync_mount(const char *mnt)
{
  int fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    syncfs(fd);
    close(fd);
  }
}

/* Unmount without detaching: 0, or -1 (busy, or could not). */
static int unmount_now(const char *mnt)
{
  if (geteuid() == 0)
    return umount2(mnt, 0) == 0 ? 0 : -1;
  return fs_fusermount_u(mnt, true) == 0 ? 0 : -1;
}

static void *stopper(void *arg)
{
  (void)arg;
  char c;
  for (;;) {
    ssize_t n = read(stop_pipe[0], &c, 1);
    if (n == 1)
      break;
    if (n < 0 && errno == EINTR)
      continue;
    return NULL;
  }
  if (c == 0)
    return NULL; /* fs_stop_end: the session ended some other way */
  fuse_log(FUSE_LOG_INFO, "burnstore: signal %d: flushing and unmounting %s\n", c, stop_mnt);
  sync_mount(stop_mnt);
  /* Files still open get a grace period to be closed (their close sends
   * their last pages); 10 s, as a service manager waits before SIGKILL. */
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    if (unmount_now(stop_mnt) == 0)
      return NULL; /* the kernel ends the session: the loop returns */
    if (fuse_session_exited(stop_se))
      return NULL;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 10)
      break;
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  fuse_log(FUSE_LOG_ERR,
           "burnstore: %s is still busy 10 s after the signal: detaching it; data written to "
           "files still open after now is not kept\n",
           stop_mnt);
  sync_mount(stop_mnt);
  fuse_session_exit(stop_se);
  pthread_kill(main_thread, SIGUSR2);
  return NULL;
}

int fs_stop_begin(struct fuse_session *se, const char *mnt)
{
  if (pipe2(stop_pipe, O_CLOEXEC) != 0)
    return -1;
  stop_se = se;
  stop_mnt = strdup(mnt);
  main_thread = pthread_self();
  if (!stop_mnt || pthread_create(&stop_thread, NULL, stopper, NULL) != 0) {
    close(stop_pipe[0]);
    close(stop_pipe[1]);
    stop_pipe[0] = stop_pipe[1] = -1;
    free(stop_mnt);
    stop_mnt = NULL;
    return -1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
    sigaction(stop_signals[i], &sa, NULL);
  sa.sa_handler = on_wake;
  sa.sa_flags = 0; /* no SA_RESTART: the loop's wait returns EINTR */
  sigaction(SIGUSR2, &sa, NULL);
  return 0;
}

void fs_stop_end(void)
{
  if (stop_pipe[1] < 0)
    return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = SIG_DFL;
  for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
    sigaction(stop_signals[i], &sa, NULL);
  char c = 0;
  if (write(stop_pipe[1], &c, 1) < 0) {
    /* the thread reads until EOF below */
  }
  close(stop_pipe[1]);
  pthread_join(stop_thread, NULL);
  close(stop_pipe[0]);
  stop_pipe[0] = stop_pipe[1] = -1;
  sa.sa_handler = SIG_DFL;
  sigaction(SIGUSR2, &sa, NULL);
  free(stop_mnt);
  stop_mnt = NULL;
}
