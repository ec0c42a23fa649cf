/* burnstore: command line, validation before mounting, the FUSE session,
 * write-back after the session ends, and the waiting unmount (-u).
 *
 * The waiting unmount: the daemon holds an exclusive flock on a status file
 * (in /run/burnstore, keyed by the mountpoint) from before it mounts until
 * it exits, and writes "ok" or the error into it at the end. `burnstore -u`
 * unmounts, then blocks on that lock, so it returns only after the write-back
 * has finished, with its result. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <malloc.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include "burnstore/adapter.h"
#include "burnstore/formats.h"
#include "burnstore/version.h"
#include "cli.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/stage_index.h"
#include "core/strmap.h"
#include "formats/pth_write.h"
#include "formats/st_index.h"
#include "formats/st_write.h"
#include "fs.h"
#include "fs_views.h"

#define PROG "burnstore"

static const char usage_text[] =
    "usage: burnstore [-f] [-d] [-s] [-o OPTIONS] SOURCE MOUNTPOINT\n"
    "       burnstore -u [-v] MOUNTPOINT\n"
    "       burnstore --finish STAGING_DIR | --list-staging STAGING_DIR\n";
/* then bs_cli_usage (the subcommands), then: */
static const char usage_rest[] =
    "\n"
    "Mount a model checkpoint (Burnpack, SafeTensors, GGUF, PyTorch) as a directory:\n"
    "one file per tensor, holding its raw little-endian row-major bytes.\n"
    "If SOURCE does not exist and ends in .bpk, .safetensors, .gguf or .pth (.pt, .bin),\n"
    "MOUNTPOINT is an empty writable directory that is written to SOURCE in that format\n"
    "on unmount.\n"
    "\n"
    "  -f              stay in the foreground\n"
    "  -d              debug output (implies -f)\n"
    "  -s              single-threaded\n"
    "  -u, --unmount   unmount, wait for the write-back, exit 0 only if it succeeded\n"
    "                  (-v: print the write-back's report)\n"
    "  --finish DIR    finish the write-back a killed daemon left in staging DIR\n"
    "  --list-staging DIR  list what staging DIR holds (key, dtype, shape, bytes, where)\n"
    "  -h, --help      this text\n"
    "  -V, --version   the version\n"
    "\n"
    "Options (-o, comma-separated; a comma inside a value is written \\,):\n"
    "  ro, rw                 read-only (default for an existing SOURCE) or writable\n"
    "  output=PATH            where a writable mount is written (default: SOURCE;\n"
    "                         needed for rw on a PyTorch file whose pickle holds\n"
    "                         objects or sets); the extension\n"
    "                         names the format: .bpk, .safetensors, .gguf or\n"
    "                         .pth/.pt/.bin (a flat torch.save state dict)\n"
    "  staging=DIR            where written data is staged (default: beside the output)\n"
    "  max_shard_size=SIZE    write SafeTensors as NAME-0000K-of-0000N.safetensors shards\n"
    "                         + NAME.safetensors.index.json (5GB, 500MB, 2GiB...)\n"
    "  include=REGEX          keep only keys matching (repeatable, any match)\n"
    "  exclude=REGEX          drop keys matching (repeatable)\n"
    "  remap=FROM=>TO         rename keys by regex, $1 or ${1} for groups (repeatable, in order)\n"
    "  top_level_key=K        mount only the subtree under K (e.g. state_dict)\n"
    "  contiguous_indices     renumber numeric key segments 0,1,2... per parent\n"
    "  flat                   no directories: one file per key\n"
    "  strict                 PyTorch: refuse unknown pickle classes instead of skipping\n"
    "  npy, npy=only          read-only: NAME.npy beside (or instead of) each tensor file:\n"
    "                         a NumPy header, then the same bytes (numpy.load opens it)\n"
    "  adapter=pytorch        read-only: PyTorchToBurnAdapter's view: Linear weights\n"
    "                         transposed, norm weight/bias named gamma/beta\n"
    "  adapter_linear=REGEX, adapter_norm=REGEX  name those weights instead of the rule\n"
    "  direct_io              read-only: reads bypass the page cache in ~1 MiB requests\n"
    "                         (faster first reads; shared mmap of tensor files then fails)\n"
    "  uid=ID, gid=ID         owner and group of SOURCE's files (number or name;\n"
    "                         default: the mounting user's)\n"
    "  umask=OOO              mode bits (octal) taken off SOURCE's files and directories,\n"
    "                         which show SOURCE's read bits (rw: and the owner's w;\n"
    "                         directories: x where r)\n"
    "  allow_other, allow_root, nosuid, nodev, noexec, noatime: passed to FUSE; the\n"
    "                         kernel checks the modes shown on every mount\n"
    "                         (default_permissions is always on)\n"
    "\n"
    "See burnstore(1) and docs/user-guide.md.\n";

/* mount(8) and fstab options that mean nothing to us. */
static const char *const ignored_opts[] = {"defaults", "auto",   "noauto",  "user",  "users",
                                           "nouser",   "nofail", "_netdev", "owner", "group",
                                           "comment",  "loop",   NULL};
/* Options handed to the kernel / libfuse unchanged. */
static const char *const fuse_opts[] = {"allow_other", "allow_root",  "default_permissions",
                                        "nosuid",      "suid",        "nodev",
                                        "dev",         "noexec",      "exec",
                                        "noatime",     "atime",       "relatime",
                                        "norelatime",  "strictatime", "nodiratime",
                                        "sync",        "async",       "dirsync",
                                        "lazytime",    "max_read",    "blkdev",
                                        "blksize",     "fsname",      "subtype",
                                        NULL};

struct args {
  const char *source, *mountpoint;
  bool foreground, debug, single, unmount, verbose;
  const char *finish, *list_staging; /* --finish DIR, --list-staging DIR */
  bool ro, rw, flat, strict, direct_io;
  bool has_uid, has_gid;
  uint32_t uid, gid, umask; /* -o uid=, gid=, umask= */
  char *output, *staging;   /* owned */
  uint64_t max_shard_size;  /* 0: none */
  char fuse_extra[2048];
  struct bs_keyopts keys;
  int npy;                   /* FS_NPY_*: -o npy, npy=only */
  struct bs_adapter adapter; /* -o adapter=pytorch, adapter_linear=, adapter_norm= */
};

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, PROG ": ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see burnstore --help)\n");
  fflush(stderr);
  _exit(2); /* no leak report for what parsing had allocated */
}

