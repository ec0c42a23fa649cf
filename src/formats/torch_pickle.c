/* What pickled names mean for PyTorch checkpoints: GLOBAL resolution (torch's
 * tensor rebuild functions, storage classes, dtypes, OrderedDict, sets, ...),
 * storages given as persistent ids, and the "calls" (REDUCE, NEWOBJ, BUILD)
 * on known names. Nothing is imported or called: known names are interpreted,
 * every other one becomes an inert opaque object (noted). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/decode.h"
#include "pickle_vm.h"

/* ---- GLOBAL resolution ---------------------------------------------------------------------- */

static const struct {
  const char *name;
  unsigned esize;
  bool ok;
  enum bs_dtype dt;
} storage_table[] = {
    {"DoubleStorage", 8, true, BS_DT_F64},       {"FloatStorage", 4, true, BS_DT_F32},
    {"HalfStorage", 2, true, BS_DT_F16},         {"BFloat16Storage", 2, true, BS_DT_BF16},
    {"LongStorage", 8, true, BS_DT_I64},         {"IntStorage", 4, true, BS_DT_I32},
    {"ShortStorage", 2, true, BS_DT_I16},        {"CharStorage", 1, true, BS_DT_I8},
    {"ByteStorage", 1, true, BS_DT_U8},          {"BoolStorage", 1, true, BS_DT_BOOL},
    {"ComplexFloatStorage", 8, true, BS_DT_C64}, {"ComplexDoubleStorage", 16, true, BS_DT_C128},
    {"QInt8Storage", 1, true, BS_DT_QI8},        {"QUInt8Storage", 1, true, BS_DT_QU8},
    {"QInt32Storage", 4, true, BS_DT_QI32},      {"QUInt4x2Storage", 1, false, BS_DT_U8},
    {"QUInt2x4Storage", 1, false, BS_DT_U8},     {"ComplexHalfStorage", 4, false, BS_DT_U8},
    {"UntypedStorage", 1, true, BS_DT_U8},       {"_UntypedStorage", 1, true, BS_DT_U8},
};

bool bs_pickle_storage_dtype(const char *name, unsigned *esize, enum bs_dtype *dt)
{
  for (size_t i = 0; i < sizeof storage_table / sizeof storage_table[0]; i++) {
    if (strcmp(storage_table[i].name, name) == 0) {
      *esize = storage_table[i].esize;
      *dt = storage_table[i].dt;
      return storage_table[i].ok;
    }
  }
  *esize = 0;
  *dt = BS_DT_U8;
  return false;
}

static const struct {
  const char *name;
  bool ok;
  enum bs_dtype dt;
} dtype_table[] = {
    {"float64", true, BS_DT_F64},
    {"double", true, BS_DT_F64},
    {"float32", true, BS_DT_F32},
    {"float", true, BS_DT_F32},
    {"float16", true, BS_DT_F16},
    {"half", true, BS_DT_F16},
    {"bfloat16", true, BS_DT_BF16},
    {"int64", true, BS_DT_I64},
    {"long", true, BS_DT_I64},
    {"int32", true, BS_DT_I32},
    {"int", true, BS_DT_I32},
    {"int16", true, BS_DT_I16},
    {"short", true, BS_DT_I16},
    {"int8", true, BS_DT_I8},
    {"uint8", true, BS_DT_U8},
    {"uint16", true, BS_DT_U16},
    {"uint32", true, BS_DT_U32},
    {"uint64", true, BS_DT_U64},
    {"bool", true, BS_DT_BOOL},
    {"complex64", true, BS_DT_C64},
    {"cfloat", true, BS_DT_C64},
    {"complex128", true, BS_DT_C128},
    {"cdouble", true, BS_DT_C128},
    {"float8_e5m2", true, BS_DT_F8_E5M2},
    {"float8_e4m3fn", true, BS_DT_F8_E4M3},
    {"float8_e5m2fnuz", true, BS_DT_F8_E5M2FNUZ},
    {"float8_e4m3fnuz", true, BS_DT_F8_E4M3FNUZ},
    {"float8_e8m0fnu", true, BS_DT_F8_E8M0},
    {"qint8", true, BS_DT_QI8},
    {"quint8", true, BS_DT_QU8},
    {"qint32", true, BS_DT_QI32},
    {"complex32", false, BS_DT_U8},
    {"chalf", false, BS_DT_U8},
    {"quint4x2", false, BS_DT_U8},
    {"quint2x4", false, BS_DT_U8},
    {"bits8", false, BS_DT_U8},
    {"bits16", false, BS_DT_U8},
    {"bits1x8", false, BS_DT_U8},
    {"bits2x4", false, BS_DT_U8},
    {"bits4x2", false, BS_DT_U8},
    {"float4_e2m1fn_x2", true, BS_DT_F4}, /* two F4 a byte: make_tensor */
};

