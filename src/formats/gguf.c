/* The GGUF reader (llama.cpp / ggml; spec: ggml's docs/gguf.md).
 *
 * Layout (little-endian; versions 1, 2 and 3):
 *   "GGUF", u32 version, u64 tensor_count, u64 kv_count,
 *   kv_count x { string key, u32 type, value },
 *   tensor_count x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset },
 *   padding to general.alignment (default 32), then the data section; each
 *   tensor's offset is relative to it and a multiple of the alignment.
 * A string is u64 length + bytes; an array is u32 element type, u64 count,
 * elements (arrays of arrays allowed). ne lists dimensions fastest first: the
 * catalog shape is ne reversed (row-major). Quantized types keep their raw
 * blocks; the fastest dimension must be a multiple of the block size.
 * Version 1 (llama.cpp's first GGUF files) is the same with 32-bit sizes:
 * the tensor and kv counts, string and array lengths and the ne[] are u32
 * (tensor offsets stay u64); version 2 widened them to u64. Big-endian
 * files (the magic read as "FUGG", or the version's bytes swapped) are
 * refused, saying so.
 *
 * Metadata becomes catalog metadata shown as text: strings as they are,
 * numbers in decimal (floats with enough digits to round-trip; NaN,
 * Infinity, -Infinity), bools as true/false, arrays as JSON arrays (strings
 * escaped; non-finite floats spelled as above). The text is never kept: the
 * catalog holds each value as a range of the file (struct bs_meta_ref) with
 * its text's length, counted here; bs_gguf_render makes the text of one
 * value when it is asked for (an xattr, `info --meta`, a conversion). Every
 * count, length and offset is checked against the bytes left before
 * anything is allocated. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"
#include "formats/safetensors_write.h" /* bs_st_json_string_n */
#include "gguf_private.h"

/* ---- ggml types --------------------------------------------------------------------------- */

#define REMOVED ((enum bs_dtype)BS_DT_COUNT)
static const struct {
  enum bs_dtype dt; /* REMOVED: an id ggml no longer has */
  const char *name; /* removed ids: their old name, for the message */
} ggml_types[BS_GGUF_NTYPES] = {
    [0] = {BS_DT_F32, "F32"},          [1] = {BS_DT_F16, "F16"},
    [2] = {BS_DT_Q4_0, "Q4_0"},        [3] = {BS_DT_Q4_1, "Q4_1"},
    [4] = {REMOVED, "Q4_2"},           [5] = {REMOVED, "Q4_3"},
    [6] = {BS_DT_Q5_0, "Q5_0"},        [7] = {BS_DT_Q5_1, "Q5_1"},
    [8] = {BS_DT_Q8_0, "Q8_0"},        [9] = {BS_DT_Q8_1, "Q8_1"},
    [10] = {BS_DT_Q2_K, "Q2_K"},       [11] = {BS_DT_Q3_K, "Q3_K"},
    [12] = {BS_DT_Q4_K, "Q4_K"},       [13] = {BS_DT_Q5_K, "Q5_K"},
    [14] = {BS_DT_Q6_K, "Q6_K"},       [15] = {BS_DT_Q8_K, "Q8_K"},
    [16] = {BS_DT_IQ2_XXS, "IQ2_XXS"}, [17] = {BS_DT_IQ2_XS, "IQ2_XS"},
    [18] = {BS_DT_IQ3_XXS, "IQ3_XXS"}, [19] = {BS_DT_IQ1_S, "IQ1_S"},
    [20] = {BS_DT_IQ4_NL, "IQ4_NL"},   [21] = {BS_DT_IQ3_S, "IQ3_S"},
    [22] = {BS_DT_IQ2_S, "IQ2_S"},     [23] = {BS_DT_IQ4_XS, "IQ4_XS"},
    [24] = {BS_DT_I8, "I8"},           [25] = {BS_DT_I16, "I16"},
    [26] = {BS_DT_I32, "I32"},         [27] = {BS_DT_I64, "I64"},
    [28] = {BS_DT_F64, "F64"},         [29] = {BS_DT_IQ1_M, "IQ1_M"},
    [30] = {BS_DT_BF16, "BF16"},       [31] = {REMOVED, "Q4_0_4_4"},
    [32] = {REMOVED, "Q4_0_4_8"},      [33] = {REMOVED, "Q4_0_8_8"},
    [34] = {BS_DT_TQ1_0, "TQ1_0"},     [35] = {BS_DT_TQ2_0, "TQ2_0"},
    [36] = {REMOVED, "IQ4_NL_4_4"},    [37] = {REMOVED, "IQ4_NL_4_8"},
    [38] = {REMOVED, "IQ4_NL_8_8"},    [39] = {BS_DT_MXFP4, "MXFP4"},
};

int bs_gguf_dtype(uint32_t gtype, enum bs_dtype *out)
{
  if (gtype >= BS_GGUF_NTYPES || ggml_types[gtype].dt == REMOVED)
    return -1;
  *out = ggml_types[gtype].dt;
  return 0;
}

bool bs_gguf_type_of(enum bs_dtype dt, uint32_t *gtype)
{
  for (uint32_t i = 0; i < BS_GGUF_NTYPES; i++)
    if (ggml_types[i].dt == dt) {
      *gtype = i;
      return true;
    }
  return false;
}

