/* The GGUF writer (the ".gguf" row of the writers table).
 *
 * What it writes (the layout ggml's gguf_write_to_file writes):
 *   "GGUF", u32 version (the source's if 2 or 3, else 3), u64 tensor count, u64 kv count,
 *   the key/values in catalog order, the tensor infos, zero padding to the
 *   alignment, then each tensor's bytes followed by zero padding to the
 *   alignment; tensor offsets are those running positions.
 *
 * Metadata types: when the catalog's first source is a GGUF file (a mount of
 * a .gguf written back, or extracted to a new .gguf), its header is parsed
 * again; a key it has keeps its GGUF type: an unchanged value (the text is
 * the one the reader rendered) is copied byte for byte (from a version 1
 * file with its lengths widened to u64), a changed one is
 * parsed as that type (a bad value fails the write with EINVAL naming the
 * key). Other keys are written as strings, except general.alignment (uint32).
 * Tensors keep the source's order (those it has, by name), new ones follow in
 * catalog order. Tensor bytes are streamed in chunks, never held whole. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/layout.h"
#include "core/utf8.h"
#include "formats/write_common.h"
#include "gguf_private.h"

#define CHUNK BS_SINK_CHUNK
/* A plan copies the source's values of at most COPY_SMALL bytes, up to
 * COPY_BUDGET bytes in all; longer ones (and the rest) are segments. */
#define COPY_SMALL 4096u
#define COPY_BUDGET (16u << 20)

int bs_gguf_name_ok(const char *name, bs_err *err)
{
  return bs_writer_name_text(name, BS_GGUF_MAX_NAME, false,
                             "GGUF tensor names are UTF-8 strings of at most 63 bytes (ggml's "
                             "GGML_MAX_NAME less its NUL; rename it, -o remap=)",
                             err);
}

int bs_gguf_can_write(const struct bs_tensor *t, bs_err *err)
{
  uint32_t gt;
  if (bs_gguf_name_ok(t->name, err) != 0)
    return -1;
  if (t->x->unsupported)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name, "its data cannot be read: %s",
                   t->x->unsupported);
  if (!bs_gguf_type_of(t->dtype, &gt))
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                   "GGUF has no type for %s (ggml stores F32, F16, BF16, F64, I8-I64 and its "
                   "quantized block types)",
                   bs_dtype_name(t->dtype));
  if (t->rank > BS_GGUF_MAX_DIMS)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                   "rank %" PRIu32 " exceeds the %u dimensions ggml tensors have", t->rank,
                   BS_GGUF_MAX_DIMS);
  return 0;
}

/* ---- Buffers ------------------------------------------------------------------------------ */

static int bput_u32(struct bs_buf *b, uint32_t v)
{
  uint8_t x[4];
  bs_put_le32(x, v);
  return bs_buf_put(b, x, 4);
}

static int bput_u64(struct bs_buf *b, uint64_t v)
{
  uint8_t x[8];
  bs_put_le64(x, v);
  return bs_buf_put(b, x, 8);
}

static int bput_str(struct bs_buf *b, const char *s, size_t n)
{
  return bput_u64(b, n) || bs_buf_put(b, s, n) ? -1 : 0;
}

/* ---- Parsing metadata text as a GGUF value --------------------------------------------------- */

struct parse {
  const char *s;
  size_t i, n;
  const char *key;
  bs_err *err;
};

