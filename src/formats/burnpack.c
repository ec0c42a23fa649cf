/* The Burnpack (.bpk) reader, Burn's native checkpoint format.
 *
 * Byte layout (integers little-endian):
 *  1. offset 0, 4 bytes: magic, the bytes "NRUB" (u32 0x4255524E read LE)
 *  2. offset 4, 2 bytes: version, u16; Burn accepts any value <= 1 (0 included)
 *  3. offset 6, 4 bytes: metadata_size M, u32, at most 100 MiB
 *  4. offset 10, M bytes: metadata, one CBOR map:
 *       "tensors":  {name: {"dtype", "shape": [uint...], "data_offsets": [start, end],
 *                   "param_id"?: uint}}                       (required)
 *       "metadata": {text: text}                               (optional)
 *       "scalars":  {name: {"Int"|"UInt"|"Float"|"Bool": v}}  (optional, 0.22+)
 *  5. zero bytes up to D = round_up(10 + M, 256)
 *  6. offset D: tensor data; tensor i is [D + start_i, D + end_i) (offsets relative to D,
 *     in write order, not name order); the file ends at D + max(end_i)
 * Burn 0.19 wrote no padding: data at 10 + M, tensors packed back to back. Both layouts are
 * read; pick_layout() tells them apart by the file size.
 */
#include <cbor.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/burnpack_dtype.h"
#include "formats/cbor_item.h"
#include "formats/formats.h"

#define HDR_LEN 10u

/* ---- Pre-pass over the CBOR heads --------------------------------------------------------
 * libcbor 0.8's cbor_load trusts the file: it allocates a definite container of any claimed
 * size, builds as many items as there are heads, and cbor_decref recurses once per nesting
 * level. So the heads are walked with the streaming decoder first, bounding the nesting
 * depth, container sizes (against the bytes left) and the item count. The walk also records
 * where each descriptor of the "tensors" map starts, for error offsets. Error positions
 * follow cbor_load's convention: the offset of the head that failed. */

enum pc_kind { PC_ARRAY, PC_MAP, PC_TAG, PC_BSTR, PC_TSTR };

struct pc_frame {
  uint8_t kind;
  bool indef;
  bool tensors;  /* the map under the top-level key "tensors" */
  uint64_t left; /* definite: items still to come */
  uint64_t seen; /* items completed */
};

struct precheck {
  const uint8_t *buf;
  size_t len;
  size_t pos; /* offset of the head being decoded */
  struct pc_frame st[BS_CBOR_MAX_DEPTH];
  size_t depth;
  uint64_t items;
  bool root_done, key_is_tensors, found_tensors;
  uint64_t *desc_pos; /* bs_malloc'd: offsets of the descriptors, in map order */
  size_t ndesc, desccap;
  bool desc_oom;
  int code;
  size_t epos;
  char emsg[200];
};

__attribute__((format(printf, 3, 4))) static void pc_fail(struct precheck *p, int code,
                                                          const char *fmt, ...)
{
  if (p->code)
    return;
  p->code = code;
  p->epos = p->pos;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->emsg, sizeof p->emsg, fmt, ap);
  va_end(ap);
}

static struct pc_frame *pc_top(struct precheck *p)
{
  return p->depth ? &p->st[p->depth - 1] : NULL;
}

static bool pc_in_indef_string(struct precheck *p)
{
  struct pc_frame *f = pc_top(p);
  return f && (f->kind == PC_BSTR || f->kind == PC_TSTR);
}

/* A new data item starts at p->pos. */
static bool pc_begin(struct precheck *p)
{
  if (p->code)
    return false;
  if (++p->items > BS_CBOR_MAX_ITEMS) {
    pc_fail(p, EFBIG, "metadata has more than %u CBOR items", BS_CBOR_MAX_ITEMS);
    return false;
  }
  if (pc_in_indef_string(p)) {
    pc_fail(p, EINVAL, "malformed CBOR: an indefinite-length string holds a non-string chunk");
    return false;
  }
  if (p->depth == 1 && p->st[0].kind == PC_MAP && p->st[0].seen % 2 == 0)
    p->key_is_tensors = false;
  if (p->depth == 2 && p->st[1].tensors && p->st[1].seen % 2 == 1 && !p->desc_oom &&
      p->ndesc <= BS_BPK_MAX_TENSORS) {
    if (bs_grow((void **)&p->desc_pos, &p->desccap, p->ndesc + 1, sizeof *p->desc_pos) != 0) {
      p->desc_oom = true;
      pc_fail(p, ENOMEM, "out of memory");
      return false;
    }
    p->desc_pos[p->ndesc++] = p->pos;
  }
  return true;
}

static void pc_item_done(struct precheck *p)
{
  while (p->depth > 0) {
    struct pc_frame *f = &p->st[p->depth - 1];
    f->seen++;
    if (f->indef || --f->left > 0)
      return;
    p->depth--;
  }
  p->root_done = true;
}

static void pc_push(struct precheck *p, uint8_t kind, bool indef, uint64_t n, bool tensors)
{
  if (p->depth >= BS_CBOR_MAX_DEPTH) {
    pc_fail(p, EINVAL, "CBOR nesting deeper than %u levels", BS_CBOR_MAX_DEPTH);
    return;
  }
  p->st[p->depth++] =
      (struct pc_frame){.kind = kind, .indef = indef, .left = n, .tensors = tensors};
}

static void pc_leaf(struct precheck *p)
{
  if (pc_begin(p))
    pc_item_done(p);
}

