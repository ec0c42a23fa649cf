/* The PyTorch writer (spec: shared/docs/pytorch-format.md, section (a) and (b)).
 *
 * Byte layout written: a zip archive of STORED members, as torch.save's
 * PyTorchStreamWriter (miniz) writes it. P is the archive prefix (pth_write.h).
 *  1. members, in this order, each as
 *       local header, 30 bytes LE: 50 4B 03 04, version 0, flags 0x0808 (data
 *         descriptor + UTF-8), method 0, time/date 0, CRC and both sizes 0,
 *         name length, extra length;
 *       the name; the extra field: a zip64 extra (id 1: the two 64-bit sizes when
 *         the member is >= 0xFFFFFFFF bytes, then the 64-bit header offset when
 *         that is >= 0xFFFFFFFF) if either, then torch's padding extra (id 0x4246
 *         "FB", L bytes of 'Z') sized so the data starts at a multiple of 64;
 *       the data;
 *       a data descriptor: 50 4B 07 08, CRC-32, both sizes (4 bytes each, 8 each
 *         for a zip64-sized member);
 *     P/data.pkl   the pickle (protocol 2) of one collections.OrderedDict:
 *                  key -> torch._utils._rebuild_tensor_v2(storage, 0, size,
 *                  row-major stride, False, OrderedDict()), the storage a
 *                  persistent id ('storage', torch.<T>Storage, 'I', 'cpu', numel);
 *                  for a dtype with no <T>Storage (F8, U16-U64)
 *                  torch._utils._rebuild_tensor_v3(storage, 0, size, stride,
 *                  False, OrderedDict(), torch.<dtype>), the storage
 *                  ('storage', torch.storage.UntypedStorage, 'I', 'cpu', nbytes)
 *     P/byteorder  "little"
 *     P/data/I     tensor I's bytes (I = 0, 1, ... in catalog order), row-major
 *     P/version    "3\n"
 *  2. the central directory: one 46-byte entry per member (version 0, flags
 *     0x0808, CRC, sizes, offset; 0xFFFFFFFF and a zip64 extra for what does not
 *     fit 32 bits), with the name and no other extra;
 *  3. the zip64 end record (56 bytes), its locator (20), the classic end record
 *     (22), always, as torch writes them.
 * Tensor bytes are streamed from their source (checkpoint or staging file) in
 * chunks, CRC-32 computed on the way (core/crc32.h); the pickle and the central directory
 * (O(tensors)) are the only things built in memory.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/crc32.h"
#include "formats/formats.h"
#include "formats/pickle.h"
#include "formats/pth_write.h"
#include "formats/write_common.h"
#include "formats/zip.h"
#include "pth_private.h"

#define Z32 0xFFFFFFFFu

/* The storage class torch.save names for a dtype it rebuilds with
 * _rebuild_tensor_v2 (pytorch torch/storage.py _dtype_to_storage_type_map,
 * frozen "for BC/FC with older PyTorch versions": every torch since 1.6
 * loads these); NULL: none. */
static const char *const storage_class[BS_DT_COUNT] = {
    [BS_DT_F64] = "DoubleStorage",       [BS_DT_F32] = "FloatStorage",
    [BS_DT_F16] = "HalfStorage",         [BS_DT_BF16] = "BFloat16Storage",
    [BS_DT_I64] = "LongStorage",         [BS_DT_I32] = "IntStorage",
    [BS_DT_I16] = "ShortStorage",        [BS_DT_I8] = "CharStorage",
    [BS_DT_U8] = "ByteStorage",          [BS_DT_BOOL] = "BoolStorage",
    [BS_DT_C64] = "ComplexFloatStorage", [BS_DT_C128] = "ComplexDoubleStorage",
};

/* The torch dtype of each dtype torch.save writes the newer way (pytorch
 * torch/storage.py _new_dtypes): torch/_tensor.py _reduce_ex_internal hands
 * the tensor's torch.storage.UntypedStorage to _rebuild_tensor_v3 with the
 * dtype appended to the arguments, and torch/serialization.py _save's
 * persistent_id gives that storage's numel in bytes. torch's
 * _weights_only_unpickler.py _get_allowed_globals allows the function, the
 * storage class and every one of these dtypes; only a torch that has the
 * dtype loads the file (not 1.13). NULL: not one of them. */
static const char *const v3_dtype[BS_DT_COUNT] = {
    [BS_DT_F8_E4M3] = "float8_e4m3fn",
    [BS_DT_F8_E5M2] = "float8_e5m2",
    [BS_DT_F8_E4M3FNUZ] = "float8_e4m3fnuz",
    [BS_DT_F8_E5M2FNUZ] = "float8_e5m2fnuz",
    [BS_DT_F8_E8M0] = "float8_e8m0fnu",
    [BS_DT_U16] = "uint16",
    [BS_DT_U32] = "uint32",
    [BS_DT_U64] = "uint64",
    /* two E2M1 values a byte, element 2j in the low nibble, 2j + 1 in the
     * high one (c10/util/Float4_e2m1fn_x2.h: "val1 : val0" is bits
     * "7654 : 3210"); one torch element is a byte, so the last dimension is
     * halved (F4: its bytes as they are) */
    [BS_DT_F4] = "float4_e2m1fn_x2",
};

int bs_pth_name_ok(const char *name, bs_err *err)
{
  return bs_writer_name_text(name, BS_MAX_KEY_LEN, true, "torch's keys are Python strings", err);
}