static bool starts_with(const char *s, const char *prefix)
{
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

void pk_resolve(struct bs_pv *g)
{
  const char *m = g->u.glob.module, *n = g->u.glob.name;
  enum bs_pg k = BS_PG_OPAQUE;
#define IS(mod, nm) (strcmp(m, mod) == 0 && strcmp(n, nm) == 0)
  if (IS("collections", "OrderedDict")) {
    k = BS_PG_ORDERED_DICT;
  } else if (strcmp(m, "torch._utils") == 0 && starts_with(n, "_rebuild_")) {
    if (strcmp(n, "_rebuild_tensor_v2") == 0)
      k = BS_PG_REBUILD_V2;
    else if (strcmp(n, "_rebuild_tensor_v3") == 0)
      k = BS_PG_REBUILD_V3;
    else if (strcmp(n, "_rebuild_tensor") == 0)
      k = BS_PG_REBUILD_LEGACY;
    else if (strcmp(n, "_rebuild_qtensor") == 0)
      k = BS_PG_REBUILD_QTENSOR;
    else if (strcmp(n, "_rebuild_parameter") == 0 ||
             strcmp(n, "_rebuild_parameter_with_state") == 0)
      k = BS_PG_PARAMETER;
    else
      k = BS_PG_REBUILD_OTHER;
  } else if (IS("torch._tensor", "_rebuild_from_type_v2")) {
    k = BS_PG_FROM_TYPE_V2;
  } else if (bs_ends_with(n, strlen(n), "Storage", false)) {
    k = BS_PG_STORAGE; /* by name alone, as torch does */
    g->u.glob.dtype_ok = bs_pickle_storage_dtype(n, &g->u.glob.esize, &g->u.glob.dtype);
  } else if (IS("torch", "Size")) {
    k = BS_PG_SIZE;
  } else if (IS("torch", "device")) {
    k = BS_PG_DEVICE;
  } else if (IS("torch", "Tensor") || IS("torch._tensor", "Tensor") ||
             IS("torch.nn.parameter", "Parameter")) {
    k = BS_PG_TENSOR_CLASS;
  } else if (IS("_codecs", "encode")) {
    k = BS_PG_CODECS_ENCODE;
  } else if (IS("builtins", "set")) {
    k = BS_PG_SET;
  } else if (IS("builtins", "frozenset")) {
    k = BS_PG_FROZENSET;
  } else if (IS("builtins", "complex")) {
    k = BS_PG_COMPLEX;
  } else if (IS("builtins", "bytearray")) {
    k = BS_PG_BYTEARRAY;
  } else if (IS("copyreg", "_reconstructor")) {
    k = BS_PG_RECONSTRUCTOR;
  } else if (IS("argparse", "Namespace")) {
    k = BS_PG_NAMESPACE;
  } else if (starts_with(m, "torch.nn.modules.")) {
    k = BS_PG_NN_MODULE;
  } else if (strcmp(m, "torch") == 0) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++) {
      if (strcmp(dtype_table[i].name, n) == 0) {
        k = BS_PG_DTYPE;
        g->u.glob.dtype_ok = dtype_table[i].ok;
        g->u.glob.dtype = dtype_table[i].dt;
        if (dtype_table[i].ok)
          g->u.glob.esize = bs_dtype_bits(dtype_table[i].dt) / 8;
        break;
      }
    }
    if (k == BS_PG_OPAQUE &&
        (starts_with(n, "per_tensor_") || starts_with(n, "per_channel_") ||
         strcmp(n, "contiguous_format") == 0 || strcmp(n, "channels_last") == 0 ||
         strcmp(n, "channels_last_3d") == 0 || strcmp(n, "preserve_format") == 0 ||
         strcmp(n, "strided") == 0 || strcmp(n, "sparse_coo") == 0))
      k = BS_PG_INERT;
  }
