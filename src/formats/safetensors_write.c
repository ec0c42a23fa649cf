/* The SafeTensors (.safetensors) writer (spec: shared/docs/safetensors-format.md).
 *
 * Byte layout written (what the reference `safetensors` crate writes):
 *  1. offset 0, 8 bytes: N, u64 LE, the header's length (a multiple of 8)
 *  2. offset 8, N bytes: compact JSON, padded with spaces:
 *       {"__metadata__":{"k":"v",...},                      (only with metadata; keys sorted)
 *        "<name>":{"dtype":"F32","shape":[2,3],"data_offsets":[B,E]},...}
 *     tensors in data order
 *  3. offset 8 + N: the tensors back to back, no gaps, in data order: dtype
 *     alignment descending (the crate's Dtype enum, last first), then name
 *     byte-wise. The file ends where the last tensor ends.
 * Tensor bytes are streamed from their source (the checkpoint or a staging
 * file) in chunks; the header is the one thing built in memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/safetensors_write.h"
#include "formats/write_common.h"

#define PREFIX 8u

/* The crate's Dtype enum order (increasing alignment): the data order sorts
 * by it, descending. 0: SafeTensors has no such dtype. */
static const unsigned char st_rank[BS_DT_COUNT] = {
    [BS_DT_BOOL] = 1,    [BS_DT_F4] = 2,           [BS_DT_F6_E2M3] = 3,      [BS_DT_F6_E3M2] = 4,
    [BS_DT_U8] = 5,      [BS_DT_I8] = 6,           [BS_DT_F8_E5M2] = 7,      [BS_DT_F8_E4M3] = 8,
    [BS_DT_F8_E8M0] = 9, [BS_DT_F8_E4M3FNUZ] = 10, [BS_DT_F8_E5M2FNUZ] = 11, [BS_DT_I16] = 12,
    [BS_DT_U16] = 13,    [BS_DT_F16] = 14,         [BS_DT_BF16] = 15,        [BS_DT_I32] = 16,
    [BS_DT_U32] = 17,    [BS_DT_F32] = 18,         [BS_DT_C64] = 19,         [BS_DT_F64] = 20,
    [BS_DT_I64] = 21,    [BS_DT_U64] = 22,
};

static int buf_str(struct bs_buf *b, const char *s)
{
  return bs_buf_put(b, s, strlen(s));
}

int bs_st_json_string(struct bs_buf *b, const char *s)
{
  return bs_st_json_string_n(b, s, strlen(s));
}

/* The escape serde_json writes for byte c into esc (at most 6 bytes): its
 * length, 0 when c stands for itself. */
static size_t json_escape(unsigned char c, char esc[6])
{
  static const char hex[] = "0123456789abcdef";
  switch (c) {
  case '"': esc[1] = '"'; break;
  case '\\': esc[1] = '\\'; break;
  case '\b': esc[1] = 'b'; break;
  case '\f': esc[1] = 'f'; break;
  case '\n': esc[1] = 'n'; break;
  case '\r': esc[1] = 'r'; break;
  case '\t': esc[1] = 't'; break;
  default:
    if (c >= 0x20)
      return 0;
    memcpy(esc, "\\u00", 4);
    esc[4] = hex[c >> 4];
    esc[5] = hex[c & 15];
    return 6;
  }
  esc[0] = '\\';
  return 2;
}

size_t bs_st_json_len_n(const char *s, size_t len)
{
  size_t total = 2;
  char esc[6];
  for (size_t i = 0; i < len; i++) {
    size_t n = json_escape((unsigned char)s[i], esc);
    total += n ? n : 1;
  }
  return total;
}

int bs_st_json_string_n(struct bs_buf *b, const char *s, size_t len)
{
  if (bs_buf_put(b, "\"", 1) != 0)
    return -1;
  const char *run = s;
  const unsigned char *end = (const unsigned char *)s + len;
  for (const unsigned char *p = (const unsigned char *)s; p < end; p++) {
    char esc[6];
    size_t n = json_escape(*p, esc);
    if (n == 0)
      continue;
    if (bs_buf_put(b, run, (size_t)((const char *)p - run)) != 0 || bs_buf_put(b, esc, n) != 0)
      return -1;
    run = (const char *)p + 1;
  }
  return bs_buf_put(b, run, (size_t)((const char *)end - run)) != 0 || bs_buf_put(b, "\"", 1) != 0
             ? -1
             : 0;
}