static void cb_u8(void *c, uint8_t v)
{
  (void)v;
  pc_leaf(c);
}
static void cb_u16(void *c, uint16_t v)
{
  (void)v;
  pc_leaf(c);
}
static void cb_u32(void *c, uint32_t v)
{
  (void)v;
  pc_leaf(c);
}
static void cb_u64(void *c, uint64_t v)
{
  (void)v;
  pc_leaf(c);
}
static void cb_f4(void *c, float v)
{
  (void)v;
  pc_leaf(c);
}
static void cb_f8(void *c, double v)
{
  (void)v;
  pc_leaf(c);
}
static void cb_bool(void *c, bool v)
{
  (void)v;
  pc_leaf(c);
}
static void cb_simple(void *c)
{
  pc_leaf(c);
}

/* A definite string: a chunk of an open indefinite string of the same kind, or an item. */
static void pc_string(struct precheck *p, uint8_t kind, cbor_data data, size_t len)
{
  struct pc_frame *f = pc_top(p);
  if (f && (f->kind == PC_BSTR || f->kind == PC_TSTR)) {
    if (f->kind != kind)
      pc_fail(p, EINVAL, "malformed CBOR: an indefinite-length %s string holds a %s chunk",
              f->kind == PC_TSTR ? "text" : "byte", kind == PC_TSTR ? "text" : "byte");
    else if (++p->items > BS_CBOR_MAX_ITEMS)
      pc_fail(p, EFBIG, "metadata has more than %u CBOR items", BS_CBOR_MAX_ITEMS);
    return;
  }
  if (!pc_begin(p))
    return;
  if (kind == PC_TSTR && p->depth == 1 && p->st[0].kind == PC_MAP && p->st[0].seen % 2 == 0)
    p->key_is_tensors = len == 7 && memcmp(data, "tensors", 7) == 0;
  pc_item_done(p);
}

static void cb_bytes(void *c, cbor_data d, size_t n)
{
  pc_string(c, PC_BSTR, d, n);
}
static void cb_text(void *c, cbor_data d, size_t n)
{
  pc_string(c, PC_TSTR, d, n);
}

static void cb_bytes_start(void *c)
{
  if (pc_begin(c))
    pc_push(c, PC_BSTR, true, 0, false);
}

static void cb_text_start(void *c)
{
  if (pc_begin(c))
    pc_push(c, PC_TSTR, true, 0, false);
}

static void pc_container(struct precheck *p, uint8_t kind, bool indef, uint64_t n)
{
  if (!pc_begin(p))
    return;
  size_t left = p->len - p->pos;
  if (!indef && (kind == PC_MAP ? n > left / 2 : n > left)) {
    pc_fail(p, EINVAL, "CBOR %s claims %" PRIu64 " %s but only %zu bytes of metadata remain",
            kind == PC_MAP ? "map" : "array", n, kind == PC_MAP ? "entries" : "items", left);
    return;
  }
  bool tensors = false;
  if (kind == PC_MAP && p->depth == 1 && p->st[0].kind == PC_MAP && p->st[0].seen % 2 == 1 &&
      p->key_is_tensors && !p->found_tensors)
    tensors = p->found_tensors = true;
  if (kind == PC_MAP && !indef)
    n *= 2;
  if (!indef && n == 0)
    pc_item_done(p);
  else
    pc_push(p, kind, indef, n, tensors);
}

static void cb_array(void *c, size_t n)
{
  pc_container(c, PC_ARRAY, false, n);
}
static void cb_array_indef(void *c)
{
  pc_container(c, PC_ARRAY, true, 0);
}
static void cb_map(void *c, size_t n)
{
  pc_container(c, PC_MAP, false, n);
}
static void cb_map_indef(void *c)
{
  pc_container(c, PC_MAP, true, 0);
}

static void cb_tag(void *c, uint64_t v)
{
  (void)v;
  if (pc_begin(c))
    pc_push(c, PC_TAG, false, 1, false);
}

static void cb_break(void *c)
{
  struct precheck *p = c;
  struct pc_frame *f = pc_top(p);
  if (!f || !f->indef) {
    pc_fail(p, EINVAL, "malformed CBOR: break (0xff) outside an indefinite-length item");
    return;
  }
  if (f->kind == PC_MAP && f->seen % 2 == 1) {
    pc_fail(p, EINVAL, "malformed CBOR: indefinite-length map ends after a key with no value");
    return;
  }
  p->depth--;
  pc_item_done(p);
}

/* Walk one top-level item at the start of buf. Returns 0, or -1 with p->code set. */
static int precheck_run(struct precheck *p)
{
  struct cbor_callbacks cb = cbor_empty_callbacks;
  cb.uint8 = cb_u8, cb.uint16 = cb_u16, cb.uint32 = cb_u32, cb.uint64 = cb_u64;
  cb.negint8 = cb_u8, cb.negint16 = cb_u16, cb.negint32 = cb_u32, cb.negint64 = cb_u64;
  cb.byte_string = cb_bytes, cb.byte_string_start = cb_bytes_start;
  cb.string = cb_text, cb.string_start = cb_text_start;
  cb.array_start = cb_array, cb.indef_array_start = cb_array_indef;
  cb.map_start = cb_map, cb.indef_map_start = cb_map_indef;
  cb.tag = cb_tag, cb.float2 = cb_f4, cb.float4 = cb_f4, cb.float8 = cb_f8;
  cb.undefined = cb_simple, cb.null = cb_simple, cb.boolean = cb_bool;
  cb.indef_break = cb_break;
  if (p->len == 0) {
    pc_fail(p, EINVAL, "metadata is empty (0 bytes); expected a CBOR map");
    return -1;
  }
  while (!p->root_done) {
    if (p->pos >= p->len) {
      pc_fail(p, EINVAL, "metadata CBOR ends inside an unfinished item (metadata_size %zu)",
              p->len);
      return -1;
    }
    struct cbor_decoder_result r = cbor_stream_decode(p->buf + p->pos, p->len - p->pos, &cb, p);
    if (r.status == CBOR_DECODER_NEDATA) {
      pc_fail(p, EINVAL,
              "metadata CBOR truncated: the item needs %zu bytes but only %zu remain "
              "(metadata_size %zu)",
              r.required, p->len - p->pos, p->len);
      return -1;
    }
    if (r.status != CBOR_DECODER_FINISHED) {
      pc_fail(p, EINVAL, "malformed CBOR: head byte 0x%02x is reserved or unsupported",
              p->buf[p->pos]);
      return -1;
    }
    if (p->code)
      return -1;
    p->pos += r.read;
  }
  return 0;
}

