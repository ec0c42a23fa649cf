/* The checkpoint CLI: ls, info, cat, diff, convert on the core, without a
 * mount. One line on stderr and a non-zero exit for every error; diff exits
 * 0 (same), 1 (different) or 2 (trouble), like diff(1). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "cli.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/decode.h"
#include "core/npy.h"
#include "core/progress.h"
#include "core/safe_open.h"
#include "core/strmap.h"
#include "core/target.h"
#include "core/version.h"
#include "formats/formats.h"
#include "formats/writers.h"
#include "policy/convert.h"
#include "policy/decode_as.h"
#include "policy/open.h"
#include "policy/writeback.h"

#define PROG "burnstore"
#define CHUNK (1u << 20)

const char bs_cli_usage[] =
    "       burnstore ls [--json] [-o KEYOPTS] FILE\n"
    "       burnstore info [--meta KEY] [-o KEYOPTS] FILE\n"
    "       burnstore cat [--npy] [--as DT] [-o KEYOPTS] FILE KEY\n"
    "       burnstore diff [-q] [-o KEYOPTS] A B\n"
    "       burnstore convert [-q] [--as DT] [-o KEYOPTS] IN OUT\n"
    "       burnstore --finish [--salvage] STAGING_DIR | --list-staging STAGING_DIR\n";

static const char keyopts_help[] =
    "  -o OPTIONS   how FILE is opened, as for a mount, comma-separated: include=REGEX,\n"
    "               exclude=REGEX, remap=FROM=>TO, top_level_key=K, contiguous_indices,\n"
    "               strict (PyTorch: refuse unknown pickle classes), adapter=pytorch\n"
    "               (Linear weights transposed, norm weight/bias as gamma/beta),\n"
    "               adapter_linear=REGEX, adapter_norm=REGEX, as=F32|F16|BF16; a URL:\n"
    "               http_cache=SIZE, http_timeout=SECONDS, unvalidated\n";

struct cmd {
  const char *name, *args, *help;
  int (*run)(int argc, char **argv);
  int trouble; /* the exit status of a failure (diff: 2, like diff(1)) */
};

/* ---- Common options and opening --------------------------------------------------------- */

struct opts {
  struct bs_open_spec open; /* -o: how a checkpoint is opened (policy/open.h) */
  bool json, npy, quiet;
  enum bs_dtype as; /* --as F32|F16|BF16; BS_DT_COUNT: none */
  int progress;     /* BS_PROGRESS_*: --progress, --no-progress */
  const char *meta;
  uint64_t max_shard_size;
  const char *pos[3];
  int npos;
};

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
  char line[2048]; /* (one line: names and server-given text cleaned) */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, PROG ": %s\n", bs_text_clean(line));
  return -1;
}

static int fail_err(const char *file, const bs_err *err)
{
  char line[700];
  return fail("%s", bs_err_format(err, file, line, sizeof line));
}

static const struct cmd *find_cmd(const char *name);

static void help(const struct cmd *c, FILE *f)
{
  fprintf(f, "usage: burnstore %s %s\n\n%s%s", c->name, c->args, c->help, keyopts_help);
}

/* Parse argv (argv[0] is the subcommand). want: the number of positional
 * arguments. flags: which of --json --npy --meta -q apply. Returns 0, 1 for
 * --help (printed), -1 on a usage error (printed). */