static int buf_u64(struct bs_buf *b, uint64_t v)
{
  char s[24], *p = s + sizeof s; /* (snprintf was a third of a 100,000-tensor header's time) */
  do
    *--p = (char)('0' + v % 10);
  while ((v /= 10) != 0);
  return bs_buf_put(b, p, (size_t)(s + sizeof s - p));
}

int bs_st_name_ok(const char *name, bs_err *err)
{
  if (strcmp(name, "__metadata__") == 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, name,
                   "__metadata__ is the name SafeTensors reserves for the file's metadata; "
                   "rename the tensor (-o remap=)");
  return bs_writer_name_text(name, BS_MAX_KEY_LEN, true,
                             "SafeTensors names are JSON strings (UTF-8)", err);
}

int bs_st_can_write(const struct bs_tensor *t, bs_err *err)
{
  if (bs_st_name_ok(t->name, err) != 0)
    return -1;
  if (t->x->unsupported)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name, "its data cannot be read: %s",
                   t->x->unsupported);
  if (t->dtype < BS_DT_COUNT && st_rank[t->dtype])
    return 0;
  const char *hint = bs_writer_alias_hint(t->dtype);
  switch (t->dtype) {
  case BS_DT_QFLOAT: hint = " (Burn's quantized tensors exist only in Burnpack)"; break;
  case BS_DT_QI8:
  case BS_DT_QU8:
  case BS_DT_QI32:
    hint =
        " (torch's quantized tensors have no SafeTensors form; convert --as F32 dequantizes them)";
    break;
  default: break;
  }
  return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                 "SafeTensors has no dtype for %s (it stores BOOL, U8-U64, I8-I64, F16, BF16, F32, "
                 "F64, C64, F4, F6 and F8 types)%s",
                 bs_dtype_name(t->dtype), hint);
}

int bs_st_default_meta(struct bs_catalog *cat, bs_err *err)
{
  (void)err;
  for (size_t i = 0; i < cat->nmeta; i++)
    if (strcmp(cat->meta[i].key, "format") == 0 && cat->meta[i].value &&
        strcmp(cat->meta[i].value, "burnpack") == 0) {
      char *v = bs_strdup("pt");
      if (!v || bs_kv_set_value(&cat->meta[i], v) != 0) /* (an entry of the edit's: copied) */
        return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    }
  return 0;
}

/* ---- Plan --------------------------------------------------------------------------------- */

struct plan {
  size_t n;
  size_t *order; /* catalog indices in data order */
  size_t *meta;  /* cat->meta indices sorted by key */
  uint64_t data; /* bytes of data */
  uint64_t biggest;
  struct bs_buf hdr; /* the padded header */
};

static void plan_destroy(struct plan *p)
{
  bs_free(p->order);
  bs_free(p->meta);
  bs_buf_destroy(&p->hdr);
}

static int cmp_name(const void *a, const void *b, void *c)
{
  const struct bs_catalog *cat = c;
  return strcmp(cat->tensors[*(const size_t *)a].name, cat->tensors[*(const size_t *)b].name);
}

static int cmp_meta(const void *a, const void *b, void *c)
{
  const struct bs_catalog *cat = c;
  return strcmp(cat->meta[*(const size_t *)a].key, cat->meta[*(const size_t *)b].key);
}

static int check_tensor(const struct bs_tensor *t, bs_err *err)
{
  if (bs_st_can_write(t, err) != 0)
    return -1;
  uint64_t want;
  if (bs_dtype_nbytes(t->dtype, t->rank, t->shape, &want, t->name, BS_OFF_NONE, err) != 0)
    return -1;
  if (want != t->nbytes)
    return bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
                   "holds %" PRIu64 " bytes but its shape and %s need %" PRIu64, t->nbytes,
                   bs_dtype_name(t->dtype), want);
  return 0;
}