static bool in_list(const char *const *list, const char *name, size_t len)
{
  for (size_t i = 0; list[i]; i++)
    if (strlen(list[i]) == len && strncmp(list[i], name, len) == 0)
      return true;
  return false;
}

static void add_fuse_opt(struct args *a, const char *opt)
{
  size_t used = strlen(a->fuse_extra);
  if (used + strlen(opt) + 2 >= sizeof a->fuse_extra)
    die_usage("too many FUSE options");
  if (used)
    strcat(a->fuse_extra, ",");
  strcat(a->fuse_extra, opt);
}

/* uid=/gid= (a number, or a user or group name), umask= (octal, <= 0777). */
static uint32_t parse_owner_opt(const char *opt, const char *val)
{
  char *end;
  errno = 0;
  bool octal = opt[0] == 'u' && opt[1] == 'm';
  unsigned long v = strtoul(val, &end, octal ? 8 : 10);
  bool num = *val >= '0' && *val <= '9' && *end == '\0' && errno == 0;
  if (octal) {
    if (!num || v > 0777)
      die_usage("umask=%s: not octal mode bits (0 to 0777, e.g. 022 or 077)", val);
    return (uint32_t)v;
  }
  if (num && v < (uid_t)-1)
    return (uint32_t)v;
  if (!num && opt[0] == 'u') {
    struct passwd *pw = *val ? getpwnam(val) : NULL;
    if (pw)
      return pw->pw_uid;
  } else if (!num) {
    struct group *gr = *val ? getgrnam(val) : NULL;
    if (gr)
      return gr->gr_gid;
  }
  die_usage("%s=%s: not a %s (a number below %lu, or a name)", opt, val,
            opt[0] == 'u' ? "user" : "group", (unsigned long)(uid_t)-1);
}

static void parse_opts(struct args *a, const char *optstr)
{
  char **items = NULL;
  size_t n = 0;
  bs_err err;
  bs_err_clear(&err);
  if (bs_opts_split(optstr, &items, &n, &err) != 0)
    die_usage("bad options '%s': %s", optstr, err.msg);
  for (size_t i = 0; i < n; i++) {
    char *it = items[i];
    char *eq = strchr(it, '=');
    size_t nlen = eq ? (size_t)(eq - it) : strlen(it);
    const char *val = eq ? eq + 1 : NULL;
    if (nlen == 0) {
      /* empty item, e.g. "a,,b" */
    } else if (strcmp(it, "ro") == 0) {
      a->ro = true;
      a->rw = false;
    } else if (strcmp(it, "rw") == 0) {
      a->rw = true;
      a->ro = false;
    } else if (strcmp(it, "flat") == 0) {
      a->flat = true;
    } else if (strcmp(it, "strict") == 0) {
      a->strict = true;
    } else if (strcmp(it, "direct_io") == 0) {
      a->direct_io = true;
    } else if (strcmp(it, "npy") == 0 || strcmp(it, "npy=only") == 0) {
      a->npy = it[3] ? FS_NPY_ONLY : FS_NPY_BOTH;
    } else if (strncmp(it, "adapter", 7) == 0 && bs_adapter_add_item(&a->adapter, it, &err) <= 0) {
      if (err.code)
        die_usage("option '%s': %s", it, err.msg);
    } else if (eq && nlen == 6 && strncmp(it, "output", 6) == 0) {
      bs_free(a->output);
      a->output = bs_strdup(val);
    } else if (eq && nlen == 14 && strncmp(it, "max_shard_size", 14) == 0) {
      if (bs_st_parse_size(val, &a->max_shard_size) != 0)
        die_usage("max_shard_size=%s: not a size (5GB, 500MB, 2GiB, bytes...)", val);
    } else if (eq && ((nlen == 3 && (strncmp(it, "uid", 3) == 0 || strncmp(it, "gid", 3) == 0)) ||
                      (nlen == 5 && strncmp(it, "umask", 5) == 0))) {
      *eq = '\0';
      uint32_t v = parse_owner_opt(it, val);
      if (it[0] == 'g') {
        a->gid = v;
        a->has_gid = true;
      } else if (it[1] == 'i') {
        a->uid = v;
        a->has_uid = true;
      } else {
        a->umask = v;
      }
    } else if (eq && nlen == 7 && strncmp(it, "staging", 7) == 0) {
      bs_free(a->staging);
      a->staging = bs_strdup(val);
    } else if (in_list(ignored_opts, it, nlen) || strncmp(it, "x-", 2) == 0) {
      /* fstab-only */
    } else if (in_list(fuse_opts, it, nlen)) {
      add_fuse_opt(a, it);
    } else {
      int rc = bs_keyopts_add_item(&a->keys, it, &err);
      if (rc < 0) {
        fprintf(stderr, PROG ": option '%s': %s\n", it, err.msg);
        fflush(stderr);
        _exit(2);
      }
      if (rc > 0)
        die_usage("unknown option '%s'", it);
    }
    bs_free(items[i]);
  }
  bs_free(items);
}

static void args_destroy(struct args *a)
{
  bs_keyopts_destroy(&a->keys);
  bs_adapter_destroy(&a->adapter);
  bs_free(a->output);
  bs_free(a->staging);
  a->output = a->staging = NULL;
}

static void parse_args(struct args *a, int argc, char **argv)
{
  memset(a, 0, sizeof *a);
  bs_keyopts_init(&a->keys);
  bs_adapter_init(&a->adapter);
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
      fputs(usage_text, stdout);
      fputs(bs_cli_usage, stdout);
      fputs(usage_rest, stdout);
      exit(0);
    } else if (strcmp(s, "-V") == 0 || strcmp(s, "--version") == 0) {
      printf("burnstore %s (libfuse %s)\n", BURNSTORE_VERSION, fuse_pkgversion());
      exit(0);
    } else if (strcmp(s, "-f") == 0) {
      a->foreground = true;
    } else if (strcmp(s, "-d") == 0) {
      a->debug = a->foreground = true;
    } else if (strcmp(s, "-s") == 0) {
      a->single = true;
    } else if (strcmp(s, "-u") == 0 || strcmp(s, "--unmount") == 0) {
      a->unmount = true;
    } else if (strcmp(s, "-v") == 0 || strcmp(s, "--verbose") == 0) {
      a->verbose = true;
    } else if (strcmp(s, "--finish") == 0 || strcmp(s, "--list-staging") == 0) {
      if (++i >= argc)
        die_usage("%s needs a STAGING_DIR", s);
      if (a->finish || a->list_staging)
        die_usage("--finish and --list-staging take one STAGING_DIR, once");
      if (s[2] == 'f')
        a->finish = argv[i];
      else
        a->list_staging = argv[i];
    } else if (strcmp(s, "-o") == 0) {
      if (++i >= argc)
        die_usage("-o needs an argument");
      parse_opts(a, argv[i]);
    } else if (strncmp(s, "-o", 2) == 0) {
      parse_opts(a, s + 2);
    } else if (s[0] == '-' && s[1] != '\0') {
      die_usage("unknown flag '%s'", s);
    } else if (!a->source) {
      a->source = s;
    } else if (!a->mountpoint) {
      a->mountpoint = s;
    } else {
      die_usage("too many arguments ('%s')", s);
    }
  }
  if (a->finish || a->list_staging) {
    if (a->source || a->unmount)
      die_usage("%s takes only a STAGING_DIR", a->finish ? "--finish" : "--list-staging");
  } else if (a->unmount) {
    if (!a->source || a->mountpoint)
      die_usage("-u takes exactly one MOUNTPOINT");
    a->mountpoint = a->source;
    a->source = NULL;
  } else if (!a->source || !a->mountpoint) {
    die_usage("need SOURCE and MOUNTPOINT");
  }
}

