/* The PyTorch-to-Burn adapter view (see adapter.h). */
#include <errno.h>
#include <string.h>

#include "core/alloc.h"
#include "core/strmap.h"
#include "policy/adapter.h"

void bs_adapter_init(struct bs_adapter *a)
{
  memset(a, 0, sizeof *a);
  bs_keyopts_init(&a->linear);
  bs_keyopts_init(&a->norm);
}

void bs_adapter_destroy(struct bs_adapter *a)
{
  bs_keyopts_destroy(&a->linear);
  bs_keyopts_destroy(&a->norm);
  a->pytorch = false;
}

bool bs_adapter_any(const struct bs_adapter *a)
{
  return a->pytorch || a->linear.ninclude || a->norm.ninclude;
}

int bs_adapter_add_item(struct bs_adapter *a, const char *item, bs_err *err)
{
  if (strncmp(item, "adapter=", 8) == 0) {
    if (strcmp(item + 8, "pytorch") != 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "adapter=%s: the one adapter is 'pytorch' (PyTorchToBurnAdapter)", item + 8);
    a->pytorch = true;
    return 0;
  }
  struct bs_keyopts *o = NULL;
  const char *v = NULL;
  if (strncmp(item, "adapter_linear=", 15) == 0)
    o = &a->linear, v = item + 15;
  else if (strncmp(item, "adapter_norm=", 13) == 0)
    o = &a->norm, v = item + 13;
  if (!o)
    return 1;
  return bs_keyopts_add(o, "include", v, err) == 0 ? 0 : -1;
}

/* "P.weight" -> the index of the visible "P.<last>" sibling, or -1. */
static long sibling(const struct bs_strmap *m, const char *name, const char *last)
{
  size_t n = strlen(name);
  if (n < 6 || strcmp(name + n - 6, "weight") != 0)
    return -1;
  size_t pre = n - 6, ln = strlen(last);
  char stack[512];
  char *buf = pre + ln + 1 <= sizeof stack ? stack : bs_malloc(pre + ln + 1);
  if (!buf)
    return -1;
  memcpy(buf, name, pre);
  memcpy(buf + pre, last, ln + 1);
  size_t v;
  long r = bs_strmap_get(m, buf, &v) ? (long)v : -1;
  if (buf != stack)
    bs_free(buf);
  return r;
}

static bool is_weight(const char *name)
{
  size_t n = strlen(name);
  return n >= 6 && strcmp(name + n - 6, "weight") == 0 && (n == 6 || name[n - 7] == '.');
}

/* Replace the trailing "weight"/"bias" of t->name by `to`. */
static int rename_last(struct bs_tensor *t, size_t cut, const char *to, bs_err *err)
{
  size_t n = strlen(t->name) - cut, tl = strlen(to);
  char *s = bs_malloc(n + tl + 1);
  if (!s)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
  memcpy(s, t->name, n);
  memcpy(s + n, to, tl + 1);
  if (t->name != t->key) /* a name shares its key's string until renamed */
    bs_free(t->name);
  t->name = s;
  return 0;
}

static int transpose(struct bs_catalog *cat, struct bs_tensor *t, bs_err *err)
{
  if (t->x->strides) {
    int64_t s = t->x->strides[0];
    t->x->strides[0] = t->x->strides[1];
    t->x->strides[1] = s;
  } else {
    int64_t *st = bs_tensor_x(cat, t) ? bs_malloc(2 * sizeof *st) : NULL;
    if (!st)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
    /* [out, in] row-major: element (o, i) at o*in + i; the view [in, out]
     * has (i, o) there: strides [1, in]. */
    st[0] = 1;
    st[1] = (int64_t)t->shape[1];
    t->x->strides = st;
    t->x->storage_off = 0;
    t->x->storage_bytes = t->nbytes;
  }
  uint64_t d = t->shape[0];
  t->shape[0] = t->shape[1];
  t->shape[1] = d;
  return bs_tensor_check_view(t, t->off, err);
}

int bs_adapter_apply(struct bs_catalog *cat, const struct bs_adapter *a, size_t *ntrans,
                     size_t *nren, bs_err *err)
{
  size_t nt = 0, nr = 0;
  if (ntrans)
    *ntrans = 0;
  if (nren)
    *nren = 0;
  if (!bs_adapter_any(a))
    return 0;
  if (!a->pytorch)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "adapter_linear= and adapter_norm= need adapter=pytorch");
  struct bs_strmap m = {0};
  int rc = -1;
  /* Decide on the names as they are (before any rename), then act. */
  uint8_t *kind =
      bs_calloc(cat->count ? cat->count : 1, 1); /* 1 linear, 2 norm weight, 3 norm bias */
  if (!kind) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < cat->count; i++)
    if (!cat->tensors[i].hidden && bs_strmap_put(&m, cat->tensors[i].name, i) < 0) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
  for (size_t i = 0; i < cat->count; i++) {
    struct bs_tensor *t = &cat->tensors[i];
    if (t->hidden || !is_weight(t->name) || t->x->unsupported)
      continue;
    long b = sibling(&m, t->name, "bias");
    const struct bs_tensor *bt = b >= 0 ? &cat->tensors[b] : NULL;
    bool lin, norm;
    if (a->linear.ninclude)
      lin = t->rank == 2 && bs_keys_keep(&a->linear, t->name);
    else
      lin = t->rank == 2 && bt && bt->rank == 1 && bt->shape[0] == t->shape[0];
    if (a->norm.ninclude)
      norm = bs_keys_keep(&a->norm, t->name);
    else
      norm = t->rank == 1;
    if (lin) {
      unsigned bits = bs_dtype_bits(t->dtype);
      if (bits && bits % 8 == 0)
        kind[i] = 1;
    } else if (norm) {
      kind[i] = 2;
      if (bt)
        kind[b] = 3;
    }
  }
  for (size_t i = 0; i < cat->count; i++) {
    struct bs_tensor *t = &cat->tensors[i];
    if (kind[i] == 1) {
      if (transpose(cat, t, err) != 0)
        goto out;
      nt++;
    } else if (kind[i] >= 2) {
      const char *to = kind[i] == 2 ? "gamma" : "beta";
      size_t cut = kind[i] == 2 ? 6 : 4;
      if (rename_last(t, cut, to, err) != 0)
        goto out;
      nr++;
    }
  }
  /* The renamed keys must not meet another visible key (the map's keys
   * were the old names: start again). */
  bs_strmap_destroy(&m);
  memset(&m, 0, sizeof m);
  for (size_t i = 0; i < cat->count; i++) {
    if (cat->tensors[i].hidden)
      continue;
    int p = bs_strmap_put(&m, cat->tensors[i].name, i);
    if (p < 0) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
    if (p > 0) {
      size_t j = 0;
      (void)bs_strmap_get(&m, cat->tensors[i].name, &j);
      size_t r = kind[i] >= 2 ? i : j, o = r == i ? j : i;
      bs_fail(err, EEXIST, BS_OFF_NONE, cat->tensors[r].key,
              "adapter=pytorch renames it to '%s', which tensor '%s' already has",
              cat->tensors[r].name, cat->tensors[o].key);
      goto out;
    }
  }
  rc = 0;
  if (ntrans)
    *ntrans = nt;
  if (nren)
    *nren = nr;
out:
  bs_free(kind);
  bs_strmap_destroy(&m);
  return rc;
}
