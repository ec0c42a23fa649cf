/* The INDEX of a staging directory (see stage_index.h): serialize an output
 * catalog, save it durably, parse it back and reopen its byte sources. */
#include "policy/stage_index.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/decode.h"
#include "core/journal.h"
#include "core/safe_open.h"
#include "core/target.h"
#include "formats/formats.h"
#include "policy/open.h"

#define MAGIC "burnstore-staging-index"

void bs_stage_index_init(struct bs_stage_index *idx)
{
  memset(idx, 0, sizeof *idx);
  bs_catalog_init(&idx->cat);
}

void bs_stage_index_destroy(struct bs_stage_index *idx)
{
  bs_free(idx->target);
  bs_free(idx->staging);
  bs_free(idx->ck.path);
  for (size_t i = 0; i < idx->nsrcs; i++) {
    bs_free(idx->srcs[i].file);
    bs_free(idx->srcs[i].validator);
  }
  bs_free(idx->srcs);
  bs_catalog_destroy(&idx->cat);
  bs_free(idx->incomplete);
  for (size_t i = 0; i < idx->nfiles; i++) {
    bs_free(idx->files[i].file);
    bs_free(idx->files[i].key);
    bs_free(idx->files[i].shape);
  }
  bs_free(idx->files);
  memset(idx, 0, sizeof *idx);
}

/* ---- writing ----------------------------------------------------------- */

struct out {
  struct bs_buf *b;
  bool oom;
};

static void put(struct out *o, const char *s, size_t n)
{
  if (o->oom)
    return;
  if (n > SIZE_MAX - o->b->len - 1 ||
      bs_grow((void **)&o->b->data, &o->b->cap, o->b->len + n + 1, 1) != 0) {
    o->oom = true;
    return;
  }
  memcpy(o->b->data + o->b->len, s, n);
  o->b->len += n;
  o->b->data[o->b->len] = 0;
}

static void putf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct out *o, const char *fmt, ...)
{
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof tmp) {
    o->oom = true;
    return;
  }
  put(o, tmp, (size_t)n);
}

/* A TAB, then s percent-escaped. */
static void put_str(struct out *o, const char *s)
{
  put(o, "\t", 1);
  if (!*s) {
    put(o, "%", 1); /* "%" alone: the empty string */
    return;
  }
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p <= 0x20 || *p == '%' || *p == 0x7f)
      putf(o, "%%%02X", *p);
    else
      put(o, (const char *)p, 1);
  }
}

static void put_shape(struct out *o, uint32_t rank, const uint64_t *shape)
{
  char buf[BS_MAX_RANK * 21 + 3];
  size_t n = bs_shape_format(buf, sizeof buf, rank, shape);
  put(o, "\t", 1);
  put(o, buf, n < sizeof buf ? n : sizeof buf - 1);
}

/* The last component of the directory path `dir` (trailing slashes
 * ignored) into out: false if there is none ("/", "", ".", "..") or it is too long. */
static bool dir_name(const char *dir, char *out, size_t n)
{
  size_t len = strlen(dir);
  while (len > 1 && dir[len - 1] == '/')
    len--;
  size_t start = len;
  while (start > 0 && dir[start - 1] != '/')
    start--;
  size_t k = len - start;
  if (k == 0 || k >= n || (k == 1 && dir[start] == '.') ||
      (k == 2 && dir[start] == '.' && dir[start + 1] == '.'))
    return false;
  memcpy(out, dir + start, k);
  out[k] = '\0';
  return true;
}

