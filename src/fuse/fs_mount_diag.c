/* Why a mount by a user other than root failed: libfuse opens /dev/fuse
 * itself and mounts through the setuid fusermount3, which allows
 * allow_other and allow_root only with user_allow_other in /etc/fuse.conf.
 * libfuse's own lines name the symptom; this names the setting to change. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"

/* fusermount3 where libfuse looks for it: /usr/bin, then $PATH. */
static bool find_fusermount(char *out, size_t n)
{
  struct stat st;
  snprintf(out, n, "/usr/bin/fusermount3");
  if (stat(out, &st) == 0)
    return true;
  const char *path = getenv("PATH");
  for (const char *p = path ? path : ""; *p;) {
    size_t len = strcspn(p, ":");
    if (len && snprintf(out, n, "%.*s/fusermount3", (int)len, p) < (int)n && stat(out, &st) == 0)
      return true;
    p += len + (p[len] == ':');
  }
  return false;
}

/* Whether /etc/fuse.conf has a line "user_allow_other" (blanks and
 * comments aside), as fusermount3 reads it. */
static bool conf_allows_other(const char *conf)
{
  FILE *f = fopen(conf, "r");
  if (!f)
    return false;
  char line[512];
  bool yes = false;
  while (!yes && fgets(line, sizeof line, f)) {
    line[strcspn(line, "#\n")] = '\0';
    char *s = line + strspn(line, " \t");
    size_t len = strcspn(s, " \t");
    yes = len == 16 && strncmp(s, "user_allow_other", 16) == 0 &&
          s[len + strspn(s + len, " \t")] == '\0';
  }
  fclose(f);
  return yes;
}

static bool has_opt(const char *opts, const char *name)
{
  size_t len = strlen(name);
  for (const char *p = opts; (p = strstr(p, name)); p += len)
    if ((p == opts || p[-1] == ',') && (p[len] == '\0' || p[len] == ','))
      return true;
  return false;
}

bool fs_mount_diagnose(const char *opts, char *out, size_t n)
{
  out[0] = '\0';
  if (geteuid() == 0)
    return false;
  struct stat st;
  const char *dev = "/dev/fuse";
  if (access(dev, R_OK | W_OK) != 0) {
    int e = errno;
    if (stat(dev, &st) != 0)
      snprintf(out, n,
               "%s: %s: the fuse module is not loaded (modprobe fuse) or the device is "
               "not in this container",
               dev, strerror(e));
    else
      snprintf(out, n,
               "%s: %s (mode %04o, owner uid %u): a user other than root mounts only if "
               "it may read and write %s (the fuse3 package makes it 0666)",
               dev, strerror(e), (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, dev);
    return true;
  }
  char fm[4096];
  if (!find_fusermount(fm, sizeof fm)) {
    snprintf(out, n,
             "fusermount3 is not installed (in /usr/bin or $PATH): a user other than "
             "root mounts through it (the fuse3 package)");
    return true;
  }
  if (stat(fm, &st) == 0 && (st.st_uid != 0 || !(st.st_mode & S_ISUID))) {
    snprintf(out, n,
             "%s is not setuid root (mode %04o, owner uid %u): a user other than root "
             "mounts through it (chmod u+s %s, as the fuse3 package installs it)",
             fm, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, fm);
    return true;
  }
  const char *conf = "/etc/fuse.conf";
  for (const char *o = "allow_other"; o; o = o[6] == 'o' ? "allow_root" : NULL) {
    if (has_opt(opts, o) && !conf_allows_other(conf)) {
      snprintf(out, n,
               "%s: a user other than root may use it only if %s has a line "
               "user_allow_other (or mount without %s)",
               o, conf, o);
      return true;
    }
  }
  return false;
}