/* An absolute path without stat-ing the last component (which may be a
 * mount whose daemon hangs): realpath of the parent + the base name. */
static char *abs_path(const char *p)
{
  char buf[PATH_MAX], parent[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", p);
  size_t len = strlen(buf);
  while (len > 1 && buf[len - 1] == '/')
    buf[--len] = '\0';
  char *slash = strrchr(buf, '/');
  const char *base;
  if (!slash) {
    snprintf(parent, sizeof parent, ".");
    base = buf;
  } else {
    *slash = '\0';
    snprintf(parent, sizeof parent, "%s", slash == buf ? "/" : buf);
    base = slash + 1;
  }
  char *rp = realpath(parent, NULL);
  if (!rp)
    return NULL;
  char *out = bs_malloc(strlen(rp) + strlen(base) + 2);
  if (out) {
    if (strcmp(base, ".") == 0 || base[0] == '\0')
      strcpy(out, rp);
    else if (strcmp(base, "..") == 0) {
      char *r2 = realpath(p, NULL);
      strcpy(out, r2 ? r2 : rp);
      free(r2);
    } else
      sprintf(out, "%s%s%s", rp, strcmp(rp, "/") == 0 ? "" : "/", base);
  }
  free(rp);
  return out;
}

/* /run/burnstore/<FNV-1a of `key`><suffix> (per-user elsewhere for non-root). */
static void run_path(const char *key, const char *suffix, char *out, size_t n)
{
  const char *base = "/run/burnstore";
  char alt[PATH_MAX];
  if (geteuid() != 0) {
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
      snprintf(alt, sizeof alt, "%s/burnstore", xdg);
    else
      snprintf(alt, sizeof alt, "/tmp/burnstore-%u", (unsigned)geteuid());
    base = alt;
  }
  mkdir(base, 0700);
  uint64_t h = bs_fnv1a_str(BS_FNV1A_INIT, key);
  if (snprintf(out, n, "%s/%016llx%s", base, (unsigned long long)h, suffix) >= (int)n)
    out[0] = '\0';
}

static void status_path(const char *mnt, char *out, size_t n)
{
  run_path(mnt, ".status", out, n);
}

static void update_target_pid(int fd, const char *target, const char *mnt);
static bool is_mounted(const char *mnt);
static void write_status(int fd, const char *text);

/* The target lock: one writable mount (or --finish) per output file. An
 * exclusive flock on /run/burnstore/<hash of the target>.target, held until
 * the daemon has written back and exits; the file names the holder. Returns
 * the fd, or -1 after printing who holds it. */
static int lock_target(const char *target, const char *mnt)
{
  char path[PATH_MAX];
  char *real = realpath(target, NULL); /* one lock whatever symlink names it */
  run_path(real ? real : target, ".target", path, sizeof path);
  free(real);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    fprintf(stderr, PROG ": cannot lock the target %s (%s: %s)\n", target, path, strerror(errno));
    return -1;
  }
  /* A daemon that was just unmounted may still be writing back: wait a bit. */
  for (int i = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; i++) {
    if (i >= 50) {
      char buf[PATH_MAX + 128] = {0};
      ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
      buf[r > 0 ? r : 0] = '\0';
      long pid = 0;
      const char *m = strstr(buf, "mountpoint ");
      const char *pp = strstr(buf, "pid ");
      if (pp)
        pid = strtol(pp + 4, NULL, 10);
      char holder[PATH_MAX + 16] = "?";
      if (m)
        snprintf(holder, sizeof holder, "%.*s", (int)strcspn(m + 11, "\n"), m + 11);
      if (m && strncmp(m + 11, "--finish ", 9) == 0)
        fprintf(stderr, PROG ": %s is being written by burnstore %s (pid %ld)\n", target, holder,
                pid);
      else if (m && !is_mounted(holder))
        fprintf(stderr,
                PROG ": %s is still being written back by the daemon of %s (burnstore pid %ld, "
                     "already unmounted): wait for it\n",
                target, holder, pid);
      else
        fprintf(stderr,
                PROG ": %s is already the target of a writable mount on %s (burnstore pid %ld): "
                     "unmount that first (burnstore -u %s)\n",
                target, holder, pid, holder);
      close(fd);
      return -1;
    }
    usleep(20000);
  }
  update_target_pid(fd, target, mnt);
  return fd;
}

static void update_target_pid(int fd, const char *target, const char *mnt)
{
  if (fd < 0)
    return;
  char text[PATH_MAX * 2 + 128];
  snprintf(text, sizeof text, "pid %ld\nmountpoint %s\ntarget %s\n", (long)getpid(), mnt, target);
  write_status(fd, text); /* informative only */
}

static void write_status(int fd, const char *text)
{
  if (fd < 0)
    return;
  if (ftruncate(fd, 0) == 0 && pwrite(fd, text, strlen(text), 0) == (ssize_t)strlen(text))
    fsync(fd);
}

/* A write-back result line: always to syslog (openlog in main), and to
 * stderr while in the foreground. */
static void report(bool daemonized, int prio, const char *line)
{
  syslog(prio, "%s", line);
  if (!daemonized)
    fprintf(stderr, PROG ": %s\n", line);
}

static void status_running(int sfd, const struct fs *fs, const char *mnt)
{
  char text[3 * PATH_MAX + 128];
  snprintf(text, sizeof text, "running\npid %ld\nmountpoint %s\nstaging %s\ntarget %s\n",
           (long)getpid(), mnt, fs->writable ? fs->staging : "-", fs->writable ? fs->output : "-");
  write_status(sfd, text);
}