#undef IS
  g->u.glob.kind = k;
}

/* ---- storages and tensors ------------------------------------------------------------------- */

static const char *int_key(struct vm *v, const struct bs_pv *x)
{
  if (x->kind == BS_PV_STR) {
    if (strlen(x->u.str.s) != x->u.str.len) {
      VFAIL(v, EINVAL, "%s", "storage key contains a NUL byte");
      return NULL;
    }
    return x->u.str.s;
  }
  if (x->kind == BS_PV_INT) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, x->u.i);
    return pk_strndup(v, tmp, (size_t)n);
  }
  VFAIL(v, EINVAL, "storage key is a %s, expected a str", bs_pv_kind_name(x->kind));
  return NULL;
}

static bool as_u64(const struct bs_pv *x, uint64_t *out)
{
  if (x->kind == BS_PV_INT && x->u.i >= 0) {
    *out = (uint64_t)x->u.i;
    return true;
  }
  if (x->kind == BS_PV_BOOL) {
    *out = x->u.b;
    return true;
  }
  return false;
}

static void storage_class(struct bs_pv *s, const struct bs_pv *cls, struct vm *v)
{
  if (cls->kind == BS_PV_GLOBAL) {
    s->u.storage.cls = cls->u.glob.name;
    if (cls->u.glob.kind == BS_PG_STORAGE) {
      s->u.storage.dtype_ok = cls->u.glob.dtype_ok;
      s->u.storage.dtype = cls->u.glob.dtype;
      s->u.storage.esize = cls->u.glob.esize;
    }
  } else if (cls->kind == BS_PV_STR) { /* some writers give the class as a name */
    s->u.storage.cls = cls->u.str.s;
    s->u.storage.dtype_ok =
        bs_pickle_storage_dtype(cls->u.str.s, &s->u.storage.esize, &s->u.storage.dtype);
  } else {
    s->u.storage.cls = bs_pv_kind_name(cls->kind);
  }
  (void)v;
}

/* ('storage', cls, key, location, numel[, view_metadata]) -> STORAGE. */
struct bs_pv *pk_persistent_load(struct vm *v, const struct bs_pv *pid)
{
  if (pid->kind != BS_PV_TUPLE || pid->u.seq.n == 0 || pid->u.seq.items[0]->kind != BS_PV_STR) {
    VFAIL(v, EINVAL, "unsupported persistent id: a %s, expected ('storage', ...)",
          bs_pv_kind_name(pid->kind));
    return NULL;
  }
  struct bs_pv **it = pid->u.seq.items;
  size_t n = pid->u.seq.n;
  const char *tag = it[0]->u.str.s;
  if (strcmp(tag, "module") == 0) {
    const bool g = n > 1 && it[1]->kind == BS_PV_GLOBAL;
    VFAIL(v, ENOTSUP,
          "this file pickles a whole nn.Module (legacy format, class %s%s%s); save "
          "model.state_dict() instead",
          g ? it[1]->u.glob.module : "", g ? "." : "", g ? it[1]->u.glob.name : "?");
    return NULL;
  }
  if (strcmp(tag, "storage") != 0) {
    VFAIL(v, EINVAL, "unsupported persistent id tag '%.64s' (expected 'storage')", tag);
    return NULL;
  }
  if (n != 5 && n != 6) {
    VFAIL(v, EINVAL, "storage persistent id has %zu fields, expected 5 or 6", n);
    return NULL;
  }
  struct bs_pv *s = pk_newv(v, BS_PV_STORAGE);
  if (!s)
    return NULL;
  storage_class(s, it[1], v);
  if (!(s->u.storage.key = int_key(v, it[2])))
    return NULL;
  if (!as_u64(it[4], &s->u.storage.numel)) {
    VFAIL(v, EINVAL, "storage '%.64s': element count is a %s, expected an int >= 0",
          s->u.storage.key, bs_pv_kind_name(it[4]->kind));
    return NULL;
  }
  if (n == 6 && it[5]->kind != BS_PV_NONE) {
    const struct bs_pv *vm = it[5];
    if (vm->kind != BS_PV_TUPLE || vm->u.seq.n != 3 ||
        !as_u64(vm->u.seq.items[1], &s->u.storage.view_off) ||
        !as_u64(vm->u.seq.items[2], &s->u.storage.view_numel)) {
      VFAIL(v, EINVAL, "storage '%.64s': view metadata is not (key, offset, size)",
            s->u.storage.key);
      return NULL;
    }
    if (!(s->u.storage.view_key = int_key(v, vm->u.seq.items[0])))
      return NULL;
    s->u.storage.has_view = true;
  }
  return s;
}

