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

/* A mountinfo field as the kernel escapes it (space, tab, newline and
 * backslash as \ooo) equals s. */
static bool field_is(const char *f, size_t n, const char *s)
{
  for (size_t i = 0; i < n; s++) {
    char c = f[i];
    if (c == '\\' && i + 3 < n) {
      c = (char)((f[i + 1] - '0') * 64 + (f[i + 2] - '0') * 8 + (f[i + 3] - '0'));
      i += 4;
    } else {
      i++;
    }
    if (*s != c)
      return false;
  }
  return *s == '\0';
}

bool fs_bdi_of(const char *mnt, char *out, size_t n)
{
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f)
    return false;
  char *line = NULL;
  size_t cap = 0;
  bool found = false;
  /* "ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ...": the last line of mnt is the
   * mount on top (ours, just made). A line has no length limit: a
   * mountpoint may be up to PATH_MAX escaped (4 bytes a space). */
  while (getline(&line, &cap, f) > 0) {
    char *p = line, *fld[5];
    size_t len[5];
    int k = 0;
    for (; k < 5 && *p; k++) {
      fld[k] = p;
      len[k] = strcspn(p, " \n");
      p += len[k];
      if (*p == ' ')
        p++;
    }
    if (k == 5 && field_is(fld[4], len[4], mnt) && len[2] < n) {
      memcpy(out, fld[2], len[2]);
      out[len[2]] = '\0';
      found = true;
    }
  }
  free(line);
  fclose(f);
  return found;
}

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
