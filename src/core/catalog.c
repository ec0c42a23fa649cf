#include "core/catalog.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/decode.h"
#include "core/qfloat.h"

void bs_catalog_init(struct bs_catalog *cat)
{
  memset(cat, 0, sizeof *cat);
}

/* The tensors' shapes and keys live in arenas of blocks (issue 34): a
 * malloc per tensor cost 16-24 bytes of overhead and rounding, a sixth of
 * an entry at a million tensors. Keys are packed byte by byte (cat->keys),
 * shapes and x blocks 8-aligned (cat->words). A dropped tensor's bytes (a
 * reader's rollback) stay in the arena until the catalog goes. */
struct bs_key_block {
  struct bs_key_block *next;
  size_t used, cap;
  _Alignas(uint64_t) char bytes[];
};

#define KEY_BLOCK (256u << 10)

/* n bytes from arena *head (align: 1, or 8 rounds n up); NULL out of memory. */
static void *arena_alloc(struct bs_key_block **head, size_t n, size_t align)
{
  size_t need = (n + align - 1) & ~(align - 1);
  struct bs_key_block *b = *head;
  if (!b || b->cap - b->used < need) {
    size_t cap = need > KEY_BLOCK ? need : KEY_BLOCK;
    struct bs_key_block *nb = bs_malloc(sizeof *nb + cap);
    if (!nb)
      return NULL;
    nb->used = 0;
    nb->cap = cap;
    if (b && need > KEY_BLOCK) { /* a long key: a block of its own, behind the current one */
      nb->next = b->next;
      b->next = nb;
    } else {
      nb->next = b;
      *head = nb;
    }
    b = nb;
  }
  void *p = b->bytes + b->used;
  b->used += need;
  return p;
}

/* The rarely-used fields of every tensor that has none of its own: read
 * only (in read-only memory: a write through it faults at once). */
static const struct bs_tensor_x x_none;

struct bs_tensor_x *bs_tensor_x(struct bs_catalog *cat, struct bs_tensor *t)
{
  if (t->x != &x_none)
    return t->x;
  struct bs_tensor_x *x = arena_alloc(&cat->words, sizeof *x, 8);
  if (x) {
    memset(x, 0, sizeof *x);
    t->x = x;
  }
  return x;
}

int bs_tensor_copy_x(struct bs_catalog *cat, struct bs_tensor *t, const struct bs_tensor *s)
{
  if (s->x == &x_none)
    return 0;
  struct bs_tensor_x *x = bs_tensor_x(cat, t);
  if (!x)
    return -1;
  x->storage_off = s->x->storage_off;
  x->storage_bytes = s->x->storage_bytes;
  x->param_id = s->x->param_id;
  if (s->x->strides) {
    if (!(x->strides = bs_malloc(s->rank * sizeof *x->strides)))
      return -1;
    memcpy(x->strides, s->x->strides, s->rank * sizeof *x->strides);
  }
  if (s->x->dtype_raw) {
    if (!(x->dtype_raw = bs_malloc(s->x->dtype_raw_len)))
      return -1;
    memcpy(x->dtype_raw, s->x->dtype_raw, s->x->dtype_raw_len);
    x->dtype_raw_len = s->x->dtype_raw_len;
  }
  return 0;
}

static void tensor_destroy(struct bs_tensor *t)
{
  if (t->name != t->key)
    bs_free(t->name);
  /* key, shape and x are in the catalog's arena (bs_catalog_add). */
  if (t->x != &x_none) {
    bs_free(t->x->strides);
    bs_free(t->x->dtype_raw);
    bs_free(t->x->unsupported);
  }
}

void bs_catalog_truncate(struct bs_catalog *cat, size_t count, size_t nmeta)
{
  while (cat->count > count)
    tensor_destroy(&cat->tensors[--cat->count]);
  while (cat->nmeta > nmeta)
    bs_kv_destroy(&cat->meta[--cat->nmeta]);
}

