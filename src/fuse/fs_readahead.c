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