int bs_pth_can_write(const struct bs_tensor *t, bs_err *err)
{
  if (bs_pth_name_ok(t->name, err) != 0)
    return -1;
  if (t->x->unsupported)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name, "its data cannot be read: %s",
                   t->x->unsupported);
  if (t->dtype == BS_DT_F4 && (t->rank == 0 || t->shape[t->rank - 1] % 2 != 0))
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                   "an F4 tensor goes to torch as float4_e2m1fn_x2, two values a byte along the "
                   "last dimension, which must then be even (shape [..., %" PRIu64 "])",
                   t->rank ? t->shape[t->rank - 1] : 0);
  if (t->dtype < BS_DT_COUNT && (storage_class[t->dtype] || v3_dtype[t->dtype]))
    return 0;
  const char *hint = bs_writer_alias_hint(t->dtype);
  switch (t->dtype) {
  case BS_DT_F6_E2M3:
  case BS_DT_F6_E3M2: hint = " (torch has no 6-bit float)"; break;
  case BS_DT_QFLOAT: hint = " (Burn's quantized tensors exist only in Burnpack)"; break;
  case BS_DT_QI8:
  case BS_DT_QU8:
  case BS_DT_QI32:
    hint = " (quantized tensors are not written; convert --as F32 dequantizes them)";
    break;
  default: break;
  }
  return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                 "a torch.save file has no storage for %s (BOOL, U8-U64, I8-I64, F16, BF16, F32, "
                 "F64, C64, C128, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F4)%s",
                 bs_dtype_name(t->dtype), hint);
}

/* ---- the pickle ------------------------------------------------------------------------- */

struct pk {
  struct bs_buf b;
  bool bad;
  uint32_t memo; /* next memo index */
  /* memo index + 1 (0: not yet) of what every tensor repeats */
  uint32_t odict, rebuild_v2, rebuild_v3, storage, cpu, untyped;
  uint32_t class_memo[BS_DT_COUNT], dtype_memo[BS_DT_COUNT];
  uint64_t work; /* values pk_value wrote: shared references can multiply them */
};

static void put(struct pk *p, const void *d, size_t n)
{
  if (!p->bad && bs_buf_put(&p->b, d, n) != 0)
    p->bad = true;
}

static void op(struct pk *p, uint8_t c)
{
  put(p, &c, 1);
}

static void memo_put(struct pk *p)
{
  uint8_t b[5];
  if (p->memo < 256) {
    b[0] = 'q', b[1] = (uint8_t)p->memo;
    put(p, b, 2);
  } else {
    b[0] = 'r', bs_put_le32(b + 1, p->memo);
    put(p, b, 5);
  }
  p->memo++;
}

static void memo_get(struct pk *p, uint32_t i)
{
  uint8_t b[5];
  if (i < 256) {
    b[0] = 'h', b[1] = (uint8_t)i;
    put(p, b, 2);
  } else {
    b[0] = 'j', bs_put_le32(b + 1, i);
    put(p, b, 5);
  }
}

/* Non-negative ints the way Python's pickler writes them. */
static void pk_int(struct pk *p, uint64_t v)
{
  uint8_t b[11];
  if (v < 256) {
    b[0] = 'K', b[1] = (uint8_t)v;
    put(p, b, 2);
  } else if (v < 65536) {
    b[0] = 'M', bs_put_le16(b + 1, (uint16_t)v);
    put(p, b, 3);
  } else if (v < 0x80000000u) {
    b[0] = 'J', bs_put_le32(b + 1, (uint32_t)v);
    put(p, b, 5);
  } else { /* LONG1: little-endian two's complement, a 0 byte when the top bit is set */
    uint8_t n = 0;
    for (uint64_t x = v; x; x >>= 8)
      b[2 + n++] = (uint8_t)x;
    if (b[2 + n - 1] & 0x80)
      b[2 + n++] = 0;
    b[0] = 0x8A, b[1] = n;
    put(p, b, 2u + n);
  }
}

static void pk_strn(struct pk *p, const char *s, size_t n)
{
  uint8_t b[5] = {'X'};
  if (n > UINT32_MAX) {
    p->bad = true;
    return;
  }
  bs_put_le32(b + 1, (uint32_t)n);
  put(p, b, 5);
  put(p, s, n);
}

static void pk_str(struct pk *p, const char *s)
{
  pk_strn(p, s, strlen(s));
}

static void pk_global(struct pk *p, const char *mod, const char *name)
{
  op(p, 'c');
  put(p, mod, strlen(mod));
  op(p, '\n');
  put(p, name, strlen(name));
  op(p, '\n');
}

/* GLOBAL mod.name, memoised in *slot on its first use, from the memo after. */
static void pk_global_memo(struct pk *p, uint32_t *slot, const char *mod, const char *name)
{
  if (*slot) {
    memo_get(p, *slot - 1);
    return;
  }
  pk_global(p, mod, name);
  *slot = p->memo + 1;
  memo_put(p);
}

/* collections.OrderedDict, from the memo after its first use. */
static void pk_odict(struct pk *p)
{
  pk_global_memo(p, &p->odict, "collections", "OrderedDict");
}

/* The string s, memoised in *slot on its first use. */
static void pk_str_memo(struct pk *p, uint32_t *slot, const char *s)
{
  if (*slot) {
    memo_get(p, *slot - 1);
    return;
  }
  pk_str(p, s);
  *slot = p->memo + 1;
  memo_put(p);
}

/* Signed ints: as Python writes them, LONG1 with 8 bytes past 32 bits. */
static void pk_sint(struct pk *p, int64_t v)
{
  if (v >= 0) {
    pk_int(p, (uint64_t)v);
    return;
  }
  uint8_t b[10];
  if (v >= INT32_MIN) {
    b[0] = 'J', bs_put_le32(b + 1, (uint32_t)v);
    put(p, b, 5);
    return;
  }
  b[0] = 0x8A, b[1] = 8;
  bs_put_le64(b + 2, (uint64_t)v);
  put(p, b, 10);
}

/* A tuple of n ints. */
static void pk_tuple(struct pk *p, const uint64_t *v, uint32_t n)
{
  if (n == 0) {
    op(p, ')');
    return;
  }
  if (n > 3)
    op(p, '(');
  for (uint32_t i = 0; i < n; i++)
    pk_int(p, v[i]);
  op(p, n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 't');
}

/* Row-major strides in elements, as torch computes them (a dimension of size
 * 0 counts as 1). Into st[rank]. */
