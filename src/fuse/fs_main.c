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
#include <poll.h>
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

#include "core/alloc.h"
#include "core/checked.h"
#include "core/decode.h"
#include "core/http_client.h"
#include "core/progress.h"
#include "core/safe_open.h"
#include "core/target.h"
#include "core/version.h"
#include "formats/formats.h"
#include "fs.h"
#include "fs_log.h"
#include "fs_mounts.h"
#include "fs_views.h"
#include "main/mount.h"
#include "policy/adapter.h"
#include "policy/decode_as.h"
#include "policy/open.h"
#include "policy/stage_index.h"
#include "policy/writeback.h"

#define PROG "burnstore"
enum {
  READAHEAD_URL = 1024, /* KiB: a URL mount's read-ahead (-o readahead=) */
  READAHEAD_MAX = 65536 /* KiB: the largest -o readahead= (64 MiB) */
};

static const char usage_text[] = "usage: burnstore [-f] [-d] [-s] [-o OPTIONS] SOURCE MOUNTPOINT\n"
                                 "       burnstore -u [-v] [--progress|--no-progress] MOUNTPOINT\n"
                                 "       burnstore status MOUNTPOINT\n";
/* then the CLI's usage (the subcommands), then: */
static const char usage_rest[] =
    "\n"
    "Mount a model checkpoint (Burnpack, SafeTensors, GGUF, PyTorch) as a directory:\n"
    "one file per tensor, holding its raw little-endian row-major bytes.\n"
    "If SOURCE does not exist and ends in .bpk, .safetensors, .gguf or .pth (.pt, .bin),\n"
    "MOUNTPOINT is an empty writable directory that is written to SOURCE in that format\n"
    "on unmount. SOURCE (and every command's FILE) may be an http:// or https:// URL:\n"
    "read by range requests, mounted read-only or written to a local -o output=\n"
    "($BURNSTORE_HTTP_TOKEN: a bearer token,\n"
    "$BURNSTORE_HTTP_CACHE: the block cache, default 64M; $BURNSTORE_HTTP_TIMEOUT: the\n"
    "seconds a read may block, default 60; $BURNSTORE_HTTP_UNVALIDATED=1: read a server\n"
    "that gives no strong ETag; $CURL_CA_BUNDLE or $SSL_CERT_FILE: the CAs\n"
    "https trusts, as for curl); a file on the Hugging Face\n"
    "Hub, hf://[datasets/|spaces/]ORG/REPO[@REVISION]/PATH ($HF_ENDPOINT, a token from\n"
    "$HF_TOKEN or $HF_HOME/token; the revision pinned to its commit at open); or an S3\n"
    "object, s3://BUCKET/KEY (Signature V4 from $AWS_ACCESS_KEY_ID,\n"
    "$AWS_SECRET_ACCESS_KEY, $AWS_SESSION_TOKEN; $AWS_REGION; $AWS_ENDPOINT_URL for an\n"
    "S3-compatible store, path style).\n"
    "\n"
    "  -f              stay in the foreground\n"
    "  -d              debug output (implies -f)\n"
    "  -s              single-threaded\n"
    "  -u, --unmount   unmount, wait for the write-back, exit 0 only if it succeeded\n"
    "                  (-v: print the write-back's report and the mount's log;\n"
    "                  --progress / --no-progress: the progress line of a write-back over\n"
    "                  256 MiB also when stderr is not a terminal / not even on one)\n"
    "  status MNT      the daemon serving MNT and what it logged (refusals and why)\n"
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
    "  nojournal              keep no staging journal (a kill while mounted then loses\n"
    "                         the names of what was written; see --finish)\n"
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
    "  output_as=DT           writable: every floating tensor written back as DT (F32,\n"
    "                         F16 or BF16; narrowed to nearest even), also when unchanged\n"
    "  as=F32|F16|BF16        read-only: every floating tensor not stored as that dtype\n"
    "                         shown as it, decoded on read (BF16, F16, F64, F8, F4, every\n"
    "                         ggml quantized type: Q4_0..Q8_1, K-quants, TQ, MXFP4, IQ;\n"
    "                         PyTorch's quantized tensors; Burn's symmetric QFloat);\n"
    "                         F16 and BF16 rounded to nearest even, as convert --as\n"
    "  adapter=pytorch        read-only: PyTorchToBurnAdapter's view: Linear weights\n"
    "                         transposed, norm weight/bias named gamma/beta\n"
    "  adapter_linear=REGEX, adapter_norm=REGEX  name those weights instead of the rule\n"
    "  http_cache=SIZE        a URL SOURCE: its block cache (default 64M, 1M to 16G;\n"
    "                         as $BURNSTORE_HTTP_CACHE, which it overrides)\n"
    "  http_timeout=SECONDS   a URL SOURCE: how long a read may block (default 60, 1 to\n"
    "                         3600; as $BURNSTORE_HTTP_TIMEOUT, which it overrides)\n"
    "  unvalidated            a URL SOURCE whose server gives no strong ETag: read it,\n"
    "                         comparing each answer's size and Last-Modified (two\n"
    "                         versions written within a second could mix); as\n"
    "                         $BURNSTORE_HTTP_UNVALIDATED=1\n"
    "  direct_io              read-only: reads bypass the page cache in ~1 MiB requests\n"
    "                         (faster first reads; shared mmap of tensor files then fails)\n"
    "  readahead=KIB          the mount's read-ahead, also the size of the kernel's reads\n"
    "                         (up to 1 MiB); needs root. Default: 1024 for a URL (0:\n"
    "                         the kernel's 128 KiB), the kernel's for a local file\n"
    "  uid=ID, gid=ID         owner and group of SOURCE's files (number or name;\n"
    "                         default: the mounting user's)\n"
    "  umask=OOO              mode bits (octal) taken off SOURCE's files and directories,\n"
    "                         which show SOURCE's read bits (of a shard set: those all\n"
    "                         its files grant; rw: and the owner's w; directories: x\n"
    "                         where r)\n"
    "  allow_other, allow_root, nosuid, nodev, noexec, noatime: passed to FUSE; the\n"
    "                         kernel checks the modes shown on every mount\n"
    "                         (default_permissions is always on)\n"
    "  SIZE: bytes, or K, M, G, T, KiB, MiB... (powers of 1024: 64M = 64MiB) or KB, MB,\n"
    "        GB, TB (powers of 1000, as Hugging Face: 5GB; Kb, Mb, Gb: bits)\n"
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
  int progress; /* BS_PROGRESS_*: -u --progress, --no-progress */
  bool ro, rw, flat, direct_io, nojournal;
  long readahead_kb; /* -o readahead=KIB; -1: not given */
  bool has_uid, has_gid;
  uint32_t uid, gid, umask; /* -o uid=, gid=, umask= */
  char *output, *staging;   /* owned */
  uint64_t max_shard_size;  /* 0: none */
  char fuse_extra[2048];
  int npy;               /* FS_NPY_*: -o npy, npy=only */
  const char *output_as; /* -o output_as=DT, as given (NULL: none) */
  /* How SOURCE is opened (policy/open.h): key options, strict, adapter=,
   * as=, and for a URL http_cache=, http_timeout=, unvalidated */
  struct bs_open_spec open;
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
    } else if (strcmp(it, "nojournal") == 0) {
      a->nojournal = true;
    } else if (strcmp(it, "direct_io") == 0) {
      a->direct_io = true;
    } else if (eq && nlen == 9 && strncmp(it, "readahead", 9) == 0) {
      char *end;
      errno = 0;
      unsigned long v = strtoul(val, &end, 10);
      if (*val < '0' || *val > '9' || *end || errno || (v != 0 && (v < 4 || v > READAHEAD_MAX)))
        die_usage("readahead=%s: not a size in KiB (0: the kernel's, or 4 to %d)", val,
                  READAHEAD_MAX);
      a->readahead_kb = (long)v;
    } else if (strcmp(it, "npy") == 0 || strcmp(it, "npy=only") == 0) {
      a->npy = it[3] ? FS_NPY_ONLY : FS_NPY_BOTH;
    } else if (strncmp(it, "output_as=", 10) == 0) {
      enum bs_dtype dt;
      if (bs_dtype_from_name(it + 10, &dt) != 0 || !bs_encode_ok(dt))
        die_usage("option '%s': output_as= takes F32, F16 or BF16", it);
      a->output_as = bs_dtype_name(dt);
    } else if (eq && nlen == 6 && strncmp(it, "output", 6) == 0) {
      bs_free(a->output);
      a->output = bs_strdup(val);
    } else if (bs_write_spec_add_item(&a->max_shard_size, it, &err) <= 0) {
      if (err.code)
        die_usage("%s", err.msg);
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
      /* how SOURCE is opened: key options, strict, adapter=, as=, http_* */
      int rc = bs_open_spec_add_item(&a->open, it, &err);
      if (rc < 0)
        die_usage("%s", err.msg);
      if (rc > 0)
        die_usage("unknown option '%s'", it);
    }
    bs_free(items[i]);
  }
  bs_free(items);
}