/* ---- Reading the decoded items ------------------------------------------------------------ */

struct span {
  uint64_t start, end;
  size_t idx;    /* into cat->tensors */
  uint64_t doff; /* absolute offset of the descriptor (for errors) */
};

struct rd {
  struct bs_catalog *cat;
  uint32_t src;
  uint64_t size;                 /* file size */
  uint64_t meta_end, data_start; /* 10 + M, D */
  size_t count0;                 /* tensors in the catalog before this read */
  struct span *spans;
  size_t nspans;
  struct kvtmp *kvs;
  size_t nkvs;
  json_t *scalars;
};

struct kvtmp {
  char *key, *value;
  size_t order;
};

/* libcbor 0.8's cbor_is_null/cbor_is_bool assert (abort) when given a float: check the
 * width first. */
static bool is_ctrl(const cbor_item_t *it)
{
  return cbor_isa_float_ctrl(it) && cbor_float_get_width(it) == CBOR_FLOAT_0;
}
static bool is_null(const cbor_item_t *it)
{
  return is_ctrl(it) && cbor_is_null(it);
}
static bool is_bool(const cbor_item_t *it)
{
  return is_ctrl(it) && cbor_is_bool(it);
}

static const char *type_name(const cbor_item_t *it)
{
  switch (cbor_typeof(it)) {
  case CBOR_TYPE_UINT: return "an unsigned integer";
  case CBOR_TYPE_NEGINT: return "a negative integer";
  case CBOR_TYPE_BYTESTRING: return "a byte string";
  case CBOR_TYPE_STRING: return "a text string";
  case CBOR_TYPE_ARRAY: return "an array";
  case CBOR_TYPE_MAP: return "a map";
  case CBOR_TYPE_TAG: return "a tag";
  case CBOR_TYPE_FLOAT_CTRL:
    if (is_null(it))
      return "null";
    if (is_bool(it))
      return "a boolean";
    return cbor_float_get_width(it) == CBOR_FLOAT_0 ? "a simple value" : "a float";
  }
  return "an unknown item";
}

/* A text item as a bs_malloc'd NUL-terminated copy; *len excludes the NUL. Returns NULL on
 * OOM or overflow (the caller reports ENOMEM). */
static char *text_dup(const cbor_item_t *it, size_t *len)
{
  size_t n = 0;
  if (cbor_string_is_definite(it)) {
    n = cbor_string_length(it);
  } else {
    cbor_item_t **ch = cbor_string_chunks_handle(it);
    for (size_t i = 0; i < cbor_string_chunk_count(it); i++)
      if (__builtin_add_overflow(n, cbor_string_length(ch[i]), &n))
        return NULL;
  }
  if (n == SIZE_MAX)
    return NULL;
  char *s = bs_malloc(n + 1);
  if (!s)
    return NULL;
  if (cbor_string_is_definite(it)) {
    if (n)
      memcpy(s, cbor_string_handle(it), n);
  } else {
    cbor_item_t **ch = cbor_string_chunks_handle(it);
    size_t at = 0;
    for (size_t i = 0; i < cbor_string_chunk_count(it); i++) {
      size_t l = cbor_string_length(ch[i]);
      if (l)
        memcpy(s + at, cbor_string_handle(ch[i]), l);
      at += l;
    }
  }
  s[n] = '\0';
  *len = n;
  return s;
}

/* Map key `k` as a NUL-free string (a map key must be text). */
static char *key_dup(const cbor_item_t *k, const char *where, uint64_t off, bs_err *err)
{
  k = bs_cbor_untag(k);
  if (!cbor_isa_string(k)) {
    bs_fail(err, EINVAL, off, NULL, "a key of the %s map is %s; map keys must be text strings",
            where, type_name(k));
    return NULL;
  }
  size_t len;
  char *s = text_dup(k, &len);
  if (!s) {
    bs_fail(err, ENOMEM, off, NULL, "out of memory");
    return NULL;
  }
  if (memchr(s, '\0', len)) {
    bs_fail(err, EINVAL, off, NULL, "a key of the %s map contains a NUL byte", where);
    bs_free(s);
    return NULL;
  }
  return s;
}

static bool get_uint(const cbor_item_t *it, uint64_t *v)
{
  it = bs_cbor_untag(it);
  if (!cbor_isa_uint(it))
    return false;
  *v = cbor_get_int(it);
  return true;
}

/* The dtype value: a variant name, or a 1-entry map {variant: payload}. For QFloat, *raw gets
 * the item re-serialized (libcbor keeps widths and definiteness, so this is the file's bytes
 * for anything Burn wrote). */