/* ---- A cursor over the source, with a read-ahead window -------------------------------------- */

#define WIN (64u * 1024)

struct cur {
  const struct bs_src *s;
  uint64_t pos;
  uint64_t wstart;
  size_t wlen;
  struct bs_buf *out;     /* the value's text, or NULL: its length counted only */
  uint64_t text;          /* the value's text so far (made or counted) */
  uint64_t max;           /* at most this much text is made: the rest is cut */
  bool cut;               /* it was (then the render stops with -1, no error) */
  bool types_only;        /* bs_gguf_parse_types: strings are skipped, not read */
  bool v1;                /* GGUF version 1: counts and lengths are 32-bit */
  struct bs_catalog *cat; /* the reader's: key/values go straight into its metadata */
  uint32_t src;           /* (the source they are left in) */
  size_t meta0;           /* where they start in cat->meta */
  char *tmp;              /* a string value's bytes */
  size_t tmpcap;
  bs_err *err;
  uint8_t win[WIN];
};

static int truncated(struct cur *c, uint64_t n, const char *what)
{
  return bs_fail(c->err, EINVAL, c->pos, NULL,
                 "truncated: %s needs %" PRIu64 " bytes, the file has %" PRIu64 " left", what, n,
                 c->s->size - (c->pos < c->s->size ? c->pos : c->s->size));
}

static uint64_t left(const struct cur *c)
{
  return c->pos < c->s->size ? c->s->size - c->pos : 0;
}

static int get(struct cur *c, void *out, size_t n, const char *what)
{
  if (!bs_range_ok(c->pos, n, c->s->size))
    return truncated(c, n, what);
  if (n > WIN) {
    if (bs_src_read(c->s, c->pos, out, n, c->err) != 0)
      return -1;
  } else {
    if (c->pos < c->wstart || c->pos - c->wstart + n > c->wlen) {
      uint64_t l = left(c);
      c->wstart = c->pos;
      c->wlen = l < WIN ? (size_t)l : WIN;
      if (bs_src_read(c->s, c->pos, c->win, c->wlen, c->err) != 0) {
        c->wlen = 0;
        return -1;
      }
    }
    memcpy(out, c->win + (c->pos - c->wstart), n);
  }
  c->pos += n;
  return 0;
}

static int get_u32(struct cur *c, uint32_t *v, const char *what)
{
  uint8_t b[4];
  if (get(c, b, 4, what) != 0)
    return -1;
  *v = bs_le32(b);
  return 0;
}

static int get_u64(struct cur *c, uint64_t *v, const char *what)
{
  uint8_t b[8];
  if (get(c, b, 8, what) != 0)
    return -1;
  *v = bs_le64(b);
  return 0;
}

/* A count or length: u64, or u32 in a version 1 file. */
static int get_size(struct cur *c, uint64_t *v, const char *what)
{
  if (!c->v1)
    return get_u64(c, v, what);
  uint32_t v32;
  if (get_u32(c, &v32, what) != 0)
    return -1;
  *v = v32;
  return 0;
}

/* A GGUF string of at most `cap` bytes into a new NUL-terminated buffer.
 * *len gets its length (it may hold NUL bytes). */
static int get_string(struct cur *c, uint64_t cap, const char *what, char **out, uint64_t *len)
{
  uint64_t at = c->pos, n;
  *out = NULL;
  if (get_size(c, &n, what) != 0)
    return -1;
  if (n > left(c))
    return bs_fail(c->err, EINVAL, at, NULL,
                   "%s: string length %" PRIu64 " exceeds the %" PRIu64 " bytes left in the file",
                   what, n, left(c));
  if (n > cap)
    return bs_fail(c->err, EFBIG, at, NULL,
                   "%s: string of %" PRIu64 " bytes exceeds the limit of %" PRIu64, what, n, cap);
  char *s = bs_malloc((size_t)n + 1);
  if (!s)
    return bs_fail(c->err, ENOMEM, at, NULL, "out of memory");
  if (get(c, s, (size_t)n, what) != 0) {
    bs_free(s);
    return -1;
  }
  s[n] = '\0';
  *out = s;
  if (len)
    *len = n;
  return 0;
}

/* ---- Rendering metadata ----------------------------------------------------------------- */

/* n bytes of text; past c->max the rest is cut (c->cut, and -1 with no
 * error: the render stops). Into c->out, or only counted. */
static int put(struct cur *c, const void *d, size_t n)
{
  size_t take = n;
  if (n > c->max - c->text) {
    take = (size_t)(c->max - c->text);
    c->cut = true;
  }
  if (c->out && take && bs_buf_put(c->out, d, take) != 0)
    return bs_fail(c->err, ENOMEM, c->pos, NULL, "out of memory");
  c->text += take;
  return c->cut ? -1 : 0;
}

static int puts_(struct cur *c, const char *s)
{
  return put(c, s, strlen(s));
}

/* A string value's length (at `at`), checked against the bytes left. */
static int get_string_len(struct cur *c, uint64_t at, uint64_t *n)
{
  if (get_size(c, n, "a string value") != 0)
    return -1;
  if (*n > left(c))
    return bs_fail(c->err, EINVAL, at, NULL,
                   "a string value: string length %" PRIu64 " exceeds the %" PRIu64
                   " bytes left in the file",
                   *n, left(c));
  return 0;
}

