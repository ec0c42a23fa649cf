/* SafeTensors reader (spec: shared/docs/safetensors-format.md).
 *
 * Byte layout:
 *  1. 8 bytes, u64 little-endian: N, the byte length of the header (at most
 *     BS_ST_MAX_HEADER, and 8 + N <= file size).
 *  2. N bytes: one UTF-8 JSON object. Space, tab, CR and LF may come before
 *     the '{' and after the '}'; nothing else (no NUL padding).
 *       {"__metadata__": {"k": "v", ...} | null,          (optional)
 *        "<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [BEGIN, END]},
 *        ...}
 *     Unknown fields inside an entry are ignored; duplicate keys are an error.
 *  3. D bytes of data. A tensor's bytes are [8 + N + BEGIN, 8 + N + END) in
 *     the file. Sorted by (BEGIN, END), the tensors tile [0, D) with no gap
 *     and no overlap, END - BEGIN = the size of dtype x shape, and
 *     8 + N + D is exactly the file size.
 *
 * The JSON is parsed by jansson (docs/json-library.md). jansson validates
 * UTF-8, rejects duplicate keys and trailing garbage, and reads integers as
 * signed 64-bit: values of 2^63 and above are rejected, which no real file
 * can need (no file holds 2^63 bytes).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/utf8.h"
#include "formats/formats.h"

#define PREFIX 8u

/* The dtype names of the reference crate, all of them. bs_dtype_from_name
 * knows more (C128, FLEX32, QI8...), which are not SafeTensors dtypes. */
static const char *const st_dtypes[] = {
    "BOOL",    "F4",          "F6_E2M3",     "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",     "U16", "F16", "BF16",    "I32",
    "U32",     "F32",         "C64",         "F64",     "I64", "U64",
};
_Static_assert(BS_ST_MAX_HEADER < UINT32_MAX - 8, "header offsets fit struct entry's 32 bits");
_Static_assert(sizeof st_dtypes / sizeof st_dtypes[0] == 22, "SafeTensors has 22 dtypes");

/* One tensor entry, validated field by field, not yet in the catalog. */
/* 40 bytes (a million of them are held with the catalog at the mount's
 * peak): offsets into the header fit 32 bits (BS_ST_MAX_HEADER). */
struct entry {
  const char *name; /* borrowed from the jansson tree, or the header's strings */
  uint64_t begin, end;
  uint32_t pos;  /* file offset of the key, for messages */
  uint32_t dims; /* index of shape[0] in the flat dims array */
  enum bs_dtype dtype;
  uint32_t rank;
};

struct dims {
  uint64_t *v;
  size_t n, cap;
};

/* A __metadata__ pair (borrowed strings). */
struct meta_kv {
  const char *k, *v;
};

static bool is_space(uint8_t c)
{
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static const char *type_name(const json_t *v)
{
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "?";
}

/* ---- Positions in the header text -------------------------------------
 * jansson keeps no positions of values, so for messages we walk the raw text
 * ourselves: a byte scanner that knows strings, escapes and nesting and
 * nothing else. It runs on text jansson accepted, or (for parse errors) on
 * its prefix up to where jansson stopped, and is bounded by the length. */

struct scan {
  size_t *keys; /* start of each top-level key string ('"'), may be NULL */
  size_t nkeys, cap;
  size_t last_key; /* start of the last top-level key seen, or SIZE_MAX */
  int depth;       /* nesting at the end of the scanned range */
};

static void scan_text(const char *h, size_t n, struct scan *sc)
{
  bool in_str = false, esc = false, expect_key = false;
  int depth = 0;
  sc->nkeys = 0;
  sc->last_key = SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    char c = h[i];
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      continue;
    }
    switch (c) {
    case '"':
      in_str = true;
      if (depth == 1 && expect_key) {
        if (sc->keys && sc->nkeys < sc->cap)
          sc->keys[sc->nkeys] = i;
        sc->nkeys++;
        sc->last_key = i;
        expect_key = false;
      }
      break;
    case '{':
      if (++depth == 1)
        expect_key = true;
      break;
    case '[': depth++; break;
    case '}':
    case ']': depth--; break;
    case ',':
      if (depth == 1)
        expect_key = true;
      break;
    default: break;
    }
  }
  sc->depth = depth;
}

/* Decode the JSON string token starting at h[at] ('"') into a bs_malloc'd C
 * string, or NULL (bad token, NUL inside, or out of memory). */
static char *decode_key_at(const char *h, size_t n, size_t at)
{
  if (at >= n || h[at] != '"')
    return NULL;
  size_t i = at + 1;
  bool esc = false;
  for (; i < n; i++) {
    if (esc)
      esc = false;
    else if (h[i] == '\\')
      esc = true;
    else if (h[i] == '"')
      break;
  }
  if (i >= n)
    return NULL;
  json_t *s = json_loadb(h + at, i + 1 - at, JSON_DECODE_ANY, NULL);
  char *out = NULL;
  if (json_is_string(s) && strlen(json_string_value(s)) == json_string_length(s))
    out = bs_strdup(json_string_value(s));
  json_decref(s);
  return out;
}