static void ws(struct parse *p)
{
  while (p->i < p->n &&
         (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
    p->i++;
}

static int bad(struct parse *p, const char *what)
{
  return bs_fail(p->err, EINVAL, BS_OFF_NONE, NULL,
                 "metadata '%.100s': %s at character %zu of the new value", p->key, what, p->i);
}

/* A number token (up to , ] or whitespace) into tok. */
static int token(struct parse *p, char *tok, size_t cap)
{
  size_t st = p->i;
  while (p->i < p->n && p->s[p->i] != ',' && p->s[p->i] != ']' && p->s[p->i] != ' ' &&
         p->s[p->i] != '\t' && p->s[p->i] != '\n' && p->s[p->i] != '\r')
    p->i++;
  size_t len = p->i - st;
  if (len == 0 || len >= cap)
    return bad(p, "expected a value");
  memcpy(tok, p->s + st, len);
  tok[len] = '\0';
  return 0;
}

static int scalar(struct parse *p, uint8_t t, struct bs_buf *b)
{
  char tok[64], *end;
  if (token(p, tok, sizeof tok) != 0)
    return -1;
  uint8_t x[8];
  errno = 0;
  switch (t) {
  case BS_GG_BOOL:
    if (strcmp(tok, "true") == 0 || strcmp(tok, "1") == 0)
      x[0] = 1;
    else if (strcmp(tok, "false") == 0 || strcmp(tok, "0") == 0)
      x[0] = 0;
    else
      return bad(p, "expected true or false");
    return bs_buf_put(b, x, 1);
  case BS_GG_F32:
  case BS_GG_F64: {
    double d;
    if (strcmp(tok, "NaN") == 0)
      d = NAN;
    else if (strcmp(tok, "Infinity") == 0)
      d = INFINITY;
    else if (strcmp(tok, "-Infinity") == 0)
      d = -INFINITY;
    else {
      d = strtod(tok, &end);
      if (*end || end == tok || tok[0] == 'n' || tok[0] == 'i' || isnan(d) ||
          (isinf(d) && errno == ERANGE))
        return bad(p, "expected a number");
    }
    if (t == BS_GG_F64) {
      uint64_t u;
      memcpy(&u, &d, 8);
      bs_put_le64(x, u);
      return bs_buf_put(b, x, 8);
    }
    if (isfinite(d) && fabs(d) > 3.4028235677973366e38)
      return bad(p, "the number does not fit a float32");
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, 4);
    bs_put_le32(x, u);
    return bs_buf_put(b, x, 4);
  }
  default: break;
  }
  static const struct {
    unsigned size;
    bool sign;
    uint64_t max;
    int64_t min;
  } it[] = {
      [BS_GG_U8] = {1, false, UINT8_MAX, 0},   [BS_GG_I8] = {1, true, INT8_MAX, INT8_MIN},
      [BS_GG_U16] = {2, false, UINT16_MAX, 0}, [BS_GG_I16] = {2, true, INT16_MAX, INT16_MIN},
      [BS_GG_U32] = {4, false, UINT32_MAX, 0}, [BS_GG_I32] = {4, true, INT32_MAX, INT32_MIN},
      [BS_GG_U64] = {8, false, UINT64_MAX, 0}, [BS_GG_I64] = {8, true, INT64_MAX, INT64_MIN},
  };
  if (t >= sizeof it / sizeof it[0] || it[t].size == 0)
    return bad(p, "an element type nothing tells");
  uint64_t u;
  if (!((tok[0] >= '0' && tok[0] <= '9') || (it[t].sign && tok[0] == '-')))
    return bad(p, "expected an integer");
  if (it[t].sign) {
    long long v = strtoll(tok, &end, 10);
    if (*end || errno == ERANGE || v < it[t].min || (v > 0 && (uint64_t)v > it[t].max))
      return bad(p, "expected an integer in the type's range");
    u = (uint64_t)v;
  } else {
    unsigned long long v = strtoull(tok, &end, 10);
    if (*end || errno == ERANGE || v > it[t].max)
      return bad(p, "expected an integer in the type's range");
    u = v;
  }
  for (unsigned k = 0; k < it[t].size; k++)
    x[k] = (uint8_t)(u >> (8 * k));
  return bs_buf_put(b, x, it[t].size);
}

/* A JSON string as a GGUF string (u64 length + UTF-8 bytes). */
static int jstring(struct parse *p, struct bs_buf *b)
{
  if (p->i >= p->n || p->s[p->i] != '"')
    return bad(p, "expected a JSON string");
  p->i++;
  struct bs_buf s = {0};
  int rc = -1;
  for (;;) {
    if (p->i >= p->n) {
      bad(p, "unterminated string");
      goto out;
    }
    unsigned char ch = (unsigned char)p->s[p->i++];
    if (ch == '"')
      break;
    if (ch != '\\') {
      if (bs_buf_put(&s, &ch, 1) != 0)
        goto oom;
      continue;
    }
    if (p->i >= p->n) {
      bad(p, "unterminated escape");
      goto out;
    }
    char e = p->s[p->i++];
    const char *map = strchr("\"\"\\\\//b\bf\fn\nr\rt\t", e);
    if (e != 'u') {
      if (!map || ((map - "\"\"\\\\//b\bf\fn\nr\rt\t") % 2) != 0) {
        bad(p, "bad escape");
        goto out;
      }
      if (bs_buf_put(&s, map + 1, 1) != 0)
        goto oom;
      continue;
    }
    uint32_t cp, lo;
    if (p->i + 4 > p->n || bs_hex4(p->s + p->i, &cp) != 0) {
      bad(p, "bad \\u escape");
      goto out;
    }
    p->i += 4;
    if (cp >= 0xd800 && cp < 0xdc00) {
      if (p->i + 6 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
          bs_hex4(p->s + p->i + 2, &lo) != 0 || lo < 0xdc00 || lo >= 0xe000) {
        bad(p, "a lone surrogate");
        goto out;
      }
      p->i += 6;
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    uint8_t u[4];
    size_t k;
    if (cp < 0x80)
      u[0] = (uint8_t)cp, k = 1;
    else if (cp < 0x800)
      u[0] = (uint8_t)(0xc0 | cp >> 6), u[1] = (uint8_t)(0x80 | (cp & 63)), k = 2;
    else if (cp < 0x10000)
      u[0] = (uint8_t)(0xe0 | cp >> 12), u[1] = (uint8_t)(0x80 | ((cp >> 6) & 63)),
      u[2] = (uint8_t)(0x80 | (cp & 63)), k = 3;
    else
      u[0] = (uint8_t)(0xf0 | cp >> 18), u[1] = (uint8_t)(0x80 | ((cp >> 12) & 63)),
      u[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)), u[3] = (uint8_t)(0x80 | (cp & 63)), k = 4;
    if (bs_buf_put(&s, u, k) != 0)
      goto oom;
  }
  size_t at;
  if (!bs_utf8_valid(s.data, s.len, &at)) {
    bad(p, "a string that is not UTF-8");
    goto out;
  }
  rc = bput_str(b, s.data ? (const char *)s.data : "", s.len) ? -1 : 0;
  if (rc == 0)
    goto out;
oom:
  rc = bs_fail(p->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
out:
  bs_buf_destroy(&s);
  return rc;
}

/* An array of types[0] elements (types[1]... for nested arrays). */
static int array(struct parse *p, const uint8_t *types, unsigned depth, struct bs_buf *b)
{
  uint8_t et = types[0];
  ws(p);
  if (p->i >= p->n || p->s[p->i] != '[')
    return bad(p, "expected a JSON array '['");
  p->i++;
  if (bput_u32(b, et == BS_GG_UNKNOWN ? BS_GG_U8 : et) != 0)
    return bs_fail(p->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  size_t count_at = b->len;
  if (bput_u64(b, 0) != 0)
    return bs_fail(p->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  uint64_t count = 0;
  ws(p);
  if (p->i < p->n && p->s[p->i] == ']') {
    p->i++;
  } else {
    if (et == BS_GG_UNKNOWN)
      return bad(p, "the old value does not tell this array's element type");
    for (;;) {
      ws(p);
      int rc = et == BS_GG_ARRAY
                   ? (depth + 1 >= BS_GGUF_MAX_DEPTH ? bad(p, "arrays nested too deep")
                                                     : array(p, types + 1, depth + 1, b))
               : et == BS_GG_STRING ? jstring(p, b)
                                    : scalar(p, et, b);
      if (rc != 0)
        return -1;
      count++;
      ws(p);
      if (p->i < p->n && p->s[p->i] == ',') {
        p->i++;
        continue;
      }
      if (p->i < p->n && p->s[p->i] == ']') {
        p->i++;
        break;
      }
      return bad(p, "expected ',' or ']'");
    }
  }
  bs_put_le64(b->data + count_at, count);
  return 0;
}

int bs_gguf_encode_value(const char *key, const char *text, const uint8_t *types, struct bs_buf *b,
                         bs_err *err)
{
  struct parse p = {text, 0, strlen(text), key, err};
  uint8_t t = types[0];
  if (t == BS_GG_STRING) {
    size_t at;
    if (!bs_utf8_valid(text, p.n, &at))
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "metadata '%.100s': the value is not UTF-8 (byte %zu): GGUF strings are "
                     "UTF-8",
                     key, at);
    return bput_str(b, text, p.n) ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory") : 0;
  }
  if (t == BS_GG_ARRAY) {
    if (array(&p, types + 1, 0, b) != 0)
      return -1;
  } else {
    ws(&p);
    if (scalar(&p, t, b) != 0)
      return -1;
  }
  ws(&p);
  if (p.i != p.n)
    return bad(&p, "unexpected text after the value");
  return 0;
}

/* ---- The file ---------------------------------------------------------------------------------
 */

struct ctx {
  const struct bs_catalog *cat;
  struct bs_gguf orig; /* the source's header, if the first source is GGUF */
  bool has_orig;
  size_t *kv_sorted; /* orig.kv indices sorted by key, for lookups */
  size_t *order;     /* tensor indices, output order */
  size_t n;          /* tensors to write */
  uint64_t align;
  uint64_t *offs;    /* per output position, relative to the data section */
  uint64_t data_end; /* relative */
};

static void ctx_destroy(struct ctx *x)
{
  if (x->has_orig)
    bs_gguf_free(&x->orig);
  bs_free(x->order);
  bs_free(x->offs);
  bs_free(x->kv_sorted);
}

static int cmp_kv(const void *a, const void *b, void *c)
{
  const struct bs_gguf *g = c;
  return strcmp(g->kv[*(const size_t *)a].key, g->kv[*(const size_t *)b].key);
}

/* The source's key/value `key`, or NULL: a binary search (a file may hold a
 * million keys). */
static const struct bs_gguf_kv *orig_kv(const struct ctx *x, const char *key)
{
  size_t lo = 0, hi = x->has_orig ? x->orig.nkv : 0;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const struct bs_gguf_kv *kv = &x->orig.kv[x->kv_sorted[mid]];
    int c = strcmp(kv->key, key);
    if (c == 0)
      return kv;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

struct rank_ent {
  const char *name;
  size_t pos;
};

static int cmp_rank(const void *a, const void *b)
{
  return strcmp(((const struct rank_ent *)a)->name, ((const struct rank_ent *)b)->name);
}

static int cmp_order(const void *a, const void *b, void *c)
{
  const size_t *sort_key = c;
  size_t x = sort_key[*(const size_t *)a], y = sort_key[*(const size_t *)b];
  if (x != y)
    return x < y ? -1 : 1;
  return *(const size_t *)a < *(const size_t *)b ? -1 : *(const size_t *)a > *(const size_t *)b;
}

static int cmp_meta(const void *a, const void *b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key GGUF can hold (the reader refuses others): 1 to 65535 bytes. */
static int key_ok(const char *key, bs_err *err)
{
  size_t n = strlen(key);
  if (n == 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "a metadata key is empty (user.burnstore.meta. with nothing after it): GGUF "
                   "keys are 1 to %u bytes",
                   BS_GGUF_MAX_KEY);
  if (n > BS_GGUF_MAX_KEY)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "metadata key '%.100s...' is %zu bytes long: GGUF keys are 1 to %u bytes", key,
                   n, BS_GGUF_MAX_KEY);
  return 0;
}

/* GGUF readers refuse a key that appears twice, or an empty one. */
static int unique_meta(const struct bs_catalog *cat, bs_err *err)
{
  for (size_t i = 0; i < cat->nmeta; i++)
    if (key_ok(cat->meta[i].key, err) != 0)
      return -1;
  const char **v = bs_malloc((cat->nmeta ? cat->nmeta : 1) * sizeof *v);
  if (!v)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < cat->nmeta; i++)
    v[i] = cat->meta[i].key;
  qsort(v, cat->nmeta, sizeof *v, cmp_meta);
  int rc = 0;
  for (size_t i = 1; i < cat->nmeta && !rc; i++)
    if (strcmp(v[i - 1], v[i]) == 0)
      rc = bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "metadata key '%.100s' appears twice", v[i]);
  bs_free(v);
  return rc;
}

/* general.alignment's text as a uint32 (as bs_gguf_encode_value parses
 * it: the setxattr check and the writer agree), a power of two in range. */
static int alignment_of(const char *text, uint64_t *align, bs_err *err)
{
  static const uint8_t u32_t[2] = {BS_GG_U32, 0};
  struct bs_buf b = {0};
  if (bs_gguf_encode_value("general.alignment", text, u32_t, &b, err) != 0) {
    bs_buf_destroy(&b);
    return -1;
  }
  uint64_t a = b.len == 4 ? bs_le32(b.data) : 0;
  bs_buf_destroy(&b);
  if (a == 0 || (a & (a - 1)) != 0 || a > BS_GGUF_MAX_ALIGN)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "metadata general.alignment %" PRIu64 " is not a power of two from 1 to %u", a,
                   BS_GGUF_MAX_ALIGN);
  *align = a;
  return 0;
}

static int plan(struct ctx *x, bs_err *err)
{
  const struct bs_catalog *cat = x->cat;
  if (cat->nsrcs > 0 && cat->srcs[0].size >= 4) {
    uint8_t m[4];
    if (bs_src_read(&cat->srcs[0], 0, m, 4, err) != 0)
      return -1;
    if (memcmp(m, BS_GGUF_MAGIC, 4) == 0) {
      /* the keys' types only: a value the catalog still has in place is
       * copied, a changed one parsed as its type; no text is made */
      if (bs_gguf_parse_types(&cat->srcs[0], &x->orig, err) != 0)
        return -1;
      x->has_orig = true;
      x->kv_sorted = bs_malloc((x->orig.nkv ? x->orig.nkv : 1) * sizeof *x->kv_sorted);
      if (!x->kv_sorted)
        return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      for (size_t i = 0; i < x->orig.nkv; i++)
        x->kv_sorted[i] = i;
      qsort_r(x->kv_sorted, x->orig.nkv, sizeof *x->kv_sorted, cmp_kv, &x->orig);
    }
  }
  /* The alignment: general.alignment as the catalog has it. */
  x->align = BS_GGUF_DEFAULT_ALIGN;
  for (size_t i = 0; i < cat->nmeta; i++) {
    if (strcmp(cat->meta[i].key, "general.alignment") != 0)
      continue;
    struct bs_buf t = {0};
    bool cut;
    int rc = bs_meta_text(cat, &cat->meta[i], 64, &t, &cut, err) != 0 || bs_buf_put(&t, "", 1)
                 ? -1
                 : alignment_of((const char *)t.data, &x->align, err);
    bs_buf_destroy(&t);
    if (rc != 0)
      return -1;
  }
  if (unique_meta(cat, err) != 0)
    return -1;
  size_t n = 0;
  for (size_t i = 0; i < cat->count; i++)
    n += !cat->tensors[i].hidden;
  x->n = n;
  x->order = bs_malloc((n ? n : 1) * sizeof *x->order);
  x->offs = bs_malloc((n ? n : 1) * sizeof *x->offs);
  size_t *key = bs_malloc((cat->count ? cat->count : 1) * sizeof *key);
  size_t no = x->has_orig ? x->orig.nti : 0;
  struct rank_ent *r = bs_malloc((no ? no : 1) * sizeof *r);
  int rc = -1;
  if (!x->order || !x->offs || !key || !r) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < no; i++)
    r[i] = (struct rank_ent){x->orig.ti[i].name, i};
  qsort(r, no, sizeof *r, cmp_rank);
  for (size_t i = 0, j = 0; i < cat->count; i++) {
    if (cat->tensors[i].hidden)
      continue;
    struct rank_ent k = {cat->tensors[i].name, 0};
    struct rank_ent *hit = no ? bsearch(&k, r, no, sizeof *r, cmp_rank) : NULL;
    key[i] = hit ? hit->pos : SIZE_MAX; /* new tensors after, in catalog order */
    x->order[j++] = i;
  }
  qsort_r(x->order, n, sizeof *x->order, cmp_order, key);
  uint64_t off = 0;
  for (size_t j = 0; j < n; j++) {
    const struct bs_tensor *t = &cat->tensors[x->order[j]];
    uint64_t want;
    if (bs_gguf_can_write(t, err) != 0 ||
        bs_dtype_nbytes(t->dtype, t->rank, t->shape, &want, t->name, BS_OFF_NONE, err) != 0)
      goto out;
    if (want != t->nbytes) {
      bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
              "holds %" PRIu64 " bytes but its shape and %s need %" PRIu64, t->nbytes,
              bs_dtype_name(t->dtype), want);
      goto out;
    }
    x->offs[j] = off;
    if (!bs_add_u64(off, t->nbytes, &off) || !bs_align_up(off, x->align, &off)) {
      bs_fail(err, EFBIG, BS_OFF_NONE, t->name, "data offsets overflow 64 bits");
      goto out;
    }
  }
  x->data_end = off;
  rc = 0;
