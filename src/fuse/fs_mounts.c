/* The mount table and fusermount3 (fs_mounts.h). */
#include "fs_mounts.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/target.h"

extern char **environ;

char *fs_mountpoint_path(const char *p)
{
  return bs_follow_links(p, false);
}

/* A mountinfo field (n bytes at f) as the kernel escapes it (space, tab,
 * newline and backslash as \ooo) equals s. */
static bool field_is(const char *f, size_t n, const char *s)
{
  for (size_t i = 0; i < n; s++) {
    char c = f[i];
    if (c == '\\' && i + 3 < n && f[i + 1] >= '0' && f[i + 1] <= '3' && f[i + 2] >= '0' &&
        f[i + 2] <= '7' && f[i + 3] >= '0' && f[i + 3] <= '7') {
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

/* The mount table's lines whose mountpoint is mnt: 1 (the last one's
 * "MAJOR:MINOR" into dev, when dev is not NULL), 0 for none, -1 when the
 * table cannot be read. */
static int find_mount(const char *mnt, char *dev, size_t n)
{
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f)
    return -1;
  /* "ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ...". No line limit: a
   * mountpoint escapes to up to 4 bytes a character (a line cut short
   * would hide the mount, and -u would wait for ever). */
  char *line = NULL;
  size_t cap = 0;
  int found = 0;
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
    if (k < 5 || !field_is(fld[4], len[4], mnt))
      continue;
    found = 1;
    if (dev && len[2] < n) {
      memcpy(dev, fld[2], len[2]);
      dev[len[2]] = '\0';
    } else if (dev) {
      dev[0] = '\0';
    }
  }
  free(line);
  fclose(f);
  return found;
}

bool fs_is_mounted(const char *mnt)
{
  return find_mount(mnt, NULL, 0) != 0;
}

bool fs_bdi_of(const char *mnt, char *out, size_t n)
{
  return find_mount(mnt, out, n) > 0 && out[0];
}

int fs_fusermount_u(const char *mnt, bool quiet)
{
  char *argv[] = {"fusermount3", "-u", quiet ? "-q" : (char *)mnt, quiet ? (char *)mnt : NULL,
                  NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet)
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawnp(&pid, "fusermount3", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return 127; /* (glibc's posix_spawnp reports a failed exec here) */
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