static int parse(int argc, char **argv, struct opts *o, int want, const char *flags)
{
  const struct cmd *c = find_cmd(argv[0]);
  memset(o, 0, sizeof *o);
  o->as = BS_DT_COUNT;
  bs_open_spec_init(&o->open);
  bool dashdash = false;
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (dashdash || s[0] != '-' || s[1] == '\0') {
      if (o->npos >= want) {
        fail("%s: too many arguments ('%s'); see burnstore %s --help", argv[0], s, argv[0]);
        return -1;
      }
      o->pos[o->npos++] = s;
    } else if (strcmp(s, "--") == 0) {
      dashdash = true;
    } else if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
      help(c, stdout);
      return 1;
    } else if (strcmp(s, "--json") == 0 && strchr(flags, 'j')) {
      o->json = true;
    } else if (strcmp(s, "--npy") == 0 && strchr(flags, 'n')) {
      o->npy = true;
    } else if (strcmp(s, "--as") == 0 && strchr(flags, 'a')) {
      enum bs_dtype dt;
      if (++i >= argc || bs_dtype_from_name(argv[i], &dt) != 0 || !bs_encode_ok(dt)) {
        fail("%s: --as needs F32, F16 or BF16", argv[0]);
        return -1;
      }
      o->as = dt;
    } else if ((strcmp(s, "-q") == 0 || strcmp(s, "--quiet") == 0) && strchr(flags, 'q')) {
      o->quiet = true;
    } else if (bs_progress_flag(s) != BS_PROGRESS_AUTO && strchr(flags, 'p')) {
      o->progress = bs_progress_flag(s);
    } else if (strcmp(s, "--meta") == 0 && strchr(flags, 'm')) {
      if (++i >= argc) {
        fail("%s: --meta needs a KEY", argv[0]);
        return -1;
      }
      o->meta = argv[i];
    } else if (strcmp(s, "-o") == 0 || strncmp(s, "-o", 2) == 0) {
      const char *optstr = s[2] ? s + 2 : (++i < argc ? argv[i] : NULL);
      if (!optstr) {
        fail("%s: -o needs OPTIONS", argv[0]);
        return -1;
      }
      char **items = NULL;
      size_t n = 0;
      bs_err err;
      bs_err_clear(&err);
      if (bs_opts_split(optstr, &items, &n, &err) != 0) {
        fail("%s: bad options '%s': %s", argv[0], optstr, err.msg);
        return -1;
      }
      int bad = 0;
      for (size_t k = 0; k < n && !bad; k++) {
        int rc =
            strchr(flags, 's') ? bs_write_spec_add_item(&o->max_shard_size, items[k], &err) : 1;
        if (rc > 0)
          rc = bs_open_spec_add_item(&o->open, items[k], &err);
        if (rc < 0)
          bad = fail("%s: %s", argv[0], err.msg);
        else if (rc > 0)
          bad =
              fail("%s: unknown option '%s' (see burnstore %s --help)", argv[0], items[k], argv[0]);
      }
      bs_opts_free(items, n);
      if (bad)
        return -1;
    } else {
      fail("%s: unknown flag '%s' (see burnstore %s --help)", argv[0], s, argv[0]);
      return -1;
    }
  }
  if (o->npos != want) {
    fail("%s: needs %s (see burnstore %s --help)", argv[0], c->args, argv[0]);
    return -1;
  }
  return 0;
}

static void opts_destroy(struct opts *o)
{
  bs_open_spec_destroy(&o->open);
}

/* Open a checkpoint (a file, a directory, a URL) through the one open path
 * with the -o options. 0, or -1 with the error printed. */
static int open_ckpt(const char *path, const struct opts *o, struct bs_catalog *cat)
{
  bs_err err;
  bs_err_clear(&err);
  bs_catalog_init(cat);
  char *name = NULL;
  int rc = bs_checkpoint_open(cat, path, &o->open, &name, &err);
  if (rc != 0) /* (a URL as shown without credentials; a file or directory as given) */
    fail_err(name && bs_src_is_url(path) ? name : path, &err);
  bs_free(name);
  return rc;
}

/* The visible tensor named `key` (presented name), or NULL. */
static const struct bs_tensor *find_visible(const struct bs_catalog *cat, const char *key)
{
  for (size_t i = 0; i < cat->count; i++)
    if (!cat->tensors[i].hidden && strcmp(cat->tensors[i].name, key) == 0)
      return &cat->tensors[i];
  return NULL;
}

static void shape_str(const struct bs_tensor *t, char *buf, size_t n)
{
  bs_shape_format(buf, n, t->rank, t->shape);
}

/* The common start of a subcommand that reads checkpoint o->pos[0]: parse
 * the command line and open it. -1: go on (the caller destroys o and cat);
 * else the exit status (0 after --help, 2 on a usage error, `bad` when the
 * checkpoint cannot be opened). */
static int start(int argc, char **argv, int want, const char *flags, int bad, struct opts *o,
                 struct bs_catalog *cat)
{
  int p = parse(argc, argv, o, want, flags);
  if (p == 0 && open_ckpt(o->pos[0], o, cat) == 0)
    return -1;
  opts_destroy(o);
  return p > 0 ? 0 : p < 0 ? 2 : bad;
}

/* ---- ls --------------------------------------------------------------------------------- */

static int cmd_ls(int argc, char **argv)
{
  struct opts o;
  struct bs_catalog cat;
  int rc = start(argc, argv, 1, "j", 1, &o, &cat);
  if (rc >= 0)
    return rc;
  rc = 0;
  json_t *arr = o.json ? json_array() : NULL;
  for (size_t i = 0; i < cat.count; i++) {
    const struct bs_tensor *t = &cat.tensors[i];
    if (t->hidden)
      continue;
    if (arr) {
      json_t *sh = json_array();
      for (uint32_t d = 0; d < t->rank; d++)
        json_array_append_new(sh, json_integer((json_int_t)t->shape[d]));
      json_t *e = json_pack("{s:s, s:s, s:o, s:I}", "key", t->name, "dtype",
                            bs_dtype_name(t->dtype), "shape", sh, "bytes", (json_int_t)t->nbytes);
      if (e && strcmp(t->name, t->key) != 0)
        json_object_set_new(e, "source_key", json_string(t->key));
      if (e && t->x->strides)
        json_object_set_new(e, "strided", json_true());
      if (e && t->x->unsupported)
        json_object_set_new(e, "unsupported", json_string(t->x->unsupported));
      if (!e || json_array_append_new(arr, e) != 0) {
        rc = 1;
        break;
      }
    } else {
      char shape[BS_MAX_RANK * 21 + 3];
      shape_str(t, shape, sizeof shape);
      printf("%s\t%s\t%s\t%" PRIu64 "%s%s\n", t->name, bs_dtype_name(t->dtype), shape, t->nbytes,
             t->x->unsupported ? "\tunsupported: " : "",
             t->x->unsupported ? t->x->unsupported : "");
    }
  }
  if (arr) {
    if (rc == 0 && json_dumpf(arr, stdout, JSON_INDENT(1) | JSON_ENSURE_ASCII) != 0)
      rc = 1;
    fputc('\n', stdout);
    json_decref(arr);
    if (rc)
      fail("ls: out of memory");
  }
  bs_catalog_destroy(&cat);
  opts_destroy(&o);
  return rc;
}