/* Start of the string token that ends just before h[end] (jansson reports
 * a duplicate key at the byte after it). Inside a JSON string every '"' is
 * escaped, so going backwards the first quote preceded by an even number of
 * backslashes opens the token. */
static size_t token_start(const char *h, size_t end)
{
  if (end < 2 || h[end - 1] != '"')
    return SIZE_MAX;
  for (size_t i = end - 1; i-- > 0;) {
    if (h[i] != '"')
      continue;
    size_t bs = 0;
    while (bs < i && h[i - 1 - bs] == '\\')
      bs++;
    if (bs % 2 == 0)
      return i;
  }
  return SIZE_MAX;
}

/* Turn a jansson parse error into ours: file offset, the enclosing tensor
 * when there is one, and a message in the user's terms. */
static int parse_failure(const char *h, size_t n, const json_error_t *je, bool oom, bs_err *err)
{
  enum json_error_code code = json_error_code(je);
  size_t pos = je->position > 0 ? (size_t)je->position : 0;
  if (pos > n)
    pos = n;
  uint64_t off = PREFIX + pos;
  if (code == json_error_out_of_memory || oom)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory parsing the header");
  if (code == json_error_invalid_utf8)
    return bs_fail(err, EINVAL, off, NULL, "header is not valid UTF-8: %s (header byte %zu)",
                   je->text, pos);

  struct scan sc = {0};
  if (code == json_error_duplicate_key) {
    size_t at = token_start(h, pos);
    char *key = at == SIZE_MAX ? NULL : decode_key_at(h, n, at);
    if (at != SIZE_MAX) {
      off = PREFIX + at;
      scan_text(h, at, &sc);
    }
    int rc;
    if (key && sc.depth == 1 && strcmp(key, "__metadata__") == 0)
      rc = bs_fail(err, EINVAL, off, NULL, "duplicate __metadata__ in the header");
    else if (key && sc.depth == 1)
      rc = bs_fail(err, EINVAL, off, key, "duplicate tensor name '%.80s' in the header", key);
    else
      rc = bs_fail(err, EINVAL, off, NULL, "duplicate key in the header: %s", je->text);
    bs_free(key);
    return rc;
  }

  /* Name the tensor the error sits in, if any. */
  scan_text(h, pos, &sc);
  char *key = sc.depth >= 2 ? decode_key_at(h, n, sc.last_key) : NULL;
  int rc;
  if (code == json_error_numeric_overflow)
    rc = bs_fail(err, EINVAL, off, key,
                 "integer too large: %s (header integers must be below 2^63; burnstore reads "
                 "them as signed 64-bit)",
                 je->text);
  else if (code == json_error_null_byte_in_key)
    rc = bs_fail(err, ENOTSUP, off, key,
                 "a key in the header contains \\u0000, which burnstore cannot represent (%s)",
                 je->text);
  else if (code == json_error_end_of_input_expected)
    rc = bs_fail(err, EINVAL, off, key,
                 "trailing characters after the header's JSON object: %s (only space, tab, CR "
                 "and LF may pad the header)",
                 je->text);
  else
    rc = bs_fail(err, EINVAL, off, key, "header is not valid JSON: %s (line %d, column %d)",
                 je->text, je->line, je->column);
  bs_free(key);
  return rc;
}

/* NUL padding is the one invalid padding seen in the wild; say so plainly
 * rather than let the parser call it trailing characters. */
static int check_nul_padding(const char *h, size_t n, bs_err *err)
{
  size_t i = n;
  while (i > 0 && (h[i - 1] == ' ' || h[i - 1] == '\t' || h[i - 1] == '\r' || h[i - 1] == '\n' ||
                   h[i - 1] == '\0'))
    i--;
  const char *nul = memchr(h + i, '\0', n - i);
  if (!nul)
    return 0;
  return bs_fail(err, EINVAL, PREFIX + (uint64_t)(nul - h), NULL,
                 "header is padded with NUL bytes (from header byte %zu); SafeTensors allows "
                 "only space, tab, CR and LF after the JSON object",
                 (size_t)(nul - h));
}

/* ---- Entries ----------------------------------------------------------- */

