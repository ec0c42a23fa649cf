/* The .npy header: built for the views, parsed (untrusted) for .npy files
 * written into a writable mount. See npy.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/npy.h"

static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

struct descr_row {
  enum bs_dtype dt;
  const char *descr;
  bool exact;
};

/* Served descr per dtype. The first row of a descr is also what parsing it
 * gives back (so "<u2" is U16, never BF16). */
static const struct descr_row rows[] = {
    {BS_DT_F64, "<f8", true},          {BS_DT_F32, "<f4", true},
    {BS_DT_F16, "<f2", true},          {BS_DT_I64, "<i8", true},
    {BS_DT_I32, "<i4", true},          {BS_DT_I16, "<i2", true},
    {BS_DT_I8, "|i1", true},           {BS_DT_U64, "<u8", true},
    {BS_DT_U32, "<u4", true},          {BS_DT_U16, "<u2", true},
    {BS_DT_U8, "|u1", true},           {BS_DT_BOOL, "|b1", true},
    {BS_DT_C64, "<c8", true},          {BS_DT_C128, "<c16", true},
    {BS_DT_FLEX32, "<f4", false},      {BS_DT_BOOL_U8, "|b1", false},
    {BS_DT_BOOL_U32, "<u4", false},    {BS_DT_BF16, "<u2", false},
    {BS_DT_F8_E4M3, "|u1", false},     {BS_DT_F8_E5M2, "|u1", false},
    {BS_DT_F8_E8M0, "|u1", false},     {BS_DT_F8_E4M3FNUZ, "|u1", false},
    {BS_DT_F8_E5M2FNUZ, "|u1", false}, {BS_DT_QI8, "|i1", false},
    {BS_DT_QU8, "|u1", false},         {BS_DT_QI32, "<i4", false},
};
#define NROWS (sizeof rows / sizeof rows[0])

const char *bs_npy_descr(enum bs_dtype dt, bool *exact)
{
  for (size_t i = 0; i < NROWS; i++)
    if (rows[i].dt == dt) {
      if (exact)
        *exact = rows[i].exact;
      return rows[i].descr;
    }
  if (exact)
    *exact = false;
  return NULL;
}

/* The dict, unpadded, into buf (snprintf contract). */
static size_t dict_text(const char *descr, uint32_t rank, const uint64_t *shape, char *buf,
                        size_t cap)
{
  size_t len = 0;
#define PUT(...)                                                                                   \
  do {                                                                                             \
    int w_ = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__);       \
    len += w_ > 0 ? (size_t)w_ : 0;                                                                \
  } while (0)
  PUT("{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (uint32_t i = 0; i < rank; i++)
    PUT("%s%" PRIu64, i ? ", " : "", shape[i]);
  PUT("%s), }", rank == 1 ? "," : "");
#undef PUT
  return len;
}

/* Total header length for a dict of dlen bytes (+1 for the '\n'). */
static size_t total_len(size_t dlen, int *version)
{
  size_t t = 10 + dlen + 1;
  t = (t + 63) / 64 * 64;
  if (t - 10 <= 0xffff) {
    *version = 1;
    return t;
  }
  *version = 2;
  t = 12 + dlen + 1;
  return (t + 63) / 64 * 64;
}

size_t bs_npy_header_len(enum bs_dtype dt, uint32_t rank, const uint64_t *shape)
{
  const char *d = bs_npy_descr(dt, NULL);
  if (!d || rank > BS_MAX_RANK)
    return 0;
  int v;
  return total_len(dict_text(d, rank, shape, NULL, 0), &v);
}