static int row_major(const struct bs_tensor *t, const uint64_t *shape, uint64_t *st, bs_err *err)
{
  uint64_t s = 1;
  for (uint32_t d = t->rank; d-- > 0;) {
    st[d] = s;
    if (!bs_mul_u64(s, shape[d] ? shape[d] : 1, &s) || s > INT64_MAX)
      return bs_fail(err, EFBIG, BS_OFF_NONE, t->name,
                     "its strides overflow the 64-bit integers torch keeps them in");
  }
  return 0;
}

static int pk_tensor(struct pk *p, const struct bs_tensor *t, size_t idx, uint64_t *st, bs_err *err)
{
  char key[24];
  const char *v3 = v3_dtype[t->dtype];
  unsigned esize = bs_dtype_bits(t->dtype) / 8;
  /* F4: torch's shape, the last dimension in bytes (st's second half) */
  const uint64_t *shape = t->shape;
  if (t->dtype == BS_DT_F4) {
    if (t->rank == 0 || t->shape[t->rank - 1] % 2 != 0)
      return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                     "an F4 tensor needs an even last dimension");
    memcpy(st + t->rank, t->shape, t->rank * sizeof *st);
    st[2 * t->rank - 1] /= 2;
    shape = st + t->rank;
  }
  if (row_major(t, shape, st, err) != 0)
    return -1;
  if (v3)
    pk_global_memo(p, &p->rebuild_v3, "torch._utils", "_rebuild_tensor_v3");
  else
    pk_global_memo(p, &p->rebuild_v2, "torch._utils", "_rebuild_tensor_v2");
  op(p, '(');
  op(p, '('); /* the persistent id */
  pk_str_memo(p, &p->storage, "storage");
  if (v3)
    pk_global_memo(p, &p->untyped, "torch.storage", "UntypedStorage");
  else
    pk_global_memo(p, &p->class_memo[t->dtype], "torch", storage_class[t->dtype]);
  snprintf(key, sizeof key, "%zu", idx);
  pk_str(p, key);
  pk_str_memo(p, &p->cpu, "cpu");
  pk_int(p, v3 ? t->nbytes : t->nbytes / esize);
  op(p, 't');
  op(p, 'Q');   /* BINPERSID */
  pk_int(p, 0); /* storage_offset */
  pk_tuple(p, shape, t->rank);
  pk_tuple(p, st, t->rank);
  op(p, 0x89); /* requires_grad: NEWFALSE */
  pk_odict(p);
  op(p, ')');
  op(p, 'R'); /* backward hooks: OrderedDict() */
  if (v3)
    pk_global_memo(p, &p->dtype_memo[t->dtype], "torch", v3);
  op(p, 't');
  op(p, 'R');
  return 0;
}

/* The pickle of the state dict (an OrderedDict) of the n tensors order[] into p->b. */
static int make_pickle(const struct bs_catalog *cat, const size_t *order, size_t n, struct pk *p,
                       bs_err *err)
{
  uint32_t maxrank = 0;
  for (size_t i = 0; i < n; i++)
    if (cat->tensors[order[i]].rank > maxrank)
      maxrank = cat->tensors[order[i]].rank;
  uint64_t *st = bs_malloc((maxrank ? maxrank : 1) * 2 * sizeof *st); /* strides, F4's shape */
  if (!st)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  static const uint8_t head[] = {0x80, 2};
  put(p, head, sizeof head);
  pk_odict(p);
  op(p, ')');
  op(p, 'R');
  if (n)
    op(p, '(');
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    if (i && i % 1000 == 0) { /* as Python batches SETITEMS */
      op(p, 'u');
      op(p, '(');
    }
    pk_str(p, cat->tensors[order[i]].name);
    rc = pk_tensor(p, &cat->tensors[order[i]], i, st, err);
  }
  if (n)
    op(p, 'u');
  op(p, '.');
  bs_free(st);
  if (rc == 0 && p->bad)
    rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory encoding data.pkl");
  return rc;
}

/* ---- what a rewrite in place keeps -------------------------------------------------------- */

void bs_pth_keep_destroy(struct bs_pth_keep *keep)
{
  bs_pickle_free(keep->p);
  memset(keep, 0, sizeof *keep);
}

/* A plain value (None, bool, int, float, str and tuples, lists and dicts of
 * them) into p, without the memo; else -1 naming it (at `where`). */
static int pk_value(struct pk *p, const struct bs_pv *v, unsigned depth, const char *where,
                    bs_err *err)
{
  if (depth > 64)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "%s nests values deeper than 64", where);
  if (++p->work > BS_PTH_REPICKLE_MAX_NODES)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "%s: more than %u values to re-pickle (shared references multiply them)", where,
                   BS_PTH_REPICKLE_MAX_NODES);
  uint8_t b[9];
  switch (v->kind) {
  case BS_PV_NONE: op(p, 'N'); return 0;
  case BS_PV_BOOL: op(p, v->u.b ? 0x88 : 0x89); return 0;
  case BS_PV_INT: pk_sint(p, v->u.i); return 0;
  case BS_PV_FLOAT: {
    uint64_t u;
    memcpy(&u, &v->u.f, sizeof u);
    b[0] = 'G';
    for (int i = 0; i < 8; i++) /* big-endian */
      b[1 + i] = (uint8_t)(u >> (56 - 8 * i));
    put(p, b, 9);
    return 0;
  }
  case BS_PV_STR: pk_strn(p, v->u.str.s, v->u.str.len); return 0;
  case BS_PV_TUPLE:
  case BS_PV_LIST:
    if (v->kind == BS_PV_LIST)
      op(p, ']');
    if (v->u.seq.n)
      op(p, '(');
    for (size_t i = 0; i < v->u.seq.n; i++)
      if (pk_value(p, v->u.seq.items[i], depth + 1, where, err) != 0)
        return -1;
    if (v->kind == BS_PV_LIST) {
      if (v->u.seq.n)
        op(p, 'e');
    } else
      op(p, v->u.seq.n ? 't' : ')');
    return 0;
  case BS_PV_DICT:
    if (v->u.dict.ordered) {
      pk_global(p, "collections", "OrderedDict");
      op(p, ')');
      op(p, 'R');
    } else
      op(p, '}');
    if (v->u.dict.keys.n)
      op(p, '(');
    for (size_t i = 0; i < v->u.dict.keys.n; i++)
      if (pk_value(p, v->u.dict.keys.items[i], depth + 1, where, err) != 0 ||
          pk_value(p, v->u.dict.vals.items[i], depth + 1, where, err) != 0)
        return -1;
    if (v->u.dict.keys.n)
      op(p, 'u');
    if (v->u.dict.attrs) {
      if (pk_value(p, v->u.dict.attrs, depth + 1, where, err) != 0)
        return -1;
      op(p, 'b');
    }
    return 0;
  default:
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
                   "%s holds a value of type %s, which is not written back", where,
                   bs_pv_kind_name(v->kind));
  }
}