static int parse_dtype(const cbor_item_t *v, const char *name, uint64_t off, enum bs_dtype *dt,
                       uint8_t **raw, size_t *rawlen, bs_err *err)
{
  v = bs_cbor_untag(v);
  char *s = NULL;
  size_t len;
  if (cbor_isa_string(v)) {
    if (!(s = text_dup(v, &len)))
      return bs_fail(err, ENOMEM, off, name, "out of memory");
    if (strlen(s) == len && bs_dtype_from_bpk_name(s, dt) == 0) {
      bs_free(s);
      return 0;
    }
    bs_fail(err, ENOTSUP, off, name,
            "unknown Burnpack dtype '%.40s' (known: F64 F32 Flex32 F16 BF16 I64 I32 I16 I8 "
            "U64 U32 U16 U8 Bool QFloat)",
            s);
    bs_free(s);
    return -1;
  }
  if (!cbor_isa_map(v) || cbor_map_size(v) != 1)
    return bs_fail(
        err, EINVAL, off, name,
        "dtype is %s%s; expected a text name or a 1-entry map like {\"Bool\": \"Native\"}",
        type_name(v), cbor_isa_map(v) ? " with other than 1 entry" : "");
  struct cbor_pair *pr = cbor_map_handle(v);
  char *variant = key_dup(pr[0].key, "dtype", off, err);
  if (!variant)
    return -1;
  int rc = 0;
  if (strcmp(variant, "Bool") == 0) {
    const cbor_item_t *st = bs_cbor_untag(pr[0].value);
    if (!cbor_isa_string(st)) {
      rc =
          bs_fail(err, EINVAL, off, name, "Bool dtype storage is %s; expected text", type_name(st));
    } else if (!(s = text_dup(st, &len))) {
      rc = bs_fail(err, ENOMEM, off, name, "out of memory");
    } else if (strlen(s) == len && bs_dtype_from_bpk_bool(s, dt) == 0) {
      /* *dt is BOOL, BOOL_U8 or BOOL_U32 */
    } else {
      rc = bs_fail(err, ENOTSUP, off, name, "unknown Bool storage '%.40s' (known: Native, U8, U32)",
                   s);
    }
    bs_free(s);
  } else if (strcmp(variant, "QFloat") == 0) {
    unsigned char *buf = NULL;
    size_t cap = 0;
    size_t n = cbor_serialize_alloc(v, &buf, &cap);
    if (n == 0 || !(*raw = bs_malloc(n))) {
      rc = bs_fail(err, ENOMEM, off, name, "out of memory");
    } else {
      memcpy(*raw, buf, n);
      *rawlen = n;
      *dt = BS_DT_QFLOAT;
    }
    free(buf); /* libcbor allocates with malloc */
  } else {
    rc = bs_fail(err, ENOTSUP, off, name,
                 "unknown Burnpack dtype {\"%.40s\": ...} (known maps: Bool, QFloat)", variant);
  }
  bs_free(variant);
  return rc;
}