static void args_destroy(struct args *a)
{
  bs_open_spec_destroy(&a->open);
  bs_free(a->output);
  bs_free(a->staging);
  a->output = a->staging = NULL;
}

static void parse_args(struct args *a, int argc, char **argv, const char *cli_usage)
{
  memset(a, 0, sizeof *a);
  a->readahead_kb = -1;
  bs_open_spec_init(&a->open);
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
      fputs(usage_text, stdout);
      fputs(cli_usage, stdout);
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
    } else if (bs_progress_flag(s) != BS_PROGRESS_AUTO) {
      a->progress = bs_progress_flag(s);
    } else if (strcmp(s, "--finish") == 0 || strcmp(s, "--list-staging") == 0) {
      die_usage("%s comes first: burnstore %s ...", s, s);
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
  if (a->progress && !a->unmount)
    die_usage("--progress and --no-progress go with -u (convert takes them too)");
  if (a->unmount) {
    if (!a->source || a->mountpoint)
      die_usage("-u takes exactly one MOUNTPOINT");
    a->mountpoint = a->source;
    a->source = NULL;
  } else if (!a->source || !a->mountpoint) {
    die_usage("need SOURCE and MOUNTPOINT");
  }
}

/* 0, or -1 having printed why the run directory cannot be used. */
static int status_path(const char *mnt, char *out, size_t n)
{
  bs_err err;
  bs_err_clear(&err);
  if (bs_run_path(mnt, ".status", out, n, &err) == 0)
    return 0;
  fprintf(stderr, PROG ": %s\n", err.msg);
  return -1;
}

/* The status file (spath) and the log (lpath, "" when it cannot be named)
 * of mountpoint mnt, both PATH_MAX bytes. 0, or -1 having printed why. */
static int mount_files(const char *mnt, char *spath, char *lpath)
{
  if (status_path(mnt, spath, PATH_MAX) != 0)
    return -1;
  bs_err err;
  bs_err_clear(&err);
  if (bs_run_path(mnt, ".log", lpath, PATH_MAX, &err) != 0)
    lpath[0] = '\0';
  return 0;
}

static void write_status(int fd, const char *text);

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
  char text[3 * PATH_MAX + 256];
  int n = snprintf(text, sizeof text, "running\npid %ld\nmountpoint %s\nstaging %s\ntarget %s\n",
                   (long)getpid(), mnt, fs->writable ? fs->staging : "-",
                   fs->writable ? fs->output : "-");
  if (fs->unvalidated && n > 0 && (size_t)n < sizeof text)
    snprintf(text + n, sizeof text - (size_t)n,
             "unvalidated its server gives no strong ETag: -o unvalidated reads it comparing each "
             "answer's size and Last-Modified\n");
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

