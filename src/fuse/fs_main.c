/* burnstore: command line, validation before mounting, the FUSE session,
 * write-back after the session ends, and the waiting unmount (-u).
 *
 * The waiting unmount: the daemon holds an exclusive flock on a status file
 * (in /run/burnstore, keyed by the mountpoint) from before it mounts until
 * it exits, and writes "ok" or the error into it at the end. `burnstore -u`
 * unmounts, then blocks on that lock, so it returns only after the write-back
 * has finished, with its result. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
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

#include "burnstore/alloc.h"
#include "burnstore/formats.h"
#include "burnstore/version.h"
#include "fs.h"

#define PROG "burnstore"

static const char usage_text[] =
    "usage: burnstore [-f] [-d] [-s] [-o OPTIONS] SOURCE MOUNTPOINT\n"
    "       burnstore -u MOUNTPOINT\n"
    "\n"
    "Mount a model checkpoint (Burnpack, SafeTensors, PyTorch) as a directory:\n"
    "one file per tensor, holding its raw little-endian row-major bytes.\n"
    "If SOURCE does not exist, MOUNTPOINT is an empty writable directory that is\n"
    "written to SOURCE as a Burnpack file on unmount.\n"
    "\n"
    "  -f              stay in the foreground\n"
    "  -d              debug output (implies -f)\n"
    "  -s              single-threaded\n"
    "  -u, --unmount   unmount, wait for the write-back, exit 0 only if it succeeded\n"
    "  -h, --help      this text\n"
    "  -V, --version   the version\n"
    "\n"
    "Options (-o, comma-separated; a comma inside a value is written \\,):\n"
    "  ro, rw                 read-only (default for an existing SOURCE) or writable\n"
    "  output=PATH            where a writable mount is written (default: SOURCE;\n"
    "                         needed for rw on SafeTensors and PyTorch files)\n"
    "  staging=DIR            where written data is staged (default: beside the output)\n"
    "  include=REGEX          keep only keys matching (repeatable, any match)\n"
    "  exclude=REGEX          drop keys matching (repeatable)\n"
    "  remap=FROM=>TO         rename keys by regex, $1 or ${1} for groups (repeatable, in order)\n"
    "  top_level_key=K        mount only the subtree under K (e.g. state_dict)\n"
    "  contiguous_indices     renumber numeric key segments 0,1,2... per parent\n"
    "  flat                   no directories: one file per key\n"
    "  strict                 PyTorch: refuse unknown pickle classes instead of skipping\n"
    "  allow_other, default_permissions, nosuid, nodev, noexec, noatime: passed to FUSE\n"
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
  bool foreground, debug, single, unmount;
  bool ro, rw, flat, strict;
  char *output, *staging; /* owned */
  char fuse_extra[2048];
  struct bs_keyopts keys;
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
    } else if (eq && nlen == 6 && strncmp(it, "output", 6) == 0) {
      bs_free(a->output);
      a->output = bs_strdup(val);
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
  bs_free(a->output);
  bs_free(a->staging);
  a->output = a->staging = NULL;
}

static void parse_args(struct args *a, int argc, char **argv)
{
  memset(a, 0, sizeof *a);
  bs_keyopts_init(&a->keys);
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
      fputs(usage_text, stdout);
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
  if (a->unmount) {
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

static void status_path(const char *mnt, char *out, size_t n)
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
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char *p = (const unsigned char *)mnt; *p; p++)
    h = (h ^ *p) * 1099511628211ull;
  if (snprintf(out, n, "%s/%016llx.status", base, (unsigned long long)h) >= (int)n)
    out[0] = '\0';
}

static void write_status(int fd, const char *text)
{
  if (fd < 0)
    return;
  if (ftruncate(fd, 0) == 0 && pwrite(fd, text, strlen(text), 0) == (ssize_t)strlen(text))
    fsync(fd);
}

/* The daemon's error line: to stderr (foreground) and syslog (daemon). */
static void report(bool daemonized, const char *line)
{
  if (daemonized)
    syslog(LOG_ERR, "%s", line);
  else
    fprintf(stderr, PROG ": %s\n", line);
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

static int do_unmount(const char *mountpoint)
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
  /* Blocks until the daemon has written back and exited. */
  while (flock(fd, LOCK_EX) != 0)
    if (errno != EINTR)
      break;
  char buf[4096] = {0};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n < 0)
    n = 0;
  buf[n] = '\0';
  int ret;
  if (strncmp(buf, "ok", 2) == 0) {
    ret = 0;
  } else if (strncmp(buf, "error\n", 6) == 0) {
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
  bs_free(mnt);
  return ret;
}