static int parse_desc(struct rd *r, const char *name, const cbor_item_t *v, uint64_t off,
                      bs_err *err)
{
  v = bs_cbor_untag(v);
  if (!cbor_isa_map(v))
    return bs_fail(err, EINVAL, off, name, "tensor descriptor is %s; expected a map", type_name(v));
  const cbor_item_t *dtype = NULL, *shape = NULL, *offsets = NULL, *pid = NULL;
  struct cbor_pair *pr = cbor_map_handle(v);
  for (size_t i = 0; i < cbor_map_size(v); i++) {
    char *k = key_dup(pr[i].key, "descriptor", off, err);
    if (!k)
      return -1;
    const cbor_item_t **slot = strcmp(k, "dtype") == 0          ? &dtype
                               : strcmp(k, "shape") == 0        ? &shape
                               : strcmp(k, "data_offsets") == 0 ? &offsets
                               : strcmp(k, "param_id") == 0     ? &pid
                                                                : NULL;
    if (slot && *slot) {
      bs_fail(err, EINVAL, off, name, "descriptor has the key '%s' twice", k);
      bs_free(k);
      return -1;
    }
    bs_free(k);
    if (slot) /* unknown keys are ignored, as Burn does */
      *slot = pr[i].value;
  }
  if (!dtype || !shape || !offsets)
    return bs_fail(err, EINVAL, off, name, "descriptor has no '%s'",
                   !dtype   ? "dtype"
                   : !shape ? "shape"
                            : "data_offsets");

  shape = bs_cbor_untag(shape);
  if (!cbor_isa_array(shape))
    return bs_fail(err, EINVAL, off, name, "shape is %s; expected an array of unsigned integers",
                   type_name(shape));
  if (cbor_array_size(shape) > BS_MAX_RANK)
    return bs_fail(err, EINVAL, off, name, "rank %zu exceeds the limit of %u",
                   cbor_array_size(shape), BS_MAX_RANK);
  uint64_t dims[BS_MAX_RANK];
  uint32_t rank = (uint32_t)cbor_array_size(shape);
  cbor_item_t **sh = cbor_array_handle(shape);
  for (uint32_t i = 0; i < rank; i++)
    if (!get_uint(sh[i], &dims[i]))
      return bs_fail(err, EINVAL, off, name,
                     "shape entry %u is %s; expected a non-negative integer", i,
                     type_name(bs_cbor_untag(sh[i])));

  offsets = bs_cbor_untag(offsets);
  uint64_t start, end;
  if (!cbor_isa_array(offsets) || cbor_array_size(offsets) != 2 ||
      !get_uint(cbor_array_handle(offsets)[0], &start) ||
      !get_uint(cbor_array_handle(offsets)[1], &end)) {
    if (cbor_isa_array(offsets) && cbor_array_size(offsets) != 2)
      return bs_fail(err, EINVAL, off, name,
                     "data_offsets has %zu entries; expected exactly 2 ([start, end])",
                     cbor_array_size(offsets));
    return bs_fail(err, EINVAL, off, name,
                   "data_offsets must be an array of 2 unsigned integers [start, end]");
  }

  bool has_pid = false;
  uint64_t param_id = 0;
  if (pid && !is_null(bs_cbor_untag(pid))) {
    if (!get_uint(pid, &param_id))
      return bs_fail(err, EINVAL, off, name, "param_id is %s; expected an unsigned integer",
                     type_name(bs_cbor_untag(pid)));
    has_pid = true;
  }

  enum bs_dtype dt = BS_DT_F32;
  uint8_t *raw = NULL;
  size_t rawlen = 0;
  if (parse_dtype(dtype, name, off, &dt, &raw, &rawlen, err) != 0)
    return -1;
  int rc = -1;
  if (end < start) {
    bs_fail(err, EINVAL, off, name, "data_offsets end %" PRIu64 " < start %" PRIu64, end, start);
    goto out;
  }
  uint64_t len = end - start, abs_end;
  if (len > BS_MAX_TENSOR_BYTES) {
    bs_fail(err, EFBIG, off, name, "tensor of %" PRIu64 " bytes exceeds the limit of %llu", len,
            (unsigned long long)BS_MAX_TENSOR_BYTES);
    goto out;
  }
  if (!bs_add_u64(r->data_start, end, &abs_end)) {
    bs_fail(err, EINVAL, off, name,
            "data_offsets end %" PRIu64 " overflows when added to the data start %" PRIu64, end,
            r->data_start);
    goto out;
  }
  struct bs_tensor *t = bs_catalog_add(r->cat, name, dt, rank, dims, off, err);
  if (!t)
    goto out;
  if (dt == BS_DT_QFLOAT) {
    t->nbytes = len;
    if (!bs_tensor_x(r->cat, t)) {
      bs_fail(err, ENOMEM, off, name, "out of memory");
      goto out;
    }
    t->x->dtype_raw = raw;
    t->x->dtype_raw_len = rawlen;
    raw = NULL;
  } else if (t->nbytes != len) {
    bs_fail(err, EINVAL, off, name,
            "data_offsets [%" PRIu64 ", %" PRIu64 ") span %" PRIu64
            " bytes but %u-d %s needs %" PRIu64,
            start, end, len, rank, bs_dtype_name(dt), t->nbytes);
    goto out;
  }
  t->src = r->src;
  t->off = start; /* relative until the layout is known */
  if (has_pid) {
    if (!bs_tensor_x(r->cat, t)) {
      bs_fail(err, ENOMEM, off, name, "out of memory");
      goto out;
    }
    t->has_param_id = true;
    t->x->param_id = param_id;
  }
  r->spans[r->nspans++] = (struct span){start, end, r->cat->count - 1, off};
  rc = 0;
out:
  bs_free(raw);
  return rc;
}

static int cmp_name(const void *a, const void *b, void *cat)
{
  const struct bs_catalog *c = cat;
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  int r = strcmp(c->tensors[x].key, c->tensors[y].key);
  return r ? r : (x > y) - (x < y); /* ties in map order: the later duplicate is reported */
}

static int cmp_span(const void *a, const void *b)
{
  const struct span *x = a, *y = b;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  return 0;
}

static int parse_tensors(struct rd *r, const cbor_item_t *map, const struct precheck *pc,
                         bs_err *err)
{
  map = bs_cbor_untag(map);
  if (!cbor_isa_map(map))
    return bs_fail(err, EINVAL, HDR_LEN, NULL, "'tensors' is %s; expected a map", type_name(map));
  size_t n = cbor_map_size(map);
  if (n > BS_BPK_MAX_TENSORS)
    return bs_fail(err, EFBIG, HDR_LEN, NULL, "%zu tensors exceed Burn's limit of %u", n,
                   BS_BPK_MAX_TENSORS);
  r->spans = bs_calloc(n ? n : 1, sizeof *r->spans);
  if (!r->spans)
    return bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
  bool have_pos = pc->ndesc == n && !pc->desc_oom;
  struct cbor_pair *pr = cbor_map_handle(map);
  for (size_t i = 0; i < n; i++) {
    uint64_t off = have_pos ? HDR_LEN + pc->desc_pos[i] : HDR_LEN;
    char *name = key_dup(pr[i].key, "tensors", off, err);
    if (!name)
      return -1;
    int rc = parse_desc(r, name, pr[i].value, off, err);
    bs_free(name);
    if (rc != 0)
      return -1;
  }

  /* Duplicate names: Burn keeps the last one silently; here the first would be invisible. */
  if (n > 1) {
    size_t *idx = bs_malloc(n * sizeof *idx);
    if (!idx)
      return bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
    for (size_t i = 0; i < n; i++)
      idx[i] = r->count0 + i;
    qsort_r(idx, n, sizeof *idx, cmp_name, r->cat);
    for (size_t i = 1; i < n; i++) {
      const struct bs_tensor *t = &r->cat->tensors[idx[i]];
      if (strcmp(t->key, r->cat->tensors[idx[i - 1]].key) == 0) {
        uint64_t off = r->spans[idx[i] - r->count0].doff;
        bs_free(idx);
        return bs_fail(err, EINVAL, off, t->key,
                       "the tensor name appears twice in the metadata (Burn would silently keep "
                       "only the last)");
      }
    }
    bs_free(idx);
  }
  return 0;
}