/* libfuse splices a local file's reply through a pipe that must hold it
 * whole, with 3 pages and the header (fuse_send_data_iov), and grows the
 * pipe with F_SETPIPE_SZ: past pipe-max-size only with CAP_SYS_RESOURCE.
 * Where the pipe cannot grow so far, every READ of readahead= KiB is read
 * into memory and copied instead, half as fast (bench.py): said in one
 * line, with the largest value that still splices. Probed on a pipe of
 * our own, as the daemon's threads will ask for theirs. */
static void warn_unspliced(unsigned kib)
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
  fprintf(stderr,
          PROG ": readahead=%u: reads of a local file larger than %lu KiB cannot be spliced here "
               "(pipe-max-size is %lu bytes): they are copied, about half as fast; readahead=%lu "
               "keeps splicing\n",
          kib, fit, pmax, fit);
}

/* A file of the run directory (status, log), opened as any file burnstore
 * did not just create: never through a link, never blocking on a FIFO. */
static int run_file(const char *path, int flags)
{
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_safe_open_path(path, flags, 0, BS_SAFE_REG, &err);
  if (fd < 0)
    errno = err.code;
  return fd;
}

static int do_unmount(const char *mountpoint, bool verbose, int progress)
{
  char *mnt = fs_mountpoint_path(mountpoint);
  if (!mnt) {
    fprintf(stderr, PROG ": %s: %s\n", mountpoint, strerror(errno));
    return 1;
  }
  char spath[PATH_MAX], lpath[PATH_MAX];
  if (mount_files(mnt, spath, lpath) != 0) {
    bs_free(mnt);
    return 1;
  }
  int fd = run_file(spath, O_RDWR);
  /* The daemon removes them as it exits: read them through these fds. */
  int lfd = fd >= 0 && lpath[0] ? run_file(lpath, O_RDONLY) : -1;
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

/* burnstore status MOUNTPOINT: which daemon serves it, for what, and what
 * it logged (refusals, changed sources). Exit 0 while a daemon serves it. */
static int do_status(int argc, char **argv)
{
  if (argc == 3 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0)) {
    fputs("usage: burnstore status MOUNTPOINT\n"
          "The daemon serving MOUNTPOINT (pid, staging directory, target) and every line it\n"
          "logged: refusals (a setfattr or write it refused, and why), changed sources, signals.\n"
          "Exit status 0 while a burnstore daemon serves it, 1 otherwise.\n",
          stdout);
    return 0;
  }
  if (argc != 3 || argv[2][0] == '-')
    die_usage("status takes one MOUNTPOINT");
  char *mnt = fs_mountpoint_path(argv[2]);
  if (!mnt) {
    fprintf(stderr, PROG ": %s: %s\n", argv[2], strerror(errno));
    return 1;
  }
  char spath[PATH_MAX], lpath[PATH_MAX];
  if (mount_files(mnt, spath, lpath) != 0) {
    bs_free(mnt);
    return 1;
  }
  int fd = run_file(spath, O_RDONLY);
  bool alive = fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0;
  char buf[3 * PATH_MAX + 256] = "";
  ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
  buf[n > 0 ? n : 0] = '\0';
  if (fd >= 0)
    close(fd);
  if (!alive) {
    fprintf(stderr, PROG ": %s: no burnstore daemon serves it%s\n", mnt,
            fs_is_mounted(mnt) ? " (it is mounted, but not by a burnstore daemon of this user)"
                               : "");
    bs_free(mnt);
    return 1;
  }
  long pid = 0;
  const char *pp = strstr(buf, "\npid ");
  if (pp)
    pid = strtol(pp + 5, NULL, 10);
  printf("%s: served by burnstore pid %ld (%s)\n", mnt, pid,
         fs_is_mounted(mnt) ? "mounted" : "unmounted, writing back or exiting");
  for (char *line = buf, *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
    *nl = '\0';
    if ((strncmp(line, "staging ", 8) == 0 || strncmp(line, "target ", 7) == 0) &&
        strcmp(strchr(line, ' ') + 1, "-") != 0)
      printf("%s\n", line);
    else if (strncmp(line, "unvalidated ", 12) == 0)
      printf("unvalidated: %s\n", line + 12);
  }
  int lfd = run_file(lpath, O_RDONLY);
  printf("log %s:\n", lpath);
  if (fs_log_print(lfd, stdout, "  ") == 0)
    printf("  (nothing logged)\n");
  if (lfd >= 0)
    close(lfd);
  bs_free(mnt);
  return 0;
}

static int fail_line(const char *file, const bs_err *err);

static void fs_destroy(struct fs *fs)
{
  fs_npy_destroy(fs);
  fs_journal_stop(fs);
  fs_xattr_destroy(fs);
  bs_edit_destroy(&fs->edit);
  bs_tree_destroy(&fs->tree);
  bs_catalog_destroy(&fs->cat);
  bs_free(fs->fixed);
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

/* -o output_as=: a floating tensor of the checkpoint that cannot be decoded
 * is refused at mount, as convert --as refuses it (one written into the
 * mount later is kept as stored, with a note in the write-back's report). */
static int refuse_undecodable(const char *source, const struct bs_catalog *cat, enum bs_dtype as,
                              bool skip_hidden)
{
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    if (t->hidden && skip_hidden)
      continue; /* an extraction does not write what the key options hide */
    char buf[400];
    const char *why = bs_tensor_why_stored(t, as, buf, sizeof buf);
    if (!why)
      continue;
    fprintf(stderr, PROG ": %s: tensor '%s': output_as=%s: %s (exclude it with -o exclude=REGEX)\n",
            source, t->name, bs_dtype_name(as), why);
    return -1;
  }
  return 0;
}

/* bs_writer_check on the dtypes the output will hold: with output_as=,
 * every decodable floating tensor is checked as that dtype (a quantized
 * .pth can be written as SafeTensors once dequantized). */