/* A string value's length *n (checked against the file) and its first
 * *k = min(n, want) bytes, into c->tmp (NUL-terminated); the rest skipped. */
static int get_value_string(struct cur *c, uint64_t at, uint64_t want, uint64_t *n, size_t *k)
{
  if (get_string_len(c, at, n) != 0)
    return -1;
  uint64_t end = c->pos + *n;
  *k = (size_t)(*n < want ? *n : want);
  if (*k + 1 > c->tmpcap) {
    char *t = bs_realloc(c->tmp, *k + 1);
    if (!t)
      return bs_fail(c->err, ENOMEM, at, NULL, "out of memory");
    c->tmp = t;
    c->tmpcap = *k + 1;
  }
  if (get(c, c->tmp, *k, "a string value") != 0)
    return -1;
  c->tmp[*k] = '\0';
  c->pos = end;
  return 0;
}

static void fmt_float(char *s, size_t n, double v, int digits)
{
  if (isnan(v))
    snprintf(s, n, "NaN");
  else if (isinf(v))
    snprintf(s, n, v < 0 ? "-Infinity" : "Infinity");
  else
    snprintf(s, n, "%.*g", digits, v);
}

static const char *const vtype_names[BS_GG_NTYPES] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64",
};

/* Size in bytes of a scalar type; 0 for string and array. */
static unsigned scalar_size(uint32_t t)
{
  static const unsigned sz[BS_GG_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return t < BS_GG_NTYPES ? sz[t] : 0;
}

/* The fewest bytes one value of type t takes in the file (a version 1
 * file's sizes are 4 bytes). */
static unsigned min_size(const struct cur *c, uint32_t t)
{
  unsigned sz = c->v1 ? 4 : 8;
  return t == BS_GG_STRING ? sz : t == BS_GG_ARRAY ? 4 + sz : scalar_size(t);
}

static int render_scalar(struct cur *c, uint32_t t, const uint8_t *p)
{
  char s[40];
  switch (t) {
  case BS_GG_U8: snprintf(s, sizeof s, "%u", p[0]); break;
  case BS_GG_I8: snprintf(s, sizeof s, "%d", (int8_t)p[0]); break;
  case BS_GG_U16: snprintf(s, sizeof s, "%u", bs_le16(p)); break;
  case BS_GG_I16: snprintf(s, sizeof s, "%d", (int16_t)bs_le16(p)); break;
  case BS_GG_U32: snprintf(s, sizeof s, "%" PRIu32, bs_le32(p)); break;
  case BS_GG_I32: snprintf(s, sizeof s, "%" PRId32, (int32_t)bs_le32(p)); break;
  case BS_GG_U64: snprintf(s, sizeof s, "%" PRIu64, bs_le64(p)); break;
  case BS_GG_I64: snprintf(s, sizeof s, "%" PRId64, (int64_t)bs_le64(p)); break;
  case BS_GG_F32: {
    uint32_t u = bs_le32(p);
    float f;
    memcpy(&f, &u, 4);
    fmt_float(s, sizeof s, f, 9);
    break;
  }
  case BS_GG_F64: {
    uint64_t u = bs_le64(p);
    double d;
    memcpy(&d, &u, 8);
    fmt_float(s, sizeof s, d, 17);
    break;
  }
  default: /* BOOL */
    if (p[0] > 1)
      return bs_fail(c->err, EINVAL, c->pos - 1, NULL, "bool value %u is neither 0 nor 1", p[0]);
    snprintf(s, sizeof s, "%s", p[0] ? "true" : "false");
  }
  return puts_(c, s);
}

/* The text of a string, counted, a window at a time (a long string is
 * never held): a value that is one string is its bytes to the first NUL;
 * in an array (json) it is JSON, escaped byte by byte. */
static int count_string(struct cur *c, uint64_t at, bool json)
{
  uint64_t n, len = json ? 2 : 0;
  if (get_string_len(c, at, &n) != 0)
    return -1;
  uint64_t end = c->pos + n;
  bool nul = false;
  while (c->pos < end && !nul) {
    uint8_t buf[4096];
    size_t k = end - c->pos < sizeof buf ? (size_t)(end - c->pos) : sizeof buf;
    if (get(c, buf, k, "a string value") != 0)
      return -1;
    if (json) {
      len += bs_st_json_len_n((const char *)buf, k) - 2;
      continue;
    }
    const uint8_t *z = memchr(buf, 0, k);
    len += z ? (uint64_t)(z - buf) : k;
    nul = z != NULL;
  }
  c->pos = end;
  if (len > c->max - c->text) {
    c->text = c->max;
    c->cut = true;
    return -1;
  }
  c->text += len;
  return 0;
}

/* One value of type t at the cursor, its text made (c->out) or counted
 * (in_array: strings as JSON). types[0..] get t and, for arrays, the
 * element types (from the first inner array when nested). */
static int render_value(struct cur *c, uint32_t t, bool in_array, unsigned depth, uint8_t *types,
                        bool set_types)
{
  uint64_t at = c->pos;
  if (set_types)
    types[0] = (uint8_t)t;
  if (t >= BS_GG_NTYPES)
    return bs_fail(c->err, EINVAL, at, NULL, "unknown metadata value type %" PRIu32, t);
  if (t == BS_GG_STRING && c->types_only) {
    uint64_t n;
    if (get_string_len(c, at, &n) != 0)
      return -1;
    c->pos += n;
    return 0;
  }
  if (t == BS_GG_STRING && !c->out)
    return count_string(c, at, in_array);
  if (t == BS_GG_STRING) {
    /* what the text has room for: a byte of the string makes one or more of
     * text, so the bytes past the room (and one more: a NUL there ends it)
     * are never read */
    uint64_t room = c->max - c->text, n = 0;
    size_t k = 0;
    if (get_value_string(c, at, room < UINT64_MAX ? room + 1 : room, &n, &k) != 0)
      return -1;
    if (!in_array) { /* a value that is one string: its text is the string, to a NUL */
      size_t z = strlen(c->tmp);
      /* a NUL or the end was read: the whole text; else k = room + 1 bytes
       * and more: put cuts them at the room */
      return put(c, c->tmp, z < k || k == n ? z : k);
    }
    /* in an array: JSON, escaped straight into the text when it fits whole */
    size_t jl = bs_st_json_len_n(c->tmp, k);
    if (jl > c->max - c->text) { /* cut: escaped a piece at a time (byte by byte, as
                                      JSON is) until the room is full */
      int rc = put(c, "\"", 1);
      for (size_t i = 0; i < k && rc == 0; i += 4096) {
        struct bs_buf j = {0};
        rc = bs_st_json_string_n(&j, c->tmp + i, k - i < 4096 ? k - i : 4096) != 0
                 ? bs_fail(c->err, ENOMEM, at, NULL, "out of memory")
                 : put(c, j.data + 1, j.len - 2); /* without its quotes */
        bs_buf_destroy(&j);
      }
      return rc == 0 ? put(c, "\"", 1) : rc;
    }
    if (bs_st_json_string_n(c->out, c->tmp, k) != 0)
      return bs_fail(c->err, ENOMEM, at, NULL, "out of memory");
    c->text += jl;
    return 0; /* (k < n only when jl > room: cut above) */
  }
  if (t != BS_GG_ARRAY) {
    uint8_t v[8];
    if (get(c, v, scalar_size(t), vtype_names[t]) != 0)
      return -1;
    return render_scalar(c, t, v);
  }
  uint32_t et;
  uint64_t n;
  if (get_u32(c, &et, "an array's element type") != 0 || get_size(c, &n, "an array's length") != 0)
    return -1;
  if (et >= BS_GG_NTYPES)
    return bs_fail(c->err, EINVAL, at, NULL, "array of unknown metadata value type %" PRIu32, et);
  if (et == BS_GG_ARRAY && depth + 1 >= BS_GGUF_MAX_DEPTH)
    return bs_fail(c->err, EINVAL, at, NULL, "arrays nested more than %u deep", BS_GGUF_MAX_DEPTH);
  uint64_t need;
  if (!bs_mul_u64(n, min_size(c, et), &need) || need > left(c))
    return bs_fail(c->err, EINVAL, at, NULL,
                   "array of %" PRIu64 " %s values does not fit in the %" PRIu64
                   " bytes left in the file",
                   n, vtype_names[et], left(c));
  if (set_types) {
    types[1] = (uint8_t)et;
    if (et == BS_GG_ARRAY)
      types[2] = BS_GG_UNKNOWN;
  }
  if (put(c, "[", 1) != 0)
    return -1;
  for (uint64_t i = 0; i < n; i++) {
    if (i && put(c, ",", 1) != 0)
      return -1;
    if (et == BS_GG_ARRAY) {
      if (render_value(c, et, true, depth + 1, types ? types + 1 : NULL, set_types && i == 0) != 0)
        return -1;
    } else if (et == BS_GG_STRING) {
      if (render_value(c, et, true, depth + 1, NULL, false) != 0)
        return -1;
    } else {
      uint8_t v[8];
      if (get(c, v, scalar_size(et), vtype_names[et]) != 0 || render_scalar(c, et, v) != 0)
        return -1;
    }
  }
  return put(c, "]", 1);
}

/* ---- The header ------------------------------------------------------------------------------ */

void bs_gguf_free(struct bs_gguf *g)
{
  for (size_t i = 0; g->kv && i < g->nkv; i++) /* (no kv: the reader's, in its catalog) */
    bs_free(g->kv[i].key);
  for (size_t i = 0; i < g->nti; i++)
    bs_free(g->ti[i].name);
  bs_free(g->kv);
  bs_free(g->ti);
  memset(g, 0, sizeof *g);
}

static int cmp_str(const void *a, const void *b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Two equal strings among v[0..n) (sorted here)? Their value, or NULL. */
static const char *duplicate(const char **v, size_t n)
{
  qsort(v, n, sizeof *v, cmp_str);
  for (size_t i = 1; i < n; i++)
    if (strcmp(v[i - 1], v[i]) == 0)
      return v[i];
  return NULL;
}

/* Key/value i: g->kv[i], or (the reader's parse) the catalog's entry as a
 * view, its key borrowed. */
static struct bs_gguf_kv kv_at(const struct cur *c, const struct bs_gguf *g, size_t i)
{
  if (!c->cat)
    return g->kv[i];
  const struct bs_kv *m = &c->cat->meta[c->meta0 + i];
  struct bs_gguf_kv v = {.key = m->key, .off = m->ref->off, .len = m->ref->len};
  memcpy(v.types, m->ref->types, sizeof v.types);
  return v;
}

/* Key/value i of the parse: read into g->kv, or (the reader's parse: no
 * copy of the header beside the catalog, a GGUF file may hold a million
 * small values; issue 34) into the catalog's metadata, its key the
 * catalog's from the start and its value's place set once read. */
static int read_kvs(struct cur *c, struct bs_gguf *g, uint64_t nkv)
{
  for (uint64_t i = 0; i < nkv; i++) {
    struct bs_gguf_kv one, *kv = c->cat ? &one : &g->kv[g->nkv];
    memset(kv, 0, sizeof *kv);
    uint64_t at = c->pos, klen;
    char *key;
    if (get_string(c, BS_GGUF_MAX_KEY, "a metadata key", &key, &klen) != 0)
      return -1;
    if (c->cat) {
      const struct bs_meta_ref none = {.format = BS_FMT_GGUF, .src = c->src};
      if (bs_catalog_take_meta_ref(c->cat, key, &none, c->err) != 0)
        return -1;
    } else {
      kv->key = key;
    }
    g->nkv++; /* (the key is freed with g or the catalog from now on) */
    if (klen == 0 || strlen(key) != klen)
      return bs_fail(c->err, EINVAL, at, NULL, "metadata key %" PRIu64 " is %s", i,
                     klen ? "not text (it holds a NUL byte)" : "empty");
    uint32_t t;
    if (get_u32(c, &t, "a metadata value type") != 0)
      return -1;
    kv->off = c->pos;
    c->text = 0; /* counted, not made */
    int rc = render_value(c, t, false, 0, kv->types, true);
    if (rc != 0) {
      bs_fail(c->err, EINVAL, at, NULL, "bad value"); /* kept only if none was set */
      if (c->err && c->err->key[0] == '\0') {
        /* err->key names a tensor: the metadata key goes in the message */
        char msg[sizeof c->err->msg + 128];
        snprintf(msg, sizeof msg, "metadata '%.100s': %s", key, c->err->msg);
        memcpy(c->err->msg, msg, sizeof c->err->msg - 1);
        c->err->msg[sizeof c->err->msg - 1] = '\0';
      }
      return -1;
    }
    kv->text_len = c->text;
    kv->len = c->pos - kv->off;
    if (c->cat) {
      struct bs_meta_ref *r = c->cat->meta[c->cat->nmeta - 1].ref;
      r->off = kv->off;
      r->len = kv->len;
      r->text_len = kv->text_len;
      memcpy(r->types, kv->types, sizeof r->types);
    }
  }
  return 0;
}

static int read_alignment(struct cur *c, struct bs_gguf *g)
{
  g->alignment = BS_GGUF_DEFAULT_ALIGN;
  for (size_t i = 0; i < g->nkv; i++) {
    const struct bs_gguf_kv view = kv_at(c, g, i), *kv = &view;
    if (strcmp(kv->key, "general.alignment") != 0)
      continue;
    if (kv->types[0] != BS_GG_U32)
      return bs_fail(c->err, EINVAL, kv->off, NULL,
                     "general.alignment is a %s, the spec wants a uint32",
                     vtype_names[kv->types[0]]);
    uint8_t b[4];
    if (kv->len != 4 || bs_src_read(c->s, kv->off, b, 4, c->err) != 0)
      return -1;
    uint64_t a = bs_le32(b);
    if (a == 0 || (a & (a - 1)) != 0 || a > BS_GGUF_MAX_ALIGN)
      return bs_fail(c->err, EINVAL, kv->off, NULL,
                     "general.alignment %" PRIu64 " is not a power of two from 1 to %u", a,
                     BS_GGUF_MAX_ALIGN);
    g->alignment = a;
  }
  return 0;
}

static int read_tensor_info(struct cur *c, struct bs_gguf *g, uint64_t i)
{
  struct bs_gguf_ti *ti = &g->ti[g->nti];
  memset(ti, 0, sizeof *ti);
  uint64_t at = c->pos, nlen;
  if (get_string(c, BS_MAX_KEY_LEN, "a tensor name", &ti->name, &nlen) != 0)
    return -1;
  g->nti++;
  if (nlen == 0 || strlen(ti->name) != nlen)
    return bs_fail(c->err, EINVAL, at, NULL, "tensor %" PRIu64 "'s name is %s", i,
                   nlen ? "not text (it holds a NUL byte)" : "empty");
  uint32_t nd, gt;
  if (get_u32(c, &nd, "a tensor's n_dims") != 0)
    return -1;
  if (nd > BS_GGUF_MAX_DIMS)
    return bs_fail(c->err, EINVAL, c->pos - 4, ti->name, "n_dims %" PRIu32 " exceeds ggml's %u", nd,
                   BS_GGUF_MAX_DIMS);
  ti->rank = nd;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t ne;
    if (get_size(c, &ne, "a tensor dimension") != 0)
      return -1;
    if (ne > INT64_MAX)
      return bs_fail(c->err, EINVAL, c->pos - 8, ti->name, "dimension %" PRIu64 " is negative", ne);
    ti->shape[nd - 1 - d] = ne; /* ne is fastest first */
  }
  if (get_u32(c, &gt, "a tensor's type") != 0)
    return -1;
  ti->gtype = gt;
  if (bs_gguf_dtype(gt, &ti->dtype) != 0) {
    if (gt < BS_GGUF_NTYPES)
      return bs_fail(c->err, ENOTSUP, c->pos - 4, ti->name,
                     "ggml type %" PRIu32 " (%s) was removed from ggml and is not read", gt,
                     ggml_types[gt].name);
    return bs_fail(c->err, EINVAL, c->pos - 4, ti->name, "unknown ggml type %" PRIu32, gt);
  }
  if (get_u64(c, &ti->off, "a tensor's offset") != 0)
    return -1;
  return bs_dtype_nbytes(ti->dtype, ti->rank, ti->shape, &ti->nbytes, ti->name, at, c->err);
}

static int cmp_off(const void *a, const void *b)
{
  const struct bs_gguf_ti *x = *(const struct bs_gguf_ti *const *)a;
  const struct bs_gguf_ti *y = *(const struct bs_gguf_ti *const *)b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Every tensor aligned, inside the file, none overlapping another; names unique. */
static int check_tensors(struct cur *c, struct bs_gguf *g)
{
  for (size_t i = 0; i < g->nti; i++) {
    const struct bs_gguf_ti *ti = &g->ti[i];
    uint64_t abs;
    if (ti->off % g->alignment != 0)
      return bs_fail(c->err, EINVAL, g->data_off, ti->name,
                     "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, ti->off,
                     g->alignment);
    if (ti->nbytes > BS_MAX_TENSOR_BYTES || !bs_add_u64(g->data_off, ti->off, &abs) ||
        !bs_range_ok(abs, ti->nbytes, c->s->size))
      return bs_fail(c->err, EINVAL, g->data_off, ti->name,
                     "data [%" PRIu64 ", +%" PRIu64 ") of the data section (at %" PRIu64
                     ") lies outside the file of %" PRIu64 " bytes",
                     ti->off, ti->nbytes, g->data_off, c->s->size);
  }
  size_t n = g->nti;
  const struct bs_gguf_ti **v = bs_malloc((n ? n : 1) * sizeof *v);
  const char **names = bs_malloc((n ? n : 1) * sizeof *names);
  int rc = 0;
  if (!v || !names) {
    rc = bs_fail(c->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    v[i] = &g->ti[i];
    names[i] = g->ti[i].name;
  }
  const char *dup = duplicate(names, n);
  if (dup) {
    rc = bs_fail(c->err, EINVAL, BS_OFF_NONE, dup, "two tensors have this name");
    goto out;
  }
  qsort(v, n, sizeof *v, cmp_off);
  const struct bs_gguf_ti *prev = NULL;
  for (size_t i = 0; i < n; i++) {
    if (v[i]->nbytes == 0)
      continue;
    if (prev && prev->off + prev->nbytes > v[i]->off) {
      rc = bs_fail(c->err, EINVAL, g->data_off + v[i]->off, v[i]->name,
                   "its data overlaps tensor '%.60s' (%" PRIu64 " + %" PRIu64 " > %" PRIu64 ")",
                   prev->name, prev->off, prev->nbytes, v[i]->off);
      goto out;
    }
    prev = v[i];
  }
out:
  bs_free(v);
  bs_free(names);
  return rc;
}

/* With cat (the reader), the key/values go into cat->meta (from its end
 * on; the caller rolls them back on failure), not into g->kv. */
static int parse(const struct bs_src *s, struct bs_gguf *g, bool types_only, struct bs_catalog *cat,
                 uint32_t src, bs_err *err)
{
  memset(g, 0, sizeof *g);
  struct cur *c = bs_malloc(sizeof *c);
  if (!c)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  memset(c, 0, offsetof(struct cur, win));
  c->types_only = types_only;
  c->cat = cat;
  c->src = src;
  c->meta0 = cat ? cat->nmeta : 0;
  c->s = s;
  c->max = UINT64_MAX;
  c->err = err;
  int rc = -1;
  uint8_t magic[4];
  uint32_t version;
  uint64_t nt, nkv;
  if (get(c, magic, 4, "the GGUF magic") != 0)
    goto out;
  if (memcmp(magic, BS_GGUF_MAGIC_SWAPPED, 4) == 0) {
    bs_fail(err, ENOTSUP, 0, NULL,
            "a big-endian GGUF file (its magic reads 'FUGG': an early big-endian writer's): "
            "burnstore reads little-endian GGUF only");
    goto out;
  }
  if (memcmp(magic, BS_GGUF_MAGIC, 4) != 0) {
    bs_fail(err, EINVAL, 0, NULL, "not a GGUF file: no 'GGUF' magic");
    goto out;
  }
  if (get_u32(c, &version, "the version") != 0)
    goto out;
  if (version == 0x01000000u || version == 0x02000000u || version == 0x03000000u) {
    bs_fail(err, ENOTSUP, 4, NULL,
            "a big-endian GGUF file (version %u with its bytes swapped): burnstore reads "
            "little-endian GGUF only",
            version >> 24);
    goto out;
  }
  if (version < 1 || version > 3) {
    bs_fail(err, ENOTSUP, 4, NULL, "GGUF version %" PRIu32 " is not read (versions 1 to 3 are)",
            version);
    goto out;
  }
  g->version = version;
  c->v1 = version == 1;
  if (get_size(c, &nt, "the tensor count") != 0 || get_size(c, &nkv, "the metadata count") != 0)
    goto out;
  /* Each key/value takes at least 13 bytes and each tensor info 24 (10 and
   * 21 in a version 1 file). */
  const uint64_t kv_min = c->v1 ? 10 : 13, ti_min = c->v1 ? 21 : 24;
  if (nkv > BS_GGUF_MAX_KV || nkv > left(c) / kv_min) {
    bs_fail(err, EINVAL, c->v1 ? 12 : 16, NULL,
            "metadata count %" PRIu64 " cannot fit in the file (%" PRIu64 " bytes left)", nkv,
            left(c));
    goto out;
  }
  if (nt > BS_MAX_TENSORS || nt > left(c) / ti_min) {
    bs_fail(err, EINVAL, 8, NULL,
            "tensor count %" PRIu64 " cannot fit in the file (%" PRIu64 " bytes left)", nt,
            left(c));
    goto out;
  }
  g->kv = cat ? NULL : bs_malloc((nkv ? (size_t)nkv : 1) * sizeof *g->kv);
  if (!cat && !g->kv) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  if (read_kvs(c, g, nkv) != 0)
    goto out;
  if (types_only) {
    rc = 0;
    goto out;
  }
  {
    const char **keys = bs_malloc((g->nkv ? g->nkv : 1) * sizeof *keys);
    if (!keys) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < g->nkv; i++)
      keys[i] = cat ? cat->meta[c->meta0 + i].key : g->kv[i].key;
    const char *dup = duplicate(keys, g->nkv);
    if (dup)
      bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "metadata key '%.100s' appears twice", dup);
    bs_free(keys);
    if (dup)
      goto out;
  }
  if (read_alignment(c, g) != 0)
    goto out;
  if (nt > left(c) / ti_min) {
    bs_fail(err, EINVAL, 8, NULL,
            "tensor count %" PRIu64 " cannot fit in the %" PRIu64 " bytes after the metadata", nt,
            left(c));
    goto out;
  }
  /* Allocated only now: the count is checked against what the metadata left. */
  if (!(g->ti = bs_malloc((nt ? (size_t)nt : 1) * sizeof *g->ti))) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (uint64_t i = 0; i < nt; i++)
    if (read_tensor_info(c, g, i) != 0)
      goto out;
  if (!bs_align_up(c->pos, g->alignment, &g->data_off)) {
    bs_fail(err, EINVAL, c->pos, NULL, "the data section's offset overflows");
    goto out;
  }
  if (g->nti && g->data_off > s->size) {
    bs_fail(err, EINVAL, c->pos, NULL,
            "the data section (at %" PRIu64 ", after padding to %" PRIu64
            ") starts past the end of the file (%" PRIu64 " bytes)",
            g->data_off, g->alignment, s->size);
    goto out;
  }
  if (check_tensors(c, g) != 0)
    goto out;
  rc = 0;
out:
  bs_free(c->tmp);
  bs_free(c);
  if (rc != 0)
    bs_gguf_free(g);
  return rc;
}

int bs_gguf_src_v1(const struct bs_src *s, bool *v1, bs_err *err)
{
  uint8_t h[8];
  if (bs_src_read(s, 0, h, sizeof h, err) != 0)
    return -1;
  *v1 = memcmp(h, BS_GGUF_MAGIC, 4) == 0 && bs_le32(h + 4) == 1;
  return 0;
}

/* Copy one value of type t at the cursor (a version 1 file's) to out as
 * version 3 encodes it: its sizes widened to u64. */
static int widen_value(struct cur *c, uint32_t t, unsigned depth, struct bs_buf *out)
{
  uint64_t at = c->pos, n;
  if (t >= BS_GG_NTYPES)
    return bs_fail(c->err, EINVAL, at, NULL, "unknown metadata value type %" PRIu32, t);
  if (t != BS_GG_STRING && t != BS_GG_ARRAY) {
    uint8_t v[8];
    return get(c, v, scalar_size(t), vtype_names[t]) != 0 ? -1
           : bs_buf_put(out, v, scalar_size(t)) != 0
               ? bs_fail(c->err, ENOMEM, at, NULL, "out of memory")
               : 0;
  }
  uint32_t et = 0;
  if (t == BS_GG_ARRAY && get_u32(c, &et, "an array's element type") != 0)
    return -1;
  if (get_size(c, &n, t == BS_GG_ARRAY ? "an array's length" : "a string value") != 0)
    return -1;
  uint8_t w[12];
  size_t wl = 0;
  if (t == BS_GG_ARRAY) {
    bs_put_le32(w, et);
    wl = 4;
  }
  bs_put_le64(w + wl, n);
  if (bs_buf_put(out, w, wl + 8) != 0)
    return bs_fail(c->err, ENOMEM, at, NULL, "out of memory");
  if (t == BS_GG_STRING) {
    if (n > left(c))
      return truncated(c, n, "a string value");
    for (uint64_t done = 0; done < n;) {
      uint8_t buf[4096];
      size_t k = n - done < sizeof buf ? (size_t)(n - done) : sizeof buf;
      if (get(c, buf, k, "a string value") != 0)
        return -1;
      if (bs_buf_put(out, buf, k) != 0)
        return bs_fail(c->err, ENOMEM, at, NULL, "out of memory");
      done += k;
    }
    return 0;
  }
  if (et == BS_GG_ARRAY && depth + 1 >= BS_GGUF_MAX_DEPTH)
    return bs_fail(c->err, EINVAL, at, NULL, "arrays nested more than %u deep", BS_GGUF_MAX_DEPTH);
  uint64_t need;
  if (et >= BS_GG_NTYPES || !bs_mul_u64(n, min_size(c, et), &need) || need > left(c))
    return bs_fail(c->err, EINVAL, at, NULL, "a bad array of %" PRIu64 " values", n);
  for (uint64_t i = 0; i < n; i++)
    if (widen_value(c, et, depth + 1, out) != 0)
      return -1;
  return 0;
}

/* A cursor at value r of source s (checked to lie in it), making text
 * into out (NULL: none) up to max bytes; NULL with err set. */
static struct cur *value_cur(const struct bs_src *s, const struct bs_meta_ref *r, uint64_t max,
                             struct bs_buf *out, bs_err *err)
{
  if (r->format != BS_FMT_GGUF || !bs_range_ok(r->off, r->len, s->size)) {
    bs_fail(err, EINVAL, r->off, NULL,
            "a metadata value at [%" PRIu64 ", +%" PRIu64 ") is not a GGUF value of %s", r->off,
            r->len, s->name ? s->name : "its file");
    return NULL;
  }
  struct cur *c = bs_malloc(sizeof *c);
  if (!c) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    return NULL;
  }
  memset(c, 0, offsetof(struct cur, win));
  c->s = s;
  c->pos = r->off;
  c->out = out;
  c->max = max;
  c->err = err;
  return c;
}