/* ---- info ------------------------------------------------------------------------------- */

/* The format's own details (bs_format_describe), one "key: value" line each. */
static void print_detail(void *ctx, const char *key, const char *value)
{
  (void)ctx;
  printf("%s: %s\n", key, value);
}

/* A value on one line: control characters shown as \n, \t, \xNN; cut at
 * `max` bytes (0: whole). */
/* The first max bytes of v (n bytes of a text of total bytes), escaped. */
static void print_escaped(const char *v, size_t n, uint64_t total, size_t max)
{
  size_t lim = max && n > max ? max : n;
  for (size_t i = 0; i < lim; i++) {
    unsigned char ch = (unsigned char)v[i];
    if (ch == '\n')
      fputs("\\n", stdout);
    else if (ch == '\t')
      fputs("\\t", stdout);
    else if (ch < 0x20 || ch == 0x7f)
      printf("\\x%02x", ch);
    else
      putchar(ch);
  }
  if (lim < total)
    printf("... (%" PRIu64 " bytes in all)", total);
}

static int cmd_info(int argc, char **argv)
{
  struct opts o;
  struct bs_catalog cat;
  int rc = start(argc, argv, 1, "m", 1, &o, &cat);
  if (rc >= 0)
    return rc;
  rc = 0;
  if (o.meta) {
    size_t i;
    for (i = 0; i < cat.nmeta; i++)
      if (strcmp(cat.meta[i].key, o.meta) == 0)
        break;
    if (i == cat.nmeta) {
      fail("%s: no metadata key '%s' (burnstore info lists them)", o.pos[0], o.meta);
      rc = 1;
    } else { /* (a GGUF value is made text now: the only one made) */
      struct bs_buf b = {0};
      bool cut;
      bs_err err;
      bs_err_clear(&err);
      if (bs_meta_text(&cat, &cat.meta[i], UINT64_MAX, &b, &cut, &err) != 0) {
        fail_err(o.pos[0], &err);
        rc = 1;
      } else {
        fwrite(b.data, 1, b.len, stdout);
        fputc('\n', stdout);
      }
      bs_buf_destroy(&b);
    }
  } else {
    uint64_t total = 0, count = 0;
    uint64_t per_n[BS_DT_COUNT] = {0}, per_b[BS_DT_COUNT] = {0};
    size_t nhidden = 0, nstrided = 0, nunsup = 0;
    for (size_t i = 0; i < cat.count; i++) {
      const struct bs_tensor *t = &cat.tensors[i];
      if (t->hidden) {
        nhidden++;
        continue;
      }
      count++;
      total += t->nbytes;
      per_n[t->dtype]++;
      per_b[t->dtype] += t->nbytes;
      nstrided += t->x->strides != NULL;
      nunsup += t->x->unsupported != NULL;
    }
    printf("file: %s\nformat: %s\n", o.pos[0], bs_format_name(cat.format));
    bs_format_describe(&cat, print_detail, NULL);
    printf("tensors: %" PRIu64 "\n", count);
    if (nhidden)
      printf("hidden by key options: %zu\n", nhidden);
    if (nstrided)
      printf("strided views: %zu\n", nstrided);
    if (nunsup)
      printf("unreadable: %zu\n", nunsup);
    printf("bytes: %" PRIu64 "\n", total);
    printf("dtypes:");
    for (int d = 0; d < BS_DT_COUNT; d++)
      if (per_n[d])
        printf(" %s=%" PRIu64 " (%" PRIu64 " bytes)", bs_dtype_name((enum bs_dtype)d), per_n[d],
               per_b[d]);
    printf("\n");
    printf("metadata: %zu\n", cat.nmeta);
    for (size_t i = 0; i < cat.nmeta; i++) {
      struct bs_buf b = {0};
      bool cut;
      bs_err err;
      bs_err_clear(&err);
      printf("  %s: ", cat.meta[i].key);
      if (bs_meta_text(&cat, &cat.meta[i], 200, &b, &cut, &err) != 0)
        printf("(unreadable: %s)", err.msg);
      else
        print_escaped((const char *)b.data, b.len, bs_kv_text_len(&cat.meta[i]), 200);
      bs_buf_destroy(&b);
      printf("\n");
    }
    if (cat.values_json) {
      printf("values: ");
      size_t vn = strlen(cat.values_json);
      print_escaped(cat.values_json, vn, vn, 400);
      printf("\n");
    }
    if (cat.notes) {
      printf("notes:\n");
      const char *s = cat.notes;
      while (*s) {
        const char *e = strchr(s, '\n');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        printf("  %.*s\n", (int)len, s);
        s += len + (e ? 1 : 0);
      }
    }
  }
  bs_catalog_destroy(&cat);
  opts_destroy(&o);
  return rc;
}