int bs_stage_index_format(const struct bs_stage_index *idx, const struct bs_catalog *out,
                          const char *staging, struct bs_buf *buf, bs_err *err)
{
  struct out o = {.b = buf};
  size_t slen = strlen(staging);
  static const char comment[] = "# burnstore staging directory: finish the write-back with "
                                "`burnstore --finish DIR`, list it with `burnstore "
                                "--list-staging DIR`\n";
  put(&o, comment, sizeof comment - 1);
  putf(&o, MAGIC "\t2\npid\t%ld\n", idx->pid);
  put(&o, "target", 6);
  put_str(&o, idx->target ? idx->target : "");
  put(&o, "\nstaging", 8); /* its name: an INDEX or JOURNAL copied elsewhere is refused */
  char sname[NAME_MAX + 1];
  if (!dir_name(staging, sname, sizeof sname))
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "INDEX: no staging directory name in '%s'",
                   staging);
  put_str(&o, sname);
  putf(&o, "\nformat\t%s\n", bs_format_name(idx->format));
  if (idx->max_shard_size)
    putf(&o, "max_shard_size\t%llu\n", (unsigned long long)idx->max_shard_size);
  if (idx->has_mode)
    putf(&o, "mode\t%04o\n", idx->mode & 0666);
  if (idx->has_output_as)
    putf(&o, "output_as\t%s\n", bs_dtype_name(idx->output_as));
  if (idx->ck.path && idx->ck.remote) { /* a URL: its validators are in its src records */
    put(&o, "remote", 6);
    put_str(&o, idx->ck.path);
    putf(&o, "\t%llu\t%s\n", (unsigned long long)idx->ck.size, idx->ck.strict ? "strict" : "-");
  } else if (idx->ck.path) {
    put(&o, "checkpoint", 10);
    put_str(&o, idx->ck.path);
    putf(&o, "\t%llu\t%lld\t%ld\t%llu\t%llu\t%s\n", (unsigned long long)idx->ck.size,
         (long long)idx->ck.mtime_sec, idx->ck.mtime_nsec, (unsigned long long)idx->ck.dev,
         (unsigned long long)idx->ck.ino, idx->ck.strict ? "strict" : "-");
  }
  if (idx->incomplete) {
    put(&o, "incomplete", 10);
    put_str(&o, idx->incomplete);
    put(&o, "\n", 1);
  }
  size_t records = 0;
  if (out) {
    if (idx->ncksrcs > out->nsrcs)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "INDEX: more checkpoint sources than sources");
    for (size_t i = 0; i < out->nsrcs; i++) {
      const struct bs_src *s = &out->srcs[i];
      const char *validator;
      if (i < idx->ncksrcs && idx->ck.remote) {
        if (!bs_src_remote(s, NULL, &validator) || !*validator)
          return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                         "INDEX: source %zu of the remote checkpoint is not remote or has no "
                         "validator",
                         i);
        putf(&o, "src\t%zu\tremote", i);
        put_str(&o, validator);
        putf(&o, "\t%llu\n", (unsigned long long)s->size);
        continue;
      }
      if (i < idx->ncksrcs) {
        putf(&o, "src\t%zu\tcheckpoint\t%llu\n", i, (unsigned long long)s->size);
        continue;
      }
      const char *name = s->name ? s->name : "";
      if (strncmp(name, staging, slen) != 0 || name[slen] != '/' || strchr(name + slen + 1, '/'))
        return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                       "INDEX: source %s is not a file of the staging directory %s", name, staging);
      putf(&o, "src\t%zu\tstage", i);
      put_str(&o, name + slen + 1);
      putf(&o, "\t%llu\n", (unsigned long long)s->size);
    }
    for (size_t i = 0; i < out->nmeta; i++) {
      const struct bs_meta_ref *r = out->meta[i].ref;
      if (r && r->src >= idx->ncksrcs)
        return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                       "INDEX: metadata '%.100s' is in source %u, not the checkpoint's",
                       out->meta[i].key, r->src);
      put(&o, r ? "metaref" : "meta", r ? 7 : 4);
      put_str(&o, out->meta[i].key);
      if (r) { /* a value left in the checkpoint (GGUF): where, not its text */
        putf(&o, "\t%s\t%u\t%llu\t%llu\t%llu\t", bs_format_name(r->format), r->src,
             (unsigned long long)r->off, (unsigned long long)r->len,
             (unsigned long long)r->text_len);
        for (size_t k = 0; k < sizeof r->types; k++)
          putf(&o, "%02x", r->types[k]);
      } else {
        put_str(&o, out->meta[i].value);
      }
      put(&o, "\n", 1);
    }
    for (size_t i = 0; i < out->count; i++) {
      const struct bs_tensor *t = &out->tensors[i];
      if (t->hidden)
        continue;
      put(&o, "tensor", 6);
      put_str(&o, t->name);
      putf(&o, "\t%s", bs_dtype_name(t->dtype));
      put_shape(&o, t->rank, t->shape);
      if (t->has_param_id)
        putf(&o, "\t%llu", (unsigned long long)t->x->param_id);
      else
        put(&o, "\t-", 2);
      if (t->src == UINT32_MAX)
        put(&o, "\t-", 2);
      else
        putf(&o, "\t%u", t->src);
      putf(&o, "\t%llu\t%llu", (unsigned long long)t->off, (unsigned long long)t->nbytes);
      if (t->x->strides) {
        put(&o, "\tstrided\t[", 10);
        for (uint32_t d = 0; d < t->rank; d++)
          putf(&o, d ? ",%lld" : "%lld", (long long)t->x->strides[d]);
        putf(&o, "]\t%llu\t%llu", (unsigned long long)t->x->storage_off,
             (unsigned long long)t->x->storage_bytes);
      }
      if (t->x->dtype_raw && t->x->dtype_raw_len) {
        put(&o, "\traw\t", 5);
        for (size_t k = 0; k < t->x->dtype_raw_len; k++)
          putf(&o, "%02x", t->x->dtype_raw[k]);
      }
      put(&o, "\n", 1);
      records++;
    }
  }
  for (size_t i = 0; i < idx->nfiles; i++) {
    const struct bs_stage_file *f = &idx->files[i];
    put(&o, "file", 4);
    put_str(&o, f->file);
    put_str(&o, f->key);
    putf(&o, "\t%s", bs_dtype_name(f->dtype));
    if (f->has_shape)
      put_shape(&o, f->rank, f->shape);
    else
      put(&o, "\t-", 2);
    put(&o, "\n", 1);
    records++;
  }
  putf(&o, "end\t%zu\n", records);
  if (o.oom)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "INDEX: out of memory");
  return 0;
}

int bs_stage_index_save(int dirfd, const struct bs_buf *buf, bs_err *err)
{
  static const char tmp[] = BS_STAGE_INDEX_NAME ".tmp";
  bs_err sub;
  bs_err_clear(&sub);
  int fd =
      bs_safe_openat(dirfd, NULL, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600, BS_SAFE_REG, NULL, &sub);
  if (fd < 0)
    return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "cannot create the INDEX: %s", sub.msg);
  size_t done = 0;
  while (done < buf->len) {
    ssize_t w = write(fd, buf->data + done, buf->len - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      int e = w < 0 ? errno : ENOSPC;
      close(fd);
      bs_safe_unlinkat(dirfd, tmp, 0);
      return bs_fail(err, e, BS_OFF_NONE, NULL, "cannot write the INDEX (%zu of %zu bytes): %s",
                     done, buf->len, strerror(e));
    }
    done += (size_t)w;
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    int e = errno;
    bs_safe_unlinkat(dirfd, tmp, 0);
    return bs_fail(err, e, BS_OFF_NONE, NULL, "cannot write the INDEX: fsync: %s", strerror(e));
  }
  if (bs_safe_renameat(dirfd, tmp, BS_STAGE_INDEX_NAME) != 0) {
    int e = errno;
    bs_safe_unlinkat(dirfd, tmp, 0);
    return bs_fail(err, e, BS_OFF_NONE, NULL, "cannot rename the INDEX into place: %s",
                   strerror(e));
  }
  if (fsync(dirfd) != 0)
    return bs_fail(err, errno, BS_OFF_NONE, NULL, "cannot fsync the staging directory: %s",
                   strerror(errno));
  return 0;
}