int bs_npy_header(enum bs_dtype dt, uint32_t rank, const uint64_t *shape, char *buf, size_t cap,
                  size_t *len, bs_err *err)
{
  const char *d = bs_npy_descr(dt, NULL);
  if (!d)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "dtype %s has no NumPy equivalent",
                   bs_dtype_name(dt));
  if (rank > BS_MAX_RANK)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "rank %u is over %u", rank, BS_MAX_RANK);
  size_t dlen = dict_text(d, rank, shape, NULL, 0);
  int v;
  size_t t = total_len(dlen, &v);
  if (t > cap || t > BS_NPY_MAX_HEADER)
    return bs_fail(err, ENAMETOOLONG, BS_OFF_NONE, NULL, "a %zu-byte .npy header is too long", t);
  size_t pre = v == 1 ? 10 : 12;
  memcpy(buf, magic, 6);
  buf[6] = (char)v;
  buf[7] = 0;
  if (v == 1)
    bs_put_le16((uint8_t *)buf + 8, (uint16_t)(t - pre));
  else
    bs_put_le32((uint8_t *)buf + 8, (uint32_t)(t - pre));
  dict_text(d, rank, shape, buf + pre, t - pre);
  memset(buf + pre + dlen, ' ', t - pre - dlen - 1);
  buf[t - 1] = '\n';
  *len = t;
  return 0;
}

bool bs_npy_name(const char *s, size_t n)
{
  return n > 4 && memcmp(s + n - 4, ".npy", 4) == 0;
}

bool bs_npy_is_npy(const uint8_t *p, size_t n)
{
  return n >= 6 && memcmp(p, magic, 6) == 0;
}

/* ---- Parsing ---------------------------------------------------------------------------- */

struct cur {
  const char *p, *end;
  size_t base; /* offset of p's start in the file, for messages */
  const char *start;
};

static size_t at(const struct cur *c)
{
  return c->base + (size_t)(c->p - c->start);
}

static void ws(struct cur *c)
{
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
}

static bool eat(struct cur *c, char ch)
{
  ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return true;
  }
  return false;
}

/* A quoted string ('...' or "..."), without escapes; into out (cap bytes). */
static bool str(struct cur *c, char *out, size_t cap)
{
  ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
    return false;
  char q = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || n + 1 >= cap)
      return false;
    out[n++] = *c->p++;
  }
  if (c->p >= c->end)
    return false;
  c->p++;
  out[n] = '\0';
  return true;
}

static bool word(struct cur *c, const char *w)
{
  ws(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
    c->p += n;
    return true;
  }
  return false;
}

static bool uint(struct cur *c, uint64_t *v)
{
  ws(c);
  if (c->p >= c->end || *c->p < '0' || *c->p > '9')
    return false;
  uint64_t x = 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    if (!bs_mul_u64(x, 10, &x) || !bs_add_u64(x, (uint64_t)(*c->p - '0'), &x))
      return false;
    c->p++;
  }
  if (c->p < c->end && *c->p == 'L') /* Python 2's long suffix */
    c->p++;
  *v = x;
  return true;
}

static int descr_dtype(const char *d, enum bs_dtype *out)
{
  size_t n = strlen(d);
  if (n < 2 || n > 4)
    return -1;
  /* '=' is native: little-endian on every platform burnstore builds for. */
  _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian hosts only");
  char order = d[0];
  const char *rest = d;
  if (order == '<' || order == '|' || order == '=')
    rest = d + 1;
  else if (order == '>')
    return -2;
  else
    order = '=';
  for (size_t i = 0; i < NROWS; i++) {
    const char *r = rows[i].descr;
    if (strcmp(r + 1, rest) != 0)
      continue;
    /* '|' only for one-byte types, '<' / '=' / none for any (numpy accepts '<u1') */
    if (order == '|' && r[0] != '|')
      return -1;
    *out = rows[i].dt;
    return 0;
  }
  return -1;
}

#define BAD(...) bs_fail(err, EINVAL, off, NULL, __VA_ARGS__)