out:
  bs_free(key);
  bs_free(r);
  return rc;
}

/* The header built so far into the plan. */
static void flush(struct bs_layout *l, struct bs_buf *h)
{
  bs_layout_bytes(l, h->data, h->len);
  h->len = 0;
}

int bs_gguf_layout(const struct bs_catalog *cat, struct bs_layout *l, bs_err *err)
{
  struct ctx x;
  memset(&x, 0, sizeof x);
  x.cat = cat;
  struct bs_buf h = {0};
  int rc = -1;
  if (plan(&x, err) != 0)
    goto out;
  /* Header and key/values; an unchanged value is a segment of its source,
   * after the part of the header built so far. */
  uint32_t version = x.has_orig && x.orig.version >= 2 ? x.orig.version : 3;
  uint32_t v1_src = UINT32_MAX; /* the last source asked (bs_gguf_src_v1), and its answer */
  bool v1 = false;
  uint64_t copied = 0;
  if (bs_buf_put(&h, BS_GGUF_MAGIC, 4) || bput_u32(&h, version) || bput_u64(&h, x.n) ||
      bput_u64(&h, cat->nmeta))
    goto oom;
  for (size_t i = 0; i < cat->nmeta; i++) {
    const struct bs_kv *kv = &cat->meta[i];
    const struct bs_meta_ref *r = kv->ref;
    if (r && (r->format != BS_FMT_GGUF || r->src >= cat->nsrcs)) {
      bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "metadata '%.100s': not a GGUF value of a source",
              kv->key);
      goto out;
    }
    const struct bs_gguf_kv *o = r ? NULL : orig_kv(&x, kv->key);
    static const uint8_t str_t[2] = {BS_GG_STRING, 0}, u32_t[2] = {BS_GG_U32, 0};
    const uint8_t *types = r                                           ? r->types
                           : o                                         ? o->types
                           : strcmp(kv->key, "general.alignment") == 0 ? u32_t
                                                                       : str_t;
    if (bput_str(&h, kv->key, strlen(kv->key)) || bput_u32(&h, types[0]))
      goto oom;
    if (r && r->src != v1_src) {
      if (bs_gguf_src_v1(&cat->srcs[r->src], &v1, err) != 0)
        goto out;
      v1_src = r->src;
    }
    if (r && v1) { /* a version 1 file's value: its lengths widened */
      if (bs_gguf_widen(&cat->srcs[r->src], r, &h, err) != 0)
        goto out;
      if (h.len >= CHUNK)
        flush(l, &h);
      continue;
    }
    if (r && r->len <= COPY_SMALL && copied + r->len <= COPY_BUDGET) {
      /* a small value still in place: its bytes as they are, copied (a
       * segment each would cost more than the bytes: a file may hold a
       * million one-byte values) up to a budget */
      uint8_t small[COPY_SMALL];
      if (bs_src_read(&cat->srcs[r->src], r->off, small, (size_t)r->len, err) != 0)
        goto out;
      if (bs_buf_put(&h, small, (size_t)r->len))
        goto oom;
      copied += r->len;
      if (h.len >= CHUNK)
        flush(l, &h);
      continue;
    }
    if (r) { /* a value still in place: a segment of its source */
      flush(l, &h);
      bs_layout_src(l, (uint32_t)r->src, r->off, r->len);
      continue;
    }
    if (bs_gguf_encode_value(kv->key, kv->value, types, &h, err) != 0)
      goto out;
  }
  for (size_t j = 0; j < x.n; j++) {
    const struct bs_tensor *t = &cat->tensors[x.order[j]];
    uint32_t gt = 0;
    (void)bs_gguf_type_of(t->dtype, &gt);
    if (bput_str(&h, t->name, strlen(t->name)) || bput_u32(&h, t->rank))
      goto oom;
    for (uint32_t d = t->rank; d-- > 0;)
      if (bput_u64(&h, t->shape[d]))
        goto oom;
    if (bput_u32(&h, gt) || bput_u64(&h, x.offs[j]))
      goto oom;
    if (h.len >= CHUNK)
      flush(l, &h);
  }
  flush(l, &h);
  bs_layout_align(l, x.align);
  uint64_t data_off = l->size;
  for (size_t j = 0; j < x.n; j++) {
    const struct bs_tensor *t = &cat->tensors[x.order[j]];
    if (l->size - data_off != x.offs[j] && !l->oom && !l->big) {
      bs_fail(err, EIO, BS_OFF_NONE, t->name, "internal: data planned out of place");
      goto out;
    }
    bs_layout_tensor(l, cat, x.order[j]);
    bs_layout_align(l, x.align);
  }
  rc = bs_layout_done(l, err);
  goto out;