/* A walk of the source's value tree. Pass 1 (`p` NULL) names every tensor
 * by its path as the reader does (dict keys and list indices joined by
 * dots), counts which of cat's tensors each path names and records the
 * paths of the dicts; pass 2 pickles the tree with cat's tensors in place
 * of the source's, a tensor cat lacks left out of its dict, and each tensor
 * no path names added to the deepest dict whose path prefixes its name. */
struct tw {
  const struct bs_catalog *cat;
  size_t *byname; /* cat's tensors that are not hidden, sorted by name */
  size_t nby;
  uint32_t *hits; /* per cat tensor: the tree paths that name it */
  struct bs_buf path;
  char **dicts; /* pass 1: every dict's path */
  size_t ndicts, dictcap;
  const char **home; /* pass 2: per cat tensor no path names, its dict's path */
  struct pk *p;
  size_t *order; /* pass 2: cat's tensors in the order they are pickled */
  size_t n, ocap;
  uint64_t *st;
  uint64_t work; /* values visited: shared references can multiply them */
  bool *fixed;   /* pass 1, may be NULL: per cat tensor, an item of a list */
  bs_err *err;
};

/* qsort_r's order of catalog indices (c: the catalog) by tensor name. */
static int cmp_name(const void *a, const void *b, void *c)
{
  const struct bs_catalog *cat = c;
  return strcmp(cat->tensors[*(const size_t *)a].name, cat->tensors[*(const size_t *)b].name);
}