static int get_u64(const json_t *v, const char *field, size_t idx, const char *name, uint64_t off,
                   uint64_t *out, bs_err *err)
{
  if (json_is_integer(v)) {
    json_int_t x = json_integer_value(v);
    if (x < 0)
      return bs_fail(err, EINVAL, off, name,
                     "%s[%zu] is %" JSON_INTEGER_FORMAT ", not a non-negative integer", field, idx,
                     x);
    *out = (uint64_t)x;
    return 0;
  }
  if (json_is_real(v))
    return bs_fail(err, EINVAL, off, name,
                   "%s[%zu] is the real number %g; only integers (no fraction, no exponent) "
                   "are allowed",
                   field, idx, json_real_value(v));
  return bs_fail(err, EINVAL, off, name, "%s[%zu] is %s, not a non-negative integer", field, idx,
                 type_name(v));
}

static const json_t *get_field(const json_t *obj, const char *field, json_type want,
                               const char *name, uint64_t off, bs_err *err)
{
  const json_t *v = json_object_get(obj, field);
  if (!v) {
    bs_fail(err, EINVAL, off, name,
            "missing field \"%s\" (each tensor needs dtype, shape and data_offsets)", field);
    return NULL;
  }
  if (json_typeof(v) != want) {
    bs_fail(err, EINVAL, off, name, "field \"%s\" is %s, not %s", field, type_name(v),
            want == JSON_STRING ? "a string" : "an array");
    return NULL;
  }
  return v;
}

static int parse_entry(const json_t *val, const char *name, uint64_t off, struct entry *e,
                       struct dims *dims, bs_err *err)
{
  memset(e, 0, sizeof *e);
  e->name = name;
  e->pos = (uint32_t)off; /* < 8 + BS_ST_MAX_HEADER */
  if (!json_is_object(val))
    return bs_fail(err, EINVAL, off, name,
                   "entry is %s, not an object with dtype, shape and data_offsets", type_name(val));
  if (strlen(name) > BS_MAX_KEY_LEN)
    return bs_fail(err, ENOTSUP, off, NULL, "tensor name of %zu bytes exceeds the limit of %u",
                   strlen(name), BS_MAX_KEY_LEN);

  const json_t *dt = get_field(val, "dtype", JSON_STRING, name, off, err);
  if (!dt)
    return -1;
  const char *dts = json_string_value(dt);
  bool known = false;
  if (strlen(dts) == json_string_length(dt))
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0] && !known; i++)
      known = strcmp(dts, st_dtypes[i]) == 0;
  if (!known || bs_dtype_from_name(dts, &e->dtype) != 0)
    return bs_fail(err, ENOTSUP, off, name,
                   "unknown dtype \"%.40s\" (SafeTensors has BOOL, U8-U64, I8-I64, F16, BF16, "
                   "F32, F64, C64, F4, F6_E2M3, F6_E3M2 and F8_E5M2, F8_E4M3, F8_E8M0, "
                   "F8_E4M3FNUZ, F8_E5M2FNUZ)",
                   dts);

  const json_t *shape = get_field(val, "shape", JSON_ARRAY, name, off, err);
  if (!shape)
    return -1;
  size_t rank = json_array_size(shape);
  if (rank > BS_MAX_RANK)
    return bs_fail(err, ENOTSUP, off, name, "rank %zu exceeds the limit of %u", rank, BS_MAX_RANK);
  if (bs_grow((void **)&dims->v, &dims->cap, dims->n + rank, sizeof *dims->v) != 0)
    return bs_fail(err, ENOMEM, off, name, "out of memory");
  e->rank = (uint32_t)rank;
  e->dims = (uint32_t)dims->n; /* <= the header's length */
  for (size_t i = 0; i < rank; i++)
    if (get_u64(json_array_get(shape, i), "shape", i, name, off, &dims->v[dims->n + i], err))
      return -1;
  dims->n += rank;

  const json_t *offs = get_field(val, "data_offsets", JSON_ARRAY, name, off, err);
  if (!offs)
    return -1;
  if (json_array_size(offs) != 2)
    return bs_fail(err, EINVAL, off, name, "data_offsets has %zu entries, expected [BEGIN, END]",
                   json_array_size(offs));
  if (get_u64(json_array_get(offs, 0), "data_offsets", 0, name, off, &e->begin, err) ||
      get_u64(json_array_get(offs, 1), "data_offsets", 1, name, off, &e->end, err))
    return -1;
  return 0;
}

/* __metadata__: a string -> string map, or null for none. */
static int check_meta(const json_t *meta, uint64_t off, bs_err *err)
{
  if (json_is_null(meta))
    return 0;
  if (!json_is_object(meta))
    return bs_fail(err, EINVAL, off, NULL, "__metadata__ is %s, not an object of strings",
                   type_name(meta));
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)meta, k, v)
  {
    if (!json_is_string(v))
      return bs_fail(err, EINVAL, off, NULL,
                     "__metadata__ value of \"%.60s\" is %s; metadata values must be strings", k,
                     type_name(v));
    if (strlen(json_string_value(v)) != json_string_length(v))
      return bs_fail(err, ENOTSUP, off, NULL,
                     "__metadata__ value of \"%.60s\" contains \\u0000, which burnstore cannot "
                     "represent",
                     k);
  }
  return 0;
}