oom:
  bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
out:
  bs_buf_destroy(&h);
  ctx_destroy(&x);
  return rc;
}

int bs_gguf_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err)
{
  struct bs_layout l;
  bs_layout_init(&l);
  int rc = bs_gguf_layout(cat, &l, err) == 0 ? bs_layout_emit(&l, cat, k, err) : -1;
  bs_layout_destroy(&l);
  return rc;
}

/* ---- The metadata rules (writers table columns) ------------------------------------------- */

struct gg_rule {
  char *key; /* owned */
  uint8_t types[BS_GGUF_MAX_DEPTH + 2];
};

struct bs_meta_rules {
  struct gg_rule *v; /* sorted by key */
  size_t n;
};

static int cmp_rule(const void *a, const void *b)
{
  return strcmp(((const struct gg_rule *)a)->key, ((const struct gg_rule *)b)->key);
}

void bs_gguf_meta_rules_free(struct bs_meta_rules *r)
{
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++)
    bs_free(r->v[i].key);
  bs_free(r->v);
  bs_free(r);
}

int bs_gguf_meta_rules(const struct bs_catalog *src, struct bs_meta_rules **out, bs_err *err)
{
  *out = NULL;
  struct bs_meta_rules *r = bs_calloc(1, sizeof *r);
  if (!r)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  uint8_t m[4];
  bs_err sub;
  bs_err_clear(&sub);
  if (src->nsrcs == 0 || src->srcs[0].size < 4 || bs_src_read(&src->srcs[0], 0, m, 4, &sub) != 0 ||
      memcmp(m, BS_GGUF_MAGIC, 4) != 0) {
    *out = r; /* no GGUF source: no typed keys */
    return 0;
  }
  struct bs_gguf g;
  if (bs_gguf_parse_types(&src->srcs[0], &g, err) != 0) {
    bs_free(r);
    return -1;
  }
  r->v = bs_malloc((g.nkv ? g.nkv : 1) * sizeof *r->v);
  int rc = r->v ? 0 : bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < g.nkv && !rc; i++) {
    /* the key moves over; the rendered text goes with the header */
    r->v[r->n].key = g.kv[i].key;
    g.kv[i].key = NULL;
    memcpy(r->v[r->n].types, g.kv[i].types, sizeof r->v[r->n].types);
    r->n++;
  }
  bs_gguf_free(&g);
  if (rc) {
    bs_gguf_meta_rules_free(r);
    return -1;
  }
  qsort(r->v, r->n, sizeof *r->v, cmp_rule);
  *out = r;
  return 0;
}