/* The cat tensor named `name`, or -1. */
static long tw_find(const struct tw *w, const char *name)
{
  size_t lo = 0, hi = w->nby;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(w->cat->tensors[w->byname[mid]].name, name);
    if (c == 0)
      return (long)w->byname[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

static const char *tw_path(const struct tw *w)
{
  return w->path.len ? (const char *)w->path.data : "";
}

/* Append ".seg" (no dot at the root) to the path; the old length in *old. */
static int tw_push(struct tw *w, const char *seg, size_t sl, size_t *old)
{
  *old = w->path.len;
  if ((w->path.len && bs_buf_put(&w->path, ".", 1) != 0) || bs_buf_put(&w->path, seg, sl) != 0 ||
      bs_buf_put(&w->path, "", 1) != 0)
    return bs_fail(w->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  w->path.len--; /* NUL-terminated, the NUL not counted */
  return 0;
}

static void tw_pop(struct tw *w, size_t old)
{
  w->path.len = old;
  if (w->path.data)
    w->path.data[old] = '\0';
}

/* A dict key as the reader names it (str() of str, int, bool, None). */
static int tw_key(struct tw *w, const struct bs_pv *k, size_t *old)
{
  char b[32];
  switch (k->kind) {
  case BS_PV_STR:
    if (strlen(k->u.str.s) != k->u.str.len)
      break;
    return tw_push(w, k->u.str.s, k->u.str.len, old);
  case BS_PV_INT: snprintf(b, sizeof b, "%" PRId64, k->u.i); return tw_push(w, b, strlen(b), old);
  case BS_PV_BOOL: return tw_push(w, k->u.b ? "True" : "False", k->u.b ? 4 : 5, old);
  case BS_PV_NONE: return tw_push(w, "None", 4, old);
  default: break;
  }
  return bs_fail(w->err, ENOTSUP, BS_OFF_NONE, NULL,
                 "a dict at '%.100s' has a key that is a %s, which is not written back", tw_path(w),
                 bs_pv_kind_name(k->kind));
}

static bool is_plain(const struct bs_pv *v)
{
  return v->kind == BS_PV_NONE || v->kind == BS_PV_BOOL || v->kind == BS_PV_INT ||
         v->kind == BS_PV_FLOAT || v->kind == BS_PV_STR;
}

static int tw_tensor(struct tw *w, bool in_list)
{
  long i = tw_find(w, tw_path(w));
  if (i < 0 && in_list)
    return bs_fail(w->err, ENOTSUP, BS_OFF_NONE, NULL,
                   "tensor '%.100s' is an item of a list: it cannot be left out or renamed in a "
                   "rewrite in place",
                   tw_path(w));
  if (i < 0)
    return 0; /* left out of its dict */
  if (!w->p) {
    w->hits[i]++;
    if (in_list && w->fixed)
      w->fixed[i] = true;
    return 0;
  }
  if (w->n == w->ocap && bs_grow((void **)&w->order, &w->ocap, w->n + 1, sizeof *w->order) != 0)
    return bs_fail(w->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  w->order[w->n] = (size_t)i;
  return pk_tensor(w->p, &w->cat->tensors[i], w->n++, w->st, w->err);
}

static int tw_value(struct tw *w, const struct bs_pv *v, unsigned depth, bool in_list);

static int tw_dict(struct tw *w, const struct bs_pv *v, unsigned depth)
{
  struct pk *p = w->p;
  if (!p) {
    if (bs_grow((void **)&w->dicts, &w->dictcap, w->ndicts + 1, sizeof *w->dicts) != 0 ||
        !(w->dicts[w->ndicts] = bs_strdup(tw_path(w))))
      return bs_fail(w->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    w->ndicts++;
  } else if (v->u.dict.ordered) {
    pk_odict(p);
    op(p, ')');
    op(p, 'R');
  } else
    op(p, '}');
  bool open = false;
  for (size_t i = 0; i < v->u.dict.keys.n; i++) {
    const struct bs_pv *k = v->u.dict.keys.items[i], *x = v->u.dict.vals.items[i];
    size_t old;
    if (tw_key(w, k, &old) != 0)
      return -1;
    bool left_out = x->kind == BS_PV_TENSOR && tw_find(w, tw_path(w)) < 0;
    if (p && !left_out) {
      if (!open)
        op(p, '(');
      open = true;
      if (pk_value(p, k, 0, tw_path(w), w->err) != 0)
        return -1;
    }
    if (!(p && left_out) && tw_value(w, x, depth + 1, false) != 0)
      return -1;
    tw_pop(w, old);
  }
  if (p) {
    const char *here = tw_path(w);
    size_t hl = strlen(here);
    for (size_t i = 0; i < w->cat->count; i++) {
      const char *name = w->cat->tensors[i].name;
      if (!w->home[i] || strcmp(w->home[i], here) != 0)
        continue;
      if (!open)
        op(p, '(');
      open = true;
      pk_str(p, name + hl + (hl ? 1 : 0));
      if (w->n == w->ocap && bs_grow((void **)&w->order, &w->ocap, w->n + 1, sizeof *w->order) != 0)
        return bs_fail(w->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      w->order[w->n] = i;
      if (pk_tensor(p, &w->cat->tensors[i], w->n++, w->st, w->err) != 0)
        return -1;
    }
    if (open)
      op(p, 'u');
  }
  if (v->u.dict.attrs) { /* BUILD state: plain values (a module's _metadata) */
    struct pk scratch;
    memset(&scratch, 0, sizeof scratch);
    int rc =
        pk_value(p ? p : &scratch, v->u.dict.attrs, 0, "the attributes of a state dict", w->err);
    bs_buf_destroy(&scratch.b);
    if (rc != 0)
      return -1;
    if (p)
      op(p, 'b');
  }
  return 0;
}

static int tw_value(struct tw *w, const struct bs_pv *v, unsigned depth, bool in_list)
{
  if (depth > 100)
    return bs_fail(w->err, ENOTSUP, BS_OFF_NONE, NULL, "values nested deeper than 100 at '%.100s'",
                   tw_path(w));
  if (++w->work > BS_PTH_REPICKLE_MAX_NODES)
    return bs_fail(w->err, EFBIG, BS_OFF_NONE, NULL,
                   "more than %u values to re-pickle at '%.100s' (shared references multiply "
                   "them)",
                   BS_PTH_REPICKLE_MAX_NODES, tw_path(w));
  struct pk *p = w->p;
  switch (v->kind) {
  case BS_PV_TENSOR: return tw_tensor(w, in_list);
  case BS_PV_DICT: return tw_dict(w, v, depth);
  case BS_PV_LIST:
  case BS_PV_TUPLE:
    if (p && v->kind == BS_PV_LIST)
      op(p, ']');
    if (p && v->u.seq.n)
      op(p, '(');
    for (size_t i = 0; i < v->u.seq.n; i++) {
      char b[24];
      size_t old;
      snprintf(b, sizeof b, "%zu", i);
      if (tw_push(w, b, strlen(b), &old) != 0 || tw_value(w, v->u.seq.items[i], depth + 1, true))
        return -1;
      tw_pop(w, old);
    }
    if (p && v->kind == BS_PV_LIST && v->u.seq.n)
      op(p, 'e');
    if (p && v->kind == BS_PV_TUPLE)
      op(p, v->u.seq.n ? 't' : ')');
    return 0;
  default:
    if (!is_plain(v))
      return bs_fail(w->err, ENOTSUP, BS_OFF_NONE, NULL,
                     "key '%.100s' holds a value of type %s, which is not written back", tw_path(w),
                     bs_pv_kind_name(v->kind));
    return p ? pk_value(p, v, 0, tw_path(w), w->err) : 0;
  }
}

static void tw_destroy(struct tw *w)
{
  bs_free(w->byname);
  bs_free(w->hits);
  bs_buf_destroy(&w->path);
  for (size_t i = 0; i < w->ndicts; i++)
    bs_free(w->dicts[i]);
  bs_free(w->dicts);
  bs_free((void *)w->home);
  bs_free(w->order);
  bs_free(w->st);
}

/* Pass 1 of root against cat (hidden tensors ignored). `sorted`: cat's
 * tensors that are not hidden, sorted by cmp_name (plan's), or NULL to sort
 * them here. */
static int tw_init(struct tw *w, const struct bs_catalog *cat, const struct bs_pv *root,
                   const size_t *sorted, bool *fixed, bs_err *err)
{
  memset(w, 0, sizeof *w);
  w->cat = cat;
  w->fixed = fixed;
  w->err = err;
  size_t n = cat->count ? cat->count : 1;
  uint32_t maxrank = 1;
  w->byname = bs_malloc(n * sizeof *w->byname);
  w->hits = bs_malloc(n * sizeof *w->hits);
  w->home = bs_malloc(n * sizeof *w->home);
  for (size_t i = 0; i < cat->count; i++)
    if (cat->tensors[i].rank > maxrank)
      maxrank = cat->tensors[i].rank;
  w->st = bs_malloc((size_t)maxrank * 2 * sizeof *w->st); /* strides, F4's shape */
  if (!w->byname || !w->hits || !w->home || !w->st)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < cat->count; i++) {
    w->hits[i] = 0;
    w->home[i] = NULL;
    if (!cat->tensors[i].hidden)
      w->byname[w->nby++] = i;
  }
  if (sorted)
    memcpy(w->byname, sorted, w->nby * sizeof *w->byname);
  else
    qsort_r(w->byname, w->nby, sizeof *w->byname, cmp_name, (void *)cat);
  if (root->kind != BS_PV_DICT)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
                   "its pickle holds a %s, not a dict (a state dict or a checkpoint)",
                   bs_pv_kind_name(root->kind));
  return tw_value(w, root, 0, false);
}

/* Does the reader name the tensors of root exactly as the walk does (each of
 * src_cat's tensors by one path, and every path one of them)? */
static int tw_same_names(const struct bs_catalog *src_cat, const struct bs_pv *root, bs_err *err)
{
  struct tw w;
  int rc = tw_init(&w, src_cat, root, NULL, NULL, err);
  for (size_t i = 0; rc == 0 && i < src_cat->count; i++)
    if (w.hits[i] != 1)
      rc = bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
                   "tensor '%.100s' is %s (shared references or colliding names): it is not "
                   "rewritten in place",
                   src_cat->tensors[i].name,
                   w.hits[i] ? "under several keys" : "not under the key the reader gives it");
  tw_destroy(&w);
  return rc;
}

/* Pass 2: the pickle of the tree with cat's tensors, and their order
 * (sorted: as tw_init takes it). */
static int tw_pickle(const struct bs_catalog *cat, const struct bs_pv *root, const size_t *sorted,
                     struct pk *p, size_t **order, size_t *n, bs_err *err)
{
  struct tw w;
  int rc = tw_init(&w, cat, root, sorted, NULL, err);
  for (size_t i = 0; rc == 0 && i < w.nby; i++) { /* the tensors no path names: their dicts */
    size_t t = w.byname[i], best = 0;
    const char *name = cat->tensors[t].name;
    if (w.hits[t])
      continue;
    for (size_t d = 0; d < w.ndicts; d++) {
      size_t dl = strlen(w.dicts[d]);
      if ((dl == 0 || (strncmp(name, w.dicts[d], dl) == 0 && name[dl] == '.' && name[dl + 1])) &&
          (!w.home[t] || dl > best)) {
        w.home[t] = w.dicts[d];
        best = dl;
      }
    }
  }
  if (rc == 0) {
    static const uint8_t head[] = {0x80, 2};
    w.p = p;
    put(p, head, sizeof head);
    rc = tw_value(&w, root, 0, false);
    op(p, '.');
    if (rc == 0 && p->bad)
      rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory encoding data.pkl");
  }
  if (rc == 0) {
    *order = w.order, *n = w.n;
    w.order = NULL;
  }
  tw_destroy(&w);
  return rc;
}
int bs_pth_keep_fixed(const struct bs_pth_keep *keep, const struct bs_catalog *cat, bool *fixed,
                      bs_err *err)
{
  struct tw w;
  int rc = tw_init(&w, cat, keep->root, NULL, fixed, err);
  tw_destroy(&w);
  return rc;
}

int bs_pth_keep_check(const struct bs_src *src, struct bs_pth_keep *keep, bs_err *err)
{
  memset(keep, 0, sizeof *keep);
  enum bs_pth_container kind;
  if (bs_pth_container(src, &kind, err) != 0)
    return -1;
  if (kind != BS_PTH_ZIP)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
                   "only torch.save's zip files (torch >= 1.6) are rewritten in place, not the "
                   "legacy formats");
  struct bs_zip z;
  struct bs_src bs;
  struct bs_catalog sc;
  int rc = -1;
  memset(&z, 0, sizeof z);
  bs_catalog_init(&sc);
  if (bs_zip_open(&z, src, err) != 0)
    goto out;
  const char *first = z.ents[0].name, *slash = strchr(first, '/');
  char name[600];
  if (!slash || slash == first || (size_t)(slash - first) > 500) {
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "zip entry '%.100s' is not inside a directory", first);
    goto out;
  }
  snprintf(name, sizeof name, "%.*s/data.pkl", (int)(slash - first), first);
  const struct bs_zip_entry *e = bs_zip_find(&z, name);
  if (!e) {
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "no '%.100s' in the zip", name);
    goto out;
  }
  bs_formats_init();
  struct bs_pv *root;
  uint32_t idx;
  if (!(keep->p = bs_pickle_new())) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  /* as the reader loads it (never the whole member in memory: it held a
   * deflated data.pkl whole, 300 MB of a 306 KB file); then the tensors as
   * the reader names them, to check the walk's names against */
  if (pth_zip_load_pickle(src, e, keep->p, false, &root, err) != 0 ||
      bs_src_init_borrowed(&bs, src, err) != 0)
    goto out;
  if (bs_catalog_add_src(&sc, &bs, &idx, err) != 0) {
    bs_src_destroy(&bs);
    goto out;
  }
  if (bs_pth_read(&sc, idx, NULL, err) != 0 || tw_same_names(&sc, root, err) != 0)
    goto out;
  keep->root = root;
  rc = 0;
out:
  if (rc != 0)
    bs_pth_keep_destroy(keep);
  bs_catalog_destroy(&sc);
  bs_zip_close(&z);
  return rc;
}