/* ---- parsing ----------------------------------------------------------- */

#define MAX_FIELDS 16

struct line {
  char *f[MAX_FIELDS];
  size_t n;
  uint64_t off; /* byte offset of the line in the INDEX */
};

static int perr(bs_err *err, const struct line *l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int perr(bs_err *err, const struct line *l, const char *fmt, ...)
{
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return bs_fail(err, EINVAL, l ? l->off : BS_OFF_NONE, NULL, "INDEX: %s", msg);
}

/* Undo the percent escapes in place. */
static int unescape(char *s)
{
  if (strcmp(s, "%") == 0) {
    s[0] = 0;
    return 0;
  }
  char *o = s;
  for (char *p = s; *p; p++) {
    if (*p != '%') {
      *o++ = *p;
      continue;
    }
    unsigned v = 0;
    for (int k = 1; k <= 2; k++) {
      int d = bs_hex_digit(p[k]);
      if (d < 0)
        return -1;
      v = v * 16 + (unsigned)d;
    }
    if (v == 0)
      return -1;
    *o++ = (char)v;
    p += 2;
  }
  *o = 0;
  return 0;
}

static bool parse_u64(const char *s, uint64_t *out)
{
  if (!*s)
    return false;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || !bs_mul_u64(v, 10, &v) || !bs_add_u64(v, (uint64_t)(*s - '0'), &v))
      return false;
  }
  *out = v;
  return true;
}

static bool parse_i64(const char *s, int64_t *out)
{
  bool neg = *s == '-';
  uint64_t v;
  if (!parse_u64(s + neg, &v) || v > (uint64_t)INT64_MAX)
    return false;
  *out = neg ? -(int64_t)v : (int64_t)v;
  return true;
}

/* "[a,b,c]" -> rank and a bs_malloc'd array (NULL for rank 0). */
static bool parse_list(const char *s, bool is_signed, uint32_t *rank, void **vals)
{
  size_t len = strlen(s);
  *vals = NULL;
  *rank = 0;
  if (len < 2 || s[0] != '[' || s[len - 1] != ']')
    return false;
  if (len == 2)
    return true;
  uint64_t *v = bs_malloc((BS_MAX_RANK + 1) * sizeof *v);
  if (!v)
    return false;
  char tmp[32];
  uint32_t n = 0;
  const char *p = s + 1;
  for (;;) {
    const char *e = p;
    while (*e != ',' && *e != ']')
      e++;
    if ((size_t)(e - p) >= sizeof tmp || n >= BS_MAX_RANK) {
      bs_free(v);
      return false;
    }
    memcpy(tmp, p, (size_t)(e - p));
    tmp[e - p] = 0;
    bool ok = is_signed ? parse_i64(tmp, (int64_t *)&v[n]) : parse_u64(tmp, &v[n]);
    if (!ok) {
      bs_free(v);
      return false;
    }
    n++;
    if (*e == ']') {
      if (e[1]) {
        bs_free(v);
        return false;
      }
      break;
    }
    p = e + 1;
  }
  *rank = n;
  *vals = v;
  return true;
}