static int int_tuple(struct vm *v, const struct bs_pv *x, const char *what, bool nonneg,
                     uint32_t *rank, int64_t **out)
{
  if (x->kind != BS_PV_TUPLE && x->kind != BS_PV_LIST)
    return VFAIL(v, EINVAL, "tensor %s is a %s, expected a tuple of ints", what,
                 bs_pv_kind_name(x->kind));
  if (x->u.seq.n > BS_MAX_RANK)
    return VFAIL(v, EINVAL, "tensor %s has %zu dimensions, more than the limit of %u", what,
                 x->u.seq.n, BS_MAX_RANK);
  int64_t *a = NULL;
  if (x->u.seq.n) {
    a = pk_alloc(v->p, x->u.seq.n * sizeof *a);
    if (!a)
      return pk_oom(v);
  }
  for (size_t i = 0; i < x->u.seq.n; i++) {
    const struct bs_pv *e = x->u.seq.items[i];
    if (e->kind != BS_PV_INT || (nonneg && e->u.i < 0))
      return VFAIL(v, EINVAL, "tensor %s[%zu] is not an int%s", what, i, nonneg ? " >= 0" : "");
    a[i] = e->u.i;
  }
  *rank = (uint32_t)x->u.seq.n;
  *out = a;
  return 0;
}

static struct bs_pv *unsupported_tensor(struct vm *v, const char *why)
{
  struct bs_pv *t = pk_newv(v, BS_PV_TENSOR);
  if (t)
    t->u.tensor.unsupported = why;
  return t;
}

/* _rebuild_qtensor's quantizer_params (torch/_tensor.py __reduce_ex__):
 * (torch.per_tensor_affine, scale, zero_point) or
 * (torch.per_channel_affine, scales, zero_points, axis). Anything else
 * leaves the tensor without one (shown as its stored integers). */
static int quantizer(struct vm *v, struct bs_pv *t, const struct bs_pv *q)
{
  if (q->kind != BS_PV_TUPLE || q->u.seq.n < 3)
    return 0;
  struct bs_pv *const *it = q->u.seq.items;
  if (it[0]->kind != BS_PV_GLOBAL || strcmp(it[0]->u.glob.module, "torch") != 0)
    return 0;
  const char *name = it[0]->u.glob.name;
  struct bs_pv_quant k = {0};
  if (strcmp(name, "per_tensor_affine") == 0 && q->u.seq.n == 3 &&
      (it[1]->kind == BS_PV_FLOAT || it[1]->kind == BS_PV_INT) && it[2]->kind == BS_PV_INT) {
    k.scheme = BS_TQ_PER_TENSOR;
    k.scale = it[1]->kind == BS_PV_FLOAT ? it[1]->u.f : (double)it[1]->u.i;
    k.zp = it[2]->u.i;
  } else if (strcmp(name, "per_channel_affine") == 0 && q->u.seq.n == 4 &&
             it[1]->kind == BS_PV_TENSOR && it[2]->kind == BS_PV_TENSOR &&
             it[3]->kind == BS_PV_INT) {
    k.scheme = BS_TQ_PER_CHANNEL;
    k.scales = it[1];
    k.zps = it[2];
    k.axis = it[3]->u.i;
  } else {
    return 0;
  }
  if (!(t->u.tensor.q = pk_alloc(v->p, sizeof k)))
    return pk_oom(v);
  *t->u.tensor.q = k;
  return 0;
}