static int encode_header(const struct bs_catalog *cat, struct plan *p, bs_err *err)
{
  struct bs_buf *b = &p->hdr;
  int bad = buf_str(b, "{");
  bool first = true;
  if (cat->nmeta) {
    bad |= buf_str(b, "\"__metadata__\":{");
    for (size_t i = 0; i < cat->nmeta; i++) {
      const struct bs_kv *kv = &cat->meta[p->meta[i]];
      bad |= (i ? buf_str(b, ",") : 0) | bs_st_json_string(b, kv->key) | buf_str(b, ":") |
             bs_st_json_string(b, kv->value);
    }
    bad |= buf_str(b, "}");
    first = false;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < p->n && !bad; i++) {
    const struct bs_tensor *t = &cat->tensors[p->order[i]];
    bad |= (first ? 0 : buf_str(b, ",")) | bs_st_json_string(b, t->name) |
           buf_str(b, ":{\"dtype\":\"") | buf_str(b, bs_dtype_name(t->dtype)) |
           buf_str(b, "\",\"shape\":[");
    first = false;
    for (uint32_t d = 0; d < t->rank; d++)
      bad |= (d ? buf_str(b, ",") : 0) | buf_u64(b, t->shape[d]);
    bad |= buf_str(b, "],\"data_offsets\":[") | buf_u64(b, off) | buf_str(b, ",") |
           buf_u64(b, off + t->nbytes) | buf_str(b, "]}");
    off += t->nbytes; /* cannot overflow: make_plan summed them checked */
  }
  bad |= buf_str(b, "}");
  while (!bad && b->len % 8)
    bad |= buf_str(b, " ");
  if (bad)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory encoding the header");
  if (b->len > BS_ST_MAX_HEADER)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "a header of %zu bytes exceeds the %u bytes SafeTensors readers accept (too "
                   "many tensors or too much metadata for one file: shard it, -o max_shard_size=)",
                   b->len, BS_ST_MAX_HEADER);
  return 0;
}

static int make_plan(const struct bs_catalog *cat, const size_t *which, size_t n, struct plan *p,
                     bs_err *err)
{
  memset(p, 0, sizeof *p);
  if (!which) {
    n = 0;
    for (size_t i = 0; i < cat->count; i++)
      n += !cat->tensors[i].hidden;
  }
  size_t *byname = NULL;
  p->n = n;
  p->order = bs_malloc((n ? n : 1) * sizeof *p->order);
  p->meta = bs_malloc((cat->nmeta ? cat->nmeta : 1) * sizeof *p->meta);
  byname = bs_malloc((n ? n : 1) * sizeof *byname);
  if (!p->order || !p->meta || !byname) {
    bs_free(byname);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  int rc = -1;
  for (size_t i = 0, j = 0; i < (which ? n : cat->count); i++) {
    size_t ix = which ? which[i] : i;
    if (ix >= cat->count) {
      bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
              "write entry %zu is tensor %zu, but the catalog has %zu", i, ix, cat->count);
      goto out;
    }
    if (!which && cat->tensors[ix].hidden)
      continue;
    p->order[j++] = ix;
  }
  for (size_t i = 0; i < n; i++) {
    const struct bs_tensor *t = &cat->tensors[p->order[i]];
    if (check_tensor(t, err) != 0)
      goto out;
    if (!bs_add_u64(p->data, t->nbytes, &p->data)) {
      bs_fail(err, EFBIG, BS_OFF_NONE, t->name, "data offsets overflow 64 bits");
      goto out;
    }
    if (t->nbytes > p->biggest)
      p->biggest = t->nbytes;
  }
  memcpy(byname, p->order, n * sizeof *byname);
  qsort_r(byname, n, sizeof *byname, cmp_name, (void *)cat);
  for (size_t i = 1; i < n; i++)
    if (strcmp(cat->tensors[byname[i - 1]].name, cat->tensors[byname[i]].name) == 0) {
      bs_fail(err, EINVAL, BS_OFF_NONE, cat->tensors[byname[i]].name,
              "two tensors to write have this name; SafeTensors names must be unique");
      goto out;
    }
  /* The data order (rank descending, then name): the names' order, taken
   * rank by rank (the names are unique: one sort, not two). */
  size_t at[sizeof st_rank + 1] = {0};
  for (size_t i = 0; i < n; i++)
    at[st_rank[cat->tensors[byname[i]].dtype]]++;
  for (size_t r = sizeof st_rank, sum = 0; r-- > 0;) { /* the first place of each rank */
    size_t c = at[r];
    at[r] = sum;
    sum += c;
  }
  for (size_t i = 0; i < n; i++)
    p->order[at[st_rank[cat->tensors[byname[i]].dtype]]++] = byname[i];
  for (size_t i = 0; i < cat->nmeta; i++)
    p->meta[i] = i;
  qsort_r(p->meta, cat->nmeta, sizeof *p->meta, cmp_meta, (void *)cat);
  for (size_t i = 1; i < cat->nmeta; i++)
    if (strcmp(cat->meta[p->meta[i - 1]].key, cat->meta[p->meta[i]].key) == 0) {
      bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "metadata key '%.100s' appears twice",
              cat->meta[p->meta[i]].key);
      goto out;
    }
  if (encode_header(cat, p, err) != 0)
    goto out;
  rc = 0;