int bs_npy_parse(const uint8_t *p, size_t n, struct bs_npy_info *out, bs_err *err)
{
  uint64_t off = 0;
  memset(out, 0, sizeof *out);
  if (n < 6)
    return bs_fail(err, EAGAIN, 0, NULL, "a .npy header needs more bytes");
  if (!bs_npy_is_npy(p, n))
    return BAD(".npy: no \\x93NUMPY magic");
  if (n < 10)
    return bs_fail(err, EAGAIN, 0, NULL, "a .npy header needs more bytes");
  unsigned major = p[6];
  off = 6;
  if (major < 1 || major > 3)
    return BAD(".npy: format version %u.%u is not 1, 2 or 3", major, p[7]);
  size_t pre = major == 1 ? 10 : 12;
  if (n < pre)
    return bs_fail(err, EAGAIN, 0, NULL, "a .npy header needs more bytes");
  uint64_t hlen = major == 1 ? bs_le16(p + 8) : bs_le32(p + 8);
  off = 8;
  if (hlen > BS_NPY_MAX_HEADER - pre)
    return BAD(".npy: a %" PRIu64 "-byte header is over the %u-byte limit", hlen,
               BS_NPY_MAX_HEADER);
  if (n < pre + hlen)
    return bs_fail(err, EAGAIN, 0, NULL, ".npy: the %" PRIu64 "-byte header needs more bytes",
                   hlen);
  struct cur c = {(const char *)p + pre, (const char *)p + pre + hlen, pre, (const char *)p + pre};
  /* version 3 is UTF-8; we only accept ASCII dicts anyway */
  for (const char *q = c.p; q < c.end; q++)
    if ((unsigned char)*q < 0x20 && *q != '\n' && *q != '\t' && *q != '\r') {
      off = c.base + (size_t)(q - c.start);
      return BAD(".npy: control byte 0x%02x in the header", (unsigned char)*q);
    }
  off = at(&c);
  if (!eat(&c, '{'))
    return BAD(".npy: the header is not a dict");
  bool have_d = false, have_f = false, have_s = false;
  for (;;) {
    off = at(&c);
    if (eat(&c, '}'))
      break;
    char key[32];
    if (!str(&c, key, sizeof key) || !eat(&c, ':'))
      return BAD(".npy: expected 'key': in the header dict");
    off = at(&c);
    if (strcmp(key, "descr") == 0) {
      char d[16];
      if (have_d || !str(&c, d, sizeof d))
        return BAD(".npy: descr is not a simple type string (structured dtypes are not "
                   "tensors)");
      int r = descr_dtype(d, &out->dtype);
      if (r == -2)
        return BAD(".npy: descr '%s' is big-endian; save it little-endian "
                   "(a.astype(a.dtype.newbyteorder('<')))",
                   d);
      if (r != 0)
        return BAD(".npy: descr '%s' has no burnstore dtype", d);
      have_d = true;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (have_f)
        return BAD(".npy: fortran_order given twice");
      if (word(&c, "True"))
        out->fortran_order = true;
      else if (word(&c, "False"))
        out->fortran_order = false;
      else
        return BAD(".npy: fortran_order is not True or False");
      have_f = true;
    } else if (strcmp(key, "shape") == 0) {
      if (have_s || !eat(&c, '('))
        return BAD(".npy: shape is not a tuple");
      for (;;) {
        off = at(&c);
        if (eat(&c, ')'))
          break;
        if (out->rank >= BS_MAX_RANK)
          return BAD(".npy: shape has more than %u dimensions", BS_MAX_RANK);
        if (!uint(&c, &out->shape[out->rank]))
          return BAD(".npy: shape holds something that is not a dimension");
        out->rank++;
        if (!eat(&c, ',')) {
          off = at(&c);
          if (!eat(&c, ')'))
            return BAD(".npy: shape tuple not closed");
          if (out->rank == 1)
            return BAD(".npy: (N) is not a tuple: a 1-D shape is written (N,)");
          break;
        }
      }
      have_s = true;
    } else {
      return BAD(".npy: unknown header key '%s'", key);
    }
    off = at(&c);
    if (!eat(&c, ',')) {
      if (!eat(&c, '}'))
        return BAD(".npy: expected , or } in the header dict");
      break;
    }
  }
  ws(&c);
  off = at(&c);
  if (c.p != c.end)
    return BAD(".npy: bytes after the header dict");
  if (!have_d || !have_f || !have_s)
    return BAD(".npy: the header lacks %s", !have_d   ? "descr"
                                            : !have_f ? "fortran_order"
                                                      : "shape");
  if (bs_dtype_nbytes(out->dtype, out->rank, out->shape, &out->nbytes, NULL, 0, err) != 0)
    return -1;
  if (out->nbytes > BS_MAX_TENSOR_BYTES)
    return BAD(".npy: %" PRIu64 " bytes of data is over the limit", out->nbytes);
  out->header_len = pre + (size_t)hlen;
  return 0;
}