static int parse_tensor(struct bs_stage_index *idx, struct line *l, bs_err *err)
{
  /* tensor KEY DTYPE SHAPE PARAM SRC OFF NBYTES [strided STRIDES SOFF SBYTES] [raw HEX] */
  if (l->n < 8)
    return perr(err, l, "a tensor record needs 8 fields, has %zu", l->n);
  if (unescape(l->f[1]) != 0)
    return perr(err, l, "bad escape in a key");
  enum bs_dtype dt;
  if (bs_dtype_from_name(l->f[2], &dt) != 0)
    return perr(err, l, "unknown dtype '%.40s'", l->f[2]);
  uint32_t rank;
  uint64_t *shape;
  if (!parse_list(l->f[3], false, &rank, (void **)&shape))
    return perr(err, l, "bad shape '%.40s'", l->f[3]);
  uint64_t pid = 0, src = UINT32_MAX, off, nbytes;
  bool has_pid = strcmp(l->f[4], "-") != 0;
  int rc = -1;
  if ((has_pid && !parse_u64(l->f[4], &pid)) ||
      (strcmp(l->f[5], "-") != 0 && (!parse_u64(l->f[5], &src) || src >= idx->nsrcs)) ||
      !parse_u64(l->f[6], &off) || !parse_u64(l->f[7], &nbytes)) {
    perr(err, l, "bad param_id, source, offset or length");
    goto out;
  }
  struct bs_tensor *t = bs_catalog_add(&idx->cat, l->f[1], dt, rank, shape, l->off, err);
  if (!t)
    goto out;
  if (dt == BS_DT_QFLOAT)
    t->nbytes = nbytes;
  else if (t->nbytes != nbytes) {
    perr(err, l, "length %llu does not match the shape (%llu bytes)", (unsigned long long)nbytes,
         (unsigned long long)t->nbytes);
    goto out;
  }
  t->src = (uint32_t)src;
  t->off = off;
  size_t i = 8;
  bool strided = i < l->n && strcmp(l->f[i], "strided") == 0;
  if ((has_pid || strided || (i < l->n && strcmp(l->f[i], "raw") == 0)) &&
      !bs_tensor_x(&idx->cat, t)) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, l->f[1], "out of memory");
    goto out;
  }
  t->has_param_id = has_pid;
  if (has_pid)
    t->x->param_id = pid;
  if (strided) {
    uint32_t srank;
    if (i + 3 >= l->n + 0 || !parse_list(l->f[i + 1], true, &srank, (void **)&t->x->strides) ||
        srank != rank || !parse_u64(l->f[i + 2], &t->x->storage_off) ||
        !parse_u64(l->f[i + 3], &t->x->storage_bytes)) {
      perr(err, l, "bad strided view");
      goto out;
    }
    if (!t->x->strides) { /* rank 0 */
      perr(err, l, "a strided view needs a rank");
      goto out;
    }
    if (bs_tensor_check_view(t, l->off, err) != 0)
      goto out;
    i += 4;
  }
  if (i < l->n && strcmp(l->f[i], "raw") == 0 && i + 1 < l->n) {
    const char *h = l->f[i + 1];
    size_t hl = strlen(h);
    if (hl == 0 || hl % 2 || !bs_tensor_x(&idx->cat, t) || !(t->x->dtype_raw = bs_malloc(hl / 2))) {
      perr(err, l, "bad raw dtype");
      goto out;
    }
    for (size_t k = 0; k < hl / 2; k++) {
      int hi = bs_hex_digit(h[2 * k]), lo = bs_hex_digit(h[2 * k + 1]);
      if (hi < 0 || lo < 0) { /* two hex digits a byte; sscanf's %2x took "-1" and " f" */
        perr(err, l, "bad raw dtype");
        goto out;
      }
      t->x->dtype_raw[k] = (uint8_t)(hi * 16 + lo);
    }
    t->x->dtype_raw_len = hl / 2;
    i += 2;
    /* a torch quantizer (decode.h) must tile this tensor's elements (its
     * channels run over the flat index: a reshaped tensor keeps it; a
     * strided view's elements are gathered in that order) */
    const struct bs_torch_q *q = dt == BS_DT_QI8 || dt == BS_DT_QU8 || dt == BS_DT_QI32
                                     ? bs_torch_q_get(t->x->dtype_raw, t->x->dtype_raw_len)
                                     : NULL;
    uint64_t numel;
    if (q && (bs_shape_numel(rank, t->shape, &numel) != 0 || !bs_torch_q_fits(q, numel))) {
      perr(err, l, "a quantizer that does not fit the tensor's elements");
      goto out;
    }
  }
  if (i != l->n) {
    perr(err, l, "unexpected field '%.40s'", l->f[i]);
    goto out;
  }
  /* The bytes must lie inside their source. */
  if (t->src != UINT32_MAX) {
    uint64_t size = idx->srcs[t->src].size;
    uint64_t len = t->x->strides ? t->x->storage_bytes : t->nbytes;
    if (!bs_range_ok(off, len, size)) {
      perr(err, l, "bytes %llu+%llu lie outside their source (%llu bytes)", (unsigned long long)off,
           (unsigned long long)len, (unsigned long long)size);
      goto out;
    }
  } else if (t->nbytes != 0) {
    perr(err, l, "a tensor without a source must be empty");
    goto out;
  }
  rc = 0;
out:
  bs_free(shape);
  return rc;
}