/* ---- cat -------------------------------------------------------------------------------- */

/* Stream a tensor's bytes through fn. 0, or -1 with the error printed. */
static int stream(const char *file, const struct bs_catalog *cat, const struct bs_tensor *t,
                  int (*fn)(void *ctx, const uint8_t *p, size_t n), void *ctx)
{
  if (t->x->unsupported) /* no bytes to show (nbytes 0): an error, not an empty tensor */
    return fail("%s: tensor '%s' cannot be read: %s", file, t->name, t->x->unsupported);
  uint8_t *buf = bs_malloc(CHUNK);
  if (!buf)
    return fail("out of memory");
  int rc = 0;
  for (uint64_t off = 0; off < t->nbytes;) {
    long r = bs_tensor_read(cat, t, off, buf, CHUNK);
    if (r <= 0) {
      char why[BS_LOG_LINE];
      rc = fail("%s: tensor '%s': read failed at byte %" PRIu64 ": %s", file, t->name, off,
                bs_tensor_why(cat, t, r ? (int)-r : EIO, why, sizeof why));
      break;
    }
    if (fn(ctx, buf, (size_t)r) != 0) {
      rc = -1;
      break;
    }
    off += (uint64_t)r;
  }
  bs_free(buf);
  return rc;
}

/* A failed write stops the stream; bs_cli_main reports it in one line. */
static int to_stdout(void *ctx, const uint8_t *p, size_t n)
{
  (void)ctx;
  return fwrite(p, 1, n, stdout) == n ? 0 : -1;
}

static int cmd_cat(int argc, char **argv)
{
  struct opts o;
  struct bs_catalog cat;
  int rc = start(argc, argv, 2, "na", 1, &o, &cat);
  if (rc >= 0)
    return rc;
  rc = 1;
  const struct bs_tensor *t = find_visible(&cat, o.pos[1]);
  if (!t) {
    fail("%s: no tensor '%s' (burnstore ls lists them)", o.pos[0], o.pos[1]);
    goto out;
  }
  if (o.as != BS_DT_COUNT) {
    /* The mount's rule (-o as=F32); integers pass unchanged, and a float
     * without a decoder is refused rather than printed as other numbers. */
    bs_err err;
    bs_err_clear(&err);
    if (bs_catalog_decode_as(&cat, o.as, &err) != 0) {
      fail_err(o.pos[0], &err);
      goto out;
    }
    char buf[400];
    const char *why = bs_tensor_why_stored(t, o.as, buf, sizeof buf);
    if (why) {
      fail("%s: tensor '%s': --as %s: %s", o.pos[0], t->name, bs_dtype_name(o.as), why);
      goto out;
    }
  }
  if (o.npy) {
    char hdr[BS_NPY_MAX_HEADER];
    size_t hl;
    bs_err err;
    bs_err_clear(&err);
    if (bs_npy_header(t->dtype, t->rank, t->shape, hdr, sizeof hdr, &hl, &err) != 0) {
      fail("%s: tensor '%s': no .npy: %s", o.pos[0], t->name, err.msg);
      goto out;
    }
    if (to_stdout(NULL, (const uint8_t *)hdr, hl) != 0)
      goto out;
  }
  if (stream(o.pos[0], &cat, t, to_stdout, NULL) == 0)
    rc = 0;
out:
  bs_catalog_destroy(&cat);
  opts_destroy(&o);
  return rc;
}

/* ---- diff ------------------------------------------------------------------------------- */

/* Element as a double, for the float dtypes; false for the others. */
static bool as_double(enum bs_dtype dt, const uint8_t *p, double *out)
{
  switch (dt) {
  case BS_DT_F64: {
    double d;
    memcpy(&d, p, 8);
    *out = d;
    return true;
  }
  case BS_DT_F32:
  case BS_DT_FLEX32: {
    float f;
    memcpy(&f, p, 4);
    *out = f;
    return true;
  }
  case BS_DT_F16:
  case BS_DT_BF16: {
    float f;
    bs_decode(dt, p, 1, &f); /* exact: widening */
    *out = f;
    return true;
  }
  default: return false;
  }
}