static int writer_check(struct fs *fs, bs_err *err)
{
  struct bs_catalog *cat = &fs->cat;
  if (!fs->has_output_as)
    return bs_writer_check(fs->writer, cat, err);
  enum bs_dtype *saved = bs_malloc(cat->count ? cat->count * sizeof *saved : 1);
  if (!saved)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < cat->count; i++) {
    saved[i] = cat->tensors[i].dtype;
    if (bs_tensor_decodable(&cat->tensors[i]))
      cat->tensors[i].dtype = fs->output_as;
  }
  int rc = bs_writer_check(fs->writer, cat, err);
  for (size_t i = 0; i < cat->count; i++)
    cat->tensors[i].dtype = saved[i];
  bs_free(saved);
  return rc;
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
  bs_err err;
  bs_err_clear(&err);
  const struct bs_writer *w;
  if (a->output) {
    char label[PATH_MAX + 8];
    snprintf(label, sizeof label, "output=%s", a->output);
    w = bs_wb_writer(a->output, label, a->max_shard_size, &err);
  } else if (is_new) {
    w = bs_wb_writer(fs->source, a->source, a->max_shard_size, &err);
  } else if (!(w = bs_writer_for_format(fs->cat.format))) {
    fprintf(stderr,
            PROG ": %s: a writable mount of a %s file needs -o output=PATH naming a format "
                 "burnstore writes: %s; it never overwrites a %s file\n",
            a->source, bs_format_name(fs->cat.format), exts, bs_format_name(fs->cat.format));
    return NULL;
  } else {
    w = bs_wb_sharded(w, a->max_shard_size, &err);
  }
  if (!w) {
    fail_line(NULL, &err);
    return NULL;
  }
  return w;
}

/* Rewritten in place (output = source, key options applied): the writer
 * must keep all the source holds (a .pth's non-tensor values), else it is
 * refused now; what it must keep where it is becomes fs->fixed. 0, or 1
 * (printed). */
static int check_in_place(struct fs *fs, const struct args *a)
{
  const struct bs_writer *w = fs->writer;
  if (!fs->writable || fs->force_write || !fs->cat.nsrcs || !w->in_place_ok)
    return 0;
  bs_err err;
  bs_err_clear(&err);
  bool *fixed = bs_calloc(fs->cat.count ? fs->cat.count : 1, sizeof *fixed);
  if (!fixed) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  if (w->in_place_ok(&fs->cat, fixed, &err) != 0) {
    fprintf(stderr,
            PROG ": %s: cannot be rewritten in place without losing what it holds: %s; write the "
                 "edit to a new file with -o output=NEW%s\n",
            a->source, err.msg, w->extensions[0]);
    bs_free(fixed);
    return 1;
  }
  for (size_t i = 0; i < fs->cat.count; i++)
    if (fixed[i]) {
      fs->fixed = fixed;
      return 0;
    }
  bs_free(fixed); /* nothing fixed: no check at unlink and rename */
  return 0;
}

static int prepare_rest(struct fs *fs, struct args *a, uint32_t bits);

/* Overwrite a URL's user-info and query in place (it is our argv: what ps
 * shows), once the source holds its own copy. */
static void scrub_url(char *url)
{
  char *a = strstr(url, "://");
  if (!a)
    return;
  a += 3;
  size_t end = strcspn(a, "/?#");
  for (size_t i = end; i > 0; i--)
    if (a[i - 1] == '@') {
      memset(a, '*', i - 1);
      break;
    }
  char *q = strchr(a, '?');
  if (q)
    memset(q + 1, '*', strlen(q + 1));
}

/* A URL mount: the kernel's READs in flight at once (its default: 12), and
 * libfuse's workers (its default: 10), more than that (serve). */
enum { URL_BACKGROUND = 48, URL_WORKERS = 64 };

/* The views (npy, adapter=, as=) are read-only: refused on a mount that
 * will be writable, before anything is opened. 0, or 1 (printed). */
static int refuse_views(const struct args *a)
{
  bool as = a->open.has_as;
  if (!a->npy && !as && !bs_adapter_any(&a->open.adapter))
    return 0;
  fprintf(stderr,
          PROG ": %s%s are read-only views: mount without rw and output= (burnstore "
               "convert -o adapter=pytorch writes an adapted file)\n",
          a->npy ? "npy and npy=only"
          : as   ? "as="
                 : "adapter=",
          !a->npy && as ? bs_dtype_name(a->open.as) : "");
  return 1;
}

/* SOURCE is a URL: opened by range requests through the one open path
 * (bs_checkpoint_open); read-only, or writable into a local output= (never
 * in place). From here on the URL is shown without credentials (messages,
 * the mount table). */
static int prepare_url(struct fs *fs, struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  char *url = (char *)a->source; /* argv's own memory: writable */
  if (a->rw && !a->output) {
    char *shown = bs_http_redact(url);
    fprintf(stderr,
            PROG ": %s: a URL is never written in place: mount it with -o output=LOCAL (a "
                 "writable mount written to a local file), or read-only\n",
            shown ? shown : "the URL");
    bs_free(shown);
    return 1;
  }
  if (a->output && refuse_views(a))
    return 1;
  clock_gettime(CLOCK_REALTIME, &fs->mtime);
  int rc = bs_checkpoint_open(&fs->cat, url, &a->open, &fs->source, &err);
  scrub_url(url);
  if (!fs->source) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  a->source = fs->source;
  if (rc != 0)
    return fail_line(a->source, &err);
  for (size_t i = 0; i < fs->cat.nsrcs; i++) { /* (-o unvalidated let it through) */
    const char *v = NULL;
    if (bs_src_remote(&fs->cat.srcs[i], NULL, &v) && strncmp(v, "If-Match:", 9) != 0)
      fs->unvalidated = true;
  }
  if (a->output) {
    /* The staging INDEX records the URL and each file's validator, so that
     * --finish after a kill reads the same bytes or refuses. */
    const char *reopen = NULL, *validator = NULL;
    bool remote = fs->cat.nsrcs && bs_src_remote(&fs->cat.srcs[0], &reopen, &validator);
    size_t bare = 0; /* (each shard's validator is checked at --finish too) */
    while (remote && reopen && bare < fs->cat.nsrcs &&
           bs_src_remote(&fs->cat.srcs[bare], NULL, &validator) && *validator)
      bare++;
    if (remote && (!reopen || bare < fs->cat.nsrcs)) {
      const char *shard = reopen && fs->cat.nsrcs > 1 ? fs->cat.srcs[bare].name : NULL;
      fprintf(stderr,
              PROG ": %s: a writable mount of it is refused: %s%s%s, so --finish after a crash "
                   "could not tell its bytes changed; mount it read-only and copy the tensors, "
                   "or burnstore convert URL OUT\n",
              a->source,
              !reopen ? "the URL holds credentials (user-info or a query), which are never "
                        "written to the staging directory (use BURNSTORE_HTTP_TOKEN)"
                      : "the server sends neither an ETag nor a Last-Modified",
              shard ? " for " : "", shard ? shard : "");
      return 1;
    }
    fs->writable = true;
    if (!(fs->writer = choose_writer(fs, a, false)))
      return 1;
    if (!(fs->output = bs_write_path(a->output, &err)))
      return fail_line(NULL, &err);
    fs->force_write = true;
  }
  return prepare_rest(fs, a, 0444);
}