/* A file of the staging directory itself: never a path out of it. */
static bool staging_name_ok(const char *name)
{
  return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static int parse_file(struct bs_stage_index *idx, struct line *l, bs_err *err)
{
  if (l->n != 5 || unescape(l->f[1]) != 0 || unescape(l->f[2]) != 0)
    return perr(err, l, "bad file record");
  if (!staging_name_ok(l->f[1]))
    return perr(err, l, "bad staging file name");
  struct bs_stage_file f = {0};
  if (bs_dtype_from_name(l->f[3], &f.dtype) != 0)
    return perr(err, l, "unknown dtype '%.40s'", l->f[3]);
  f.has_shape = strcmp(l->f[4], "-") != 0;
  if (f.has_shape && !parse_list(l->f[4], false, &f.rank, (void **)&f.shape))
    return perr(err, l, "bad shape");
  f.file = bs_strdup(l->f[1]);
  f.key = bs_strdup(l->f[2]);
  if (!f.file || !f.key ||
      bs_grow((void **)&idx->files, &(size_t){idx->nfiles}, idx->nfiles + 1, sizeof f) != 0) {
    bs_free(f.file);
    bs_free(f.key);
    bs_free(f.shape);
    return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
  }
  idx->files[idx->nfiles++] = f;
  return 0;
}

static int parse_line(struct bs_stage_index *idx, struct line *l, unsigned version, bool *ended,
                      size_t *records, bs_err *err)
{
  const char *r = l->f[0];
  if (*ended)
    return perr(err, l, "records after 'end'");
  if (strcmp(r, "staging") == 0 && l->n == 2 && version >= 2) {
    if (idx->staging || unescape(l->f[1]) != 0 || !staging_name_ok(l->f[1]))
      return perr(err, l, "bad staging record (a directory name, once)");
    if (!(idx->staging = bs_strdup(l->f[1])))
      return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
    return 0;
  }
  if (strcmp(r, "pid") == 0 && l->n == 2) {
    int64_t v;
    if (!parse_i64(l->f[1], &v))
      return perr(err, l, "bad pid");
    idx->pid = (long)v;
  } else if (strcmp(r, "target") == 0 && l->n == 2) {
    if (idx->target || unescape(l->f[1]) != 0 || l->f[1][0] != '/')
      return perr(err, l, "bad target (an absolute path, once)");
    if (!(idx->target = bs_strdup(l->f[1])))
      return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
  } else if (strcmp(r, "format") == 0 && l->n == 2) {
    idx->format = BS_FMT_NONE;
    for (int f = BS_FMT_BURNPACK; f < BS_FMT_COUNT; f++)
      if (strcmp(bs_format_name((enum bs_format)f), l->f[1]) == 0)
        idx->format = (enum bs_format)f;
    if (idx->format == BS_FMT_NONE)
      return perr(err, l, "unknown format '%.40s'", l->f[1]);
  } else if (strcmp(r, "max_shard_size") == 0 && l->n == 2) {
    if (!parse_u64(l->f[1], &idx->max_shard_size) || idx->max_shard_size == 0)
      return perr(err, l, "bad max_shard_size");
  } else if (strcmp(r, "output_as") == 0 && l->n == 2) {
    if (idx->has_output_as || bs_dtype_from_name(l->f[1], &idx->output_as) != 0 ||
        !bs_encode_ok(idx->output_as))
      return perr(err, l, "bad output_as (F32, F16 or BF16, once)");
    idx->has_output_as = true;
  } else if (strcmp(r, "mode") == 0 && l->n == 2) {
    const char *m = l->f[1];
    unsigned v = 0;
    for (; *m >= '0' && *m <= '7' && m - l->f[1] < 4; m++)
      v = v * 8 + (unsigned)(*m - '0');
    if (idx->has_mode || *m || m == l->f[1] || (v & ~0666u))
      return perr(err, l, "bad mode (octal, within 0666, once)");
    idx->has_mode = true;
    idx->mode = v;
  } else if (strcmp(r, "checkpoint") == 0 && l->n == 8) {
    int64_t ns, sec;
    if (idx->ck.path || unescape(l->f[1]) != 0 || l->f[1][0] != '/' ||
        !parse_u64(l->f[2], &idx->ck.size) || !parse_i64(l->f[3], &sec) ||
        !parse_i64(l->f[4], &ns) || !parse_u64(l->f[5], &idx->ck.dev) ||
        !parse_u64(l->f[6], &idx->ck.ino))
      return perr(err, l, "bad checkpoint record");
    idx->ck.mtime_sec = sec;
    idx->ck.mtime_nsec = (long)ns;
    idx->ck.strict = strcmp(l->f[7], "strict") == 0;
    if (!(idx->ck.path = bs_strdup(l->f[1])))
      return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
  } else if (strcmp(r, "remote") == 0 && l->n == 4) {
    if (idx->ck.path || unescape(l->f[1]) != 0 || !bs_src_is_url(l->f[1]) ||
        !parse_u64(l->f[2], &idx->ck.size))
      return perr(err, l, "bad remote record (a URL, once)");
    idx->ck.remote = true;
    idx->ck.strict = strcmp(l->f[3], "strict") == 0;
    if (!(idx->ck.path = bs_strdup(l->f[1])))
      return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
  } else if (strcmp(r, "incomplete") == 0 && l->n == 2) {
    if (idx->incomplete || unescape(l->f[1]) != 0 || !(idx->incomplete = bs_strdup(l->f[1])))
      return perr(err, l, "bad incomplete record");
  } else if (strcmp(r, "src") == 0 && (l->n == 4 || l->n == 5)) {
    uint64_t i, size;
    bool stage = strcmp(l->f[2], "stage") == 0, remote = strcmp(l->f[2], "remote") == 0;
    if (!parse_u64(l->f[1], &i) || i != idx->nsrcs || idx->nsrcs >= UINT32_MAX - 1 ||
        (stage || remote ? l->n != 5 : (l->n != 4 || strcmp(l->f[2], "checkpoint") != 0)) ||
        !parse_u64(l->f[l->n - 1], &size))
      return perr(err, l, "bad src record (numbered from 0, in order)");
    if (!stage && idx->ncksrcs != idx->nsrcs)
      return perr(err, l, "checkpoint sources come first");
    if (!stage && !idx->ck.path)
      return perr(err, l, "a checkpoint source without a checkpoint record");
    if (!stage && remote != idx->ck.remote)
      return perr(err, l, "a %s source of a %s checkpoint", remote ? "remote" : "local",
                  idx->ck.remote ? "remote" : "local");
    char *file = NULL, *validator = NULL;
    if (stage) {
      if (unescape(l->f[3]) != 0 || !staging_name_ok(l->f[3]))
        return perr(err, l, "bad staging file name");
      if (!(file = bs_strdup(l->f[3])))
        return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
    } else if (remote) {
      if (unescape(l->f[3]) != 0)
        return perr(err, l, "bad validator");
      if (!*l->f[3]) /* (--finish could not tell the file changed) */
        return perr(err, l, "a remote source without a validator (ETag or Last-Modified)");
      if (!(validator = bs_strdup(l->f[3])))
        return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
    }
    size_t cap = idx->nsrcs;
    if (bs_grow((void **)&idx->srcs, &cap, idx->nsrcs + 1, sizeof *idx->srcs) != 0) {
      bs_free(file);
      bs_free(validator);
      return bs_fail(err, ENOMEM, l->off, NULL, "out of memory");
    }
    idx->srcs[idx->nsrcs++] =
        (struct bs_stage_src){.stage = stage, .file = file, .validator = validator, .size = size};
    if (!stage)
      idx->ncksrcs++;
  } else if (strcmp(r, "meta") == 0 && l->n == 3) {
    if (unescape(l->f[1]) != 0 || unescape(l->f[2]) != 0)
      return perr(err, l, "bad escape in metadata");
    return bs_catalog_add_meta(&idx->cat, l->f[1], l->f[2], err);
  } else if (strcmp(r, "metaref") == 0 && l->n == 8) {
    struct bs_meta_ref ref = {.format = BS_FMT_GGUF};
    uint64_t src;
    const char *h = l->f[7];
    bool ok = unescape(l->f[1]) == 0 && strcmp(l->f[2], bs_format_name(BS_FMT_GGUF)) == 0 &&
              parse_u64(l->f[3], &src) && src < idx->ncksrcs && parse_u64(l->f[4], &ref.off) &&
              parse_u64(l->f[5], &ref.len) && parse_u64(l->f[6], &ref.text_len) &&
              strlen(h) == 2 * sizeof ref.types &&
              bs_range_ok(ref.off, ref.len, idx->srcs[src].size);
    for (size_t k = 0; ok && k < sizeof ref.types; k++) {
      int hi = bs_hex_digit(h[2 * k]), lo = bs_hex_digit(h[2 * k + 1]);
      ok = hi >= 0 && lo >= 0;
      ref.types[k] = (uint8_t)(hi * 16 + lo);
    }
    if (!ok)
      return perr(err, l, "bad metaref record (a GGUF value in a checkpoint source)");
    ref.src = (uint32_t)src;
    struct bs_kv kv = {l->f[1], NULL, &ref, false};
    return bs_catalog_add_meta_kv(&idx->cat, &kv, err);
  } else if (strcmp(r, "tensor") == 0) {
    (*records)++;
    return parse_tensor(idx, l, err);
  } else if (strcmp(r, "file") == 0) {
    (*records)++;
    return parse_file(idx, l, err);
  } else if (strcmp(r, "end") == 0 && l->n == 2) {
    uint64_t n;
    if (!parse_u64(l->f[1], &n) || n != *records)
      return perr(err, l, "'end' counts %.20s records, the INDEX has %zu", l->f[1], *records);
    *ended = true;
  } else {
    return perr(err, l, "unknown record '%.40s' with %zu fields", r, l->n);
  }
  return 0;
}

int bs_stage_index_parse(const void *text, size_t len, struct bs_stage_index *idx, bs_err *err)
{
  bs_stage_index_init(idx);
  if (len > BS_STAGE_INDEX_MAX)
    return perr(err, NULL, "%zu bytes is more than the limit of %u", len, BS_STAGE_INDEX_MAX);
  char *buf = bs_malloc(len + 1);
  if (!buf)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  memcpy(buf, text, len);
  buf[len] = 0;
  int rc = -1;
  bool magic = false, ended = false;
  unsigned version = 0;
  size_t records = 0;
  char *p = buf;
  while (p < buf + len) {
    char *nl = memchr(p, '\n', (size_t)(buf + len - p));
    if (!nl) {
      perr(err, &(struct line){.off = (uint64_t)(p - buf)}, "the last line has no newline (cut?)");
      goto out;
    }
    *nl = 0;
    struct line l = {.off = (uint64_t)(p - buf)};
    if (memchr(p, 0, (size_t)(nl - p))) {
      perr(err, &l, "a NUL byte");
      goto out;
    }
    if (*p != '#' && *p) {
      for (char *f = p;;) {
        if (l.n == MAX_FIELDS) {
          perr(err, &l, "too many fields");
          goto out;
        }
        l.f[l.n++] = f;
        char *tab = strchr(f, '\t');
        if (!tab)
          break;
        *tab = 0;
        f = tab + 1;
      }
      if (!magic) {
        /* 1: burnstore 0.1.0's, without a staging record; 2: with one */
        if (strcmp(l.f[0], MAGIC) != 0 || l.n != 2 ||
            (strcmp(l.f[1], "1") != 0 && strcmp(l.f[1], "2") != 0)) {
          perr(err, &l, "not a burnstore staging INDEX of version 1 or 2");
          goto out;
        }
        version = (unsigned)(l.f[1][0] - '0');
        magic = true;
      } else if (parse_line(idx, &l, version, &ended, &records, err) != 0) {
        goto out;
      }
    }
    p = nl + 1;
  }
  if (!magic || !ended) {
    perr(err, NULL, "%s", magic ? "no 'end' record (cut?)" : "empty");
    goto out;
  }
  if (!idx->target || idx->format == BS_FMT_NONE) {
    perr(err, NULL, "no target or format record");
    goto out;
  }
  if (version >= 2 && !idx->staging) {
    perr(err, NULL, "no staging record (version 2 names its staging directory)");
    goto out;
  }
  rc = 0;
out:
  bs_free(buf);
  if (rc != 0) {
    bs_stage_index_destroy(idx);
    bs_stage_index_init(idx);
  }
  return rc;
}

int bs_stage_index_load(const struct bs_stage_dir *stg, struct bs_stage_index *idx, bs_err *err)
{
  bs_stage_index_init(idx);
  bs_err sub;
  bs_err_clear(&sub);
  int fd = bs_safe_openat(stg->fd, stg->path, BS_STAGE_INDEX_NAME, O_RDONLY, 0,
                          BS_SAFE_REG | BS_SAFE_PRIVATE, NULL, &sub);
  struct bs_src s;
  if (fd < 0)
    return sub.code == ENOENT ? bs_fail(err, ENOENT, BS_OFF_NONE, NULL,
                                        "%s (no INDEX: nothing to finish)", sub.msg)
                              : bs_fail(err, sub.code, BS_OFF_NONE, NULL, "%s", sub.msg);
  char path[PATH_MAX];
  if (bs_path_join_buf(path, sizeof path, stg->path, BS_STAGE_INDEX_NAME, err) != 0) {
    close(fd);
    return -1;
  }
  if (bs_src_init_fd(&s, fd, BS_SRC_OWN_FD | BS_SRC_UNWATCHED, path, err) != 0)
    return -1; /* (fd closed) */
  if (s.size > BS_STAGE_INDEX_MAX) {
    bs_src_destroy(&s);
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "%s: %llu bytes is more than the limit of %u",
                   path, (unsigned long long)s.size, BS_STAGE_INDEX_MAX);
  }
  uint8_t *text;
  size_t len = (size_t)s.size;
  int rc = bs_src_read_alloc(&s, 0, s.size, &text, err);
  bs_src_destroy(&s);
  if (rc != 0)
    return rc;
  rc = bs_stage_index_parse(text, len, idx, err);
  bs_free(text);
  if (rc == 0 && (rc = bs_stage_index_check_dir(idx, stg, BS_STAGE_INDEX_NAME, err)) != 0) {
    bs_stage_index_destroy(idx);
    bs_stage_index_init(idx);
  }
  return rc;
}