/* The bytes of the smallest run of whole elements of a `bits`-bit type
 * (F6: 3 bytes of 4 elements). */
static size_t sub_group(unsigned bits)
{
  unsigned g = bits, h = 8;
  while (h) { /* gcd(bits, 8) */
    unsigned t = g % h;
    g = h;
    h = t;
  }
  return bits / g;
}

/* How many `bits`-bit elements differ between two groups of n bytes
 * (n <= 8: sub_group's), element k in bits k*bits.. of the little-endian
 * group. */
static uint64_t sub_diff(const uint8_t *a, const uint8_t *b, size_t n, unsigned bits)
{
  uint64_t x = 0, mask = (1ull << bits) - 1, count = 0;
  for (size_t k = 0; k < n; k++)
    x |= (uint64_t)(a[k] ^ b[k]) << (8 * k);
  for (size_t e = 0; e < n * 8 / bits; e++)
    count += (x >> (e * bits) & mask) != 0;
  return count;
}

struct cmp {
  uint64_t diff_bytes, diff_elems; /* diff_elems: blocks, for a block type */
  double maxabs;
  bool nan;
};

/* Compare two same-dtype, same-shape tensors chunk by chunk. 0 or -1. */
static int compare(const char *fa, const struct bs_catalog *ca, const struct bs_tensor *ta,
                   const char *fb, const struct bs_catalog *cb, const struct bs_tensor *tb,
                   struct cmp *c)
{
  memset(c, 0, sizeof *c);
  uint8_t *a = bs_malloc(CHUNK), *b = bs_malloc(CHUNK);
  int rc = 0;
  if (!a || !b) {
    bs_free(a);
    bs_free(b);
    return fail("out of memory");
  }
  unsigned bits = bs_dtype_bits(ta->dtype);
  uint32_t belems, bbytes;
  /* A block type (ggml's quantized types) is compared block by block: its
   * elements have no bytes of their own. A sub-byte type (F4: 2 elements a
   * byte, F6: 4 in 3 bytes) by the bytes that hold a whole number of
   * elements, then element by element (first element in the low bits). */
  bool block = bs_dtype_block(ta->dtype, &belems, &bbytes), sub = !block && bits && bits % 8;
  size_t esz = block ? bbytes : sub ? sub_group(bits) : bits >= 8 ? bits / 8 : 1;
  size_t chunk = CHUNK / esz * esz;
  for (uint64_t off = 0; off < ta->nbytes;) {
    size_t want = (size_t)(ta->nbytes - off < chunk ? ta->nbytes - off : chunk);
    /* (b is read only once a is: a failure's reason is taken before the
     * next read) */
    long ra = bs_tensor_read(ca, ta, off, a, want);
    long rb = ra == (long)want ? bs_tensor_read(cb, tb, off, b, want) : 0;
    if (ra != (long)want || rb != (long)want) {
      bool bad_a = ra != (long)want;
      long r = bad_a ? ra : rb;
      char why[BS_LOG_LINE];
      rc = fail(
          "%s: tensor '%s': read failed at byte %" PRIu64 ": %s", bad_a ? fa : fb, ta->name, off,
          bs_tensor_why(bad_a ? ca : cb, bad_a ? ta : tb, r < 0 ? (int)-r : EIO, why, sizeof why));
      break;
    }
    if (memcmp(a, b, want) != 0) {
      for (size_t i = 0; i < want; i += esz) {
        size_t n = want - i < esz ? want - i : esz;
        if (memcmp(a + i, b + i, n) == 0)
          continue;
        c->diff_elems += sub ? sub_diff(a + i, b + i, n, bits) : 1;
        for (size_t k = 0; k < n; k++)
          c->diff_bytes += a[i + k] != b[i + k];
        double x, y;
        if (esz > 1 || bits == 8) {
          if (as_double(ta->dtype, a + i, &x) && as_double(ta->dtype, b + i, &y)) {
            double d = fabs(x - y);
            if (isnan(d))
              c->nan = true;
            else if (d > c->maxabs)
              c->maxabs = d;
          }
        }
      }
    }
    off += want;
  }
  bs_free(a);
  bs_free(b);
  return rc;
}