/* rc of a walk of value r that ended at c->pos: EIO when the walk went
 * through (not cut) and did not end at the value's end (the file
 * changed); c freed. */
static int value_done(struct cur *c, const struct bs_meta_ref *r, int rc)
{
  if (rc == 0 && !c->cut && c->pos != r->off + r->len)
    rc = bs_fail(c->err, EIO, r->off, NULL,
                 "the metadata value at %" PRIu64 " is no longer %" PRIu64 " bytes (%s changed?)",
                 r->off, r->len, c->s->name ? c->s->name : "the file");
  bs_free(c->tmp);
  bs_free(c);
  return rc;
}

int bs_gguf_widen(const struct bs_src *s, const struct bs_meta_ref *r, struct bs_buf *out,
                  bs_err *err)
{
  struct cur *c = value_cur(s, r, UINT64_MAX, NULL, err);
  if (!c)
    return -1;
  c->v1 = true;
  return value_done(c, r, widen_value(c, r->types[0], 0, out));
}

int bs_gguf_render(const struct bs_src *s, const struct bs_meta_ref *r, uint64_t max,
                   struct bs_buf *out, bool *cut, bs_err *err)
{
  *cut = false;
  struct cur *c = value_cur(s, r, max, out, err);
  if (!c)
    return -1;
  int rc = bs_gguf_src_v1(s, &c->v1, err) != 0
               ? -1
               : render_value(c, r->types[0], false, 0, NULL, false);
  if (rc != 0 && c->cut) { /* (cut: not an error) */
    rc = 0;
    *cut = true;
  }
  return value_done(c, r, rc);
}