int bs_stage_index_check_dir(const struct bs_stage_index *idx, const struct bs_stage_dir *stg,
                             const char *what, bs_err *err)
{
  if (!idx->staging) /* version 1 */
    return 0;
  /* its name now: the held directory's, as the kernel has it (a path given
   * as "." or through a link names it too); else the path's last component */
  char fdpath[64], real[PATH_MAX], name[NAME_MAX + 1] = "";
  snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", stg->fd);
  ssize_t n = stg->fd >= 0 ? readlink(fdpath, real, sizeof real - 1) : -1;
  if (n > 0 && real[0] == '/') {
    real[n] = '\0';
    if (!dir_name(real, name, sizeof name))
      name[0] = '\0';
  }
  if (!name[0] && !dir_name(stg->path, name, sizeof name))
    name[0] = '\0';
  if (strcmp(name, idx->staging) == 0)
    return 0;
  return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                 "%s/%s was written in %s, not in this staging directory (%s): copied from "
                 "another? not used (its target: %s)",
                 stg->path, what, idx->staging, name[0] ? name : "?", idx->target);
}

static int stale(bs_err *err, const char *path, const char *what)
{
  return bs_fail(err, ESTALE, BS_OFF_NONE, NULL,
                 "%s changed since the write-back started (%s): its clean tensors cannot be "
                 "trusted",
                 path, what);
}