out:
  bs_free(byname);
  return rc;
}

int bs_st_size(const struct bs_catalog *cat, const size_t *which, size_t n, uint64_t *size,
               bs_err *err)
{
  struct plan p;
  int rc = make_plan(cat, which, n, &p, err);
  if (rc == 0 && !bs_add_u64(PREFIX + (uint64_t)p.hdr.len, p.data, size))
    rc = bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "file size overflows 64 bits");
  plan_destroy(&p);
  return rc;
}

int bs_st_layout(const struct bs_catalog *cat, const size_t *which, size_t n, struct bs_layout *l,
                 bs_err *err)
{
  struct plan p;
  int rc = -1;
  if (make_plan(cat, which, n, &p, err) == 0) {
    uint8_t h[PREFIX];
    bs_put_le64(h, p.hdr.len);
    bs_layout_bytes(l, h, PREFIX);
    bs_layout_take(l, &p.hdr);
    for (size_t i = 0; i < p.n; i++)
      bs_layout_tensor(l, cat, p.order[i]);
    rc = bs_layout_done(l, err);
  }
  plan_destroy(&p);
  return rc;
}

int bs_st_write_some(const struct bs_catalog *cat, const size_t *which, size_t n, struct bs_sink *k,
                     bs_err *err)
{
  struct bs_layout l;
  bs_layout_init(&l);
  int rc = bs_st_layout(cat, which, n, &l, err) == 0 ? bs_layout_emit(&l, cat, k, err) : -1;
  bs_layout_destroy(&l);
  return rc;
}

int bs_st_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err)
{
  return bs_st_write_some(cat, NULL, 0, k, err);
}

/* The same file as an fd source's (device and inode)? */
static bool same_file(const struct bs_src *s, const struct stat *st)
{
  struct bs_src_ident id;
  return bs_src_ident(s, &id) && id.dev == (uint64_t)st->st_dev && id.ino == (uint64_t)st->st_ino;
}

int bs_st_file_unchanged(const struct bs_catalog *cat, const size_t *which, size_t n,
                         const char *path, bool *same, bs_err *err)
{
  struct plan p;
  *same = false;
  if (make_plan(cat, which, n, &p, err) != 0) {
    plan_destroy(&p);
    return -1;
  }
  /* (Another user may have put a FIFO or a link at a new shard's name: one
   * never blocks this open, the other is never followed; neither is kept,
   * nor a file of theirs, which they could change once the index names it.) */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
  struct stat st;
  uint8_t *old = NULL;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (st.st_uid != geteuid() && st.st_uid != 0))
    goto out;
  uint64_t size = PREFIX + (uint64_t)p.hdr.len + p.data;
  if ((uint64_t)st.st_size != size || !(old = bs_malloc(PREFIX + p.hdr.len)))
    goto out;
  if (pread(fd, old, PREFIX + p.hdr.len, 0) != (ssize_t)(PREFIX + p.hdr.len) ||
      bs_le64(old) != p.hdr.len || memcmp(old + PREFIX, p.hdr.data, p.hdr.len) != 0)
    goto out;
  uint64_t off = PREFIX + (uint64_t)p.hdr.len;
  for (size_t i = 0; i < p.n; i++) {
    const struct bs_tensor *t = &cat->tensors[p.order[i]];
    if (t->nbytes && (t->x->strides || t->src >= cat->nsrcs || t->off != off ||
                      !same_file(&cat->srcs[t->src], &st)))
      goto out;
    off += t->nbytes;
  }
  *same = true;
out:
  bs_free(old);
  if (fd >= 0)
    close(fd);
  plan_destroy(&p);
  return 0;
}