/* "ok", then the report: what was written (or that nothing changed), and
 * one line per file written as a U8 blob. Also to syslog, line by line. */
static void status_ok(int sfd, const struct fs *fs, const char *mnt, bool daemonized, bool wrote)
{
  size_t rlen = fs->report ? strlen(fs->report) : 0;
  size_t cap = rlen + 3 * PATH_MAX + 256;
  char *text = bs_malloc(cap);
  if (!text) {
    write_status(sfd, "ok\n");
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
  write_status(sfd, text);
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
          report(daemonized, LOG_WARNING, line);
      }
    }
    if (blobs > 100) {
      char more[64];
      snprintf(more, sizeof more, "... and %u more files written as U8", blobs - 100);
      report(daemonized, LOG_WARNING, more);
    }
  }
  bs_free(text);
}

static int run_fusermount_u(const char *mnt)
{
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    execlp("fusermount3", "fusermount3", "-u", mnt, (char *)NULL);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* /proc/self/mounts writes space, tab, newline and backslash in a path as
 * \ooo; decode the mountpoint field in place (it ends at the next space). */
static char *mounts_field(char *p)
{
  char *o = p, *start = p;
  for (; *p && *p != ' '; p++) {
    if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' &&
        p[3] <= '7') {
      *o++ = (char)((p[1] - '0') << 6 | (p[2] - '0') << 3 | (p[3] - '0'));
      p += 3;
    } else {
      *o++ = *p;
    }
  }
  *o = '\0';
  return start;
}

static bool is_mounted(const char *mnt)
{
  FILE *f = fopen("/proc/self/mounts", "r");
  if (!f)
    return true;
  char line[PATH_MAX * 2 + 256];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    char *a = strchr(line, ' ');
    found = a && strcmp(mounts_field(a + 1), mnt) == 0;
  }
  fclose(f);
  return found;
}

static int do_unmount(const char *mountpoint, bool verbose)
{
  char *mnt = abs_path(mountpoint);
  if (!mnt) {
    fprintf(stderr, PROG ": %s: %s\n", mountpoint, strerror(errno));
    return 1;
  }
  char spath[PATH_MAX];
  status_path(mnt, spath, sizeof spath);
  int fd = open(spath, O_RDWR | O_CLOEXEC);
  /* Already unmounted (umount, fusermount3 -u) while its daemon still
   * writes back: just wait for it. */
  if (fd < 0 && !is_mounted(mnt)) {
    fprintf(stderr, PROG ": %s is not mounted\n", mnt);
    bs_free(mnt);
    return 1;
  }
  int rc = is_mounted(mnt) ? run_fusermount_u(mnt) : 0;
  if (rc != 0 && fd >= 0 && !is_mounted(mnt))
    rc = 0; /* the daemon unmounted by itself meanwhile (SIGTERM) */
  if (rc != 0) {
    if (fd >= 0)
      close(fd);
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
  fs_progress_wait(fd, spath);
  /* The status: a few lines, plus one per U8 blob of the report (bounded). */
  struct stat sst;
  size_t cap = fstat(fd, &sst) == 0 && sst.st_size > 0 ? (size_t)sst.st_size + 1 : 4096;
  if (cap > (16u << 20))
    cap = 16u << 20;
  char *buf = bs_calloc(1, cap);
  if (!buf) {
    fprintf(stderr, PROG ": out of memory\n");
    close(fd);
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
    /* The report: files written as U8 blobs always, everything with -v. */
    for (char *line = buf + 3, *nl; line < buf + n && (nl = strchr(line, '\n')); line = nl + 1) {
      *nl = '\0';
      bool blob = strstr(line, "written as U8") != NULL;
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
  }
  unlink(spath);
  close(fd);
  bs_free(buf);
  bs_free(mnt);
  return ret;
}

static int fail_line(const char *file, const bs_err *err);

/* ---- --list-staging and --finish ------------------------------------- */

/* Take the staging directory's lock: fails while its daemon lives. Returns
 * the fd, or -1 with a message printed. */
static int lock_staging(const char *dir, int dfd, const struct bs_stage_index *idx)
{
  int lk = openat(dfd, BS_STAGE_LOCK_NAME, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lk < 0) {
    fprintf(stderr, PROG ": %s: cannot open its lock file: %s\n", dir, strerror(errno));
    return -1;
  }
  if (flock(lk, LOCK_EX | LOCK_NB) != 0) {
    fprintf(stderr,
            PROG ": %s belongs to a running burnstore daemon (pid %ld): unmount its mount "
                 "(burnstore -u) and let it write back instead\n",
            dir, idx ? idx->pid : 0L);
    close(lk);
    return -1;
  }
  return lk;
}

static bool staging_alive(int dfd)
{
  int lk = openat(dfd, BS_STAGE_LOCK_NAME, O_RDWR | O_CLOEXEC);
  if (lk < 0)
    return false;
  bool alive = flock(lk, LOCK_EX | LOCK_NB) != 0;
  close(lk);
  return alive;
}

static void print_shape(FILE *f, bool has, uint32_t rank, const uint64_t *shape)
{
  char buf[BS_MAX_RANK * 21 + 3];
  if (has)
    bs_shape_format(buf, sizeof buf, rank, shape);
  fputs(has ? buf : "-", f);
}

/* A staging directory without an INDEX (its daemon died while mounted or
 * before its write-back saved one): name its files, which hold raw bytes. */
static int list_raw_staging(const char *dir)
{
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    fprintf(stderr, PROG ": %s: %s\n", dir, strerror(errno));
    if (dfd >= 0)
      close(dfd);
    return 1;
  }
  bool alive = staging_alive(dfd);
  printf("staging %s\nno INDEX: %s; its files hold raw bytes, without keys (--finish cannot "
         "use them)\n",
         dir,
         alive ? "its daemon is running and has not started a write-back"
               : "the daemon died before its write-back described them");
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    struct stat st;
    if (de->d_name[0] == '.' || strcmp(de->d_name, BS_STAGE_LOCK_NAME) == 0 ||
        fstatat(dfd, de->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode))
      continue;
    printf("-\t-\t-\t%lld\tstaged %s/%s\n", (long long)st.st_size, dir, de->d_name);
  }
  closedir(d);
  return 1;
}