struct bs_catalog_mark bs_catalog_mark(const struct bs_catalog *cat)
{
  return (struct bs_catalog_mark){.count = cat->count,
                                  .nmeta = cat->nmeta,
                                  .nsrcs = cat->nsrcs,
                                  .notes_len = cat->notes ? cat->notes_len : 0,
                                  .had_values = cat->values_json != NULL};
}

void bs_catalog_rollback(struct bs_catalog *cat, const struct bs_catalog_mark *m)
{
  bs_catalog_truncate(cat, m->count, m->nmeta);
  while (cat->nsrcs > m->nsrcs)
    bs_src_destroy(&cat->srcs[--cat->nsrcs]);
  bs_catalog_notes_truncate(cat, m->notes_len);
  if (!m->had_values) {
    bs_free(cat->values_json);
    cat->values_json = NULL;
  }
}

void bs_catalog_destroy(struct bs_catalog *cat)
{
  if (!cat)
    return;
  bs_catalog_truncate(cat, 0, 0);
  bs_free(cat->tensors);
  for (size_t i = 0; i < cat->nsrcs; i++)
    bs_src_destroy(&cat->srcs[i]);
  bs_free(cat->srcs);
  bs_free(cat->meta);
  bs_free(cat->values_json);
  bs_free(cat->notes);
  for (struct bs_key_block *b = cat->keys, *next; b; b = next) {
    next = b->next;
    bs_free(b);
  }
  for (struct bs_key_block *b = cat->words, *next; b; b = next) {
    next = b->next;
    bs_free(b);
  }
  memset(cat, 0, sizeof *cat);
}