/* Choose where the data section starts: D (0.20+, aligned) or 10 + M (0.19, packed). */
static int pick_layout(struct rd *r, struct span *sorted, uint64_t *base, bs_err *err)
{
  uint64_t E = 0, D = r->data_start;
  size_t last = 0;
  for (size_t i = 0; i < r->nspans; i++) {
    if (sorted[i].end >= E) {
      E = sorted[i].end;
      last = i;
    }
  }
  *base = D;
  if (r->nspans == 0)
    return 0; /* any size >= 10 + M will do */
  if (r->size >= D && r->size - D == E)
    return 0;
  if (r->size >= r->meta_end && r->size - r->meta_end == E) {
    uint64_t cur = 0;
    bool tiles = true;
    for (size_t i = 0; i < r->nspans && tiles; i++) {
      tiles = sorted[i].start == cur;
      cur = sorted[i].end;
    }
    if (tiles) {
      *base = r->meta_end;
      return 0;
    }
  }
  if (r->size >= D && r->size - D > E)
    return 0; /* trailing bytes after the last tensor: Burn ignores them too */
  const struct bs_tensor *t = &r->cat->tensors[sorted[last].idx];
  return bs_fail(err, EINVAL, r->size, t->key,
                 "truncated: data ends at %" PRIu64 " (data start %" PRIu64 " + %" PRIu64
                 ") but the file has %" PRIu64 " bytes",
                 D + E, D, E, r->size);
}

static int check_layout(struct rd *r, bs_err *err)
{
  if (r->nspans == 0)
    return 0;
  struct span *s = bs_malloc(r->nspans * sizeof *s);
  if (!s)
    return bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
  memcpy(s, r->spans, r->nspans * sizeof *s);
  qsort(s, r->nspans, sizeof *s, cmp_span);
  uint64_t base;
  int rc = pick_layout(r, s, &base, err);
  /* Overlaps: with starts sorted, a range overlaps an earlier one iff it starts before the
   * furthest end seen so far. Empty ranges overlap nothing. */
  size_t far = SIZE_MAX;
  for (size_t i = 0; rc == 0 && i < r->nspans; i++) {
    if (s[i].start == s[i].end)
      continue;
    if (far != SIZE_MAX && s[i].start < s[far].end) {
      const struct bs_tensor *t = &r->cat->tensors[s[i].idx];
      rc = bs_fail(err, EINVAL, base + s[i].start, t->key,
                   "data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%.60s' [%" PRIu64 ", %" PRIu64
                   ")",
                   s[i].start, s[i].end, r->cat->tensors[s[far].idx].key, s[far].start, s[far].end);
    }
    if (far == SIZE_MAX || s[i].end > s[far].end)
      far = i;
  }
  for (size_t i = 0; rc == 0 && i < r->nspans; i++) {
    struct bs_tensor *t = &r->cat->tensors[r->spans[i].idx];
    t->off = base + r->spans[i].start;
    if (!bs_range_ok(t->off, t->nbytes, r->size))
      rc = bs_fail(err, EINVAL, t->off, t->key,
                   "data [%" PRIu64 ", +%" PRIu64 ") lies outside the file of %" PRIu64 " bytes",
                   t->off, t->nbytes, r->size);
  }
  bs_free(s);
  return rc;
}

static int cmp_kv(const void *a, const void *b)
{
  const struct kvtmp *x = a, *y = b;
  int c = strcmp(x->key, y->key);
  return c ? c : (x->order < y->order ? -1 : x->order > y->order);
}

/* "metadata": text -> text. A repeated key keeps its last value, as Burn's map does. */
static int parse_meta(struct rd *r, const cbor_item_t *map, bs_err *err)
{
  map = bs_cbor_untag(map);
  if (!cbor_isa_map(map))
    return bs_fail(err, EINVAL, HDR_LEN, NULL, "'metadata' is %s; expected a map of text",
                   type_name(map));
  size_t n = cbor_map_size(map);
  if (n == 0)
    return 0;
  r->kvs = bs_calloc(n, sizeof *r->kvs);
  if (!r->kvs)
    return bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
  struct cbor_pair *pr = cbor_map_handle(map);
  for (size_t i = 0; i < n; i++) {
    char *k = key_dup(pr[i].key, "metadata", HDR_LEN, err);
    if (!k)
      return -1;
    r->kvs[r->nkvs++] = (struct kvtmp){k, NULL, i};
    const cbor_item_t *v = bs_cbor_untag(pr[i].value);
    if (!cbor_isa_string(v))
      return bs_fail(err, EINVAL, HDR_LEN, NULL,
                     "metadata value of '%.60s' is %s; expected a text string", k, type_name(v));
    size_t len;
    if (!(r->kvs[i].value = text_dup(v, &len)))
      return bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
    if (memchr(r->kvs[i].value, '\0', len))
      return bs_fail(err, EINVAL, HDR_LEN, NULL, "metadata value of '%.60s' contains a NUL byte",
                     k);
  }
  qsort(r->kvs, r->nkvs, sizeof *r->kvs, cmp_kv);
  for (size_t i = 0; i < r->nkvs; i++) {
    if (i + 1 < r->nkvs && strcmp(r->kvs[i].key, r->kvs[i + 1].key) == 0)
      continue;
    if (bs_catalog_add_meta(r->cat, r->kvs[i].key, r->kvs[i].value, err) != 0)
      return -1;
  }
  return 0;
}