int bs_gguf_parse(const struct bs_src *s, struct bs_gguf *g, bs_err *err)
{
  return parse(s, g, false, NULL, 0, err);
}

int bs_gguf_parse_types(const struct bs_src *s, struct bs_gguf *g, bs_err *err)
{
  return parse(s, g, true, NULL, 0, err);
}

/* ---- The reader ---------------------------------------------------------------------------- */

enum bs_sniff bs_gguf_sniff(const uint8_t *head, size_t n, uint64_t size)
{
  (void)size;
  /* (a big-endian file's magic too: the reader says what it is) */
  return n >= 4 && (memcmp(head, BS_GGUF_MAGIC, 4) == 0 ||
                    memcmp(head, BS_GGUF_MAGIC_SWAPPED, 4) == 0)
             ? BS_SNIFF_YES
             : BS_SNIFF_NO;
}

int bs_gguf_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts, bs_err *err)
{
  (void)opts;
  if (src >= cat->nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "no source %u", src);
  const struct bs_catalog_mark mark = bs_catalog_mark(cat);
  struct bs_gguf g;
  /* The metadata goes straight into the catalog: each value stays in the
   * file, its text made when asked for. */
  if (parse(&cat->srcs[src], &g, false, cat, src, err) != 0) {
    bs_catalog_rollback(cat, &mark);
    return -1;
  }
  int rc = 0;
  for (size_t i = 0; i < g.nti && !rc; i++) {
    const struct bs_gguf_ti *ti = &g.ti[i];
    struct bs_tensor *t =
        bs_catalog_add(cat, ti->name, ti->dtype, ti->rank, ti->shape, g.data_off + ti->off, err);
    if (!t) {
      rc = -1;
      break;
    }
    t->src = src;
    t->off = g.data_off + ti->off;
  }
  bs_gguf_free(&g);
  if (rc != 0)
    bs_catalog_rollback(cat, &mark);
  return rc;
}