int bs_catalog_add_src(struct bs_catalog *cat, struct bs_src *src, uint32_t *idx, bs_err *err)
{
  if (cat->nsrcs >= UINT32_MAX ||
      bs_grow((void **)&cat->srcs, &cat->srccap, cat->nsrcs + 1, sizeof *cat->srcs) != 0) {
    bs_src_destroy(src);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  cat->srcs[cat->nsrcs] = *src;
  memset(src, 0, sizeof *src);
  *idx = (uint32_t)cat->nsrcs++;
  return 0;
}

int bs_catalog_reserve(struct bs_catalog *cat, size_t more)
{
  if (more > SIZE_MAX / sizeof *cat->tensors - cat->count)
    return -1;
  size_t need = cat->count + more;
  if (need <= cat->cap)
    return 0;
  struct bs_tensor *t = bs_realloc(cat->tensors, need * sizeof *t);
  if (!t)
    return -1;
  cat->tensors = t;
  cat->cap = need;
  return 0;
}

struct bs_tensor *bs_catalog_add(struct bs_catalog *cat, const char *key, enum bs_dtype dtype,
                                 uint32_t rank, const uint64_t *shape, uint64_t off, bs_err *err)
{
  if (cat->count >= BS_MAX_TENSORS) {
    bs_fail(err, EFBIG, off, key, "more than %u tensors", BS_MAX_TENSORS);
    return NULL;
  }
  if (strlen(key) > BS_MAX_KEY_LEN) {
    bs_fail(err, EINVAL, off, NULL, "tensor key of %zu bytes exceeds the limit of %u", strlen(key),
            BS_MAX_KEY_LEN);
    return NULL;
  }
  if (rank > BS_MAX_RANK) {
    bs_fail(err, EINVAL, off, key, "rank %u exceeds the limit of %u", rank, BS_MAX_RANK);
    return NULL;
  }
  uint64_t nbytes = 0;
  if (dtype != BS_DT_QFLOAT && bs_dtype_nbytes(dtype, rank, shape, &nbytes, key, off, err) != 0)
    return NULL;
  if (bs_grow((void **)&cat->tensors, &cat->cap, cat->count + 1, sizeof *cat->tensors) != 0) {
    bs_fail(err, ENOMEM, off, key, "out of memory");
    return NULL;
  }
  struct bs_tensor *t = &cat->tensors[cat->count];
  memset(t, 0, sizeof *t);
  size_t klen = strlen(key), sbytes = (size_t)rank * sizeof *shape;
  uint64_t *sh = rank ? arena_alloc(&cat->words, sbytes, 8) : NULL;
  char *k = arena_alloc(&cat->keys, klen + 1, 1);
  if ((rank && !sh) || !k) {
    bs_fail(err, ENOMEM, off, key, "out of memory");
    return NULL;
  }
  if (rank) {
    t->shape = sh;
    memcpy(t->shape, shape, sbytes);
  }
  t->key = k;
  memcpy(t->key, key, klen + 1);
  t->name = t->key; /* one string until key options rename it */
  t->x = (struct bs_tensor_x *)&x_none;
  t->dtype = dtype;
  t->rank = rank;
  t->nbytes = nbytes;
  cat->count++;
  return t;
}

int bs_catalog_add_meta(struct bs_catalog *cat, const char *key, const char *value, bs_err *err)
{
  char *k = bs_strdup(key), *v = bs_strdup(value);
  if (!k || !v) {
    bs_free(k);
    bs_free(v);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  return bs_catalog_take_meta(cat, k, v, err);
}

int bs_catalog_take_meta(struct bs_catalog *cat, char *key, char *value, bs_err *err)
{
  if (bs_grow((void **)&cat->meta, &cat->metacap, cat->nmeta + 1, sizeof *cat->meta) != 0) {
    bs_free(key);
    bs_free(value);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  cat->meta[cat->nmeta++] = (struct bs_kv){key, value, NULL, false};
  return 0;
}

void bs_kv_destroy(struct bs_kv *kv)
{
  if (!kv->borrowed) {
    bs_free(kv->key);
    bs_free(kv->value);
    bs_free(kv->ref);
  }
  kv->key = kv->value = NULL;
  kv->ref = NULL;
  kv->borrowed = false;
}

int bs_kv_set_value(struct bs_kv *kv, char *value)
{
  if (kv->borrowed) {
    char *key = bs_strdup(kv->key);
    if (!key) {
      bs_free(value);
      return -1;
    }
    *kv = (struct bs_kv){key, value, NULL, false};
    return 0;
  }
  bs_free(kv->value);
  bs_free(kv->ref);
  kv->value = value;
  kv->ref = NULL;
  return 0;
}

uint64_t bs_kv_text_len(const struct bs_kv *kv)
{
  return kv->ref ? kv->ref->text_len : kv->value ? strlen(kv->value) : 0;
}

int bs_kv_copy(struct bs_kv *dst, const struct bs_kv *src)
{
  dst->borrowed = false; /* (a copy is its own) */
  dst->key = bs_strdup(src->key);
  dst->value = src->value ? bs_strdup(src->value) : NULL;
  dst->ref = src->ref ? bs_malloc(sizeof *dst->ref) : NULL;
  if (!dst->key || (src->value && !dst->value) || (src->ref && !dst->ref)) {
    bs_kv_destroy(dst);
    return -1;
  }
  if (src->ref)
    *dst->ref = *src->ref;
  return 0;
}

int bs_catalog_add_meta_kv(struct bs_catalog *cat, const struct bs_kv *kv, bs_err *err)
{
  if (bs_grow((void **)&cat->meta, &cat->metacap, cat->nmeta + 1, sizeof *cat->meta) != 0 ||
      bs_kv_copy(&cat->meta[cat->nmeta], kv) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  cat->nmeta++;
  return 0;
}

int bs_catalog_take_meta_ref(struct bs_catalog *cat, char *key, const struct bs_meta_ref *r,
                             bs_err *err)
{
  struct bs_meta_ref *ref = bs_malloc(sizeof *ref);
  if (!ref || bs_grow((void **)&cat->meta, &cat->metacap, cat->nmeta + 1, sizeof *cat->meta) != 0) {
    bs_free(ref);
    bs_free(key);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  *ref = *r;
  cat->meta[cat->nmeta++] = (struct bs_kv){key, NULL, ref, false};
  return 0;
}

int bs_catalog_note(struct bs_catalog *cat, const char *line, bs_err *err)
{
  /* The length is kept, not recounted: a reader or a write-back of many
   * files notes one line each, and strlen per line made that quadratic. */
  size_t old = cat->notes ? cat->notes_len : 0, add = strlen(line);
  if (!cat->notes)
    cat->notes_cap = 0;
  if (add > SIZE_MAX - old - 2 ||
      bs_grow((void **)&cat->notes, &cat->notes_cap, old + add + 2, 1) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  memcpy(cat->notes + old, line, add);
  cat->notes[old + add] = '\n';
  cat->notes[old + add + 1] = '\0';
  cat->notes_len = old + add + 1;
  return 0;
}

void bs_catalog_notes_truncate(struct bs_catalog *cat, size_t len)
{
  if (!cat->notes || len >= cat->notes_len)
    return;
  if (len == 0) {
    bs_free(cat->notes);
    cat->notes = NULL;
    cat->notes_len = cat->notes_cap = 0;
    return;
  }
  cat->notes[len] = '\0';
  cat->notes_len = len;
}

long bs_catalog_find(const struct bs_catalog *cat, const char *key)
{
  for (size_t i = 0; i < cat->count; i++)
    if (strcmp(cat->tensors[i].key, key) == 0)
      return (long)i;
  return -1;
}

bool bs_tensor_fd_range(const struct bs_catalog *cat, const struct bs_tensor *t, int *fd,
                        uint64_t *abs_off)
{
  if (t->x->strides || t->x->unsupported || t->decoded || t->src >= cat->nsrcs)
    return false;
  *fd = bs_src_fd_get(&cat->srcs[t->src]);
  if (*fd < 0)
    return false;
  *abs_off = t->off;
  return true;
}

void bs_tensor_fd_put(const struct bs_catalog *cat, const struct bs_tensor *t, int fd)
{
  if (t->src < cat->nsrcs)
    bs_src_fd_put(&cat->srcs[t->src], fd);
}

int bs_tensor_view(const struct bs_catalog *cat, const struct bs_tensor *t, uint64_t off, size_t n,
                   struct bs_src_view *v)
{
  v->count = 0;
  if (t->x->strides || t->x->unsupported || t->decoded || t->src >= cat->nsrcs)
    return -ENOTSUP;
  if (off >= t->nbytes || n == 0)
    return -EINVAL;
  if (n > t->nbytes - off)
    n = (size_t)(t->nbytes - off);
  const struct bs_src *s = &cat->srcs[t->src];
  int rc = bs_src_view(s, t->off + off, n, v);
  if (rc == 0 && bs_src_changed(s, NULL, 0)) {
    bs_src_view_put(s, v);
    rc = -EIO;
  }
  return rc;
}

void bs_tensor_view_put(const struct bs_catalog *cat, const struct bs_tensor *t,
                        struct bs_src_view *v)
{
  if (t->src < cat->nsrcs)
    bs_src_view_put(&cat->srcs[t->src], v);
}

int bs_tensor_check_view(const struct bs_tensor *t, uint64_t off, bs_err *err)
{
  uint64_t numel;
  if (bs_shape_numel(t->rank, t->shape, &numel) != 0)
    return bs_fail(err, EINVAL, off, t->key, "shape overflows");
  if (numel == 0)
    return 0;
  unsigned bits = bs_dtype_bits(t->dtype);
  if (bits == 0 || bits % 8 != 0)
    return bs_fail(err, ENOTSUP, off, t->key, "strided view of %s is not supported",
                   bs_dtype_name(t->dtype));
  uint64_t last = t->x->storage_off;
  for (uint32_t i = 0; i < t->rank; i++) {
    uint64_t step;
    if (t->x->strides[i] < 0)
      return bs_fail(err, EINVAL, off, t->key, "negative stride %lld in dimension %u",
                     (long long)t->x->strides[i], i);
    if (!bs_mul_u64(t->shape[i] - 1, (uint64_t)t->x->strides[i], &step) ||
        !bs_add_u64(last, step, &last))
      return bs_fail(err, EINVAL, off, t->key, "stride arithmetic overflows");
  }
  uint64_t end;
  if (!bs_add_u64(last, 1, &end) || !bs_mul_u64(end, bits / 8, &end))
    return bs_fail(err, EINVAL, off, t->key, "stride arithmetic overflows");
  if (end > t->x->storage_bytes)
    return bs_fail(err, EINVAL, off, t->key,
                   "storage too short: the view needs %llu bytes but the storage has %llu",
                   (unsigned long long)end, (unsigned long long)t->x->storage_bytes);
  return 0;
}

/* Strided gather. The innermost run of elements that is contiguous in the
 * storage is read with one pread; only the caller's buffer is filled. */
static long gather(const struct bs_src *s, const struct bs_tensor *t, uint64_t esize, uint64_t off,
                   uint8_t *buf, size_t n)
{
  size_t done = 0;
  /* Dimensions from the innermost outwards that are laid out contiguously
   * form one run. */
  uint64_t run = 1;
  int inner = (int)t->rank;
  while (inner > 0) {
    uint32_t d = (uint32_t)inner - 1;
    if (t->shape[d] == 1 || (uint64_t)t->x->strides[d] == run) {
      run *= t->shape[d];
      inner--;
    } else {
      break;
    }
  }
  uint64_t run_bytes = run * esize;
  while (done < n) {
    uint64_t pos = off + done; /* byte position in contiguous output */
    uint64_t elem = pos / esize, in_el = pos % esize;
    uint64_t run_idx = elem / run, in_run = elem % run;
    /* storage element of the first element of this run */
    uint64_t se = t->x->storage_off, rem = run_idx;
    for (int d = inner - 1; d >= 0; d--) {
      uint64_t i = rem % t->shape[d];
      rem /= t->shape[d];
      se += i * (uint64_t)t->x->strides[d];
    }
    uint64_t src_off = t->off + (se + in_run) * esize + in_el;
    uint64_t avail = run_bytes - (in_run * esize + in_el);
    size_t chunk = (size_t)(avail < n - done ? avail : n - done);
    long r = bs_src_pread(s, src_off, buf + done, chunk);
    if (r < 0)
      return done ? (long)done : r;
    if ((size_t)r != chunk)
      return -EIO;
    done += chunk;
  }
  return (long)done;
}

/* The stored bytes [off, off + n) of a tensor whose stored data is nbytes
 * long, in elements of esize bytes (strided views); the caller checks that
 * the source did not change (once per request, after reading). */
static long raw_pread(const struct bs_catalog *cat, const struct bs_tensor *t, uint64_t esize,
                      uint64_t nbytes, uint64_t off, void *buf, size_t n)
{
  if (off >= nbytes)
    return 0;
  if (t->x->unsupported)
    return -ENOTSUP;
  if (t->src >= cat->nsrcs)
    return -EIO;
  if (n > nbytes - off)
    n = (size_t)(nbytes - off);
  const struct bs_src *s = &cat->srcs[t->src];
  long got;
  if (t->x->strides) {
    got = gather(s, t, esize, off, buf, n);
  } else {
    size_t done = 0;
    while (done < n) {
      long r = bs_src_pread(s, t->off + off + done, (char *)buf + done, n - done);
      if (r == 0)
        return -EIO; /* the source shrank under us */
      if (r < 0 && !done)
        return r;
      if (r < 0)
        break;
      done += (size_t)r;
    }
    got = (long)done;
  }
  return got;
}

/* Checked after reading, so a change during the read is caught too. */
static long checked(const struct bs_catalog *cat, const struct bs_tensor *t, long got)
{
  return got > 0 && bs_src_changed(&cat->srcs[t->src], NULL, 0) ? -EIO : got;
}

/* Units decoded per step of a decoded read: the scratch is at most
 * DECODE_STEP_ELEMS floats and their stored bytes (64 KiB of F64). */
#define DECODE_STEP_ELEMS 8192u

/* The quantizer of a torch quantized tensor stored as dt (its reader keeps
 * it in dtype_raw: decode.h), or NULL. */
static const struct bs_torch_q *torch_q(const struct bs_tensor *t, enum bs_dtype dt)
{
  if (dt != BS_DT_QI8 && dt != BS_DT_QU8 && dt != BS_DT_QI32)
    return NULL;
  const struct bs_torch_q *q = bs_torch_q_get(t->x->dtype_raw, t->x->dtype_raw_len);
  uint64_t numel;
  return q && bs_shape_numel(t->rank, t->shape, &numel) == 0 && bs_torch_q_fits(q, numel) ? q
                                                                                          : NULL;
}

/* A decoded QFloat tensor's layout, made once by bs_catalog_decode_as
 * (policy/decode_as.h) and kept in its dtype_raw (as a torch quantizer is
 * kept there), or NULL. */
static const struct bs_qfloat *qfloat_kept(const struct bs_tensor *t)
{
  return t->x->dtype_raw && t->x->dtype_raw_len == sizeof(struct bs_qfloat)
             ? (const struct bs_qfloat *)(const void *)t->x->dtype_raw
             : NULL;
}

/* The elements of [e, e + k) whose value bytes are all in the value bytes
 * [b0, got) (a short read stopped at got): how many, from e on. */
static uint64_t qfloat_whole(const struct bs_qfloat *q, uint64_t e, uint64_t k, uint64_t got)
{
  uint64_t i = 0, x0, x1;
  for (; i < k; i++) {
    bs_qfloat_span(q, e + i, e + i + 1, &x0, &x1);
    if (x1 > got)
      break;
  }
  return i;
}

bool bs_tensor_stored_unit(const struct bs_tensor *t, enum bs_dtype dt, uint32_t *elems,
                           uint32_t *bytes)
{
  if (dt == BS_DT_F32 || torch_q(t, dt)) {
    *elems = 1;
    *bytes = bs_dtype_bits(dt) / 8;
    return true;
  }
  return bs_decode_unit(dt, elems, bytes);
}

/* n units of dt, the first being unit `first` of the tensor, to F32. */
static void to_f32(const struct bs_tensor *t, enum bs_dtype dt, uint64_t first, const uint8_t *in,
                   size_t n, float *out)
{
  const struct bs_torch_q *q = torch_q(t, dt);
  if (q)
    bs_decode_torch_q(dt, q, first, in, n, out);
  else if (dt != BS_DT_F32)
    bs_decode(dt, in, n, out);
  else
    for (size_t i = 0; i < n; i++) {
      uint32_t u = bs_le32(in + 4 * i);
      memcpy(&out[i], &u, sizeof u);
    }
}

/* Scales cached per QFloat read: a window of them, read as needed. */
#define QF_SCALES 1024u

/* A decoded QFloat tensor's bytes [off, off + n): the value bytes that
 * cover a step of elements, read, each value times its scale (from a
 * window of scales read as needed), encoded as t->dtype. A read that fails
 * part way returns the whole elements before the failure (a short read, as
 * raw_pread does), or its error if there are none. */
static long qfloat_read(const struct bs_catalog *cat, const struct bs_tensor *t, uint64_t off,
                        uint8_t *buf, size_t n)
{
  const struct bs_qfloat *q = qfloat_kept(t);
  const uint32_t osz = bs_dtype_bits(t->dtype) / 8;
  const uint64_t stored_len = t->x->storage_bytes; /* bs_catalog_decode_as kept it */
  if (off >= t->nbytes)
    return 0;
  if (!q || !bs_encode_ok(t->dtype))
    return -EIO;
  if (n > t->nbytes - off)
    n = (size_t)(t->nbytes - off);
  const uint64_t e_end = (off + n + osz - 1) / osz, ssz = bs_dtype_bits(q->scale_dt) / 8;
  uint64_t e = off / osz;
  uint64_t step = e_end - e < DECODE_STEP_ELEMS ? e_end - e : DECODE_STEP_ELEMS;
  uint8_t *raw = bs_malloc((size_t)step * 4 + 8), *sb = bs_malloc(QF_SCALES * 4);
  float *dec = bs_malloc((size_t)step * sizeof(float)), *sc = bs_malloc(QF_SCALES * sizeof(float));
  uint8_t *enc = bs_malloc((size_t)step * osz);
  uint64_t sc0 = 0, scn = 0; /* the window: scales [sc0, sc0 + scn) */
  long ret = 0, fail = 0;    /* fail: the source's error, after done bytes */
  size_t done = 0;
  if (!raw || !sb || !dec || !sc || !enc) {
    ret = -ENOMEM;
    goto out;
  }
  for (; e < e_end && !fail; e += step) {
    uint64_t k = e_end - e < step ? e_end - e : step;
    uint64_t b0, b1, i;
    bs_qfloat_span(q, e, e + k, &b0, &b1); /* b1 - b0 <= 4 k + 4 */
    long r = raw_pread(cat, t, 1, q->value_bytes, b0, raw, (size_t)(b1 - b0));
    if (r < 0 || (uint64_t)r != b1 - b0) {
      fail = r < 0 ? r : -EIO;
      k = qfloat_whole(q, e, k, b0 + (r > 0 ? (uint64_t)r : 0));
    }
    for (i = 0; i < k;) {
      /* the elements to the end of this block along the innermost
       * dimension share a scale: its index (divisions) once a run */
      const uint64_t si = bs_qfloat_scale_index(q, e + i), bl = q->block[q->rank - 1];
      uint64_t run = bl - (e + i) % q->inner % bl;
      if (run > k - i)
        run = k - i;
      if (si < sc0 || si >= sc0 + scn) {
        sc0 = si;
        scn = q->nscales - si < QF_SCALES ? q->nscales - si : QF_SCALES;
        r = raw_pread(cat, t, 1, stored_len, q->value_bytes + si * ssz, sb, (size_t)(scn * ssz));
        if (r < 0 || (uint64_t)r != scn * ssz) {
          fail = r < 0 ? r : -EIO;
          break;
        }
        for (uint64_t j = 0; j < scn; j++)
          sc[j] = bs_qfloat_scale(q, sb + j * ssz);
      }
      const float s = sc[si - sc0];
      if (q->layout == BS_QF_BYTES && q->fdt == BS_DT_I8)
        for (const uint64_t end = i + run; i < end; i++)
          dec[i] = (float)(int8_t)raw[e + i - b0] * s; /* burn: q as f32 * scale */
      else
        for (const uint64_t end = i + run; i < end; i++)
          dec[i] = bs_qfloat_value(q, raw, b0, e + i) * s;
    }
    if (i == 0)
      break;
    bs_encode(t->dtype, dec, (size_t)i, enc);
    const uint64_t skip = off + done - e * osz; /* < osz: i * osz > skip */
    const size_t chunk = (size_t)(i * osz - skip) < n - done ? (size_t)(i * osz - skip) : n - done;
    memcpy(buf + done, enc + skip, chunk);
    done += chunk;
  }
  ret = done ? checked(cat, t, (long)done) : fail;
out:
  bs_free(raw);
  bs_free(sb);
  bs_free(dec);
  bs_free(sc);
  bs_free(enc);
  return ret;
}

/* A decoded tensor's bytes [off, off + n) (of dtype: F32, F16 or BF16):
 * the stored units that cover them, read, decoded to F32 and, for F16 and
 * BF16, narrowed, a step at a time into a bounded scratch. A read of the
 * stored bytes that fails part way (raw_pread's short read) gives the
 * decoded bytes of the whole units it read: a short read, as the raw path
 * returns the bytes it has; its error only when there are none. */
static long decoded_read(const struct bs_catalog *cat, const struct bs_tensor *t, uint64_t off,
                         uint8_t *buf, size_t n)
{
  uint32_t ue, ub;
  const enum bs_dtype sdt = (enum bs_dtype)t->stored_dtype;
  if (sdt == BS_DT_QFLOAT)
    return qfloat_read(cat, t, off, buf, n);
  if (off >= t->nbytes)
    return 0;
  if (!bs_tensor_stored_unit(t, sdt, &ue, &ub) || !bs_encode_ok(t->dtype))
    return -EIO; /* bs_catalog_decode_as set only decodable ones */
  if (n > t->nbytes - off)
    n = (size_t)(t->nbytes - off);
  const uint32_t osz = bs_dtype_bits(t->dtype) / 8;
  const uint64_t uout = (uint64_t)ue * osz; /* output bytes per unit */
  const uint64_t nunits = t->nbytes / uout, stored_len = nunits * ub;
  uint32_t step = DECODE_STEP_ELEMS / ue ? DECODE_STEP_ELEMS / ue : 1;
  const uint64_t first = off / uout, cover = (off + n + uout - 1) / uout - first;
  if (cover < step)
    step = (uint32_t)cover; /* a small read needs a small scratch */
  uint8_t *raw = bs_malloc((size_t)step * ub);
  float *dec = bs_malloc((size_t)step * ue * sizeof(float));
  uint8_t *enc = t->dtype == BS_DT_F32 ? (uint8_t *)dec : bs_malloc((size_t)step * ue * osz);
  long ret = 0;
  if (!raw || !dec || !enc) {
    ret = -ENOMEM;
    goto out;
  }
  size_t done = 0;
  long fail = 0; /* the source's error, after done bytes */
  while (done < n && !fail) {
    uint64_t pos = off + done, u0 = pos / uout;
    uint64_t k = nunits - u0 < step ? nunits - u0 : step;
    long r = raw_pread(cat, t, ub, stored_len, u0 * ub, raw, (size_t)(k * ub));
    if (r < 0 || (uint64_t)r != k * ub) {
      /* failed part way: decode the whole units it read, then stop */
      fail = r < 0 ? r : -EIO;
      k = r > 0 ? (uint64_t)r / ub : 0;
      if (k == 0)
        break;
    }
    size_t skip = (size_t)(pos - u0 * uout), avail = (size_t)(k * uout) - skip;
    size_t chunk = avail < n - done ? avail : n - done;
    if (t->dtype == BS_DT_F32 && skip == 0 && chunk == avail &&
        (uintptr_t)(buf + done) % _Alignof(float) == 0) {
      to_f32(t, sdt, u0, raw, (size_t)k, (float *)(void *)(buf + done)); /* no copy */
    } else {
      to_f32(t, sdt, u0, raw, (size_t)k, dec);
      if (enc != (uint8_t *)dec)
        bs_encode(t->dtype, dec, (size_t)k * ue, enc);
      memcpy(buf + done, enc + skip, chunk);
    }
    done += chunk;
  }
  ret = done ? checked(cat, t, (long)done) : fail;
out:
  bs_free(raw);
  if (enc != (uint8_t *)dec)
    bs_free(enc);
  bs_free(dec);
  return ret;
}

long bs_tensor_read(const struct bs_catalog *cat, const struct bs_tensor *t, uint64_t off,
                    void *buf, size_t n)
{
  if (t->decoded)
    return decoded_read(cat, t, off, buf, n);
  return checked(cat, t, raw_pread(cat, t, bs_dtype_bits(t->dtype) / 8, t->nbytes, off, buf, n));
}

const char *bs_tensor_why(const struct bs_catalog *cat, const struct bs_tensor *t, int code,
                          char *buf, size_t n)
{
  if (code == ENOTSUP && t->x->unsupported) {
    snprintf(buf, n, "%s", t->x->unsupported);
    return buf;
  }
  return bs_src_why(t->src < cat->nsrcs ? &cat->srcs[t->src] : NULL, code, buf, n);
}