static int skip_scalar(struct rd *r, const char *name, const char *why, bs_err *err)
{
  char line[300];
  snprintf(line, sizeof line, "burnpack: scalar '%.100s' skipped: %s", name, why);
  return bs_catalog_note(r->cat, line, err);
}

/* One scalar {"Int"|"UInt"|"Float"|"Bool": v} as JSON, or NULL (skipped with a note). */
static json_t *scalar_json(const cbor_item_t *v, const char **why)
{
  v = bs_cbor_untag(v);
  *why = "not a 1-entry map";
  if (!cbor_isa_map(v) || cbor_map_size(v) != 1)
    return NULL;
  struct cbor_pair *pr = cbor_map_handle(v);
  const cbor_item_t *k = bs_cbor_untag(pr[0].key), *x = bs_cbor_untag(pr[0].value);
  *why = "unknown kind";
  if (!cbor_isa_string(k) || !cbor_string_is_definite(k))
    return NULL;
  size_t kl = cbor_string_length(k);
  const char *ks = (const char *)cbor_string_handle(k);
  bool is_int = (kl == 3 && memcmp(ks, "Int", 3) == 0) || (kl == 4 && memcmp(ks, "UInt", 4) == 0);
  bool is_float = kl == 5 && memcmp(ks, "Float", 5) == 0;
  bool is_bool_kind = kl == 4 && memcmp(ks, "Bool", 4) == 0;
  char num[32];
  *why = "value of the wrong type";
  if ((is_int || is_float) && cbor_isa_uint(x)) {
    uint64_t u = cbor_get_int(x);
    if (u <= INT64_MAX)
      return json_integer((json_int_t)u);
    snprintf(num, sizeof num, "%" PRIu64, u);
    return json_string(num);
  }
  if ((is_int || is_float) && cbor_isa_negint(x)) {
    uint64_t u = cbor_get_int(x); /* the value is -1 - u */
    if (u <= INT64_MAX)
      return json_integer(-1 - (json_int_t)u);
    if (u == UINT64_MAX)
      snprintf(num, sizeof num, "-18446744073709551616");
    else
      snprintf(num, sizeof num, "-%" PRIu64, u + 1);
    return json_string(num);
  }
  if (is_float && cbor_isa_float_ctrl(x) && cbor_float_get_width(x) != CBOR_FLOAT_0) {
    double d = cbor_float_get_float(x);
    if (d != d)
      return json_string("NaN");
    if (d > 1.7976931348623157e308 || d < -1.7976931348623157e308)
      return json_string(d > 0 ? "inf" : "-inf");
    return json_real(d);
  }
  if (is_bool_kind && is_bool(x))
    return json_boolean(cbor_get_bool(x));
  return NULL;
}

/* "scalars" become cat->values_json so the FUSE layer can show them; they do not affect
 * tensors, so a scalar we do not understand is skipped with a note, not an error. */
static int parse_scalars(struct rd *r, const cbor_item_t *map, bs_err *err)
{
  map = bs_cbor_untag(map);
  if (!cbor_isa_map(map))
    return bs_fail(err, EINVAL, HDR_LEN, NULL, "'scalars' is %s; expected a map", type_name(map));
  if (cbor_map_size(map) == 0)
    return 0;
  if (!(r->scalars = json_object()))
    return bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
  struct cbor_pair *pr = cbor_map_handle(map);
  for (size_t i = 0; i < cbor_map_size(map); i++) {
    char *k = key_dup(pr[i].key, "scalars", HDR_LEN, err);
    if (!k)
      return -1;
    const char *why;
    json_t *j = scalar_json(pr[i].value, &why);
    int rc = 0;
    if (!j)
      rc = skip_scalar(r, k, why, err);
    else if (json_object_set_new(r->scalars, k, j) != 0)
      rc = bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
    bs_free(k);
    if (rc != 0)
      return -1;
  }
  return 0;
}

static int parse_root(struct rd *r, const cbor_item_t *root, const struct precheck *pc, bs_err *err)
{
  root = bs_cbor_untag(root);
  if (!cbor_isa_map(root))
    return bs_fail(err, EINVAL, HDR_LEN, NULL, "metadata is %s; expected a CBOR map",
                   type_name(root));
  const cbor_item_t *tensors = NULL, *meta = NULL, *scalars = NULL;
  struct cbor_pair *pr = cbor_map_handle(root);
  for (size_t i = 0; i < cbor_map_size(root); i++) {
    char *k = key_dup(pr[i].key, "top-level", HDR_LEN, err);
    if (!k)
      return -1;
    const cbor_item_t **slot = strcmp(k, "tensors") == 0    ? &tensors
                               : strcmp(k, "metadata") == 0 ? &meta
                               : strcmp(k, "scalars") == 0  ? &scalars
                                                            : NULL;
    if (slot && *slot) {
      bs_fail(err, EINVAL, HDR_LEN, NULL, "metadata has the top-level key '%s' twice", k);
      bs_free(k);
      return -1;
    }
    bs_free(k);
    if (slot)
      *slot = pr[i].value;
  }
  if (!tensors)
    return bs_fail(err, EINVAL, HDR_LEN, NULL, "metadata has no 'tensors' map");
  if (parse_tensors(r, tensors, pc, err) != 0 || check_layout(r, err) != 0)
    return -1;
  if (meta && parse_meta(r, meta, err) != 0)
    return -1;
  if (scalars && parse_scalars(r, scalars, err) != 0)
    return -1;
  return 0;
}