/* The checkpoint of idx into ck, opened as the mount opened it (the one
 * open path, bs_checkpoint_open: strict as it was; a URL read without a
 * strong ETag, -o unvalidated, read so again), its key options not applied:
 * the INDEX names its tensors by their keys. */
static int reopen(const struct bs_stage_index *idx, struct bs_catalog *ck, bs_err *err)
{
  struct bs_open_spec spec;
  bs_open_spec_init(&spec);
  spec.open.strict = idx->ck.strict;
  for (size_t i = 0; idx->ck.remote && i < idx->ncksrcs; i++)
    if (idx->srcs[i].validator && strncmp(idx->srcs[i].validator, "If-Match:", 9) != 0)
      spec.http.unvalidated = true;
  char *name = NULL;
  int rc = bs_checkpoint_open(ck, idx->ck.path, &spec, &name, err);
  bs_free(name);
  bs_open_spec_destroy(&spec);
  return rc;
}

int bs_stage_index_attach(struct bs_stage_index *idx, const struct bs_stage_dir *stg, bs_err *err)
{
  if (idx->cat.nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "INDEX: sources already attached");
  struct bs_catalog ck;
  bs_catalog_init(&ck);
  if (idx->ncksrcs && idx->ck.remote) {
    /* A URL: opened again (an hf:// one at the commit it was read at); its
     * size and each source's validator (ETag) must be the mount's. */
    if (reopen(idx, &ck, err) != 0) {
      char m[sizeof err->msg];
      snprintf(m, sizeof m, "%s", err->msg);
      int code = err->code;
      bs_err_clear(err);
      bs_catalog_destroy(&ck);
      return bs_fail(err, code, BS_OFF_NONE, NULL, "%s, which holds the clean tensors: %s",
                     idx->ck.path, m);
    }
    if (ck.nsrcs != idx->ncksrcs || ck.srcs[0].size != idx->ck.size) {
      bs_catalog_destroy(&ck);
      return stale(err, idx->ck.path, "it reads differently");
    }
    for (size_t i = 0; i < ck.nsrcs; i++) {
      const char *v = NULL;
      uint32_t k;
      if (!bs_src_remote(&ck.srcs[i], NULL, &v) || ck.srcs[i].size != idx->srcs[i].size ||
          !idx->srcs[i].validator || strcmp(v, idx->srcs[i].validator) != 0) {
        char what[300];
        snprintf(what, sizeof what, "%s: %s, was %s", ck.srcs[i].name ? ck.srcs[i].name : "?",
                 v && *v ? v : "no validator",
                 idx->srcs[i].validator ? idx->srcs[i].validator : "none");
        bs_catalog_destroy(&ck);
        return stale(err, idx->ck.path, what);
      }
      if (bs_catalog_add_src(&idx->cat, &ck.srcs[i], &k, err) != 0) {
        bs_catalog_destroy(&ck);
        return -1;
      }
    }
    bs_catalog_destroy(&ck);
  } else if (idx->ncksrcs) {
    struct stat st;
    if (stat(idx->ck.path, &st) != 0) {
      int e = errno;
      return bs_fail(err, e == ENOENT ? ESTALE : e, BS_OFF_NONE, NULL,
                     "%s, which holds the clean tensors: %s", idx->ck.path, strerror(e));
    }
    if ((uint64_t)st.st_size != idx->ck.size || (uint64_t)st.st_ino != idx->ck.ino ||
        (uint64_t)st.st_dev != idx->ck.dev || (int64_t)st.st_mtim.tv_sec != idx->ck.mtime_sec ||
        st.st_mtim.tv_nsec != idx->ck.mtime_nsec)
      return stale(err, idx->ck.path, "size, mtime or inode");
    if (reopen(idx, &ck, err) != 0)
      return -1;
    /* The file opened is the one checked: its name may have been given to
     * another file since the stat (by whoever may write its directory). */
    struct bs_src_ident id;
    if (!ck.nsrcs || !bs_src_ident(&ck.srcs[0], &id) || id.size != idx->ck.size ||
        id.ino != idx->ck.ino || id.dev != idx->ck.dev || id.mtime_sec != idx->ck.mtime_sec ||
        id.mtime_nsec != idx->ck.mtime_nsec) {
      bs_catalog_destroy(&ck);
      return stale(err, idx->ck.path, "size, mtime or inode");
    }
    if (ck.nsrcs != idx->ncksrcs) {
      bs_catalog_destroy(&ck);
      return stale(err, idx->ck.path, "it reads differently");
    }
    for (size_t i = 0; i < ck.nsrcs; i++) {
      uint32_t k;
      if (ck.srcs[i].size != idx->srcs[i].size) {
        bs_catalog_destroy(&ck);
        return stale(err, idx->ck.path, "a member's size differs");
      }
      if (bs_catalog_add_src(&idx->cat, &ck.srcs[i], &k, err) != 0) {
        bs_catalog_destroy(&ck);
        return -1;
      }
    }
    bs_catalog_destroy(&ck);
  }
  /* The staged files beneath the held directory, opened per read: a write
   * of thousands of them holds no fd each. */
  for (size_t i = idx->ncksrcs; i < idx->nsrcs; i++) {
    char path[PATH_MAX];
    if (bs_path_join_buf(path, sizeof path, stg->path, idx->srcs[i].file, err) != 0)
      return -1;
    struct bs_src s;
    uint32_t k;
    bs_err sub;
    bs_err_clear(&sub);
    if (bs_src_init_at(&s, stg->fd, stg->path, idx->srcs[i].file, &sub) != 0)
      return bs_fail(err, sub.code == ENOENT ? ENOENT : sub.code, BS_OFF_NONE, NULL,
                     "staged file %s", sub.msg);
    if (s.size != idx->srcs[i].size) {
      bs_src_destroy(&s);
      return bs_fail(err, ESTALE, BS_OFF_NONE, NULL,
                     "staged file %s has %llu bytes, the INDEX says %llu", path,
                     (unsigned long long)s.size, (unsigned long long)idx->srcs[i].size);
    }
    if (bs_catalog_add_src(&idx->cat, &s, &k, err) != 0)
      return -1;
  }
  return 0;
}