/* torch's float4_e2m1fn_x2 holds two E2M1 values a byte, element 2j in the
 * low nibble (c10/util/Float4_e2m1fn_x2.h): its size counts bytes along the
 * last dimension. As F4, that dimension counts values: doubled, the strides
 * row-major again. A view that is not row-major (its bytes cannot be F4
 * rows) is left unsupported; 0, or -1 with the VM's error. */
static int f4_elements(struct vm *v, struct bs_pv *t)
{
  uint32_t r = t->u.tensor.rank;
  uint64_t *shape = t->u.tensor.shape, expect = 1;
  int64_t *stride = t->u.tensor.stride;
  const char *why = NULL;
  for (uint32_t d = r; d-- > 0 && !why;) {
    if (shape[d] == 0)
      break;
    if (shape[d] != 1 && (stride[d] < 0 || (uint64_t)stride[d] != expect))
      why = "a float4_e2m1fn_x2 view that is not row-major is not supported";
    else if (!bs_mul_u64(expect, shape[d], &expect))
      why = "float4_e2m1fn_x2 size overflows";
  }
  if (!why && r == 0)
    why = "a 0-dimensional float4_e2m1fn_x2 tensor is not supported";
  if (!why && shape[r - 1] > UINT64_MAX / 2)
    why = "float4_e2m1fn_x2 size overflows";
  if (why) {
    t->u.tensor.unsupported = pk_strndup(v, why, strlen(why));
    return t->u.tensor.unsupported ? 1 : -1;
  }
  shape[r - 1] *= 2;
  uint64_t s = 1;
  for (uint32_t d = r; d-- > 0;) {
    stride[d] = s > INT64_MAX ? INT64_MAX : (int64_t)s;
    if (shape[d] > 1 && !bs_mul_u64(s, shape[d], &s))
      s = UINT64_MAX;
  }
  return 0;
}

static struct bs_pv *make_tensor(struct vm *v, const struct bs_pv *g, const struct bs_pv *args)
{
  enum bs_pg k = g->u.glob.kind;
  size_t n = args->u.seq.n, min = k == BS_PG_REBUILD_V3 ? 7 : 4;
  if (n < min) {
    VFAIL(v, EINVAL, "%s.%s called with %zu arguments, expected at least %zu", g->u.glob.module,
          g->u.glob.name, n, min);
    return NULL;
  }
  struct bs_pv **a = args->u.seq.items;
  struct bs_pv *st = a[0];
  if (st->kind == BS_PV_TUPLE) /* the tar format passes the persistent id itself */
    st = pk_persistent_load(v, st);
  if (!st)
    return NULL;
  if (st->kind != BS_PV_STORAGE) {
    VFAIL(v, EINVAL, "%s.%s: storage argument is a %s", g->u.glob.module, g->u.glob.name,
          bs_pv_kind_name(st->kind));
    return NULL;
  }
  struct bs_pv *t = pk_newv(v, BS_PV_TENSOR);
  if (!t)
    return NULL;
  t->u.tensor.storage = st;
  if (!as_u64(a[1], &t->u.tensor.offset)) {
    VFAIL(v, EINVAL, "tensor storage offset is a %s, expected an int >= 0",
          bs_pv_kind_name(a[1]->kind));
    return NULL;
  }
  uint32_t rank, srank;
  int64_t *shape, *stride;
  if (int_tuple(v, a[2], "size", true, &rank, &shape) != 0 ||
      int_tuple(v, a[3], "stride", false, &srank, &stride) != 0)
    return NULL;
  if (srank != rank) {
    VFAIL(v, EINVAL, "tensor has %u sizes but %u strides", rank, srank);
    return NULL;
  }
  t->u.tensor.rank = rank;
  t->u.tensor.shape = (uint64_t *)shape; /* all >= 0 */
  t->u.tensor.stride = stride;
  if (k == BS_PG_REBUILD_V3) {
    const struct bs_pv *dt = a[6];
    if (dt->kind != BS_PV_GLOBAL || dt->u.glob.kind != BS_PG_DTYPE) {
      VFAIL(v, EINVAL, "_rebuild_tensor_v3: dtype argument is a %s, expected a torch dtype",
            bs_pv_kind_name(dt->kind));
      return NULL;
    }
    if (!dt->u.glob.dtype_ok) {
      char tmp[160];
      snprintf(tmp, sizeof tmp, "dtype torch.%s is not supported", dt->u.glob.name);
      t->u.tensor.unsupported = pk_strndup(v, tmp, strlen(tmp));
      return t->u.tensor.unsupported ? t : NULL;
    }
    t->u.tensor.dtype_ok = true;
    t->u.tensor.dtype = dt->u.glob.dtype;
    if (t->u.tensor.dtype == BS_DT_F4 && f4_elements(v, t) != 0)
      return t->u.tensor.unsupported ? t : NULL;
  } else if (!st->u.storage.dtype_ok || st->u.storage.esize == 0 ||
             !strcmp(st->u.storage.cls, "UntypedStorage")) {
    char tmp[160];
    snprintf(tmp, sizeof tmp, "storage class %s is not supported", st->u.storage.cls);
    t->u.tensor.unsupported = pk_strndup(v, tmp, strlen(tmp));
    return t->u.tensor.unsupported ? t : NULL;
  } else {
    t->u.tensor.dtype_ok = true;
    t->u.tensor.dtype = st->u.storage.dtype;
  }
  if (k == BS_PG_REBUILD_QTENSOR && n >= 5 && quantizer(v, t, a[4]) != 0)
    return NULL;
  return t;
}