/* ---- The streaming parse ----------------------------------------------
 * A well-formed header is read in one pass over its text, with no JSON tree:
 * strings are decoded in place (a decoded string is never longer than its
 * token), entries go straight into the entry array, and nothing is kept but
 * what the catalog needs. Anything this pass does not accept outright (an
 * escape it cannot keep, a real number, an unknown field, a duplicate, any
 * error) sends the whole header to the jansson path above, which gives the
 * exact verdict and message; the header bytes are then read again, as this
 * pass changed them. So the fast pass only ever accepts what jansson and
 * parse_entry would accept, with the same entries in the same order. */

enum fp_result { FP_OK, FP_FALLBACK, FP_NOMEM };

struct fp {
  char *h; /* the header text, decoded in place */
  size_t n, i;
};

static void fp_ws(struct fp *p)
{
  while (p->i < p->n && is_space((uint8_t)p->h[p->i]))
    p->i++;
}

static bool fp_eat(struct fp *p, char c)
{
  fp_ws(p);
  if (p->i < p->n && p->h[p->i] == c) {
    p->i++;
    return true;
  }
  return false;
}

static char *put_utf8(char *w, uint32_t cp)
{
  if (cp < 0x80) {
    *w++ = (char)cp;
  } else if (cp < 0x800) {
    *w++ = (char)(0xC0 | cp >> 6);
    *w++ = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *w++ = (char)(0xE0 | cp >> 12);
    *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *w++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *w++ = (char)(0xF0 | cp >> 18);
    *w++ = (char)(0x80 | (cp >> 12 & 0x3F));
    *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *w++ = (char)(0x80 | (cp & 0x3F));
  }
  return w;
}

/* A string token at p->i (after whitespace): decoded in place into a C
 * string (no NUL inside), *at gets the offset of its opening quote. */
static bool fp_string(struct fp *p, char **out, size_t *at)
{
  fp_ws(p);
  if (p->i >= p->n || p->h[p->i] != '"')
    return false;
  *at = p->i;
  char *start = p->h + p->i + 1, *w = start;
  size_t i = p->i + 1;
  while (i < p->n) {
    uint8_t c = (uint8_t)p->h[i];
    if (c == '"') {
      *w = '\0';
      *out = start;
      p->i = i + 1;
      return true;
    }
    if (c < 0x20)
      return false;
    if (c == '\\') {
      if (i + 1 >= p->n)
        return false;
      char e = p->h[i + 1];
      i += 2;
      switch (e) {
      case '"': *w++ = '"'; continue;
      case '\\': *w++ = '\\'; continue;
      case '/': *w++ = '/'; continue;
      case 'b': *w++ = '\b'; continue;
      case 'f': *w++ = '\f'; continue;
      case 'n': *w++ = '\n'; continue;
      case 'r': *w++ = '\r'; continue;
      case 't': *w++ = '\t'; continue;
      case 'u': break;
      default: return false;
      }
      uint32_t cp;
      if (i + 4 > p->n || bs_hex4(p->h + i, &cp) != 0 || cp == 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
        return false;
      i += 4;
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t lo;
        if (i + 6 > p->n || p->h[i] != '\\' || p->h[i + 1] != 'u' || bs_hex4(p->h + i + 2, &lo) ||
            lo < 0xDC00 || lo > 0xDFFF)
          return false;
        i += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      w = put_utf8(w, cp);
      continue;
    }
    size_t len = bs_utf8_len((const uint8_t *)p->h + i, p->n - i);
    if (!len)
      return false;
    memmove(w, p->h + i, len);
    w += len;
    i += len;
  }
  return false;
}

/* A non-negative integer below 2^63 (no sign, fraction or exponent, no
 * leading zero). */
static bool fp_u63(struct fp *p, uint64_t *v)
{
  fp_ws(p);
  size_t i = p->i;
  if (i >= p->n || p->h[i] < '0' || p->h[i] > '9')
    return false;
  if (p->h[i] == '0' && i + 1 < p->n && p->h[i + 1] >= '0' && p->h[i + 1] <= '9')
    return false;
  uint64_t x = 0;
  for (; i < p->n && p->h[i] >= '0' && p->h[i] <= '9'; i++) {
    if (x > (UINT64_C(0x7FFFFFFFFFFFFFFF) - 9) / 10)
      return false;
    x = x * 10 + (uint64_t)(p->h[i] - '0');
  }
  if (i < p->n && (p->h[i] == '.' || p->h[i] == 'e' || p->h[i] == 'E'))
    return false;
  p->i = i;
  *v = x;
  return true;
}

static enum fp_result fp_entry(struct fp *p, const char *name, uint64_t off, struct entry *e,
                               struct dims *dims)
{
  memset(e, 0, sizeof *e);
  e->name = name;
  e->pos = (uint32_t)off; /* < 8 + BS_ST_MAX_HEADER */
  if (strlen(name) > BS_MAX_KEY_LEN || !fp_eat(p, '{'))
    return FP_FALLBACK;
  bool have_dt = false, have_shape = false, have_offs = false;
  if (fp_eat(p, '}'))
    return FP_FALLBACK; /* missing fields */
  do {
    char *field;
    size_t at;
    if (!fp_string(p, &field, &at) || !fp_eat(p, ':'))
      return FP_FALLBACK;
    if (strcmp(field, "dtype") == 0 && !have_dt) {
      char *dts;
      bool known = false;
      if (!fp_string(p, &dts, &at))
        return FP_FALLBACK;
      for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0] && !known; i++)
        known = strcmp(dts, st_dtypes[i]) == 0;
      if (!known || bs_dtype_from_name(dts, &e->dtype) != 0)
        return FP_FALLBACK;
      have_dt = true;
    } else if (strcmp(field, "shape") == 0 && !have_shape) {
      if (!fp_eat(p, '['))
        return FP_FALLBACK;
      e->dims = (uint32_t)dims->n; /* <= the header's length */
      if (!fp_eat(p, ']')) {
        do {
          uint64_t v;
          if (e->rank >= BS_MAX_RANK || !fp_u63(p, &v))
            return FP_FALLBACK;
          if (bs_grow((void **)&dims->v, &dims->cap, dims->n + 1, sizeof *dims->v) != 0)
            return FP_NOMEM;
          dims->v[dims->n++] = v;
          e->rank++;
        } while (fp_eat(p, ','));
        if (!fp_eat(p, ']'))
          return FP_FALLBACK;
      }
      have_shape = true;
    } else if (strcmp(field, "data_offsets") == 0 && !have_offs) {
      if (!fp_eat(p, '[') || !fp_u63(p, &e->begin) || !fp_eat(p, ',') || !fp_u63(p, &e->end) ||
          !fp_eat(p, ']'))
        return FP_FALLBACK;
      have_offs = true;
    } else {
      return FP_FALLBACK; /* an unknown field (to skip) or a duplicate one */
    }
  } while (fp_eat(p, ','));
  if (!fp_eat(p, '}') || !have_dt || !have_shape || !have_offs)
    return FP_FALLBACK;
  return FP_OK;
}