static int do_list_staging(const char *dir)
{
  bs_err err;
  bs_err_clear(&err);
  struct bs_stage_index idx;
  if (bs_stage_index_load(dir, &idx, &err) != 0) {
    if (err.code != ENOENT)
      return fail_line(NULL, &err);
    return list_raw_staging(dir);
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  bool alive = dfd >= 0 && staging_alive(dfd);
  if (dfd >= 0)
    close(dfd);
  printf("staging %s\ntarget %s (%s)\ndaemon pid %ld (%s)\n", dir, idx.target,
         bs_format_name(idx.format), idx.pid, alive ? "running: do not --finish" : "gone");
  if (idx.ck.path)
    printf("checkpoint %s (%llu bytes)\n", idx.ck.path, (unsigned long long)idx.ck.size);
  if (idx.incomplete)
    printf("incomplete: %s\n", idx.incomplete);
  for (size_t i = 0; i < idx.cat.count; i++) {
    const struct bs_tensor *t = &idx.cat.tensors[i];
    printf("%s\t%s\t", t->name, bs_dtype_name(t->dtype));
    print_shape(stdout, true, t->rank, t->shape);
    printf("\t%llu\t", (unsigned long long)t->nbytes);
    if (t->src == UINT32_MAX)
      printf("empty\n");
    else if (idx.srcs[t->src].stage)
      printf("staged %s/%s\n", dir, idx.srcs[t->src].file);
    else
      printf("checkpoint source %u at %llu%s\n", t->src, (unsigned long long)t->off,
             t->strides ? " (strided)" : "");
  }
  for (size_t i = 0; i < idx.nfiles; i++) {
    const struct bs_stage_file *f = &idx.files[i];
    printf("%s\t%s\t", f->key, bs_dtype_name(f->dtype));
    print_shape(stdout, f->has_shape, f->rank, f->shape);
    struct stat st;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, f->file);
    printf("\t%lld\tstaged %s\n", stat(path, &st) == 0 ? (long long)st.st_size : -1LL, path);
  }
  bs_stage_index_destroy(&idx);
  return 0;
}

/* After a kill between the rename and the removal of the staging directory,
 * the target already is the result: every tensor of the INDEX is in it with
 * its dtype and shape, and the staged ones with their bytes. */
static bool target_is_result(const struct bs_stage_index *idx, const char *dir)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err err;
  bs_err_clear(&err);
  struct bs_src src;
  struct bs_open_opts oo = {0};
  if (bs_src_open(&src, idx->target, &err) != 0 || bs_open_any(&cat, &src, &oo, &err) != 0)
    return false;
  bool same = cat.count == idx->cat.count;
  enum { CHUNK = 1 << 20 };
  char *a = bs_malloc(CHUNK), *b = bs_malloc(CHUNK);
  same = same && a && b;
  /* The target's tensors by key: one look-up each, not a scan each. */
  struct bs_strmap keys = {0};
  for (size_t i = 0; same && i < cat.count; i++)
    same = bs_strmap_put(&keys, cat.tensors[i].key, i) == 0;
  for (size_t i = 0; same && i < idx->cat.count; i++) {
    const struct bs_tensor *t = &idx->cat.tensors[i];
    size_t k;
    const struct bs_tensor *u = bs_strmap_get(&keys, t->name, &k) ? &cat.tensors[k] : NULL;
    same = u && u->dtype == t->dtype && u->rank == t->rank && u->nbytes == t->nbytes &&
           (t->rank == 0 || memcmp(u->shape, t->shape, t->rank * sizeof *t->shape) == 0);
    if (!same || t->src == UINT32_MAX || !idx->srcs[t->src].stage)
      continue;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, idx->srcs[t->src].file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    same = fd >= 0;
    for (uint64_t off = 0; same && off < t->nbytes;) {
      size_t n = t->nbytes - off < CHUNK ? (size_t)(t->nbytes - off) : CHUNK;
      same = pread(fd, a, n, (off_t)(t->off + off)) == (ssize_t)n &&
             bs_tensor_read(&cat, u, off, b, n) == (long)n && memcmp(a, b, n) == 0;
      off += n;
    }
    if (fd >= 0)
      close(fd);
  }
  bs_strmap_destroy(&keys);
  bs_free(a);
  bs_free(b);
  bs_catalog_destroy(&cat);
  return same;
}

static int do_finish(const char *arg)
{
  char *dir = realpath(arg, NULL);
  if (!dir) {
    fprintf(stderr, PROG ": %s: %s\n", arg, strerror(errno));
    return 1;
  }
  bs_err err;
  bs_err_clear(&err);
  int ret = 1, lk = -1, tfd = -1;
  struct bs_stage_index idx;
  bs_stage_index_init(&idx);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    fprintf(stderr, PROG ": %s: %s\n", dir, strerror(errno));
    goto out;
  }
  if (staging_alive(dfd)) {
    fprintf(stderr,
            PROG ": %s belongs to a running burnstore daemon: unmount its mount (burnstore -u) "
                 "and let it write back instead\n",
            dir);
    goto out;
  }
  if (bs_stage_index_load(dir, &idx, &err) != 0) {
    fail_line(NULL, &err);
    goto out;
  }
  if ((lk = lock_staging(dir, dfd, &idx)) < 0)
    goto out;
  if (idx.incomplete) {
    fprintf(stderr,
            PROG ": %s: the write-back stopped before it could describe the output (%s); the "
                 "staged files are listed by burnstore --list-staging, fix them in a new mount\n",
            dir, idx.incomplete);
    goto out;
  }
  char who[PATH_MAX + 16];
  snprintf(who, sizeof who, "--finish %s", dir);
  if ((tfd = lock_target(idx.target, who)) < 0)
    goto out;
  if (bs_stage_index_attach(&idx, dir, &err) != 0) {
    if (err.code == ESTALE && idx.ck.path && strcmp(idx.ck.path, idx.target) == 0 &&
        target_is_result(&idx, dir)) {
      printf(PROG ": %s already holds the result of this write-back; removed %s\n", idx.target,
             dir);
      bs_stage_dir_remove(dfd, dir);
      ret = 0;
      goto out;
    }
    fail_line(dir, &err);
    goto out;
  }
  const struct bs_writer *w = bs_writer_for_format(idx.format);
  if (!w) {
    fprintf(stderr, PROG ": %s: the INDEX names format %s, which burnstore does not write\n", dir,
            bs_format_name(idx.format));
    goto out;
  }
  struct bs_write_opts wo = {.max_shard_size = idx.max_shard_size};
  if (bs_writer_write_file_opts(w, &idx.cat, idx.target, &wo, &err) != 0) {
    fail_line(NULL, &err);
    fprintf(stderr, PROG ": %s is kept\n", dir);
    goto out;
  }
  bs_stage_dir_remove(dfd, dir);
  printf(PROG ": wrote %s (%zu tensors) from %s, and removed it\n", idx.target, idx.cat.count, dir);
  syslog(LOG_INFO, "--finish wrote %s (%zu tensors) from %s", idx.target, idx.cat.count, dir);
  ret = 0;