/* ---- calls ---------------------------------------------------------------------------------- */

static struct bs_pv *make_object(struct vm *v, struct bs_pv *cls, struct bs_pv *args)
{
  struct bs_pv *o = pk_newv(v, BS_PV_OBJECT);
  if (!o)
    return NULL;
  o->u.obj.cls = cls;
  o->u.obj.args = args;
  if (cls->kind == BS_PV_GLOBAL && cls->u.glob.kind == BS_PG_OPAQUE &&
      pk_note(v, "skipped object of class %s.%s at pickle offset %" PRIu64, cls->u.glob.module,
              cls->u.glob.name, v->op_pos) != 0)
    return NULL;
  return o;
}

static struct bs_pv *set_from(struct vm *v, const struct bs_pv *args)
{
  struct bs_pv *s = pk_newv(v, BS_PV_SET);
  if (!s)
    return NULL;
  if (args && args->u.seq.n > 0) {
    const struct bs_pv *src = args->u.seq.items[0];
    if (src->kind == BS_PV_LIST || src->kind == BS_PV_TUPLE || src->kind == BS_PV_SET)
      for (size_t i = 0; i < src->u.seq.n; i++)
        if (pk_seq_push(v, &s->u.seq, src->u.seq.items[i]) != 0)
          return NULL;
  }
  return s;
}

/* A module met inside an object being built (torch.save(model) of a class
 * of the user's: its submodules are met first that burnstore knows) is
 * named by that object's class: the outermost object of a class not known
 * (opaque) still on the stack, its state being read. */
static struct bs_pv *refuse_module(struct vm *v, const struct bs_pv *cls)
{
  const struct bs_pv *top = NULL;
  for (size_t i = 0; i < v->sp && !top; i++) {
    const struct bs_pv *o = v->stack[i];
    if (o->kind == BS_PV_OBJECT && o->u.obj.cls && o->u.obj.cls->kind == BS_PV_GLOBAL &&
        o->u.obj.cls->u.glob.kind == BS_PG_OPAQUE)
      top = o->u.obj.cls;
  }
  if (top && (strcmp(top->u.glob.module, cls->u.glob.module) != 0 ||
              strcmp(top->u.glob.name, cls->u.glob.name) != 0))
    VFAIL(v, ENOTSUP,
          "this file pickles a whole nn.Module (%s.%s, holding %s.%s); save model.state_dict() "
          "instead",
          top->u.glob.module, top->u.glob.name, cls->u.glob.module, cls->u.glob.name);
  else
    VFAIL(v, ENOTSUP,
          "this file pickles a whole nn.Module (%s.%s); save model.state_dict() instead",
          cls->u.glob.module, cls->u.glob.name);
  return NULL;
}