/* The output of a writable mount: output= (never through another user's
 * link), else SOURCE itself. 0, or 1 (printed). */
static int set_output(struct fs *fs, const struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  fs->output = a->output ? bs_write_path(a->output, &err) : bs_strdup(fs->source);
  if (fs->output)
    return 0;
  if (err.code)
    return fail_line(NULL, &err);
  fprintf(stderr, PROG ": %s: %s\n", a->output ? a->output : a->source, strerror(errno));
  return 1;
}

/* Open and validate SOURCE fully, build the tree. Prints the error. */
static int prepare(struct fs *fs, struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  fs->staging_fd = -1;
  fs->staging_lock = -1;
  fs->flat = a->flat;
  fs->nojournal = a->nojournal;
  fs->owner.uid = a->has_uid ? a->uid : getuid();
  fs->owner.gid = a->has_gid ? a->gid : getgid();
  pthread_rwlock_init(&fs->lock, NULL);
  pthread_mutex_init(&fs->stage_lock, NULL);
  bs_catalog_init(&fs->cat);
  if (bs_src_is_url(a->source))
    return prepare_url(fs, a);
  const struct bs_http_opts *h = &a->open.http;
  if (h->cache_bytes || h->timeout_s || h->unvalidated) {
    fprintf(stderr, PROG ": %s: http_cache=, http_timeout= and unvalidated apply to a URL SOURCE\n",
            a->source);
    return 1;
  }
  /* A link is the checkpoint it names: rw edits that file, and the link
   * stays a link (its rename would replace the link). Another user's link
   * is not followed by hand; rw refuses it (it could name any file). */
  fs->source = a->rw && !a->output ? bs_write_path(a->source, &err) : bs_link_path(a->source);
  if (!fs->source) {
    if (err.code)
      return fail_line(NULL, &err);
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
    /* A new checkpoint: an empty writable mount, nothing to open. */
    fs->writable = true;
    if (refuse_views(a) || !(fs->writer = choose_writer(fs, a, true)) || set_output(fs, a))
      return 1;
    if (bs_keys_apply(&fs->cat, &a->open.keys, &err) != 0)
      return fail_line(a->source, &err);
    clock_gettime(CLOCK_REALTIME, &fs->mtime);
    return prepare_rest(fs, a, 0444);
  }
  if ((a->rw || a->output) && refuse_views(a))
    return 1;
  /* The one open path: a directory is the checkpoint it holds (fs->source
   * becomes a shard set's index), a set a kill interrupted is recovered
   * first, then the format, key options, adapter=, as=. */
  char *name = NULL;
  int rc = bs_checkpoint_open(&fs->cat, fs->source, &a->open, &name, &err);
  if (rc != 0 || !name) {
    bs_free(name);
    return fail_line(a->source, &err);
  }
  bs_free(fs->source);
  fs->source = name;
  if (stat(fs->source, &st) != 0) {
    fprintf(stderr, PROG ": %s: %s\n", a->source, strerror(errno));
    return 1;
  }
  fs->mtime = st.st_mtim;
  /* The bits every file of the checkpoint grants: a sharded one's index
   * and each of its shards (a 0600 shard keeps the set private). */
  unsigned mode = bs_sources_mode(&fs->cat, fs->cat.nsrcs, st.st_mode);
  if (a->rw || a->output) {
    fs->writable = true;
    if (!(fs->writer = choose_writer(fs, a, false)) || set_output(fs, a))
      return 1;
    fs->force_write = strcmp(fs->output, fs->source) != 0;
    /* A new output is as private as its source (cp keeps the mode). */
    fs->wopts.has_mode = true;
    fs->wopts.mode = mode & 0666;
  }
  return prepare_rest(fs, a, mode & 0444);
}