out:
  bs_stage_index_destroy(&idx);
  if (tfd >= 0)
    close(tfd);
  if (lk >= 0)
    close(lk);
  if (dfd >= 0)
    close(dfd);
  free(dir);
  return ret;
}

static void fs_destroy(struct fs *fs)
{
  fs_npy_destroy(fs);
  bs_edit_destroy(&fs->edit);
  bs_tree_destroy(&fs->tree);
  bs_catalog_destroy(&fs->cat);
  if (fs->staging_fd >= 0)
    close(fs->staging_fd);
  if (fs->staging_lock >= 0)
    close(fs->staging_lock);
  bs_free(fs->report);
  bs_keyopts_destroy(&fs->keys);
  bs_free(fs->source);
  bs_free(fs->output);
  bs_free(fs->staging);
  pthread_rwlock_destroy(&fs->lock);
  pthread_mutex_destroy(&fs->stage_lock);
}

static int fail_line(const char *file, const bs_err *err)
{
  char line[700];
  fprintf(stderr, PROG ": %s\n", bs_err_format(err, file, line, sizeof line));
  return 1;
}

/* A .pth rewritten in place (output = source) must hold only what the
 * PyTorch writer re-pickles, else something would be lost at unmount.
 * true after printing why it is refused. */
static bool pth_in_place(const struct fs *fs, const struct args *a, const char *out)
{
  if (fs->cat.format != BS_FMT_PYTORCH || !out || strcmp(out, fs->source) != 0 || !fs->cat.nsrcs)
    return false;
  bs_err err;
  bs_err_clear(&err);
  struct bs_pth_keep keep;
  int rc = bs_pth_keep_check(&fs->cat.srcs[0], &keep, &err);
  bs_pth_keep_destroy(&keep);
  if (rc == 0)
    return false;
  fprintf(stderr,
          PROG ": %s: cannot be rewritten in place without losing what it holds: %s; write the "
               "edit to a new file with -o output=NEW.pth\n",
          a->source, err.msg);
  return true;
}

/* The writer of a writable mount, from the output's extension (an rw mount
 * in place keeps the format the file holds). NULL after printing why. */
static const struct bs_writer *choose_writer(const struct fs *fs, const struct args *a, bool is_new)
{
  char exts[256];
  bs_writer_list(exts, sizeof exts);
  if (is_new && !bs_writer_for_path(fs->source)) {
    fprintf(stderr,
            PROG ": %s: does not exist; a new path is mounted as an empty checkpoint only if its "
                 "extension names a format burnstore writes: %s\n",
            a->source, exts);
    return NULL;
  }
  if (a->output) {
    const struct bs_writer *w = bs_writer_for_path(a->output);
    const char *ext = bs_path_extension(a->output);
    if (!w && !*ext)
      fprintf(stderr,
              PROG ": output=%s: no extension names the format to write (burnstore writes %s)\n",
              a->output, exts);
    else if (!w)
      fprintf(stderr,
              PROG ": output=%s: burnstore cannot write %s files (it writes %s, and never writes "
                   "one format under another's extension)\n",
              a->output, ext, exts);
    if (w && w->format == BS_FMT_PYTORCH) {
      char *out = abs_path(a->output);
      bool refuse = pth_in_place(fs, a, out);
      bs_free(out);
      if (refuse)
        return NULL;
    }
    return w;
  }
  if (is_new)
    return bs_writer_for_path(fs->source);
  const struct bs_writer *w = bs_writer_for_format(fs->cat.format);
  if (w && pth_in_place(fs, a, fs->source))
    return NULL;
  if (!w)
    fprintf(stderr,
            PROG ": %s: a writable mount of a %s file needs -o output=PATH naming a format "
                 "burnstore writes: %s; it never overwrites a %s file\n",
            a->source, bs_format_name(fs->cat.format), exts, bs_format_name(fs->cat.format));
  return w;
}

