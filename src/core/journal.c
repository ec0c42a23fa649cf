/* The staging journal (journal.h). */
#include "core/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/safe_open.h"

struct bs_journal {
  int fd;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t flusher;
  bool begun, started, stop, broken;
  int sync_err;     /* the first fdatasync's errno that failed, or 0 */
  pid_t thread_pid; /* the flusher's process: a daemon forks after the journal began */
  uint64_t pending; /* records appended since the last fdatasync */
};

/* ---- Writing -------------------------------------------------------------------------------- */

static int write_all(int fd, struct iovec *iov, int n)
{
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return w < 0 ? errno : ENOSPC;
    size_t done = (size_t)w;
    while (n > 0 && done >= iov->iov_len) {
      done -= iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + done;
      iov->iov_len -= done;
    }
  }
  return 0;
}

/* One record through writev: header, fixed payload head, a, b. */
static int put_record(int fd, enum bs_jkind kind, uint64_t ino, const void *a, size_t alen,
                      const void *b, size_t blen)
{
  if (alen > BS_JOURNAL_RECORD_MAX - BS_JOURNAL_PAYLOAD ||
      blen > BS_JOURNAL_RECORD_MAX - BS_JOURNAL_PAYLOAD - alen)
    return EFBIG;
  uint8_t hdr[BS_JOURNAL_HDR], head[BS_JOURNAL_PAYLOAD];
  head[0] = (uint8_t)kind;
  bs_put_le64(head + 1, ino);
  bs_put_le32(head + 9, (uint32_t)alen);
  uint64_t h = bs_fnv1a(BS_FNV1A_INIT, head, sizeof head);
  h = bs_fnv1a(h, a, alen);
  h = bs_fnv1a(h, b, blen);
  bs_put_le32(hdr, (uint32_t)(BS_JOURNAL_PAYLOAD + alen + blen));
  bs_put_le64(hdr + 4, h);
  struct iovec iov[4] = {
      {hdr, BS_JOURNAL_HDR}, {head, BS_JOURNAL_PAYLOAD}, {(void *)a, alen}, {(void *)b, blen}};
  return write_all(fd, iov, 4);
}

/* What an fdatasync returned (rc, errno e), with j->mu held: the first
 * failure is said once, in the log and in the journal. */
static void synced(struct bs_journal *j, int rc, int e)
{
  if (rc == 0 || j->sync_err)
    return;
  j->sync_err = e;
  bs_log(BS_LOG_WARNING,
         "the staging journal is no longer durable: fdatasync: %s; a crash of the machine may "
         "lose the changes from here on (a kill loses none; the write-back at unmount is "
         "unaffected)",
         strerror(e));
  /* Said in the journal too (to the page cache, which still takes it), so
   * that --finish reports it. */
  uint8_t a[4];
  bs_put_le32(a, (uint32_t)e);
  if (!j->broken && put_record(j->fd, BS_J_UNSYNCED, 0, a, sizeof a, NULL, 0) != 0)
    j->broken = true;
}

static void *flusher(void *arg)
{
  struct bs_journal *j = arg;
  pthread_mutex_lock(&j->mu);
  while (!j->stop) {
    if (!j->pending) {
      pthread_cond_wait(&j->cv, &j->mu);
      continue;
    }
    /* Batch: the first record of a batch waits at most BS_JOURNAL_SYNC_MS. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)(BS_JOURNAL_SYNC_MS % 1000) * 1000000L;
    until.tv_sec += BS_JOURNAL_SYNC_MS / 1000 + until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (!j->stop && pthread_cond_timedwait(&j->cv, &j->mu, &until) != ETIMEDOUT)
      ;
    j->pending = 0;
    /* Appends go on meanwhile: fdatasync outside the lock. */
    pthread_mutex_unlock(&j->mu);
    int rc = fdatasync(j->fd), e = errno;
    pthread_mutex_lock(&j->mu);
    synced(j, rc, e);
  }
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

struct bs_journal *bs_journal_create(int dirfd, const void *base, size_t len, const void *origins,
                                     size_t olen, bs_err *err)
{
  struct bs_journal *j = bs_calloc(1, sizeof *j);
  if (!j) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    return NULL;
  }
  bs_err sub;
  bs_err_clear(&sub);
  j->fd = bs_safe_openat(dirfd, NULL, BS_JOURNAL_NAME, O_WRONLY | O_CREAT | O_EXCL | O_APPEND, 0600,
                         BS_SAFE_REG, NULL, &sub);
  if (j->fd < 0) {
    bs_fail(err, sub.code, BS_OFF_NONE, NULL, "cannot create the staging journal: %s", sub.msg);
    bs_free(j);
    return NULL;
  }
  struct iovec m = {BS_JOURNAL_MAGIC, BS_JOURNAL_MAGIC_LEN};
  int e = write_all(j->fd, &m, 1);
  if (!e)
    e = put_record(j->fd, BS_J_BASE, 0, base, len, origins, olen);
  if (!e && fsync(j->fd) != 0) /* (a new file: its size and blocks too) */
    e = errno;
  if (!e && fsync(dirfd) != 0)
    e = errno;
  if (e) {
    bs_fail(err, e, BS_OFF_NONE, NULL, "cannot write the staging journal: %s", strerror(e));
    close(j->fd);
    bs_safe_unlinkat(dirfd, BS_JOURNAL_NAME, 0);
    bs_free(j);
    return NULL;
  }
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  return j;
}