/* What follows the source's opening, for a file and a URL alike. */
static int prepare_rest(struct fs *fs, struct args *a, uint32_t bits)
{
  bs_err err;
  bs_err_clear(&err);
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
  /* A URL's bytes come in 1 MiB blocks: READs of 1 MiB (not the kernel's
   * 128 KiB) cost fewer requests and wake-ups (bench.py remote). A local
   * file's READs are spliced, where 1 MiB ones were slower. */
  fs->readahead_given = a->readahead_kb >= 0;
  fs->readahead_kb = fs->readahead_given        ? (unsigned)a->readahead_kb
                     : bs_src_is_url(a->source) ? READAHEAD_URL
                                                : 0;
  if (fs->readahead_given && fs->readahead_kb && !bs_src_is_url(a->source))
    warn_unspliced(fs->readahead_kb);
  if (bs_src_is_url(a->source))
    fs->max_background = URL_BACKGROUND;
  if (a->max_shard_size && !fs->writer) {
    fprintf(stderr, PROG ": max_shard_size= applies to a writable mount written as SafeTensors "
                         "(.safetensors or .safetensors.index.json)\n");
    return 1;
  }
  fs->wopts.max_shard_size = a->max_shard_size;
  if (a->output_as && !fs->writer) {
    fprintf(stderr, PROG ": output_as= applies to a writable mount (rw or output=)\n");
    return 1;
  }
  if (a->output_as) {
    fs->has_output_as = true;
    (void)bs_dtype_from_name(a->output_as, &fs->output_as); /* parse_opts checked it */
  }
  if (fs->writable && !fs->output) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  if (fs->writable) {
    char buf[PATH_MAX];
    /* A mkdtemp template: created in fs_staging_create, exclusively. */
    if (a->staging) {
      char *d = bs_abs_path(a->staging);
      if (!d) {
        fprintf(stderr, PROG ": staging=%s: %s\n", a->staging, strerror(errno));
        return 1;
      }
      int w = snprintf(buf, sizeof buf, "%s/burnstore-XXXXXX", d);
      bs_free(d);
      if (w < 0 || (size_t)w >= sizeof buf) {
        fprintf(stderr,
                PROG ": staging=%s: %s (its staging directory's path would be over %d "
                     "bytes)\n",
                a->staging, strerror(ENAMETOOLONG), PATH_MAX - 1);
        return 1;
      }
    } else {
      const char *slash = strrchr(fs->output, '/');
      int w = snprintf(buf, sizeof buf, "%.*s/.%s.staging-XXXXXX", (int)(slash - fs->output),
                       fs->output, slash + 1);
      if (w < 0 || (size_t)w >= sizeof buf || strlen(slash + 1) + 16 > NAME_MAX) {
        fprintf(stderr,
                PROG ": %s: %s (the staging directory beside it, .NAME.staging-XXXXXX, would be "
                     "too long: use -o staging=DIR)\n",
                fs->output, strerror(ENAMETOOLONG));
        return 1;
      }
    }
    fs->staging = bs_strdup(buf);
  }
  /* (key options, adapter= and as= were applied as SOURCE was opened) */
  /* A conversion that cannot succeed is refused now, not at unmount. */
  if (fs->writer && writer_check(fs, &err) != 0)
    return fail_line(a->source, &err);
  if (fs->has_output_as &&
      refuse_undecodable(a->source, &fs->cat, fs->output_as, fs->force_write) != 0)
    return 1;
  if (check_in_place(fs, a) != 0)
    return 1;
  if (bs_tree_init(&fs->tree, &err) != 0 ||
      bs_tree_build(&fs->tree, &fs->cat, fs->flat, &err) != 0 ||
      fs_npy_build(fs, a->npy, &err) != 0)
    return fail_line(a->source, &err);
  if (bs_edit_init(&fs->edit, &fs->cat, &fs->tree, fs->flat, &err) != 0 ||
      (fs->writable && bs_edit_attach(&fs->edit, &fs->mtime, &fs->owner, &err) != 0))
    return fail_line(a->source, &err);
  fs->keys = a->open.keys;
  memset(&a->open.keys, 0, sizeof a->open.keys);
  if (fs_xattr_init(fs, &err) != 0)
    return fail_line(a->source, &err);
  /* The parsers' temporary memory (a JSON or CBOR tree of the whole header)
   * is freed by now; give it back, so the daemon stays O(tensors). */
  malloc_trim(0);
  fs->timeout = fs->writable ? 1.0 : 86400.0;
  return 0;
}

/* A URL mount's requests end with its session: the kernel mount can be
 * gone (burnstore -u, fusermount3 -u) while a worker still waits for a
 * stalled server, and libfuse waits for its workers before the loop
 * returns. A thread polls the session's fd (an error once the kernel let go
 * of the mount) and its exit flag, and cancels the requests of every read
 * begun by then (not the write-back's, which come after). */

struct watch {
  struct fuse_session *se;
  int wake[2]; /* a pipe: watch_end's byte ends it */
  pthread_t thread;
};

static void *watch_session(void *arg)
{
  struct watch *w = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = fuse_session_fd(w->se)}, {.fd = w->wake[0], .events = POLLIN}};
    int k = poll(p, 2, 200);
    if (k > 0 && p[1].revents)
      return NULL;
    if ((k > 0 && (p[0].revents & (POLLERR | POLLHUP | POLLNVAL))) || fuse_session_exited(w->se))
      break;
  }
  bs_http_cancel_all();
  return NULL;
}

static int watch_begin(struct watch *w)
{
  if (pipe2(w->wake, O_CLOEXEC) != 0)
    return -1;
  if (pthread_create(&w->thread, NULL, watch_session, w) != 0) {
    close(w->wake[0]);
    close(w->wake[1]);
    return -1;
  }
  return 0;
}

static void watch_end(struct watch *w)
{
  if (write(w->wake[1], "x", 1) < 0) {
    /* (a pipe of our own: cannot be full) */
  }
  pthread_join(w->thread, NULL);
  close(w->wake[0]);
  close(w->wake[1]);
}

/* One mount's session-level state, from the claim to the exit. */
struct run {
  struct fs fs;
  struct args a;
  char *mnt;                             /* absolute mountpoint, owned */
  char spath[PATH_MAX], lpath[PATH_MAX]; /* status file, log */
  int sfd, tfd;                          /* status file, target lock */
  bool daemonized;
};

/* Before mounting: the mountpoint, the status file's lock, the target lock
 * and the staging directory (exclusive, locked), so that a failure is
 * reported here and not after the daemon has detached. 0, or 1 (printed). */