/* Open and validate SOURCE fully, build the tree. Prints the error. */
static int prepare(struct fs *fs, struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  fs->staging_fd = -1;
  fs->staging_lock = -1;
  fs->flat = a->flat;
  fs->owner.uid = a->has_uid ? a->uid : getuid();
  fs->owner.gid = a->has_gid ? a->gid : getgid();
  pthread_rwlock_init(&fs->lock, NULL);
  pthread_mutex_init(&fs->stage_lock, NULL);
  bs_catalog_init(&fs->cat);
  fs->source = abs_path(a->source);
  if (!fs->source) {
    fprintf(stderr, PROG ": %s: %s\n", a->source, strerror(errno));
    return 1;
  }
  struct stat st;
  if (stat(fs->source, &st) == 0 && S_ISDIR(st.st_mode)) {
    char *index; /* a directory: the sharded checkpoint it holds */
    if (bs_st_index_find(fs->source, &index, &err) != 0)
      return fail_line(a->source, &err);
    bs_free(fs->source);
    fs->source = index;
  }
  uint32_t bits = 0444; /* a new checkpoint's */
  if (stat(fs->source, &st) != 0) {
    if (errno != ENOENT) {
      fprintf(stderr, PROG ": %s: %s\n", a->source, strerror(errno));
      return 1;
    }
    if (a->ro) {
      fprintf(stderr, PROG ": %s: no such file (a new checkpoint cannot be mounted ro)\n",
              a->source);
      return 1;
    }
    fs->writable = true;
    if (!(fs->writer = choose_writer(fs, a, true)))
      return 1;
    fs->output = a->output ? abs_path(a->output) : bs_strdup(fs->source);
    if (!fs->output) {
      fprintf(stderr, PROG ": %s: %s\n", a->output ? a->output : a->source, strerror(errno));
      return 1;
    }
    clock_gettime(CLOCK_REALTIME, &fs->mtime);
  } else {
    fs->mtime = st.st_mtim;
    bits = st.st_mode & 0444;
    struct bs_src src;
    struct bs_open_opts oo = {.strict = a->strict};
    if (bs_src_open(&src, fs->source, &err) != 0)
      return fail_line(a->source, &err);
    if (bs_open_any(&fs->cat, &src, &oo, &err) != 0)
      return fail_line(a->source, &err);
    if (a->rw || a->output) {
      fs->writable = true;
      if (!(fs->writer = choose_writer(fs, a, false)))
        return 1;
      fs->output = a->output ? abs_path(a->output) : bs_strdup(fs->source);
      if (!fs->output) {
        fprintf(stderr, PROG ": %s: %s\n", a->output, strerror(errno));
        return 1;
      }
      fs->force_write = strcmp(fs->output, fs->source) != 0;
    }
  }
  /* The files show SOURCE's read bits, so a private checkpoint stays
   * private under allow_other; on a writable mount the owner may write (the
   * source's write bits are about the source, not about this mount). */
  bits = (bits | (fs->writable ? 0200u : 0u)) & ~a->umask;
  fs->owner.file_mode = bits;
  fs->owner.dir_mode = (bits | (bits & 0444) >> 2) & ~a->umask;
  if (a->direct_io && fs->writable) {
    fprintf(stderr, PROG ": direct_io applies to read-only mounts\n");
    return 1;
  }
  fs->direct_io = a->direct_io;
  if (a->max_shard_size) {
    /* Shards are a SafeTensors thing: x.safetensors becomes x-0000K-of-0000N + its index. */
    if (fs->writer && fs->writer->format == BS_FMT_SAFETENSORS)
      fs->writer = bs_writer_for_format(BS_FMT_ST_SHARDED);
    if (!fs->writer || fs->writer->format != BS_FMT_ST_SHARDED) {
      fprintf(stderr, PROG ": max_shard_size= applies to a writable mount written as SafeTensors "
                           "(.safetensors or .safetensors.index.json)\n");
      return 1;
    }
    fs->wopts.max_shard_size = a->max_shard_size;
  }
  if (fs->writable && !fs->output) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  if (fs->writable) {
    char buf[PATH_MAX];
    /* A mkdtemp template: created in fs_staging_create, exclusively. */
    if (a->staging) {
      char *d = abs_path(a->staging);
      if (!d) {
        fprintf(stderr, PROG ": staging=%s: %s\n", a->staging, strerror(errno));
        return 1;
      }
      snprintf(buf, sizeof buf, "%s/burnstore-XXXXXX", d);
      bs_free(d);
    } else {
      const char *slash = strrchr(fs->output, '/');
      snprintf(buf, sizeof buf, "%.*s/.%s.staging-XXXXXX", (int)(slash - fs->output), fs->output,
               slash + 1);
    }
    fs->staging = bs_strdup(buf);
  }
  if (bs_keys_apply(&fs->cat, &a->keys, &err) != 0)
    return fail_line(a->source, &err);
  if ((a->npy || bs_adapter_any(&a->adapter)) && fs->writable) {
    fprintf(stderr,
            PROG ": %s are read-only views: mount without rw and output= (burnstore "
                 "convert -o adapter=pytorch writes an adapted file)\n",
            a->npy ? "npy and npy=only" : "adapter=");
    return 1;
  }
  if (bs_adapter_apply(&fs->cat, &a->adapter, NULL, NULL, &err) != 0)
    return fail_line(a->source, &err);
  /* A conversion that cannot succeed is refused now, not at unmount. */
  if (fs->writer && bs_writer_check(fs->writer, &fs->cat, &err) != 0)
    return fail_line(a->source, &err);
  if (bs_tree_init(&fs->tree, &err) != 0 ||
      bs_tree_build(&fs->tree, &fs->cat, fs->flat, &err) != 0 ||
      fs_npy_build(fs, a->npy, &err) != 0)
    return fail_line(a->source, &err);
  if (bs_edit_init(&fs->edit, &fs->cat, &fs->tree, fs->flat, &err) != 0 ||
      (fs->writable && bs_edit_attach(&fs->edit, &fs->mtime, &fs->owner, &err) != 0))
    return fail_line(a->source, &err);
  fs->keys = a->keys;
  memset(&a->keys, 0, sizeof a->keys);
  /* The parsers' temporary memory (a JSON or CBOR tree of the whole header)
   * is freed by now; give it back, so the daemon stays O(tensors). */
  malloc_trim(0);
  fs->timeout = fs->writable ? 1.0 : 86400.0;
  return 0;
}