static int cmd_diff(int argc, char **argv)
{
  struct opts o;
  struct bs_catalog ca, cb;
  int rc = start(argc, argv, 2, "q", 2, &o, &ca);
  if (rc >= 0)
    return rc;
  if (open_ckpt(o.pos[1], &o, &cb) != 0) {
    bs_catalog_destroy(&ca);
    opts_destroy(&o);
    return 2;
  }
  const char *fa = o.pos[0], *fb = o.pos[1];
  rc = 0;
  struct bs_strmap mb = {0};
  for (size_t i = 0; i < cb.count; i++)
    if (!cb.tensors[i].hidden && bs_strmap_put(&mb, cb.tensors[i].name, i) < 0) {
      fail("out of memory");
      rc = 2;
      goto out;
    }
  bool *seen = bs_calloc(cb.count ? cb.count : 1, 1);
  if (!seen) {
    fail("out of memory");
    rc = 2;
    goto out;
  }
  for (size_t i = 0; i < ca.count && rc < 2; i++) {
    const struct bs_tensor *ta = &ca.tensors[i];
    if (ta->hidden)
      continue;
    size_t j;
    if (!bs_strmap_get(&mb, ta->name, &j)) {
      printf("only in %s: %s\n", fa, ta->name);
      rc = 1;
      continue;
    }
    seen[j] = true;
    const struct bs_tensor *tb = &cb.tensors[j];
    char sa[BS_MAX_RANK * 21 + 3], sb[BS_MAX_RANK * 21 + 3];
    shape_str(ta, sa, sizeof sa);
    shape_str(tb, sb, sizeof sb);
    if (ta->dtype != tb->dtype || strcmp(sa, sb) != 0) {
      printf("changed: %s: %s %s -> %s %s\n", ta->name, bs_dtype_name(ta->dtype), sa,
             bs_dtype_name(tb->dtype), sb);
      rc = 1;
      continue;
    }
    if (ta->nbytes != tb->nbytes) { /* QFLOAT: sizes from the file */
      printf("differs: %s: %" PRIu64 " -> %" PRIu64 " bytes\n", ta->name, ta->nbytes, tb->nbytes);
      rc = 1;
      continue;
    }
    if (o.quiet)
      continue;
    struct cmp c;
    if (compare(fa, &ca, ta, fb, &cb, tb, &c) != 0) {
      rc = 2;
      break;
    }
    if (c.diff_elems) {
      double x;
      uint8_t zero[8] = {0};
      uint32_t be, bb;
      if (bs_dtype_block(ta->dtype, &be, &bb))
        printf("differs: %s: %" PRIu64 " block%s of %" PRIu32 " elements, %" PRIu64 " bytes",
               ta->name, c.diff_elems, c.diff_elems == 1 ? "" : "s", be, c.diff_bytes);
      else
        printf("differs: %s: %" PRIu64 " elements, %" PRIu64 " bytes", ta->name, c.diff_elems,
               c.diff_bytes);
      if (as_double(ta->dtype, zero, &x))
        printf(", max abs difference %s%.9g", c.nan ? "nan; else " : "", c.maxabs);
      printf("\n");
      rc = 1;
    }
  }
  for (size_t j = 0; j < cb.count && rc < 2; j++)
    if (!cb.tensors[j].hidden && !seen[j]) {
      printf("only in %s: %s\n", fb, cb.tensors[j].name);
      rc = 1;
    }
  bs_free(seen);
out:
  bs_strmap_destroy(&mb);
  bs_catalog_destroy(&ca);
  bs_catalog_destroy(&cb);
  opts_destroy(&o);
  return rc;
}

/* ---- convert ---------------------------------------------------------------------------- */

static void progress_observer(void *ctx, uint64_t n)
{
  bs_progress_add(ctx, n);
}

static int cmd_convert(int argc, char **argv)
{
  struct opts o;
  int p = parse(argc, argv, &o, 2, "qspa");
  if (p != 0) {
    opts_destroy(&o);
    return p > 0 ? 0 : 2;
  }
  const char *in = o.pos[0], *out = o.pos[1];
  bs_err err;
  bs_err_clear(&err);
  const struct bs_writer *w = bs_wb_writer(out, out, o.max_shard_size, &err);
  if (!w) {
    fail_err(NULL, &err);
    opts_destroy(&o);
    return 2;
  }
  struct bs_catalog cat;
  if (open_ckpt(in, &o, &cat) != 0) {
    opts_destroy(&o);
    return 1;
  }
  int rc = 1;
  /* (what a -o view= mount makes of it too: policy/convert.h) */
  if (bs_convert_prepare(&cat, w, o.as != BS_DT_COUNT ? &o.as : NULL, "--as ", &err) != 0) {
    fail_err(in, &err);
    goto out;
  }
  uint64_t total = 0;
  size_t n = 0;
  for (size_t i = 0; i < cat.count; i++)
    if (!cat.tensors[i].hidden)
      total += cat.tensors[i].nbytes, n++;
  /* A new output is as private as its source (cp keeps the mode). */
  struct bs_write_opts wo = {.max_shard_size = o.max_shard_size,
                             .has_mode = true,
                             .mode = bs_sources_mode(&cat, cat.nsrcs, 0666)};
  struct bs_progress pr;
  bs_progress_start(&pr, "convert", total, 2, o.quiet ? BS_PROGRESS_OFF : o.progress);
  int lk = -1;
  if ((lk = bs_writer_lock(out, "convert", &err)) < 0) /* one writer per target */
    fail_err(NULL, &err);
  else {
    if (pr.on)
      bs_sink_set_observer(progress_observer, &pr);
    if (bs_writer_write_file_opts(w, &cat, out, &wo, &err) != 0)
      fail_err(NULL, &err);
    else
      rc = 0;
    bs_sink_set_observer(NULL, NULL);
    bs_target_unlock(lk);
  }
  if (rc == 0)
    bs_progress_end(&pr);
  else if (pr.on && pr.tty)
    fputc('\n', stderr);
  char left[BS_LEFT_OUT_MAX][BS_LEFT_OUT_LINE];
  for (size_t i = 0, k = rc == 0 ? bs_convert_left_out(&cat, w, left) : 0; i < k; i++)
    fprintf(stderr, "burnstore: note: %s: %s\n", out, left[i]);
  if (rc == 0 && !o.quiet && isatty(1))
    printf("%s: %zu tensors, %" PRIu64 " bytes of data, written as %s\n", out, n, total, w->name);
out:
  bs_catalog_destroy(&cat);
  opts_destroy(&o);
  return rc;
}

