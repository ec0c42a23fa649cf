/* The mount's command line (fs_mount.h): flags, -o options (the mount's
 * own, mount(8)'s and FUSE's, then how SOURCE is opened: policy/open.h),
 * --help and --version. A usage error is one line and exit 2. */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/decode.h"
#include "core/progress.h"
#include "core/version.h"
#include "fs_mount.h"
#include "fs_views.h"

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
    "  view=safetensors|gguf|bpk  read-only: one file, SOURCE's name with that\n"
    "                         extension, holding the bytes `burnstore convert` writes\n"
    "                         (computed on read, never written; key options, adapter=\n"
    "                         and as= apply)\n"
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

void fs_die_usage(const char *fmt, ...)
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
    fs_die_usage("too many FUSE options");
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
      fs_die_usage("umask=%s: not octal mode bits (0 to 0777, e.g. 022 or 077)", val);
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
  fs_die_usage("%s=%s: not a %s (a number below %lu, or a name)", opt, val,
               opt[0] == 'u' ? "user" : "group", (unsigned long)(uid_t)-1);
}

static void parse_opts(struct args *a, const char *optstr)
{
  char **items = NULL;
  size_t n = 0;
  bs_err err;
  bs_err_clear(&err);
  if (bs_opts_split(optstr, &items, &n, &err) != 0)
    fs_die_usage("bad options '%s': %s", optstr, err.msg);
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
        fs_die_usage("readahead=%s: not a size in KiB (0: the kernel's, or 4 to %d)", val,
                     READAHEAD_MAX);
      a->readahead_kb = (long)v;
    } else if (strcmp(it, "npy") == 0 || strcmp(it, "npy=only") == 0) {
      a->npy = it[3] ? FS_NPY_ONLY : FS_NPY_BOTH;
    } else if (strncmp(it, "view=", 5) == 0) {
      if (!(a->view = fs_view_writer(it + 5)))
        fs_die_usage("option '%s': view= takes safetensors, gguf or bpk", it);
    } else if (strncmp(it, "output_as=", 10) == 0) {
      enum bs_dtype dt;
      if (bs_dtype_from_name(it + 10, &dt) != 0 || !bs_encode_ok(dt))
        fs_die_usage("option '%s': output_as= takes F32, F16 or BF16", it);
      a->output_as = bs_dtype_name(dt);
    } else if (eq && nlen == 6 && strncmp(it, "output", 6) == 0) {
      bs_free(a->output);
      if (!(a->output = bs_strdup(val)))
        fs_die_usage("out of memory");
    } else if (bs_write_spec_add_item(&a->max_shard_size, it, &err) <= 0) {
      if (err.code)
        fs_die_usage("%s", err.msg);
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
      if (!(a->staging = bs_strdup(val)))
        fs_die_usage("out of memory");
    } else if (in_list(ignored_opts, it, nlen) || strncmp(it, "x-", 2) == 0) {
      /* fstab-only */
    } else if (in_list(fuse_opts, it, nlen)) {
      add_fuse_opt(a, it);
    } else {
      /* how SOURCE is opened: key options, strict, adapter=, as=, http_* */
      int rc = bs_open_spec_add_item(&a->open, it, &err);
      if (rc < 0)
        fs_die_usage("%s", err.msg);
      if (rc > 0)
        fs_die_usage("unknown option '%s'", it);
    }
  }
  bs_opts_free(items, n);
}

void fs_args_destroy(struct args *a)
{
  bs_open_spec_destroy(&a->open);
  bs_free(a->output);
  bs_free(a->staging);
  a->output = a->staging = NULL;
}

void fs_args_parse(struct args *a, int argc, char **argv, const char *cli_usage)
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
      fs_die_usage("%s comes first: burnstore %s ...", s, s);
    } else if (strcmp(s, "-o") == 0) {
      if (++i >= argc)
        fs_die_usage("-o needs an argument");
      parse_opts(a, argv[i]);
    } else if (strncmp(s, "-o", 2) == 0) {
      parse_opts(a, s + 2);
    } else if (s[0] == '-' && s[1] != '\0') {
      fs_die_usage("unknown flag '%s'", s);
    } else if (!a->source) {
      a->source = s;
    } else if (!a->mountpoint) {
      a->mountpoint = s;
    } else {
      fs_die_usage("too many arguments ('%s')", s);
    }
  }
  if (a->progress && !a->unmount)
    fs_die_usage("--progress and --no-progress go with -u (convert takes them too)");
  if (a->unmount) {
    if (!a->source || a->mountpoint)
      fs_die_usage("-u takes exactly one MOUNTPOINT");
    a->mountpoint = a->source;
    a->source = NULL;
  } else if (!a->source || !a->mountpoint) {
    fs_die_usage("need SOURCE and MOUNTPOINT");
  }
}

int fs_fail_line(const char *file, const bs_err *err)
{
  char line[700];
  fprintf(stderr, PROG ": %s\n", bs_err_format(err, file, line, sizeof line));
  return 1;
}