int bs_gguf_check_meta(const struct bs_meta_rules *rules, const char *key, const char *value,
                       size_t len, bs_err *err)
{
  static const uint8_t u32_t[2] = {BS_GG_U32, 0}, str_t[2] = {BS_GG_STRING, 0};
  if (key_ok(key, err) != 0)
    return -1;
  if (!rules)
    return 0; /* a write: unchanged keys of the source are written as they are */
  size_t at;
  if (!bs_utf8_valid(key, strlen(key), &at))
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "metadata key '%.100s' is not UTF-8 (byte %zu): GGUF keys are UTF-8", key, at);
  struct gg_rule k = {(char *)key, {0}};
  const struct gg_rule *hit =
      rules->n ? bsearch(&k, rules->v, rules->n, sizeof *rules->v, cmp_rule) : NULL;
  bool align = strcmp(key, "general.alignment") == 0;
  const uint8_t *types = hit ? hit->types : align ? u32_t : str_t;
  char *text = bs_strndup(value, len);
  if (!text)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  int rc;
  if (align && types[0] == BS_GG_U32) {
    uint64_t a;
    rc = alignment_of(text, &a, err);
  } else {
    struct bs_buf b = {0};
    rc = bs_gguf_encode_value(key, text, types, &b, err);
    bs_buf_destroy(&b);
  }
  bs_free(text);
  return rc;
}