/* ---- --finish, --list-staging ----------------------------------------------------------- */

/* --finish DIR and --list-staging DIR (argv[0] says which). */
static int cmd_staging(int argc, char **argv)
{
  if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    const struct cmd *c = find_cmd(argv[0]);
    printf("usage: burnstore %s %s\n\n%s", c->name, c->args, c->help);
    return 0;
  }
  bool finish = strcmp(argv[0], "--finish") == 0;
  unsigned flags = 0;
  if (finish && argc == 3 && strcmp(argv[1], "--salvage") == 0) {
    flags |= BS_WB_SALVAGE;
    argv++, argc--;
  }
  if (argc != 2 || argv[1][0] == '\0') {
    fail("%s takes one STAGING_DIR (see burnstore %s --help)", argv[0], argv[0]);
    return 2;
  }
  const char *dir = argv[1];
  bs_err err;
  bs_err_clear(&err);
  if (strcmp(argv[0], "--list-staging") == 0) {
    int rc = bs_wb_list(dir, stdout, &err);
    if (rc < 0)
      fail_err(NULL, &err);
    return rc == 0 ? 0 : 1;
  }
  /* The staged files are opened one at a time (per read), but a writer may
   * hold more (a shard set's pool): the soft limit goes up as the daemon's. */
  (void)bs_raise_nofile();
  struct bs_wb_finished res;
  int rc = bs_wb_finish(dir, flags, &res, &err);
  if (rc != 0) {
    fail_err(res.err_dir, &err);
    if (res.kept)
      fail("%s is kept", dir);
  } else if (res.empty) {
    printf(PROG ": %s held nothing to finish (only its lock); removed it\n", dir);
  } else if (res.completed) {
    printf(PROG ": the write-back%s%s had completed (a kill cut its cleanup short); removed %s\n",
           res.target ? " of " : "", res.target ? res.target : "", dir);
  } else if (res.already) {
    printf(PROG ": %s already holds the result of this write-back; removed %s\n", res.target, dir);
  } else if (res.salvaged) {
    printf(PROG ": wrote %s (%zu tensors) from the journal's records before the damage; %s is "
                "kept (its staged files hold what the dropped records name): remove it when "
                "done\n",
           res.target, res.tensors, dir);
    syslog(LOG_WARNING, "--finish --salvage wrote %s (%zu tensors) from %s, records dropped",
           res.target, res.tensors, dir);
  } else {
    printf(PROG ": wrote %s (%zu tensors) from %s, and removed it\n", res.target, res.tensors, dir);
    syslog(LOG_INFO, "--finish wrote %s (%zu tensors) from %s", res.target, res.tensors, dir);
  }
  if (res.notes)
    fputs(res.notes, stdout);
  bs_free(res.target);
  bs_free(res.notes);
  return rc == 0 ? 0 : 1;
}

/* ---- Dispatch ---------------------------------------------------------------------------- */