static int claim(struct run *r)
{
  struct fs *fs = &r->fs;
  char *mnt = r->mnt = fs_mountpoint_path(r->a.mountpoint);
  struct stat mst;
  if (!mnt || stat(mnt, &mst) != 0 || !S_ISDIR(mst.st_mode)) {
    fprintf(stderr, PROG ": mountpoint %s: %s\n", r->a.mountpoint,
            strerror(mnt && stat(mnt, &mst) == 0 ? ENOTDIR : errno));
    return 1;
  }
  /* Staging inside the mount would have the daemon call into its own mount
   * while serving it: a deadlock no signal ends. */
  size_t mlen = strlen(mnt);
  if (fs->staging && strncmp(fs->staging, mnt, mlen) == 0 &&
      (fs->staging[mlen] == '/' || strcmp(mnt, "/") == 0)) {
    fprintf(stderr,
            PROG ": the staging directory %s would be inside the mountpoint %s: put the output "
                 "elsewhere or use -o staging=DIR outside it\n",
            fs->staging, mnt);
    return 1;
  }
  /* The status file, locked before mounting (see the top of this file);
   * the runtime files of daemons that are gone are removed first. */
  bs_run_sweep();
  if (mount_files(mnt, r->spath, r->lpath) != 0)
    return 1;
  /* A daemon that was just unmounted may still be on its way out. */
  for (int i = 0; (r->sfd = bs_run_lock(r->spath)) < 0 && errno == EWOULDBLOCK; i++) {
    if (i >= 1500 || fs_is_mounted(mnt)) {
      fprintf(stderr, PROG ": %s is already served by another burnstore daemon\n", mnt);
      return 1;
    }
    usleep(20000);
  }
  if (r->sfd < 0) {
    /* Without its status file no one could wait for the write-back. */
    fprintf(stderr, PROG ": %s: cannot lock its status file %s: %s\n", mnt, r->spath,
            strerror(errno));
    return 1;
  }
  if (!fs->writable)
    return 0;
  /* One writer per target (target.h). */
  bs_err err;
  bs_err_clear(&err);
  r->tfd = bs_writer_lock(fs->output, mnt, &err);
  if (r->tfd < 0)
    fail_line(NULL, &err);
  else
    bs_staging_sweep(fs->staging, stderr); /* dead daemons' empty staging directories */
  int sc = r->tfd < 0 ? -1 : fs_staging_create(fs);
  if (sc != 0) {
    if (sc < 0 && r->tfd >= 0)
      fprintf(stderr, PROG ": cannot create a staging directory from %s: %s\n", fs->staging,
              strerror(-sc));
    return 1;
  }
  return 0;
}

/* Mount, detach (without -f) and serve until unmounted. 0 once served, 1 if
 * the loop failed, -1 if nothing was mounted (printed). */