struct bs_pv *pk_call_new(struct vm *v, struct bs_pv *cls, struct bs_pv *args)
{
  if (cls->kind != BS_PV_GLOBAL) {
    VFAIL(v, EINVAL, "NEWOBJ on a %s, which is not a class", bs_pv_kind_name(cls->kind));
    return NULL;
  }
  switch (cls->u.glob.kind) {
  case BS_PG_NN_MODULE: return refuse_module(v, cls);
  case BS_PG_ORDERED_DICT: {
    struct bs_pv *d = pk_newv(v, BS_PV_DICT);
    if (d)
      d->u.dict.ordered = true;
    return d;
  }
  case BS_PG_SET:
  case BS_PG_FROZENSET: return set_from(v, args);
  case BS_PG_TENSOR_CLASS:
    if (args && args->u.seq.n > 0 && args->u.seq.items[0]->kind == BS_PV_TENSOR)
      return args->u.seq.items[0];
    return make_object(v, cls, args);
  default: return make_object(v, cls, args);
  }
}

struct bs_pv *pk_call(struct vm *v, struct bs_pv *f, struct bs_pv *args, unsigned nesting)
{
  if (f->kind != BS_PV_GLOBAL) {
    VFAIL(v, EINVAL, "REDUCE on a %s, which cannot be called", bs_pv_kind_name(f->kind));
    return NULL;
  }
  if (args->kind != BS_PV_TUPLE) {
    VFAIL(v, EINVAL, "REDUCE arguments are a %s, expected a tuple", bs_pv_kind_name(args->kind));
    return NULL;
  }
  size_t n = args->u.seq.n;
  struct bs_pv **a = args->u.seq.items;
  switch (f->u.glob.kind) {
  case BS_PG_ORDERED_DICT: {
    struct bs_pv *d = pk_newv(v, BS_PV_DICT);
    if (!d)
      return NULL;
    d->u.dict.ordered = true;
    if (n > 0 && (a[0]->kind == BS_PV_LIST || a[0]->kind == BS_PV_TUPLE)) {
      for (size_t i = 0; i < a[0]->u.seq.n; i++) {
        const struct bs_pv *pair = a[0]->u.seq.items[i];
        if ((pair->kind != BS_PV_TUPLE && pair->kind != BS_PV_LIST) || pair->u.seq.n != 2) {
          VFAIL(v, EINVAL, "%s", "OrderedDict item is not a (key, value) pair");
          return NULL;
        }
        if (pk_dict_set(v, d, pair->u.seq.items[0], pair->u.seq.items[1]) != 0)
          return NULL;
      }
    } else if (n > 0 && a[0]->kind == BS_PV_DICT) {
      for (size_t i = 0; i < a[0]->u.dict.keys.n; i++)
        if (pk_dict_set(v, d, a[0]->u.dict.keys.items[i], a[0]->u.dict.vals.items[i]) != 0)
          return NULL;
    }
    return d;
  }
  case BS_PG_REBUILD_V2:
  case BS_PG_REBUILD_V3:
  case BS_PG_REBUILD_LEGACY:
  case BS_PG_REBUILD_QTENSOR: return make_tensor(v, f, args);
  case BS_PG_REBUILD_OTHER: {
    char tmp[200];
    snprintf(tmp, sizeof tmp, "torch._utils.%s tensors are not supported", f->u.glob.name);
    const char *why = pk_strndup(v, tmp, strlen(tmp));
    return why ? unsupported_tensor(v, why) : NULL;
  }
  case BS_PG_PARAMETER:
    if (n == 0) {
      VFAIL(v, EINVAL, "%s called without arguments", f->u.glob.name);
      return NULL;
    }
    return a[0];
  case BS_PG_FROM_TYPE_V2:
    if (n < 3 || a[2]->kind != BS_PV_TUPLE) {
      VFAIL(v, EINVAL, "%s", "_rebuild_from_type_v2 needs (func, type, args, state)");
      return NULL;
    }
    if (nesting >= MAX_REBUILD_NESTING) {
      VFAIL(v, EINVAL, "_rebuild_from_type_v2 nested more than %u deep", MAX_REBUILD_NESTING);
      return NULL;
    }
    return pk_call(v, a[0], a[2], nesting + 1);
  case BS_PG_SIZE:
    if (n > 0 && (a[0]->kind == BS_PV_TUPLE || a[0]->kind == BS_PV_LIST))
      return a[0];
    return pk_newv(v, BS_PV_TUPLE);
  case BS_PG_DEVICE:
    if (n > 0 && a[0]->kind == BS_PV_STR)
      return a[0];
    return make_object(v, f, args);
  case BS_PG_CODECS_ENCODE: {
    if (n < 1 || a[0]->kind != BS_PV_STR)
      return make_object(v, f, args);
    bool latin1 = n > 1 && a[1]->kind == BS_PV_STR &&
                  (!strcmp(a[1]->u.str.s, "latin1") || !strcmp(a[1]->u.str.s, "latin-1"));
    const uint8_t *s = (const uint8_t *)a[0]->u.str.s;
    size_t len = a[0]->u.str.len, o = 0;
    struct bs_pv *b = pk_new_str(v, BS_PV_BYTES, s, len);
    if (!b || !latin1)
      return b;
    /* UTF-8 code points below 256 -> one byte each */
    for (size_t i = 0; i < len; i++) {
      if (s[i] < 0x80) {
        b->u.str.s[o++] = (char)s[i];
      } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < len && s[i] <= 0xC3) {
        b->u.str.s[o++] = (char)(((s[i] & 0x03) << 6) | (s[i + 1] & 0x3F));
        i++;
      } else {
        VFAIL(v, EINVAL, "%s", "_codecs.encode: character outside latin-1");
        return NULL;
      }
    }
    b->u.str.s[o] = '\0';
    b->u.str.len = o;
    return b;
  }
  case BS_PG_SET:
  case BS_PG_FROZENSET: return set_from(v, args);
  case BS_PG_BYTEARRAY:
    if (n > 0 && a[0]->kind == BS_PV_BYTES)
      return a[0];
    return pk_new_str(v, BS_PV_BYTES, "", 0);
  case BS_PG_RECONSTRUCTOR:
    if (n < 1) {
      VFAIL(v, EINVAL, "%s", "copyreg._reconstructor called without a class");
      return NULL;
    }
    return pk_call_new(v, a[0], NULL);
  case BS_PG_NN_MODULE: return refuse_module(v, f);
  case BS_PG_TENSOR_CLASS: return pk_call_new(v, f, args);
  default: return make_object(v, f, args);
  }
}