/* __metadata__: null, or an object of strings with distinct keys. */
static enum fp_result fp_meta(struct fp *p, struct meta_kv **kv, size_t *nkv)
{
  fp_ws(p);
  if (p->n - p->i >= 4 && memcmp(p->h + p->i, "null", 4) == 0) {
    p->i += 4;
    return FP_OK;
  }
  if (!fp_eat(p, '{'))
    return FP_FALLBACK;
  if (fp_eat(p, '}'))
    return FP_OK;
  size_t cap = 0;
  do {
    char *k, *v;
    size_t at;
    if (!fp_string(p, &k, &at) || !fp_eat(p, ':') || !fp_string(p, &v, &at))
      return FP_FALLBACK;
    if (*nkv >= 1024)
      return FP_FALLBACK; /* the duplicate check below is quadratic */
    for (size_t j = 0; j < *nkv; j++)
      if (strcmp((*kv)[j].k, k) == 0)
        return FP_FALLBACK;
    if (bs_grow((void **)kv, &cap, *nkv + 1, sizeof **kv) != 0)
      return FP_NOMEM;
    (*kv)[(*nkv)++] = (struct meta_kv){k, v};
  } while (fp_eat(p, ','));
  return fp_eat(p, '}') ? FP_OK : FP_FALLBACK;
}

/* Two entries of one name? (A hash pass; jansson gives the message.) */
static enum fp_result fp_unique(const struct entry *ents, size_t n)
{
  size_t cap = 16;
  while (cap < 2 * n)
    cap *= 2;
  size_t *slot = bs_calloc(cap, sizeof *slot);
  if (!slot)
    return FP_NOMEM;
  enum fp_result r = FP_OK;
  for (size_t k = 0; k < n && r == FP_OK; k++) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *c = (const unsigned char *)ents[k].name; *c; c++)
      h = (h ^ *c) * 1099511628211ull;
    for (size_t i = (size_t)h & (cap - 1);; i = (i + 1) & (cap - 1)) {
      if (!slot[i]) {
        slot[i] = k + 1;
        break;
      }
      if (strcmp(ents[slot[i] - 1].name, ents[k].name) == 0) {
        r = FP_FALLBACK;
        break;
      }
    }
  }
  bs_free(slot);
  return r;
}

/* The whole header; *ents grows as it goes (a large realloc moves pages,
 * touching only what is used) and is trimmed by the caller. */