static int cbor_load_fail(const struct cbor_load_result *res, bs_err *err)
{
  uint64_t off = HDR_LEN + (uint64_t)res->error.position;
  switch (res->error.code) {
  case CBOR_ERR_MEMERROR:
    return bs_fail(err, ENOMEM, off, NULL, "out of memory decoding the metadata CBOR");
  case CBOR_ERR_NOTENOUGHDATA:
  case CBOR_ERR_NODATA: return bs_fail(err, EINVAL, off, NULL, "metadata CBOR ends early");
  case CBOR_ERR_SYNTAXERROR:
    return bs_fail(err, EINVAL, off, NULL, "malformed CBOR: syntax error in the metadata");
  default: return bs_fail(err, EINVAL, off, NULL, "malformed CBOR in the metadata");
  }
}

/* YES on "NRUB"; MAYBE on "BURN" (the magic byte-swapped), so that the
 * reader explains the magic. */
enum bs_sniff bs_bpk_sniff(const uint8_t *head, size_t n, uint64_t size)
{
  (void)size;
  if (n >= 4 && memcmp(head, "NRUB", 4) == 0)
    return BS_SNIFF_YES;
  if (n >= 4 && memcmp(head, "BURN", 4) == 0)
    return BS_SNIFF_MAYBE;
  return BS_SNIFF_NO;
}

void bs_bpk_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx)
{
  uint8_t h[6];
  char v[8];
  if (bs_src_pread(&cat->srcs[0], 0, h, sizeof h) != (long)sizeof h)
    return;
  snprintf(v, sizeof v, "%u", (unsigned)bs_le16(h + 4));
  detail(ctx, "version", v);
}

int bs_bpk_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts, bs_err *err)
{
  (void)opts;
  bs_formats_init();
  if (src >= cat->nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "no source %u in the catalog", src);
  const struct bs_src *s = &cat->srcs[src];
  const struct bs_catalog_mark mark = bs_catalog_mark(cat);
  struct rd r = {.cat = cat, .src = src, .size = s->size, .count0 = cat->count};
  uint8_t h[HDR_LEN];
  if (s->size < HDR_LEN)
    return bs_fail(err, EINVAL, 0, NULL,
                   "file of %" PRIu64 " bytes is shorter than the 10-byte Burnpack header",
                   s->size);
  if (bs_src_read(s, 0, h, HDR_LEN, err) != 0)
    return -1;
  if (memcmp(h, "NRUB", 4) != 0) {
    char shown[5];
    for (int i = 0; i < 4; i++)
      shown[i] = h[i] >= 0x20 && h[i] < 0x7f ? (char)h[i] : '.';
    shown[4] = '\0';
    return bs_fail(err, EINVAL, 0, NULL,
                   "bad magic %02x %02x %02x %02x (\"%s\"): a Burnpack file starts with "
                   "\"NRUB\" (4e 52 55 42)",
                   h[0], h[1], h[2], h[3], shown);
  }
  uint16_t version = bs_le16(h + 4);
  if (version > 1)
    return bs_fail(err, ENOTSUP, 4, NULL,
                   "Burnpack version %u is newer than the supported version 1", version);
  uint32_t m = bs_le32(h + 6);
  if (m > BS_BPK_MAX_META)
    return bs_fail(err, EFBIG, 6, NULL,
                   "metadata_size %" PRIu32 " exceeds Burn's limit of %u bytes (100 MiB)", m,
                   BS_BPK_MAX_META);
  if (!bs_range_ok(HDR_LEN, m, s->size))
    return bs_fail(err, EINVAL, 6, NULL,
                   "metadata_size %" PRIu32 " runs past the end of the file: 10 + %" PRIu32
                   " > %" PRIu64 " bytes",
                   m, m, s->size);
  r.meta_end = HDR_LEN + (uint64_t)m;
  if (!bs_align_up(r.meta_end, BS_BPK_ALIGN, &r.data_start))
    return bs_fail(err, EINVAL, 6, NULL, "metadata_size overflows");

  int rc = -1;
  cbor_item_t *root = NULL;
  struct precheck pc = {0};
  uint8_t *meta = NULL;
  if (bs_src_read_alloc(s, HDR_LEN, m, &meta, err) != 0)
    goto out;
  pc.buf = meta;
  pc.len = m;
  if (precheck_run(&pc) != 0) {
    bs_fail(err, pc.code, HDR_LEN + (uint64_t)pc.epos, NULL, "%s", pc.emsg);
    goto out;
  }
  struct cbor_load_result res;
  root = cbor_load(meta, m, &res);
  if (!root) {
    cbor_load_fail(&res, err);
    goto out;
  }
  if (parse_root(&r, root, &pc, err) != 0)
    goto out;
  if (r.scalars && json_object_size(r.scalars) > 0) {
    char *js = json_dumps(r.scalars, JSON_COMPACT);
    char *copy = js ? bs_strdup(js) : NULL;
    free(js); /* jansson allocates with malloc */
    if (!copy) {
      bs_fail(err, ENOMEM, HDR_LEN, NULL, "out of memory");
      goto out;
    }
    bs_free(cat->values_json);
    cat->values_json = copy;
  }
  rc = 0;
out:
  if (rc != 0)
    bs_catalog_rollback(cat, &mark);
  if (root)
    cbor_decref(&root);
  for (size_t i = 0; i < r.nkvs; i++) {
    bs_free(r.kvs[i].key);
    bs_free(r.kvs[i].value);
  }
  bs_free(r.kvs);
  bs_free(r.spans);
  json_decref(r.scalars);
  bs_free(pc.desc_pos);
  bs_free(meta);
  return rc;
}