static void fs_destroy(struct fs *fs)
{
  bs_edit_destroy(&fs->edit);
  bs_tree_destroy(&fs->tree);
  bs_catalog_destroy(&fs->cat);
  if (fs->staging_fd >= 0)
    close(fs->staging_fd);
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

/* Open and validate SOURCE fully, build the tree. Prints the error. */
static int prepare(struct fs *fs, struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  fs->staging_fd = -1;
  fs->flat = a->flat;
  fs->uid = getuid();
  fs->gid = getgid();
  pthread_rwlock_init(&fs->lock, NULL);
  pthread_mutex_init(&fs->stage_lock, NULL);
  bs_catalog_init(&fs->cat);
  fs->source = abs_path(a->source);
  if (!fs->source) {
    fprintf(stderr, PROG ": %s: %s\n", a->source, strerror(errno));
    return 1;
  }
  struct stat st;
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
    fs->output = bs_strdup(a->output ? a->output : fs->source);
    clock_gettime(CLOCK_REALTIME, &fs->mtime);
  } else {
    fs->mtime = st.st_mtim;
    struct bs_src src;
    struct bs_open_opts oo = {.strict = a->strict};
    if (bs_src_open(&src, fs->source, &err) != 0 || bs_open_any(&fs->cat, &src, &oo, &err) != 0)
      return fail_line(a->source, &err);
    if (a->rw || a->output) {
      fs->writable = true;
      if (!a->output && fs->cat.format != BS_FMT_BURNPACK) {
        fprintf(stderr,
                PROG ": %s: a writable mount of a %s file needs -o output=PATH.bpk (burnstore "
                     "writes Burnpack only, and never overwrites a %s file)\n",
                a->source, bs_format_name(fs->cat.format), bs_format_name(fs->cat.format));
        return 1;
      }
      fs->output = a->output ? abs_path(a->output) : bs_strdup(fs->source);
      if (!fs->output) {
        fprintf(stderr, PROG ": %s: %s\n", a->output, strerror(errno));
        return 1;
      }
      fs->force_write = strcmp(fs->output, fs->source) != 0;
    }
  }
  if (fs->writable && !fs->output) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  if (fs->writable) {
    char buf[PATH_MAX];
    if (a->staging) {
      char *d = abs_path(a->staging);
      snprintf(buf, sizeof buf, "%s/burnstore-%ld", d ? d : a->staging, (long)getpid());
      bs_free(d);
    } else {
      const char *slash = strrchr(fs->output, '/');
      snprintf(buf, sizeof buf, "%.*s/.%s.staging-%ld", (int)(slash - fs->output), fs->output,
               slash + 1, (long)getpid());
    }
    fs->staging = bs_strdup(buf);
  }
  if (bs_keys_apply(&fs->cat, &a->keys, &err) != 0)
    return fail_line(a->source, &err);
  if (bs_tree_init(&fs->tree, &err) != 0 || bs_tree_build(&fs->tree, &fs->cat, fs->flat, &err) != 0)
    return fail_line(a->source, &err);
  if (bs_edit_init(&fs->edit, &fs->cat, &fs->tree, fs->flat, &err) != 0 ||
      (fs->writable && bs_edit_attach(&fs->edit, &fs->mtime, &err) != 0))
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
  struct args a;
  parse_args(&a, argc, argv);
  if (a.unmount) {
    args_destroy(&a);
    return do_unmount(a.mountpoint);
  }

  struct fs fs;
  memset(&fs, 0, sizeof fs);
  fs.staging_fd = -1;
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
  char text[PATH_MAX + 64];
  snprintf(text, sizeof text, "running\npid %ld\nstaging %s\n", (long)getpid(),
           fs.staging ? fs.staging : "-");
  write_status(sfd, text);

  /* libfuse splits -o at commas; one in the source path is escaped "\,". */
  char esc[2 * PATH_MAX], *o = esc;
  for (const char *p = fs.source; *p && o < esc + sizeof esc - 2; p++) {
    if (*p == ',' || *p == '\\')
      *o++ = '\\';
    *o++ = *p;
  }
  *o = '\0';
  char fsname[2 * PATH_MAX + 2048 + 64];
  snprintf(fsname, sizeof fsname, "fsname=%s,subtype=burnstore%s%s%s", esc,
           fs.writable ? "" : ",ro", a.fuse_extra[0] ? "," : "", a.fuse_extra);
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
    fprintf(stderr, PROG ": cannot mount on %s (is /dev/fuse available, and the directory free?)\n",
            mnt);
    goto out_signals;
  }
  bool daemonized = !a.foreground;
  if (daemonized) {
    openlog(PROG, LOG_PID, LOG_DAEMON);
    if (fuse_daemonize(0) != 0) {
      fuse_session_unmount(se);
      goto out_signals;
    }
  }
  if (a.single) {
    ret = fuse_session_loop(se);
  } else {
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    fuse_loop_cfg_set_idle_threads(cfg, 10);
    ret = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  se = NULL;
  ret = ret < 0 ? 1 : 0;

  /* Write-back, after the kernel has let go of the mount. */
  if (fs.writable && (fs.dirty || fs.force_write)) {
    bs_err err;
    bs_err_clear(&err);
    if (fs_writeback(&fs, &err) != 0) {
      char line[900], msg[1200];
      bs_err_format(&err, NULL, line, sizeof line);
      snprintf(msg, sizeof msg, "write-back failed, %s was not written: %s%s%s", fs.output, line,
               fs.staging_fd >= 0 ? "; the written data is kept in " : "",
               fs.staging_fd >= 0 ? fs.staging : "");
      report(daemonized, msg);
      snprintf(text, sizeof text, "error\n%s\n", msg);
      write_status(sfd, text);
      ret = 1;
      goto out_fs;
    }
    fs_staging_remove(&fs);
  } else if (fs.writable) {
    fs_staging_remove(&fs);
  }
  write_status(sfd, "ok\n");
  goto out_fs;

out_signals:
  fuse_remove_signal_handlers(se);
out_session:
  fuse_session_destroy(se);
out_status:
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
  return ret;
}