static enum fp_result fp_header(struct fp *p, struct entry **ents, size_t *cap, size_t *nents,
                                struct dims *dims, struct meta_kv **kv, size_t *nkv,
                                bool *have_meta)
{
  if (!fp_eat(p, '{'))
    return FP_FALLBACK;
  if (!fp_eat(p, '}')) {
    do {
      char *key;
      size_t at;
      if (!fp_string(p, &key, &at) || !fp_eat(p, ':'))
        return FP_FALLBACK;
      if (strcmp(key, "__metadata__") == 0) {
        if (*have_meta)
          return FP_FALLBACK;
        *have_meta = true;
        enum fp_result r = fp_meta(p, kv, nkv);
        if (r != FP_OK)
          return r;
        continue;
      }
      if (*nents >= *cap && bs_grow((void **)ents, cap, *nents + 1, sizeof **ents) != 0)
        return FP_NOMEM;
      enum fp_result r = fp_entry(p, key, PREFIX + at, &(*ents)[*nents], dims);
      if (r != FP_OK)
        return r;
      (*nents)++;
    } while (fp_eat(p, ','));
    if (!fp_eat(p, '}'))
      return FP_FALLBACK;
  }
  fp_ws(p);
  if (p->i != p->n)
    return FP_FALLBACK;
  return fp_unique(*ents, *nents);
}

static int cmp_entry(const void *a, const void *b)
{
  const struct entry *x = *(const struct entry *const *)a, *y = *(const struct entry *const *)b;
  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  return x < y ? -1 : x > y; /* header order: a deterministic sort */
}

/* Rule 6 of the spec: sorted by (BEGIN, END) the tensors tile the data
 * buffer from 0. *d gets its length. */
/* An entry's shape in the flat dims array, which is NULL when every tensor
 * is a scalar. */
static const uint64_t *shape_of(const uint64_t *dims, const struct entry *e)
{
  return e->rank ? dims + e->dims : NULL;
}

static int check_layout(struct entry **sorted, size_t n, const uint64_t *dims, uint64_t *d,
                        bs_err *err)
{
  uint64_t cursor = 0;
  const struct entry *prev = NULL;
  for (size_t i = 0; i < n; i++) {
    const struct entry *e = sorted[i];
    if (e->begin != cursor) {
      if (!prev)
        return bs_fail(err, EINVAL, e->pos, e->name,
                       "gap: the first tensor in data order starts at %" PRIu64
                       ", expected 0 (data_offsets are relative to the data buffer)",
                       e->begin);
      if (e->begin > cursor)
        return bs_fail(err, EINVAL, e->pos, e->name,
                       "gap: data_offsets start at %" PRIu64 ", expected %" PRIu64
                       " where tensor '%.60s' ends (%" PRIu64 " bytes belong to no tensor)",
                       e->begin, cursor, prev->name, e->begin - cursor);
      return bs_fail(err, EINVAL, e->pos, e->name,
                     "overlap: data_offsets start at %" PRIu64 ", expected %" PRIu64
                     " where tensor '%.60s' ends (two tensors share bytes)",
                     e->begin, cursor, prev->name);
    }
    if (e->end < e->begin)
      return bs_fail(err, EINVAL, e->pos, e->name,
                     "data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", e->begin,
                     e->end);
    uint64_t nbytes;
    if (bs_dtype_nbytes(e->dtype, e->rank, shape_of(dims, e), &nbytes, e->name, e->pos, err) != 0)
      return -1;
    if (e->end - e->begin != nbytes) {
      char sh[96];
      bs_shape_format(sh, sizeof sh, e->rank, shape_of(dims, e));
      return bs_fail(err, EINVAL, e->pos, e->name,
                     "size mismatch: shape %s x %s = %" PRIu64
                     " bytes but data_offsets span %" PRIu64,
                     sh, bs_dtype_name(e->dtype), nbytes, e->end - e->begin);
    }
    cursor = e->end;
    prev = e;
  }
  *d = cursor;
  return 0;
}

static int fill(struct bs_catalog *cat, uint32_t src, uint64_t data_start,
                const struct meta_kv *meta, size_t nmeta, const struct entry *ents, size_t n,
                const uint64_t *dims, bs_err *err)
{
  for (size_t i = 0; i < nmeta; i++)
    if (bs_catalog_add_meta(cat, meta[i].k, meta[i].v, err) != 0)
      return -1;
  if (bs_catalog_reserve(cat, n) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const struct entry *e = &ents[i];
    struct bs_tensor *t =
        bs_catalog_add(cat, e->name, e->dtype, e->rank, shape_of(dims, e), e->pos, err);
    if (!t)
      return -1;
    t->src = src;
    t->off = data_start + e->begin; /* <= file size: checked by the caller */
  }
  return 0;
}

/* Copy string p to *o, advance *o past it; the copy. */
static const char *move_str(char **o, const char *p)
{
  size_t l = strlen(p) + 1;
  char *at = memcpy(*o, p, l);
  *o += l;
  return at;
}