void bs_stage_dir_remove(int dirfd, const char *dir, const char *target)
{
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_safe_openat(dirfd, dir, BS_STAGE_DONE_NAME, O_WRONLY | O_CREAT | O_TRUNC, 0600,
                          BS_SAFE_REG, NULL, &err);
  if (fd >= 0) {
    if (target && write(fd, target, strlen(target)) < 0) {
      /* (the mark is its name; what it says is for messages) */
    }
    close(fd);
    fsync(dirfd);
  }
  /* The journal before the INDEX: neither may outlive the other's removal
   * with a target already written (--finish would redo it from the source). */
  bs_safe_unlinkat(dirfd, BS_JOURNAL_NAME, 0);
  bs_safe_unlinkat(dirfd, BS_STAGE_INDEX_NAME, 0);
  DIR *d = bs_safe_dirstream(dirfd);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
      if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0 &&
          strcmp(de->d_name, BS_STAGE_LOCK_NAME) != 0 &&
          strcmp(de->d_name, BS_STAGE_DONE_NAME) != 0)
        bs_safe_unlinkat(dirfd, de->d_name, 0);
    closedir(d);
  }
  bs_safe_unlinkat(dirfd, BS_STAGE_DONE_NAME, 0);
  bs_safe_unlinkat(dirfd, BS_STAGE_LOCK_NAME, 0);
  /* The directory by its name in its parent, only while that name still is
   * this directory: another user who may write the parent may have renamed
   * it away and put theirs there. */
  struct stat was;
  const char *slash = strrchr(dir, '/');
  if (!slash || fstat(dirfd, &was) != 0)
    return;
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
  bs_err_clear(&err);
  int pfd = bs_safe_open_dir(parent, BS_SAFE_ANY_OWNER, &err);
  if (pfd < 0)
    return;
  bs_safe_unlink_same(pfd, slash + 1, &was, AT_REMOVEDIR);
  close(pfd);
}

bool bs_stage_done(const struct bs_stage_dir *stg, char *target, size_t n)
{
  bs_err err;
  bs_err_clear(&err);
  int fd =
      bs_safe_openat(stg->fd, stg->path, BS_STAGE_DONE_NAME, O_RDONLY, 0, BS_SAFE_REG, NULL, &err);
  if (fd < 0)
    return false;
  ssize_t r = n ? pread(fd, target, n - 1, 0) : 0;
  if (n)
    target[r > 0 ? r : 0] = '\0';
  for (ssize_t i = 0; i < r; i++) /* one line: it is shown */
    if ((unsigned char)target[i] < 0x20)
      target[i] = '?';
  close(fd);
  return true;
}