void bs_journal_append(struct bs_journal *j, enum bs_jkind kind, uint64_t ino, const void *a,
                       size_t alen, const void *b, size_t blen)
{
  if (!j)
    return;
  pthread_mutex_lock(&j->mu);
  if (j->broken) {
    pthread_mutex_unlock(&j->mu);
    return;
  }
  /* The flusher starts with the first change, in the process that serves
   * (threads do not survive the daemon's fork). */
  if (j->started && j->thread_pid != getpid())
    j->started = false;
  if (j->begun && !j->started && pthread_create(&j->flusher, NULL, flusher, j) == 0) {
    j->started = true;
    j->thread_pid = getpid();
  }
  int e = put_record(j->fd, kind, ino, a, alen, b, blen);
  if (e) {
    j->broken = true;
    bs_log(BS_LOG_WARNING,
           "the staging journal stops (%s): a kill now loses what changed since; the write-back "
           "at unmount is unaffected",
           strerror(e));
  } else if (j->pending++ == 0) {
    pthread_cond_signal(&j->cv);
  }
  if (j->begun && !j->started) { /* no thread: sync inline */
    int rc = fdatasync(j->fd);
    synced(j, rc, errno);
    j->pending = 0;
  }
  pthread_mutex_unlock(&j->mu);
}

void bs_journal_append_u64(struct bs_journal *j, enum bs_jkind kind, uint64_t ino, uint64_t v)
{
  uint8_t b[8];
  bs_put_le64(b, v);
  bs_journal_append(j, kind, ino, b, sizeof b, NULL, 0);
}

void bs_journal_begin(struct bs_journal *j)
{
  if (!j)
    return;
  pthread_mutex_lock(&j->mu);
  j->begun = true;
  pthread_mutex_unlock(&j->mu);
}

uint64_t bs_journal_pending(struct bs_journal *j)
{
  pthread_mutex_lock(&j->mu);
  uint64_t n = j->pending;
  pthread_mutex_unlock(&j->mu);
  return n;
}

void bs_journal_sync(struct bs_journal *j)
{
  pthread_mutex_lock(&j->mu);
  j->pending = 0;
  int rc = fdatasync(j->fd);
  synced(j, rc, errno);
  pthread_mutex_unlock(&j->mu);
}

int bs_journal_close(struct bs_journal *j)
{
  if (!j)
    return 0;
  pthread_mutex_lock(&j->mu);
  j->stop = true;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (j->started && j->thread_pid == getpid())
    pthread_join(j->flusher, NULL);
  pthread_mutex_lock(&j->mu);
  int rc = fdatasync(j->fd);
  synced(j, rc, errno);
  int e = j->sync_err;
  pthread_mutex_unlock(&j->mu);
  close(j->fd);
  pthread_cond_destroy(&j->cv);
  pthread_mutex_destroy(&j->mu);
  bs_free(j);
  return e;
}

bool bs_journal_unchanged(int dirfd)
{
  bs_err err;
  bs_err_clear(&err);
  struct stat st;
  /* (A FIFO planted there is refused, never opened for a read that waits.) */
  int fd = bs_safe_openat(dirfd, NULL, BS_JOURNAL_NAME, O_RDONLY, 0, BS_SAFE_REG | BS_SAFE_PRIVATE,
                          &st, &err);
  if (fd < 0)
    return err.code == ENOENT;
  uint8_t head[BS_JOURNAL_MAGIC_LEN + BS_JOURNAL_HDR];
  ssize_t n = pread(fd, head, sizeof head, 0);
  /* Cut inside BASE (killed while mounting): nothing changed either. */
  bool unchanged = n < (ssize_t)sizeof head ||
                   (uint64_t)st.st_size <= (uint64_t)BS_JOURNAL_MAGIC_LEN + BS_JOURNAL_HDR +
                                               bs_le32(head + BS_JOURNAL_MAGIC_LEN);
  close(fd);
  return unchanged;
}