/* Copy every string the entries and metadata point to from *hbuf into one
 * block of their own, point them there and replace *hbuf with it. */
static int compact_strings(uint8_t **hbuf, struct entry *ents, size_t n, struct meta_kv *kv,
                           size_t nkv, bs_err *err)
{
  size_t total = 1;
  for (size_t i = 0; i < n; i++)
    total += strlen(ents[i].name) + 1;
  for (size_t i = 0; i < nkv; i++)
    total += strlen(kv[i].k) + strlen(kv[i].v) + 2;
  char *b = bs_malloc(total), *o = b;
  if (!b)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < n; i++)
    ents[i].name = move_str(&o, ents[i].name);
  for (size_t i = 0; i < nkv; i++) {
    kv[i].k = move_str(&o, kv[i].k);
    kv[i].v = move_str(&o, kv[i].v);
  }
  bs_free(*hbuf);
  *hbuf = (uint8_t *)b;
  return 0;
}

/* YES: a header length of at least 2 that fits in the file, then '{' (after
 * optional whitespace). MAYBE: '{' at byte 8 but the length does not fit
 * (truncated or corrupt), so that bs_st_read says which. */
enum bs_sniff bs_st_sniff(const uint8_t *head, size_t n, uint64_t size)
{
  if (n <= PREFIX)
    return BS_SNIFF_NO;
  uint64_t hlen = bs_le64(head);
  bool fits = hlen >= 2 && hlen <= size - PREFIX;
  size_t end = hlen < n - PREFIX ? PREFIX + (size_t)hlen : n; /* header bytes we see */
  size_t i = PREFIX;
  while (i < end && is_space(head[i]))
    i++;
  if (i < end)
    return head[i] != '{' ? BS_SNIFF_NO : fits ? BS_SNIFF_YES : BS_SNIFF_MAYBE;
  /* Only whitespace seen: fine if the header goes on past what we see. */
  return fits && end == n && n - PREFIX < hlen ? BS_SNIFF_YES : BS_SNIFF_NO;
}

/* The jansson path: the whole header as a tree, every rule checked with
 * its message. *root (freed by the caller) owns the strings the entries and
 * *mkv point to. */
