/* -o readahead=KIB: the mount's read-ahead, which is also the size of the
 * kernel's READ requests (up to max_pages, 1 MiB with libfuse 3.14). FUSE
 * starts every mount at 128 KiB (the bdi's VM_READAHEAD_PAGES; FUSE_INIT's
 * max_readahead can only lower it), and only root can raise it, by writing
 * /sys/class/bdi/MAJOR:MINOR/read_ahead_kb once the kernel has taken the
 * INIT reply (it sets the bdi's value then). A file's read-ahead is taken
 * from the bdi when it is opened, after OPEN is answered: op_open applies
 * it before its first answer. mergerfs has the same option (readahead=,
 * KiB, written to the same file). */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs.h"

void fs_readahead_apply(struct fs *fs)
{
  if (!fs->readahead_kb || !fs->bdi[0] || atomic_exchange(&fs->readahead_done, true))
    return;
  char path[96], val[24];
  snprintf(path, sizeof path, "/sys/class/bdi/%s/read_ahead_kb", fs->bdi);
  int len = snprintf(val, sizeof val, "%u\n", fs->readahead_kb);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  bool ok = fd >= 0 && write(fd, val, (size_t)len) == len;
  if (fd >= 0)
    close(fd);
  /* Not root: the kernel's 128 KiB stays; said only when asked for. */
  if (!ok && fs->readahead_given)
    fuse_log(FUSE_LOG_WARNING,
             "burnstore: readahead=%u: cannot write %s (only root can): the kernel's 128 KiB "
             "stays\n",
             fs->readahead_kb, path);
}

/* libfuse splices a local file's reply through a pipe that must hold it
 * whole, with 3 pages and the header (fuse_send_data_iov), and grows the
 * pipe with F_SETPIPE_SZ: past pipe-max-size only with CAP_SYS_RESOURCE.
 * Where the pipe cannot grow so far, every READ of readahead= KiB is read
 * into memory and copied instead, half as fast (bench.py): said in one
 * line, with the largest value that still splices. Probed on a pipe of
 * our own, as the daemon's threads will ask for theirs. */
void fs_readahead_warn(unsigned kib)
{
  long pg = sysconf(_SC_PAGESIZE);
  if (pg <= 0)
    pg = 4096;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return;
  bool fits = fcntl(fds[0], F_SETPIPE_SZ, (int)((size_t)kib * 1024 + 3 * (size_t)pg + 16)) >= 0;
  close(fds[0]);
  close(fds[1]);
  if (fits)
    return;
  unsigned long pmax = 1048576;
  FILE *f = fopen("/proc/sys/fs/pipe-max-size", "re");
  if (f) {
    if (fscanf(f, "%lu", &pmax) != 1)
      pmax = 1048576;
    fclose(f);
  }
  unsigned long over = 3 * (unsigned long)pg + 16;
  unsigned long fit =
      pmax > over ? (pmax - over) / (unsigned long)pg * (unsigned long)pg / 1024 : 0;
  fprintf(
      stderr,
      "burnstore: readahead=%u: reads of a local file larger than %lu KiB cannot be spliced here "
      "(pipe-max-size is %lu bytes): they are copied, about half as fast; readahead=%lu "
      "keeps splicing\n",
      kib, fit, pmax, fit);
}