static int serve(struct run *r, char *argv0)
{
  struct fs *fs = &r->fs;
  /* libfuse splits -o at commas; one in the source path is escaped "\,". */
  char esc[2 * PATH_MAX], *o = esc;
  for (const char *p = fs->source; *p && o < esc + sizeof esc - 2; p++) {
    if (*p == ',' || *p == '\\')
      *o++ = '\\';
    *o++ = *p;
  }
  *o = '\0';
  char fsname[2 * PATH_MAX + 2048 + 96];
  /* direct_io: requests just under 1 MiB, so that a reply still fits
   * libfuse's 1 MiB splice pipe (header included). */
  const char *mr = strstr(r->a.fuse_extra, "max_read=");
  bool dio_max = fs->direct_io && !mr;
  /* op_init repeats it: libfuse refuses an init that disagrees. */
  fs->max_read = dio_max ? 1044480u : mr ? (unsigned)strtoul(mr + 9, NULL, 10) : 0;
  /* The kernel checks the modes it is shown, on every mount (the ops check
   * nothing themselves): what `ls -l` says is what holds, also for other
   * users under allow_other. */
  snprintf(fsname, sizeof fsname, "fsname=%s,subtype=burnstore,default_permissions%s%s%s%s", esc,
           fs->writable ? "" : ",ro", dio_max ? ",max_read=1044480" : "",
           r->a.fuse_extra[0] ? "," : "", r->a.fuse_extra);
  char *fargv[8];
  int fargc = 0;
  fargv[fargc++] = argv0;
  fargv[fargc++] = "-o";
  fargv[fargc++] = fsname;
  if (r->a.debug)
    fargv[fargc++] = "-d";
  fargv[fargc] = NULL;
  struct fuse_args fargs = FUSE_ARGS_INIT(fargc, fargv);
  int ret = -1;
  struct fuse_session *se = fuse_session_new(&fargs, &fs_ops, sizeof fs_ops, fs);
  if (!se) {
    fprintf(stderr, PROG ": cannot create the FUSE session\n");
    goto out;
  }
  if (fuse_set_signal_handlers(se) != 0)
    goto out_session;
  /* r->mnt is the mountpoint's real path (a symlink's target): the mount
   * table's name of it, for -u, status and readahead= alike. */
  if (fuse_session_mount(se, r->mnt) != 0) {
    char why[PATH_MAX + 256];
    if (fs_mount_diagnose(fsname, why, sizeof why))
      fprintf(stderr, PROG ": cannot mount on %s: %s\n", r->mnt, why);
    else
      fprintf(stderr,
              PROG ": cannot mount on %s (is /dev/fuse available, and the directory free?)\n",
              r->mnt);
    goto out_signals;
  }
  if (fs->readahead_kb && !fs_bdi_of(r->mnt, fs->bdi, sizeof fs->bdi) && fs->readahead_given)
    fprintf(stderr, PROG ": readahead=: %s is not in /proc/self/mountinfo: not applied\n", r->mnt);
  r->daemonized = !r->a.foreground;
  if (r->daemonized) {
    /* (a URL's client thread does not survive the fork: stopped here, the
     * daemon starts its own at its first request) */
    bs_http_client_stop();
    if (fuse_daemonize(0) != 0) {
      fuse_session_unmount(se);
      goto out_signals;
    }
    fs_log_detach();
    /* The real daemon PID, everywhere (status file, target lock). */
    status_running(r->sfd, fs, r->mnt);
    if (fs->writable)
      bs_target_lock_update(r->tfd, fs->output, r->mnt, false);
  }
  bool stopper = fs->writable && fs_stop_begin(se, r->mnt) == 0;
  bool url = bs_src_is_url(r->a.source);
  struct watch w = {.se = se, .wake = {-1, -1}};
  bool watched = url && watch_begin(&w) == 0;
  if (r->a.single) {
    ret = fuse_session_loop(se);
  } else {
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    fuse_loop_cfg_set_idle_threads(cfg, 10);
    /* A URL's reads may wait for a server up to http_timeout: workers
     * enough that readers stuck on one tensor leave others to stat, list
     * and read the rest (libfuse's default is 10). */
    if (url)
      fuse_loop_cfg_set_max_threads(cfg, URL_WORKERS);
    ret = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  if (watched)
    watch_end(&w);
  if (stopper)
    fs_stop_end();
  fuse_session_unmount(se);
  ret = ret < 0 ? 1 : 0;
out_signals:
  fuse_remove_signal_handlers(se);
out_session:
  fuse_session_destroy(se);
out:
  fuse_opt_free_args(&fargs);
  return ret;
}

/* After the kernel has let go of the mount: the write-back (a reshard is a
 * write, even with nothing changed), its result into the status file and
 * syslog. 0, or 1. */
static int write_back(struct run *r)
{
  struct fs *fs = &r->fs;
  /* No op runs any more: what the journal holds the INDEX supersedes (it
   * stays until the write-back succeeds, for a kill before the INDEX). */
  fs_journal_stop(fs);
  if (fs->writable) /* the next writer's refusal: writing back, no longer mounted */
    bs_target_lock_update(r->tfd, fs->output, r->mnt, true);
  if (!fs->writable ||
      !(fs->dirty || fs->force_write || fs->wopts.max_shard_size || fs->has_output_as)) {
    if (fs->writable)
      fs_staging_remove(fs);
    status_ok(r->sfd, fs, r->mnt, r->daemonized, false);
    return 0;
  }
  bs_err err;
  bs_err_clear(&err);
  fs_progress_begin(fs, r->spath);
  bs_log_hold(true); /* (a source's failure: in the write-back's line, with its tensor) */
  int wrc = fs_writeback(fs, &err);
  bs_log_hold(false); /* (a reason no message took: into the log now) */
  fs_progress_end();
  if (wrc != 0) {
    char line[900], msg[PATH_MAX * 2 + 1200], text[3 * PATH_MAX + 1400];
    bs_err_format(&err, NULL, line, sizeof line);
    char note[400];
    const char *jn = fs_journal_note(fs, note, sizeof note);
    snprintf(msg, sizeof msg,
             "write-back of %s (mount %s) failed, %s was not written: %s%s%s%s%s%s", fs->output,
             r->mnt, fs->output, line, fs->staging_fd >= 0 ? "; the written data is kept in " : "",
             fs->staging_fd >= 0 ? fs->staging : "",
             fs->staging_fd >= 0 ? " (burnstore --list-staging / --finish DIR)" : "",
             jn ? "; " : "", jn ? jn : "");
    report(r->daemonized, LOG_ERR, msg);
    /* Kept with the staged data, for when nobody waits and there is no
     * syslog: the session's log, then this. */
    if (fs->staging_fd >= 0)
      (void)fs_log_save(fs->staging_fd, BS_STAGE_LOG_NAME, msg);
    snprintf(text, sizeof text, "error\n%s\npid %ld\n", msg, (long)getpid());
    write_status(r->sfd, text);
    return 1;
  }
  fs_staging_remove(fs);
  status_ok(r->sfd, fs, r->mnt, r->daemonized, true);
  return 0;
}

/* A daemon's runtime files, removed as it exits: the log, the progress
 * file, the target lock, and last the status file, whose lock it lets go
 * last (a `burnstore -u` waiting has the status and log files open, and
 * returns when that lock is let go). The fds are closed. */
static void run_files_remove(struct run *r)
{
  /* Only the holder of the status lock owns the log and progress files: a
   * mount refused because another daemon serves the mountpoint must not
   * remove that daemon's log. */
  if (r->sfd >= 0) {
    if (r->lpath[0])
      unlink(r->lpath);
    fs_progress_remove(r->spath);
  }
  if (r->tfd >= 0)
    bs_target_unlock(r->tfd);
  if (r->sfd >= 0) {
    bs_run_unlink(r->spath, r->sfd);
    close(r->sfd);
  }
  r->sfd = r->tfd = -1;
}

int bs_mount_main(int argc, char **argv, const char *cli_usage)
{
  if (argc >= 2 && strcmp(argv[1], "status") == 0)
    return do_status(argc, argv);
  struct run r;
  memset(&r, 0, sizeof r);
  r.fs.staging_fd = r.fs.staging_lock = r.sfd = r.tfd = -1;
  parse_args(&r.a, argc, argv, cli_usage);
  if (r.a.unmount) {
    args_destroy(&r.a);
    return do_unmount(r.a.mountpoint, r.a.verbose, r.a.progress);
  }
  /* A source's read failure while the checkpoint is opened is told in the
   * refusal's own line (bs_src_read takes its reason), not in one before. */
  bs_log_hold(true);
  int ret = prepare(&r.fs, &r.a) != 0 || claim(&r) != 0 ? 1 : -1;
  bs_log_hold(false);
  if (ret < 0) {
    if (fs_log_open(r.lpath) != 0)
      r.lpath[0] = '\0';
    fs_progress_init(r.spath);
    fs_journal_start(&r.fs);
    status_running(r.sfd, &r.fs, r.mnt);
    ret = serve(&r, argv[0]);
    if (ret < 0) { /* nothing mounted */
      fs_staging_remove(&r.fs);
      write_status(r.sfd, "error\nthe mount failed\n");
      ret = 1;
    } else if (write_back(&r) != 0) {
      ret = 1;
    }
    fs_log_close();
  }
  /* The output path outlives fs_destroy for the target lock's removal. */
  char *output = r.fs.output;
  r.fs.output = NULL;
  fs_destroy(&r.fs);
  r.fs.output = output;
  args_destroy(&r.a);
  bs_free(r.mnt);
  run_files_remove(&r);
  bs_free(output);
  return ret;
}