static int json_path(const char *h, size_t n, json_t **rootp, struct entry **entsp, size_t *nents,
                     struct dims *dims, struct meta_kv **mkv, size_t *nmkv, bs_err *err)
{
  json_error_t je;
  unsigned long failures = bs_json_alloc_failures();
  json_t *root = *rootp = json_loadb(h, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
  if (!root)
    return parse_failure(h, n, &je, bs_json_alloc_failures() != failures, err);
  /* jansson's lexer ignores a failed growth of its string buffer: the text
   * parses, with bytes silently dropped from a string. */
  if (bs_json_alloc_failures() != failures)
    return bs_fail(err, ENOMEM, PREFIX, NULL, "out of memory parsing the header");
  if (!json_is_object(root))
    return bs_fail(err, EINVAL, PREFIX, NULL, "header is %s, not a JSON object", type_name(root));

  size_t nkeys = json_object_size(root);
  struct scan sc = {0};
  sc.cap = nkeys;
  sc.keys = bs_calloc(nkeys, sizeof *sc.keys);
  struct entry *ents = *entsp = bs_calloc(nkeys, sizeof *ents);
  if (!sc.keys || !ents) {
    bs_free(sc.keys);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  scan_text(h, n, &sc);
  bool have_pos = sc.nkeys == nkeys; /* always, for text jansson accepted */

  int rc = -1;
  size_t i = 0;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val)
  {
    uint64_t off = have_pos ? PREFIX + sc.keys[i] : PREFIX;
    i++;
    if (strcmp(key, "__metadata__") == 0) {
      if (check_meta(val, off, err) != 0)
        goto out;
      size_t cap = 0;
      const char *k;
      const json_t *v;
      json_object_foreach(val, k, v)
      {
        if (bs_grow((void **)mkv, &cap, *nmkv + 1, sizeof **mkv) != 0) {
          bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
          goto out;
        }
        (*mkv)[(*nmkv)++] = (struct meta_kv){k, json_string_value(v)};
      }
      continue;
    }
    if (parse_entry(val, key, off, &ents[*nents], dims, err) != 0)
      goto out;
    (*nents)++;
  }
  rc = 0;
out:
  bs_free(sc.keys);
  return rc;
}

int bs_st_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts, bs_err *err)
{
  (void)opts;
  bs_formats_init();
  if (src >= cat->nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "no source %u in the catalog", src);
  const struct bs_src *s = &cat->srcs[src];
  uint8_t prefix[PREFIX];
  if (s->size < PREFIX)
    return bs_fail(err, EINVAL, 0, NULL,
                   "file is %" PRIu64 " bytes, too short for the 8-byte SafeTensors header "
                   "length",
                   s->size);
  if (bs_src_read(s, 0, prefix, PREFIX, err) != 0)
    return -1;
  uint64_t hlen = bs_le64(prefix);
  if (hlen > BS_ST_MAX_HEADER)
    return bs_fail(err, EINVAL, 0, NULL,
                   "header length %" PRIu64 " exceeds the limit of %u bytes (corrupt length "
                   "prefix, or not a SafeTensors file)",
                   hlen, BS_ST_MAX_HEADER);
  if (hlen > s->size - PREFIX)
    return bs_fail(err, EINVAL, 0, NULL,
                   "header length %" PRIu64 " runs past the end of the file: 8 + %" PRIu64
                   " > file size %" PRIu64 " (truncated?)",
                   hlen, hlen, s->size);

  int rc = -1;
  const struct bs_catalog_mark mark = bs_catalog_mark(cat);
  const size_t n = (size_t)hlen;
  uint8_t *hbuf = NULL;
  json_t *root = NULL;
  struct entry *ents = NULL, **sorted = NULL;
  struct dims dims = {0};
  struct meta_kv *mkv = NULL;
  size_t nents = 0, nmkv = 0;
  if (bs_src_read_alloc(s, PREFIX, n, &hbuf, err) != 0)
    goto out;
  const char *h = (const char *)hbuf;
  if (check_nul_padding(h, n, err) != 0)
    goto out;

  /* The streaming pass; the jansson path for whatever it does not accept. */
  struct fp fp = {(char *)hbuf, n, 0};
  bool have_meta = false;
  size_t entcap = 0;
  enum fp_result fr = fp_header(&fp, &ents, &entcap, &nents, &dims, &mkv, &nmkv, &have_meta);
  if (fr == FP_OK && entcap > nents && nents) {
    struct entry *e = bs_realloc(ents, nents * sizeof *e); /* exact size */
    if (e)
      ents = e;
  }
  if (fr == FP_NOMEM) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory parsing the header");
    goto out;
  }
  if (fr == FP_FALLBACK) {
    /* The pass decoded strings in place: read the text again. */
    nents = dims.n = nmkv = 0;
    bs_free(ents);
    ents = NULL;
    bs_free(hbuf);
    hbuf = NULL;
    if (bs_src_read_alloc(s, PREFIX, n, &hbuf, err) != 0)
      goto out;
    h = (const char *)hbuf;
    if (json_path(h, n, &root, &ents, &nents, &dims, &mkv, &nmkv, err) != 0)
      goto out;
  }

  /* The keys and metadata strings, decoded in place in the header's text,
   * move to a block of their own and the text goes: at a million tensors
   * the text is 70 bytes a tensor, held through the catalog's fill
   * otherwise (the mount's peak memory; issue 34). */
  if (!root && compact_strings(&hbuf, ents, nents, mkv, nmkv, err) != 0)
    goto out;

  sorted = bs_calloc(nents, sizeof *sorted);
  if (!sorted) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (size_t k = 0; k < nents; k++)
    sorted[k] = &ents[k];
  qsort(sorted, nents, sizeof *sorted, cmp_entry);
  uint64_t d = 0;
  if (check_layout(sorted, nents, dims.v, &d, err) != 0)
    goto out;

  /* 8 + N + D must be the file size exactly. No overflow: N <= 1e8 and every
   * offset is below 2^63. */
  uint64_t data_start = PREFIX + hlen, avail = s->size - data_start;
  if (d > avail) {
    const struct entry *cut = NULL;
    for (size_t k = 0; k < nents && !cut; k++)
      if (sorted[k]->end > avail)
        cut = sorted[k];
    bs_fail(err, EINVAL, s->size, cut ? cut->name : NULL,
            "file truncated: file has %" PRIu64 " bytes, header says %" PRIu64 " (8 + %" PRIu64
            " header + %" PRIu64 " data)",
            s->size, data_start + d, hlen, d);
    goto out;
  }
  if (d < avail) {
    bs_fail(err, EINVAL, data_start + d, NULL,
            "%" PRIu64 " bytes after the last tensor (data ends at %" PRIu64 ", file has %" PRIu64
            " bytes)",
            avail - d, data_start + d, s->size);
    goto out;
  }
  bs_free(sorted); /* (not needed by fill: less at the peak) */
  sorted = NULL;

  if (fill(cat, src, data_start, mkv, nmkv, ents, nents, dims.v, err) != 0)
    goto out;
  rc = 0;
out:
  if (rc != 0)
    bs_catalog_rollback(cat, &mark);
  bs_free(sorted);
  bs_free(mkv);
  bs_free(dims.v);
  bs_free(ents);
  json_decref(root);
  bs_free(hbuf);
  return rc;
}