int main(int argc, char **argv)
{
  if (argc >= 2 && bs_cli_is_command(argv[1]))
    return bs_cli_main(argc - 1, argv + 1);
  struct args a;
  parse_args(&a, argc, argv);
  if (a.unmount) {
    args_destroy(&a);
    return do_unmount(a.mountpoint, a.verbose);
  }
  if (a.finish || a.list_staging) {
    const char *dir = a.finish ? a.finish : a.list_staging;
    bool fin = a.finish != NULL;
    args_destroy(&a);
    return fin ? do_finish(dir) : do_list_staging(dir);
  }

  struct fs fs;
  memset(&fs, 0, sizeof fs);
  fs.staging_fd = fs.staging_lock = -1;
  if (prepare(&fs, &a) != 0) {
    fs_destroy(&fs);
    args_destroy(&a);
    return 1;
  }
  char *mnt = abs_path(a.mountpoint);
  struct stat mst;
  if (!mnt || stat(mnt, &mst) != 0 || !S_ISDIR(mst.st_mode)) {
    fprintf(stderr, PROG ": mountpoint %s: %s\n", a.mountpoint,
            strerror(mnt && stat(mnt, &mst) == 0 ? ENOTDIR : errno));
    fs_destroy(&fs);
    args_destroy(&a);
    bs_free(mnt);
    return 1;
  }

  /* Staging inside the mount would have the daemon call into its own mount
   * while serving it: a deadlock no signal ends. */
  size_t mlen = strlen(mnt);
  if (fs.staging && strncmp(fs.staging, mnt, mlen) == 0 &&
      (fs.staging[mlen] == '/' || strcmp(mnt, "/") == 0)) {
    fprintf(stderr,
            PROG ": the staging directory %s would be inside the mountpoint %s: put the output "
                 "elsewhere or use -o staging=DIR outside it\n",
            fs.staging, mnt);
    fs_destroy(&fs);
    args_destroy(&a);
    bs_free(mnt);
    return 1;
  }

  /* The status file, locked before mounting (see the top of this file). */
  char spath[PATH_MAX];
  status_path(mnt, spath, sizeof spath);
  int sfd = open(spath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  /* A daemon that was just unmounted may still be on its way out. */
  for (int i = 0; sfd >= 0 && flock(sfd, LOCK_EX | LOCK_NB) != 0 && i < 1500; i++) {
    if (is_mounted(mnt))
      break;
    usleep(20000);
  }
  if (sfd >= 0 && flock(sfd, LOCK_EX | LOCK_NB) != 0) {
    fprintf(stderr, PROG ": %s is already served by another burnstore daemon\n", mnt);
    close(sfd);
    fs_destroy(&fs);
    args_destroy(&a);
    bs_free(mnt);
    return 1;
  }
  /* One writable mount per target, and its staging directory created
   * (exclusively, locked) before mounting, so that a failure is reported
   * here and not after the daemon has detached. */
  int tfd = -1;
  if (fs.writable) {
    tfd = lock_target(fs.output, mnt);
    int sc = tfd < 0 ? -1 : fs_staging_create(&fs);
    if (sc != 0) {
      if (sc < 0 && tfd >= 0)
        fprintf(stderr, PROG ": cannot create a staging directory from %s: %s\n", fs.staging,
                strerror(-sc));
      if (tfd >= 0)
        close(tfd);
      close(sfd);
      unlink(spath);
      fs_destroy(&fs);
      args_destroy(&a);
      bs_free(mnt);
      return 1;
    }
  }
  char text[3 * PATH_MAX + 256];
  status_running(sfd, &fs, mnt);

  /* libfuse splits -o at commas; one in the source path is escaped "\,". */
  char esc[2 * PATH_MAX], *o = esc;
  for (const char *p = fs.source; *p && o < esc + sizeof esc - 2; p++) {
    if (*p == ',' || *p == '\\')
      *o++ = '\\';
    *o++ = *p;
  }
  *o = '\0';
  char fsname[2 * PATH_MAX + 2048 + 96];
  /* direct_io: requests just under 1 MiB, so that a reply still fits
   * libfuse's 1 MiB splice pipe (header included). */
  const char *mr = strstr(a.fuse_extra, "max_read=");
  bool dio_max = fs.direct_io && !mr;
  /* op_init repeats it: libfuse refuses an init that disagrees. */
  fs.max_read = dio_max ? 1044480u : mr ? (unsigned)strtoul(mr + 9, NULL, 10) : 0;
  /* The kernel checks the modes it is shown, on every mount (the ops check
   * nothing themselves): what `ls -l` says is what holds, also for other
   * users under allow_other. */
  snprintf(fsname, sizeof fsname, "fsname=%s,subtype=burnstore,default_permissions%s%s%s%s", esc,
           fs.writable ? "" : ",ro", dio_max ? ",max_read=1044480" : "", a.fuse_extra[0] ? "," : "",
           a.fuse_extra);
  char *fargv[8];
  int fargc = 0;
  fargv[fargc++] = argv[0];
  fargv[fargc++] = "-o";
  fargv[fargc++] = fsname;
  if (a.debug)
    fargv[fargc++] = "-d";
  fargv[fargc] = NULL;
  struct fuse_args fargs = FUSE_ARGS_INIT(fargc, fargv);
  int ret = 1;
  struct fuse_session *se = fuse_session_new(&fargs, &fs_ops, sizeof fs_ops, &fs);
  if (!se) {
    fprintf(stderr, PROG ": cannot create the FUSE session\n");
    goto out_status;
  }
  if (fuse_set_signal_handlers(se) != 0)
    goto out_session;
  if (fuse_session_mount(se, mnt) != 0) {
    char why[PATH_MAX + 256];
    if (fs_mount_diagnose(fsname, why, sizeof why))
      fprintf(stderr, PROG ": cannot mount on %s: %s\n", mnt, why);
    else
      fprintf(stderr,
              PROG ": cannot mount on %s (is /dev/fuse available, and the directory free?)\n", mnt);
    goto out_signals;
  }
  bool daemonized = !a.foreground;
  openlog(PROG, LOG_PID, LOG_USER);
  if (daemonized) {
    if (fuse_daemonize(0) != 0) {
      fuse_session_unmount(se);
      goto out_signals;
    }
    /* The real daemon PID, everywhere (status file, target lock). */
    status_running(sfd, &fs, mnt);
    if (fs.writable)
      update_target_pid(tfd, fs.output, mnt);
  }
  bool stopper = fs.writable && fs_stop_begin(se, mnt) == 0;
  if (a.single) {
    ret = fuse_session_loop(se);
  } else {
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    fuse_loop_cfg_set_idle_threads(cfg, 10);
    ret = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  if (stopper)
    fs_stop_end();
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  se = NULL;
  ret = ret < 0 ? 1 : 0;

  /* Write-back, after the kernel has let go of the mount. */
  /* (A reshard is a write, even with nothing changed.) */
  if (fs.writable && (fs.dirty || fs.force_write || fs.wopts.max_shard_size)) {
    bs_err err;
    bs_err_clear(&err);
    fs_progress_begin(&fs, spath);
    int wrc = fs_writeback(&fs, &err);
    fs_progress_end();
    if (wrc != 0) {
      char line[900], msg[PATH_MAX * 2 + 1200];
      bs_err_format(&err, NULL, line, sizeof line);
      snprintf(msg, sizeof msg, "write-back of %s (mount %s) failed, %s was not written: %s%s%s%s",
               fs.output, mnt, fs.output, line,
               fs.staging_fd >= 0 ? "; the written data is kept in " : "",
               fs.staging_fd >= 0 ? fs.staging : "",
               fs.staging_fd >= 0 ? " (burnstore --list-staging / --finish DIR)" : "");
      report(daemonized, LOG_ERR, msg);
      snprintf(text, sizeof text, "error\n%s\npid %ld\n", msg, (long)getpid());
      write_status(sfd, text);
      ret = 1;
      goto out_fs;
    }
    fs_staging_remove(&fs);
    status_ok(sfd, &fs, mnt, daemonized, true);
  } else {
    if (fs.writable)
      fs_staging_remove(&fs);
    status_ok(sfd, &fs, mnt, daemonized, false);
  }
  goto out_fs;

out_signals:
  fuse_remove_signal_handlers(se);
out_session:
  fuse_session_destroy(se);
out_status:
  fs_staging_remove(&fs);
  write_status(sfd, "error\nthe mount failed\n");
  if (sfd >= 0)
    unlink(spath);
out_fs:
  fuse_opt_free_args(&fargs);
  fs_destroy(&fs);
  args_destroy(&a);
  bs_free(mnt);
  if (sfd >= 0)
    close(sfd);
  if (tfd >= 0)
    close(tfd);
  return ret;
}