static const struct cmd cmds[] = {
    {"ls", "[--json] [-o KEYOPTS] FILE",
     "List the tensors of a checkpoint (Burnpack, SafeTensors, sharded SafeTensors, GGUF,\n"
     "PyTorch), one per line: key, dtype, shape, bytes (tab-separated), as the mount would\n"
     "present them.\n"
     "  --json       a JSON array of {key, dtype, shape, bytes[, source_key, strided]}\n",
     cmd_ls, 1},
    {"info", "[--meta KEY] [-o KEYOPTS] FILE",
     "Describe a checkpoint: format, version, tensor count, total bytes, dtype breakdown,\n"
     "metadata (long values cut at 200 bytes), non-tensor values and the reader's notes.\n"
     "  --meta KEY   print only the metadata value KEY, in full (exit 1 if missing)\n",
     cmd_info, 1},
    {"cat", "[--npy] [--as F32|F16|BF16] [-o KEYOPTS] FILE KEY",
     "Write one tensor's raw little-endian row-major bytes to stdout.\n"
     "  --npy        as a .npy file (numpy.load reads it; BF16 comes as <u2, F8 as |u1)\n"
     "  --as F32     a floating tensor decoded to F32 (BF16, F16, F64, F8, F4, ggml Q4_0..Q8_1,\n"
     "               PyTorch's quantized tensors; as -o as=F32 mounts it); integers\n"
     "               unchanged; with --npy: <f4\n"
     "  --as F16|BF16  decoded, then rounded to nearest even (as convert --as)\n",
     cmd_cat, 1},
    {"diff", "[-q] [-o KEYOPTS] A B",
     "Compare two checkpoints: keys only in one, dtype or shape changes, and tensors whose\n"
     "bytes differ (elements, or blocks of ggml's quantized types, and bytes that differ, the\n"
     "max abs difference for float types).\n"
     "Exit status: 0 the same, 1 different, 2 trouble.\n"
     "  -q           compare keys, dtypes and shapes only, not the bytes\n",
     cmd_diff, 2},
    {"convert", "[-q] [--progress|--no-progress] [--as F32|F16|BF16] [-o KEYOPTS] IN OUT",
     "Write checkpoint IN (any readable format) as OUT, in the format OUT's extension names\n"
     "(.bpk, .safetensors, .safetensors.index.json, .gguf), atomically (a temp file beside OUT,\n"
     "fsync, rename): OUT is complete or untouched. A shard set commits through a journal\n"
     "beside its index: a convert killed midway is completed or rolled back by the next\n"
     "access, and an old index naming files that are not its shards is refused. Streams:\n"
     "memory does not grow with the checkpoint. Outputs over 256 MiB show a progress line\n"
     "(bytes, rate, ETA, until the data is on disk) when stderr is a terminal. A key OUT's\n"
     "format cannot hold (not UTF-8; over 63 bytes for GGUF) is refused before anything is\n"
     "written. A new OUT gets IN's permission bits less the umask (as cp: a private IN gives\n"
     "a private OUT); an existing OUT keeps its own.\n"
     "  -q           no progress line, no summary\n"
     "  --progress   the progress line also when stderr is not a terminal (a line a second)\n"
     "  --no-progress  no progress line, also on a terminal\n"
     "  --as DT      every floating tensor written as DT (F32, F16 or BF16): decoded (as cat\n"
     "               --as F32) and, to F16/BF16, rounded to nearest even (too large: infinity;\n"
     "               NaN stays NaN); integers and bools unchanged; a float type without a\n"
     "               decoder is refused before anything is written\n"
     "  -o max_shard_size=SIZE   sharded SafeTensors output (NAME-0000K-of-0000N + index)\n",
     cmd_convert, 1},
    {"--finish", "[--salvage] STAGING_DIR",
     "Finish the write-back a writable mount left in STAGING_DIR (its daemon was killed, or\n"
     "its writer failed): write the target from the INDEX (or, without one, from the JOURNAL),\n"
     "under the target's lock, and remove the directory. Refused while the daemon lives or\n"
     "another writer holds the target, for a directory of another user's, and for a JOURNAL\n"
     "with a damaged record that is not the end of the last write (a kill's cut tail is\n"
     "ignored and said).\n"
     "  --salvage    a damaged JOURNAL: write what its records before the damage describe,\n"
     "               list the records dropped, and keep STAGING_DIR (its staged files)\n",
     cmd_staging, 1},
    {"--list-staging", "STAGING_DIR",
     "List what STAGING_DIR holds: target, format, daemon pid, then one line per tensor: key,\n"
     "dtype, shape, bytes, where (tab-separated). Exit 1 when it has no INDEX.\n",
     cmd_staging, 1},
};

static const struct cmd *find_cmd(const char *name)
{
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (strcmp(cmds[i].name, name) == 0)
      return &cmds[i];
  return NULL;
}

bool bs_cli_is_command(const char *name)
{
  return name && find_cmd(name) != NULL;
}

int bs_cli_main(int argc, char **argv)
{
  const struct cmd *c = argc > 0 ? find_cmd(argv[0]) : NULL;
  if (!c) {
    fail("unknown command '%s'", argc > 0 ? argv[0] : "");
    return 2;
  }
  bs_formats_init();
  /* A source's failure is told in the command's own line (bs_tensor_why,
   * bs_src_read's error), not in a line of its own before it. */
  bs_log_hold(true);
  int rc = c->run(argc, argv);
  bs_log_hold(false); /* (a reason no message took: printed now) */
  /* Output that did not reach stdout (a full disk, a closed pipe) fails
   * the command, in one line: also where the command itself succeeded. */
  errno = 0;
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fail("%s: cannot write to standard output: %s", c->name,
         errno ? strerror(errno) : "write error");
    return rc > c->trouble ? rc : c->trouble;
  }
  return rc;
}