static bool dict_has_str(const struct bs_pv *d, const char *key)
{
  for (size_t i = 0; i < d->u.dict.keys.n; i++) {
    const struct bs_pv *k = d->u.dict.keys.items[i];
    if (k->kind == BS_PV_STR && strcmp(k->u.str.s, key) == 0)
      return true;
  }
  return false;
}

int pk_build(struct vm *v, struct bs_pv *target, struct bs_pv *state)
{
  switch (target->kind) {
  case BS_PV_DICT:
    if (!target->u.dict.ordered)
      return VFAIL(v, EINVAL, "%s", "BUILD on a plain dict (a dict has no attributes)");
    target->u.dict.attrs = state; /* e.g. state_dict._metadata: ignored */
    return 0;
  case BS_PV_OBJECT:
    if (state->kind == BS_PV_DICT && dict_has_str(state, "_parameters") &&
        dict_has_str(state, "_modules") && target->u.obj.cls->kind == BS_PV_GLOBAL) {
      refuse_module(v, target->u.obj.cls);
      return -1;
    }
    target->u.obj.state = state;
    return 0;
  case BS_PV_TENSOR: return 0; /* Python attributes of a tensor */
  default: return VFAIL(v, EINVAL, "BUILD on a %s", bs_pv_kind_name(target->kind));
  }
}