/* ---- the zip ------------------------------------------------------------------------------ */

struct member {
  uint64_t off, size;
  uint32_t crc;
};

struct zw {
  struct bs_sink *k;
  const char *prefix;
  struct member *m;
  size_t n, cap;
};

static int member_name(const struct zw *z, size_t i, size_t ntensors, char *buf, size_t cap)
{
  int r;
  if (i == 0)
    r = snprintf(buf, cap, "%s/data.pkl", z->prefix);
  else if (i == 1)
    r = snprintf(buf, cap, "%s/byteorder", z->prefix);
  else if (i - 2 < ntensors)
    r = snprintf(buf, cap, "%s/data/%zu", z->prefix, i - 2);
  else
    r = snprintf(buf, cap, "%s/version", z->prefix);
  return r < 0 || (size_t)r >= cap ? -1 : r;
}

static bool big(uint64_t v)
{
  return v >= Z32;
}

/* Local header + extras for a member of `size` bytes at the sink's position. */
static int local_header(struct zw *z, const char *name, size_t nlen, uint64_t size, bs_err *err)
{
  uint8_t h[30 + 20 + 4 + BS_PTH_ALIGN];
  uint64_t off = z->k->pos;
  uint16_t z64 = (uint16_t)((big(size) ? 16 : 0) + (big(off) ? 8 : 0));
  uint64_t start;
  /* off + ... cannot overflow: the sink's position is a file offset */
  start = off + 30 + nlen + (z64 ? 4u + z64 : 0) + 4;
  uint16_t pad = (uint16_t)((BS_PTH_ALIGN - start % BS_PTH_ALIGN) % BS_PTH_ALIGN);
  uint16_t xlen = (uint16_t)((z64 ? 4u + z64 : 0) + 4u + pad);
  memset(h, 0, 30);
  bs_put_le32(h, 0x04034b50);
  bs_put_le16(h + 6, 0x0808);
  bs_put_le16(h + 26, (uint16_t)nlen);
  bs_put_le16(h + 28, xlen);
  if (bs_sink_put(z->k, h, 30, err) != 0 || bs_sink_put(z->k, name, nlen, err) != 0)
    return -1;
  uint8_t *x = h;
  if (z64) {
    bs_put_le16(x, 1);
    bs_put_le16(x + 2, z64);
    x += 4;
    if (big(size)) {
      bs_put_le64(x, size);
      bs_put_le64(x + 8, size);
      x += 16;
    }
    if (big(off)) {
      bs_put_le64(x, off);
      x += 8;
    }
  }
  x[0] = 'F', x[1] = 'B';
  bs_put_le16(x + 2, pad);
  memset(x + 4, 'Z', pad);
  x += 4 + pad;
  if (bs_sink_put(z->k, h, (size_t)(x - h), err) != 0)
    return -1;
  if (z->n == z->cap && bs_grow((void **)&z->m, &z->cap, z->n + 1, sizeof *z->m) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  z->m[z->n].off = off;
  z->m[z->n].size = size;
  z->m[z->n].crc = 0;
  return 0;
}

/* The data descriptor of the member just written; it is then complete. */
static int finish_member(struct zw *z, uint32_t crc, bs_err *err)
{
  uint8_t d[24];
  struct member *m = &z->m[z->n++];
  m->crc = crc;
  bs_put_le32(d, 0x08074b50);
  bs_put_le32(d + 4, crc);
  if (big(m->size)) {
    bs_put_le64(d + 8, m->size);
    bs_put_le64(d + 16, m->size);
    return bs_sink_put(z->k, d, 24, err);
  }
  bs_put_le32(d + 8, (uint32_t)m->size);
  bs_put_le32(d + 12, (uint32_t)m->size);
  return bs_sink_put(z->k, d, 16, err);
}

static int small_member(struct zw *z, const char *name, const void *d, size_t n, bs_err *err)
{
  if (local_header(z, name, strlen(name), n, err) != 0 || bs_sink_put(z->k, d, n, err) != 0)
    return -1;
  return finish_member(z, bs_crc32(0, d, n), err);
}

static int central(struct zw *z, size_t ntensors, bs_err *err)
{
  uint64_t cd_off = z->k->pos;
  char name[512];
  for (size_t i = 0; i < z->n; i++) {
    const struct member *m = &z->m[i];
    int nlen = member_name(z, i, ntensors, name, sizeof name);
    if (nlen < 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "zip member name too long");
    uint8_t h[46 + 28];
    uint16_t z64 = (uint16_t)((big(m->size) ? 16 : 0) + (big(m->off) ? 8 : 0));
    memset(h, 0, 46);
    bs_put_le32(h, 0x02014b50);
    bs_put_le16(h + 8, 0x0808);
    bs_put_le32(h + 16, m->crc);
    bs_put_le32(h + 20, big(m->size) ? Z32 : (uint32_t)m->size);
    bs_put_le32(h + 24, big(m->size) ? Z32 : (uint32_t)m->size);
    bs_put_le16(h + 28, (uint16_t)nlen);
    bs_put_le16(h + 30, z64 ? (uint16_t)(4 + z64) : 0);
    bs_put_le32(h + 42, big(m->off) ? Z32 : (uint32_t)m->off);
    uint8_t *x = h + 46;
    if (z64) {
      bs_put_le16(x, 1);
      bs_put_le16(x + 2, z64);
      x += 4;
      if (big(m->size)) {
        bs_put_le64(x, m->size);
        bs_put_le64(x + 8, m->size);
        x += 16;
      }
      if (big(m->off)) {
        bs_put_le64(x, m->off);
        x += 8;
      }
    }
    if (bs_sink_put(z->k, h, 46, err) != 0 || bs_sink_put(z->k, name, (size_t)nlen, err) != 0 ||
        bs_sink_put(z->k, h + 46, (size_t)(x - h - 46), err) != 0)
      return -1;
  }
  uint64_t cd_size = z->k->pos - cd_off, z64_off = z->k->pos;
  uint8_t e[56 + 20 + 22];
  memset(e, 0, sizeof e);
  bs_put_le32(e, 0x06064b50);
  bs_put_le64(e + 4, 44);
  bs_put_le16(e + 12, 0x031e);
  bs_put_le16(e + 14, 45);
  bs_put_le64(e + 24, z->n);
  bs_put_le64(e + 32, z->n);
  bs_put_le64(e + 40, cd_size);
  bs_put_le64(e + 48, cd_off);
  uint8_t *l = e + 56;
  bs_put_le32(l, 0x07064b50);
  bs_put_le64(l + 8, z64_off);
  bs_put_le32(l + 16, 1);
  uint8_t *c = l + 20;
  uint16_t n16 = z->n > 0xFFFF ? 0xFFFF : (uint16_t)z->n;
  bs_put_le32(c, 0x06054b50);
  bs_put_le16(c + 8, n16);
  bs_put_le16(c + 10, n16);
  bs_put_le32(c + 12, big(cd_size) ? Z32 : (uint32_t)cd_size);
  bs_put_le32(c + 16, big(cd_off) ? Z32 : (uint32_t)cd_off);
  return bs_sink_put(z->k, e, sizeof e, err);
}

/* torch.save's prefix for a path: the base name without its last extension. */
static void archive_prefix(const char *path, char *buf, size_t cap)
{
  const char *base = path ? strrchr(path, '/') : NULL;
  base = base ? base + 1 : path ? path : "";
  const char *dot = strrchr(base, '.');
  size_t n = dot ? (size_t)(dot - base) : strlen(base);
  bool ok = n > 0 && n < cap;
  for (size_t i = 0; ok && i < n; i++)
    ok = base[i] > 0x20 && base[i] < 0x7F;
  if (!ok) {
    snprintf(buf, cap, "archive");
    return;
  }
  memcpy(buf, base, n);
  buf[n] = '\0';
}

/* Every tensor to write, in catalog order, checked; names unique. *sorted
 * (if not NULL): the same, sorted by cmp_name (owned by the caller). */
static int plan(const struct bs_catalog *cat, size_t **order, size_t **sorted, size_t *n,
                bs_err *err)
{
  size_t cnt = 0;
  for (size_t i = 0; i < cat->count; i++)
    cnt += !cat->tensors[i].hidden;
  size_t *o = bs_malloc((cnt ? cnt : 1) * sizeof *o);
  size_t *byname = bs_malloc((cnt ? cnt : 1) * sizeof *byname);
  if (!o || !byname) {
    bs_free(o);
    bs_free(byname);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  int rc = 0;
  for (size_t i = 0, j = 0; i < cat->count && rc == 0; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    if (t->hidden)
      continue;
    uint64_t want;
    if (bs_pth_can_write(t, err) != 0 ||
        bs_dtype_nbytes(t->dtype, t->rank, t->shape, &want, t->name, BS_OFF_NONE, err) != 0)
      rc = -1;
    else if (want != t->nbytes)
      rc = bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
                   "holds %" PRIu64 " bytes but its shape and %s need %" PRIu64, t->nbytes,
                   bs_dtype_name(t->dtype), want);
    o[j] = byname[j] = i;
    j++;
  }
  if (rc == 0) {
    qsort_r(byname, cnt, sizeof *byname, cmp_name, (void *)cat);
    for (size_t i = 1; i < cnt && rc == 0; i++)
      if (strcmp(cat->tensors[byname[i - 1]].name, cat->tensors[byname[i]].name) == 0)
        rc = bs_fail(err, EINVAL, BS_OFF_NONE, cat->tensors[byname[i]].name,
                     "two tensors to write have this name; a state dict's keys must be unique");
  }
  if (rc != 0) {
    bs_free(byname);
    bs_free(o);
    return -1;
  }
  if (sorted)
    *sorted = byname;
  else
    bs_free(byname);
  *order = o;
  *n = cnt;
  return 0;
}

int bs_pth_write(const struct bs_catalog *cat, struct bs_sink *k, bs_err *err)
{
  /* in place: the target is the checkpoint file the tensors come from
   * (the same file, whichever path names it) */
  struct bs_src_ident id;
  struct stat st;
  bool in_place = cat->nsrcs && bs_src_ident(&cat->srcs[0], &id) && k->name &&
                  stat(k->name, &st) == 0 && id.dev == (uint64_t)st.st_dev &&
                  id.ino == (uint64_t)st.st_ino;
  if (!in_place)
    return bs_pth_write_kept(cat, NULL, k, err);
  struct bs_pth_keep keep;
  int rc = bs_pth_keep_check(&cat->srcs[0], &keep, err);
  if (rc == 0)
    rc = bs_pth_write_kept(cat, &keep, k, err);
  bs_pth_keep_destroy(&keep);
  return rc;
}

int bs_pth_write_kept(const struct bs_catalog *cat, const struct bs_pth_keep *keep,
                      struct bs_sink *k, bs_err *err)
{
  char prefix[256], name[512];
  size_t *order = NULL, *sorted = NULL, n = 0;
  uint8_t *chunk = NULL;
  struct pk p;
  struct zw z = {.k = k, .prefix = prefix};
  int rc = -1;
  memset(&p, 0, sizeof p);
  archive_prefix(k->name, prefix, sizeof prefix);
  if (plan(cat, &order, keep ? &sorted : NULL, &n, err) != 0)
    goto out;
  if (keep) { /* the source's pickle, its tensors replaced: another order */
    bs_free(order);
    order = NULL;
    if (tw_pickle(cat, keep->root, sorted, &p, &order, &n, err) != 0)
      goto out;
  } else if (make_pickle(cat, order, n, &p, err) != 0)
    goto out;
  uint64_t biggest = 0;
  for (size_t i = 0; i < n; i++)
    if (cat->tensors[order[i]].nbytes > biggest)
      biggest = cat->tensors[order[i]].nbytes;
  size_t cap;
  if (!(chunk = bs_sink_chunk(biggest, &cap, err)))
    goto out;
  if (member_name(&z, 0, n, name, sizeof name) < 0 ||
      small_member(&z, name, p.b.data, p.b.len, err) != 0)
    goto out;
  if (member_name(&z, 1, n, name, sizeof name) < 0 || small_member(&z, name, "little", 6, err) != 0)
    goto out;
  for (size_t i = 0; i < n; i++) {
    const struct bs_tensor *t = &cat->tensors[order[i]];
    int nlen = member_name(&z, 2 + i, n, name, sizeof name);
    uint32_t crc = 0;
    if (nlen < 0 || local_header(&z, name, (size_t)nlen, t->nbytes, err) != 0 ||
        bs_sink_put_tensor_crc(cat, t, chunk, cap, k, &crc, err) != 0 ||
        finish_member(&z, crc, err) != 0)
      goto out;
  }
  if (member_name(&z, 2 + n, n, name, sizeof name) < 0 ||
      small_member(&z, name, "3\n", 2, err) != 0 || central(&z, n, err) != 0)
    goto out;
  rc = 0;
out:
  bs_free(chunk);
  bs_free(order);
  bs_free(sorted);
  bs_free(z.m);
  bs_buf_destroy(&p.b);
  return rc;
}
