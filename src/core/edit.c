/* The editable catalog of a writable mount (see edit.h). */
#include "core/edit.h"
#include "core/npy.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/journal.h"

#define XATTR_CREATE_FLAG 1
#define XATTR_REPLACE_FLAG 2

struct bs_entry *bs_entry_new(long tensor, uint64_t size, bool is_dir, uint32_t mode)
{
  struct bs_entry *e = bs_calloc(1, sizeof *e);
  if (!e)
    return NULL;
  if (pthread_rwlock_init(&e->lock, NULL) != 0) {
    bs_free(e);
    return NULL;
  }
  e->is_dir = is_dir;
  e->tensor = tensor;
  e->size = size;
  e->mode = mode;
  e->fd = -1;
  return e;
}

void bs_entry_free(struct bs_entry *e)
{
  if (!e)
    return;
  bs_free(e->shape);
  for (size_t i = 0; i < e->nxattrs; i++) {
    bs_free(e->xattrs[i].name);
    bs_free(e->xattrs[i].value);
  }
  bs_free(e->xattrs);
  pthread_rwlock_destroy(&e->lock);
  bs_free(e);
}

/* The xattr budget: take `add` bytes while giving back `release`. */
static bool budget_take(struct bs_edit *ed, uint64_t add, uint64_t release)
{
  uint64_t cur = atomic_load(&ed->xattr_bytes), next;
  do {
    next = cur - (release < cur ? release : cur) + add;
    if (add > release && next > ed->xattr_budget)
      return false;
  } while (!atomic_compare_exchange_weak(&ed->xattr_bytes, &cur, next));
  return true;
}

/* The bytes an entry of metadata holds in memory. */
static uint64_t held(const struct bs_kv *kv)
{
  return strlen(kv->key) + (kv->value ? strlen(kv->value) : 0);
}

static void budget_give(struct bs_edit *ed, uint64_t n)
{
  (void)budget_take(ed, 0, n);
}

int bs_edit_init(struct bs_edit *ed, const struct bs_catalog *src, struct bs_tree *tree, bool flat,
                 bs_err *err)
{
  memset(ed, 0, sizeof *ed);
  ed->src = src;
  ed->tree = tree;
  ed->flat = flat;
  ed->xattr_budget = BS_EDIT_XATTR_BUDGET;
  atomic_init(&ed->xattr_bytes, 0);
  /* The source's entries as they are (borrowed: src outlives the edit),
   * not copies: a file may hold a million small values (issue 34). */
  if (src->nmeta && !(ed->meta = bs_malloc(src->nmeta * sizeof *ed->meta)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  ed->metacap = src->nmeta;
  for (size_t i = 0; i < src->nmeta; i++) {
    struct bs_kv *kv = &ed->meta[ed->nmeta];
    *kv = (struct bs_kv){src->meta[i].key, src->meta[i].value, src->meta[i].ref, true};
    ed->nmeta++;
    /* The source's own metadata counts, but never refuses the mount; a
     * value left in the file (struct bs_meta_ref) holds no memory: its key only. */
    atomic_fetch_add(&ed->xattr_bytes, held(kv));
  }
  return 0;
}

int bs_edit_attach(struct bs_edit *ed, const struct timespec *mtime, const struct bs_owner *own,
                   bs_err *err)
{
  static const struct bs_owner none = {0, 0, 0644, 0755};
  if (!own)
    own = &none;
  struct bs_tree *t = ed->tree;
  for (uint64_t ino = BS_TREE_ROOT; ino < t->n; ino++) {
    struct bs_node *nd = &t->nodes[ino];
    if (!nd->live || bs_tree_user(t, ino))
      continue;
    long ti = nd->is_dir ? -1 : nd->tensor;
    uint64_t size = ti >= 0 && (size_t)ti < ed->src->count ? ed->src->tensors[ti].nbytes : 0;
    struct bs_entry *e =
        bs_entry_new(ti, size, nd->is_dir, nd->is_dir ? own->dir_mode : own->file_mode);
    if (!e)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    e->uid = own->uid;
    e->gid = own->gid;
    e->ino = ino;
    if (mtime)
      e->mtime = *mtime;
    if (bs_tree_set_user(t, ino, e) != 0) {
      bs_entry_free(e);
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    }
  }
  return 0;
}

void bs_edit_destroy(struct bs_edit *ed)
{
  if (ed->tree) {
    for (uint64_t ino = 0; ino < ed->tree->n; ino++)
      bs_entry_free(bs_tree_user(ed->tree, ino));
    bs_free(ed->tree->users);
    ed->tree->users = NULL;
    ed->tree->ucap = 0;
  }
  for (size_t i = 0; i < ed->nmeta; i++)
    bs_kv_destroy(&ed->meta[i]);
  bs_free(ed->meta);
  ed->meta = NULL;
  ed->nmeta = ed->metacap = 0;
}

struct bs_entry *bs_edit_entry(const struct bs_edit *ed, uint64_t ino)
{
  if (!ed->tree || ino == 0 || ino >= ed->tree->n || !ed->tree->nodes[ino].name)
    return NULL;
  return bs_tree_user(ed->tree, ino);
}

const struct bs_tensor *bs_entry_origin(const struct bs_edit *ed, const struct bs_entry *e)
{
  return e->tensor >= 0 && (size_t)e->tensor < ed->src->count ? &ed->src->tensors[e->tensor] : NULL;
}

void bs_entry_effective(const struct bs_edit *ed, const struct bs_entry *e, struct bs_eff *eff)
{
  const struct bs_tensor *t = bs_entry_origin(ed, e);
  memset(eff, 0, sizeof *eff);
  eff->dtype = e->has_dtype ? e->dtype : t ? t->dtype : BS_DT_U8;
  eff->dtype_inferred = !e->has_dtype && !t;
  eff->whole = true;
  if (e->has_shape) {
    eff->rank = e->rank;
    eff->shape = e->shape;
  } else if (t && eff->dtype == t->dtype) {
    eff->rank = t->rank;
    eff->shape = t->shape;
  } else {
    /* 1-D by size: elements = size * 8 / bits (opaque QFLOAT: bytes). */
    unsigned bits = bs_dtype_bits(eff->dtype);
    uint64_t nbits;
    uint32_t belems, bbytes;
    if (bs_dtype_block(eff->dtype, &belems, &bbytes)) {
      /* ggml blocks: whole blocks of belems elements */
      eff->dim0 = e->size / bbytes * belems;
      eff->whole = e->size % bbytes == 0;
    } else if (bits == 0) {
      eff->dim0 = e->size;
    } else if (bs_mul_u64(e->size, 8, &nbits)) {
      eff->dim0 = nbits / bits;
      eff->whole = nbits % bits == 0;
    } else {
      eff->dim0 = e->size / (bits >= 8 ? bits / 8 : 1);
      eff->whole = false;
    }
    eff->rank = 1;
    eff->shape = &eff->dim0;
    eff->shape_inferred = true;
  }
}

bool bs_entry_strided_clean(const struct bs_edit *ed, const struct bs_entry *e)
{
  const struct bs_tensor *t = e->stage ? NULL : bs_entry_origin(ed, e);
  return t && t->x->strides;
}

/* Append a change of e to the mount's journal, if it keeps one. */
static void jlog(const struct bs_edit *ed, enum bs_jkind kind, const struct bs_entry *e,
                 const void *a, size_t alen, const void *b, size_t blen)
{
  if (ed && ed->journal)
    bs_journal_append(ed->journal, kind, e ? e->ino : 0, a, alen, b, blen);
}

/* Trailing newlines and NULs that `setfattr -v` and echo leave. */
static size_t trim(const char *v, size_t len)
{
  while (len && (v[len - 1] == '\n' || v[len - 1] == '\0'))
    len--;
  return len;
}

int bs_entry_set_dtype(const struct bs_edit *ed, struct bs_entry *e, const char *v, size_t len,
                       bs_err *err)
{
  char tmp[32];
  len = trim(v, len);
  enum bs_dtype dt;
  if (len == 0 || len >= sizeof tmp)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "not a dtype name");
  memcpy(tmp, v, len);
  tmp[len] = '\0';
  if (bs_dtype_from_name(tmp, &dt) != 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "unknown dtype '%s'", tmp);
  if (dt == BS_DT_QFLOAT) {
    /* QFloat bytes are meaningful only with their quantization scheme,
     * which only a QFloat tensor of the source carries. */
    const struct bs_tensor *t = bs_entry_origin(ed, e);
    if (!t || t->dtype != BS_DT_QFLOAT)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "QFLOAT can only be set back on a file that was a QFloat tensor");
  }
  e->dtype = dt;
  e->has_dtype = true;
  jlog(ed, BS_J_DTYPE, e, v, len, NULL, 0);
  return 0;
}

/* Parse "[2, 3]" (JSON array of non-negative integers). */
static int parse_shape(const char *v, size_t len, uint32_t *rank, uint64_t *dims)
{
  size_t i = 0;
  uint32_t n = 0;
#define WS()                                                                                       \
  while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r'))                 \
  i++
  WS();
  if (i >= len || v[i++] != '[')
    return -1;
  WS();
  if (i < len && v[i] == ']') {
    i++;
  } else {
    for (;;) {
      WS();
      if (i >= len || v[i] < '0' || v[i] > '9' || n >= BS_MAX_RANK)
        return -1;
      uint64_t x = 0;
      while (i < len && v[i] >= '0' && v[i] <= '9') {
        if (!bs_mul_u64(x, 10, &x) || !bs_add_u64(x, (uint64_t)(v[i] - '0'), &x))
          return -1;
        i++;
      }
      dims[n++] = x;
      WS();
      if (i < len && v[i] == ',') {
        i++;
        continue;
      }
      if (i < len && v[i] == ']') {
        i++;
        break;
      }
      return -1;
    }
  }
  WS();
  while (i < len && v[i] == '\0')
    i++;
#undef WS
  if (i != len)
    return -1;
  *rank = n;
  return 0;
}

int bs_entry_set_shape(const struct bs_edit *ed, struct bs_entry *e, const char *v, size_t len,
                       bs_err *err)
{
  uint64_t dims[BS_MAX_RANK];
  uint32_t rank;
  if (parse_shape(v, len, &rank, dims) != 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "a shape is a JSON array of at most %d non-negative integers", BS_MAX_RANK);
  uint64_t *shape = NULL;
  if (rank) {
    shape = bs_malloc(rank * sizeof *shape);
    if (!shape)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    memcpy(shape, dims, rank * sizeof *shape);
  }
  bs_free(e->shape);
  e->shape = shape;
  e->rank = rank;
  e->has_shape = true;
  jlog(ed, BS_J_SHAPE, e, v, len, NULL, 0);
  return 0;
}

int bs_entry_set_param_id(const struct bs_edit *ed, struct bs_entry *e, const char *v, size_t len,
                          bs_err *err)
{
  len = trim(v, len);
  uint64_t x = 0;
  bool ok = len > 0 && len <= 20;
  for (size_t i = 0; ok && i < len; i++)
    ok = v[i] >= '0' && v[i] <= '9' && bs_mul_u64(x, 10, &x) &&
         bs_add_u64(x, (uint64_t)(v[i] - '0'), &x);
  if (!ok)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "a param_id is a decimal u64");
  e->param_id = x;
  e->has_param_id = true;
  jlog(ed, BS_J_PARAM_ID, e, v, len, NULL, 0);
  return 0;
}

void bs_entry_clear_dtype(const struct bs_edit *ed, struct bs_entry *e)
{
  e->has_dtype = false;
  jlog(ed, BS_J_DTYPE_CLR, e, NULL, 0, NULL, 0);
}

void bs_entry_clear_shape(const struct bs_edit *ed, struct bs_entry *e)
{
  bs_free(e->shape);
  e->shape = NULL;
  e->rank = 0;
  e->has_shape = false;
  jlog(ed, BS_J_SHAPE_CLR, e, NULL, 0, NULL, 0);
}

void bs_entry_clear_param_id(const struct bs_edit *ed, struct bs_entry *e)
{
  e->has_param_id = false;
  jlog(ed, BS_J_PARAM_ID_CLR, e, NULL, 0, NULL, 0);
}

const struct bs_xattr *bs_entry_get_xattr(const struct bs_entry *e, const char *name)
{
  for (size_t i = 0; i < e->nxattrs; i++)
    if (strcmp(e->xattrs[i].name, name) == 0)
      return &e->xattrs[i];
  return NULL;
}

/* One value longer than an xattr can be (setxattr never passes one; a
 * journal record could): refused for what it is, before the budget. */
static int too_long(bs_err *err, const char *what, const char *name, size_t len)
{
  return bs_fail(err, E2BIG, BS_OFF_NONE, NULL,
                 "%s '%.100s': a value of %zu bytes, over the %u bytes one xattr value can hold",
                 what, name, len, BS_MAX_XATTR_VALUE);
}

static int no_space(bs_err *err, const struct bs_edit *ed, const char *what, const char *name,
                    uint64_t add)
{
  return bs_fail(err, ENOSPC, BS_OFF_NONE, NULL,
                 "%s '%.100s': %llu more bytes would pass the mount's bound of %llu bytes of "
                 "xattrs and metadata (it holds %llu)",
                 what, name, (unsigned long long)add, (unsigned long long)ed->xattr_budget,
                 (unsigned long long)atomic_load(&ed->xattr_bytes));
}

int bs_entry_set_xattr(struct bs_edit *ed, struct bs_entry *e, const char *name, const void *value,
                       size_t len, int flags, bs_err *err)
{
  struct bs_xattr *x = (struct bs_xattr *)bs_entry_get_xattr(e, name);
  if (x && (flags & XATTR_CREATE_FLAG))
    return bs_fail(err, EEXIST, BS_OFF_NONE, NULL, "%s exists", name);
  if (!x && (flags & XATTR_REPLACE_FLAG))
    return bs_fail(err, ENODATA, BS_OFF_NONE, NULL, "no %s", name);
  if (len > BS_MAX_XATTR_VALUE)
    return too_long(err, "xattr", name, len);
  size_t nlen = strlen(name);
  uint64_t add = (uint64_t)len + (x ? 0 : nlen), release = x ? x->len : 0;
  if (!budget_take(ed, add, release))
    return no_space(err, ed, "xattr", name, add > release ? add - release : 0);
  char *v = bs_malloc(len + 1);
  if (!v) {
    budget_give(ed, add);
    (void)budget_take(ed, release, 0);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  memcpy(v, value, len);
  v[len] = '\0';
  jlog(ed, BS_J_XSET, e, name, nlen, value, len);
  if (x) {
    bs_free(x->value);
    x->value = v;
    x->len = len;
    return 0;
  }
  char *n = bs_strdup(name);
  size_t cap = e->nxattrs;
  if (!n || bs_grow((void **)&e->xattrs, &cap, e->nxattrs + 1, sizeof *e->xattrs) != 0) {
    bs_free(n);
    bs_free(v);
    budget_give(ed, add);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  e->xattrs[e->nxattrs++] = (struct bs_xattr){n, v, len};
  return 0;
}

int bs_entry_remove_xattr(struct bs_edit *ed, struct bs_entry *e, const char *name, bs_err *err)
{
  for (size_t i = 0; i < e->nxattrs; i++) {
    if (strcmp(e->xattrs[i].name, name) == 0) {
      budget_give(ed, strlen(e->xattrs[i].name) + e->xattrs[i].len);
      bs_free(e->xattrs[i].name);
      bs_free(e->xattrs[i].value);
      e->xattrs[i] = e->xattrs[--e->nxattrs];
      jlog(ed, BS_J_XRM, e, name, strlen(name), NULL, 0);
      return 0;
    }
  }
  return bs_fail(err, ENODATA, BS_OFF_NONE, NULL, "no %s", name);
}

const struct bs_kv *bs_edit_find_meta(const struct bs_edit *ed, const char *key)
{
  for (size_t i = 0; i < ed->nmeta; i++)
    if (strcmp(ed->meta[i].key, key) == 0)
      return &ed->meta[i];
  return NULL;
}

const char *bs_edit_get_meta(const struct bs_edit *ed, const char *key)
{
  const struct bs_kv *kv = bs_edit_find_meta(ed, key);
  return kv ? kv->value : NULL;
}

int bs_edit_set_meta(struct bs_edit *ed, const char *key, const char *value, size_t len,
                     bs_err *err)
{
  struct bs_kv *kv = NULL;
  for (size_t i = 0; i < ed->nmeta && !kv; i++)
    if (strcmp(ed->meta[i].key, key) == 0)
      kv = &ed->meta[i];
  if (len > BS_MAX_XATTR_VALUE)
    return too_long(err, "metadata", key, len);
  uint64_t add = (uint64_t)len + (kv ? 0 : strlen(key)),
           release = kv && kv->value ? strlen(kv->value) : 0;
  if (!budget_take(ed, add, release))
    return no_space(err, ed, "metadata", key, add > release ? add - release : 0);
  char *v = bs_strndup(value, len);
  if (!v) {
    budget_give(ed, add);
    (void)budget_take(ed, release, 0);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  if (kv) { /* (the source's entry becomes the edit's own; a value left in the
               source holds no budget) */
    if (bs_kv_set_value(kv, v) != 0) {
      budget_give(ed, add);
      (void)budget_take(ed, release, 0);
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    }
    jlog(ed, BS_J_MSET, NULL, key, strlen(key), value, len);
    return 0;
  }
  jlog(ed, BS_J_MSET, NULL, key, strlen(key), value, len);
  char *k = bs_strdup(key);
  if (!k || bs_grow((void **)&ed->meta, &ed->metacap, ed->nmeta + 1, sizeof *ed->meta) != 0) {
    bs_free(k);
    bs_free(v);
    budget_give(ed, add);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  ed->meta[ed->nmeta] = (struct bs_kv){k, v, NULL, false};
  ed->nmeta++;
  return 0;
}

int bs_edit_remove_meta(struct bs_edit *ed, const char *key, bs_err *err)
{
  for (size_t i = 0; i < ed->nmeta; i++) {
    if (strcmp(ed->meta[i].key, key) == 0) {
      budget_give(ed, held(&ed->meta[i]));
      bs_kv_destroy(&ed->meta[i]);
      /* Keep the order: the metadata is written as the user sees it. */
      memmove(&ed->meta[i], &ed->meta[i + 1], (ed->nmeta - i - 1) * sizeof *ed->meta);
      ed->nmeta--;
      jlog(ed, BS_J_MRM, NULL, key, strlen(key), NULL, 0);
      return 0;
    }
  }
  return bs_fail(err, ENODATA, BS_OFF_NONE, key, "no such metadata key");
}

static void log_keys(const struct bs_edit *ed, uint64_t ino, unsigned depth)
{
  const struct bs_node *nd = bs_tree_node(ed->tree, ino);
  if (!nd || depth > 4096)
    return;
  if (nd->is_dir) {
    for (size_t i = 0; i < nd->nkids; i++)
      if (bs_node_kids(nd)[i])
        log_keys(ed, bs_node_kids(nd)[i], depth + 1);
    return;
  }
  char *key = bs_tree_key(ed->tree, ino, ed->flat);
  if (key)
    bs_journal_append(ed->journal, BS_J_KEY, ino, key, strlen(key), NULL, 0);
  bs_free(key);
}

void bs_edit_log_key(const struct bs_edit *ed, uint64_t ino)
{
  if (ed && ed->journal)
    log_keys(ed, ino, 0);
}

void bs_edit_log_gone(const struct bs_edit *ed, uint64_t ino)
{
  if (ed && ed->journal && ino < ed->tree->n && !ed->tree->nodes[ino].is_dir)
    bs_journal_append(ed->journal, BS_J_GONE, ino, NULL, 0, NULL, 0);
}

void bs_edit_log_stage(const struct bs_edit *ed, const struct bs_entry *e)
{
  if (ed && ed->journal && e->stage)
    bs_journal_append_u64(ed->journal, BS_J_STAGE, e->ino, e->stage);
}

void bs_entry_drop(struct bs_edit *ed, struct bs_entry *e)
{
  e->stage = 0;
  e->size = 0;
  e->tensor = -1;
  bs_entry_clear_shape(NULL, e);
  for (size_t i = 0; i < e->nxattrs; i++) {
    budget_give(ed, strlen(e->xattrs[i].name) + e->xattrs[i].len);
    bs_free(e->xattrs[i].name);
    bs_free(e->xattrs[i].value);
  }
  bs_free(e->xattrs);
  e->xattrs = NULL;
  e->nxattrs = 0;
}

/* --- the output catalog -------------------------------------------------- */

/* Point the output tensor t at the source tensor s's bytes. */
static int copy_location(struct bs_catalog *out, struct bs_tensor *t, const struct bs_tensor *s,
                         bs_err *err)
{
  t->src = s->src;
  t->off = s->off;
  if (!s->x->strides && !s->x->storage_off && !s->x->storage_bytes)
    return 0;
  struct bs_tensor_x *x = bs_tensor_x(out, t);
  if (!x)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
  x->storage_off = s->x->storage_off;
  x->storage_bytes = s->x->storage_bytes;
  if (s->x->strides) {
    x->strides = bs_malloc(s->rank * sizeof *x->strides);
    if (!x->strides)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
    memcpy(x->strides, s->x->strides, s->rank * sizeof *x->strides);
  }
  return 0;
}

static int copy_dtype_raw(struct bs_catalog *out, struct bs_tensor *t, const struct bs_tensor *s,
                          bs_err *err)
{
  if (!s->x->dtype_raw)
    return 0;
  struct bs_tensor_x *x = bs_tensor_x(out, t);
  if (!x || !(x->dtype_raw = bs_malloc(s->x->dtype_raw_len)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
  memcpy(x->dtype_raw, s->x->dtype_raw, s->x->dtype_raw_len);
  x->dtype_raw_len = s->x->dtype_raw_len;
  return 0;
}

/* Give t the param id `id`. */
static int set_param_id(struct bs_catalog *out, struct bs_tensor *t, uint64_t id, bs_err *err)
{
  struct bs_tensor_x *x = bs_tensor_x(out, t);
  if (!x)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
  x->param_id = id;
  t->has_param_id = true;
  return 0;
}

/* The staged bytes of e: its file beneath the held staging directory, opened
 * per read (never by a path another user could redirect). */
static int open_staged(const struct bs_stage_dir *stg, const struct bs_entry *e, struct bs_src *s,
                       bs_err *err)
{
  char name[24];
  snprintf(name, sizeof name, "%llu", (unsigned long long)e->stage);
  if (!stg || stg->fd < 0)
    return bs_fail(err, ENOENT, BS_OFF_NONE, NULL, "staged file %s: no staging directory", name);
  return bs_src_init_at(s, stg->fd, stg->path, name, err);
}

/* A staged file named NAME.npy whose bytes start with NumPy's magic: np.save
 * wrote it (or it was copied from a .npy view). It becomes tensor
 * NAME with the header's dtype and shape (a dtype set on the file of the
 * same width wins: BF16 copied from a .npy view), the header left out (the tensor
 * starts at the header's end in the staging file). Returns 1 when the file
 * is not such a file (the caller goes on), 0 when it was added, -1 on error
 * (a header that does not parse or does not match the size, a Fortran-order
 * array of rank 2 or more). */
static int add_npy(const struct bs_stage_dir *stg, struct bs_catalog *out, const struct bs_node *nd,
                   const struct bs_entry *e, const char *key, bs_err *err)
{
  size_t nl = strlen(nd->name), kl = strlen(key);
  if (!e->stage || nd->has_seg || !bs_npy_name(nd->name, nl) || kl <= 4 || e->size < 6)
    return 1; /* shorter than NumPy's magic: no .npy (from 6 bytes on, the magic decides) */
  struct bs_src s;
  if (open_staged(stg, e, &s, err) != 0)
    return -1;
  size_t n = e->size < BS_NPY_MAX_HEADER ? (size_t)e->size : BS_NPY_MAX_HEADER;
  uint8_t *head = bs_malloc(n);
  if (!head) {
    bs_src_destroy(&s);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, key, "out of memory");
  }
  int rc = 1;
  bs_err sub;
  bs_err_clear(&sub);
  struct bs_npy_info info;
  if (bs_src_read(&s, 0, head, n, err) != 0) {
    rc = -1;
  } else if (!bs_npy_is_npy(head, n)) {
    rc = 1; /* not written by numpy: a file like any other */
  } else if (bs_npy_parse(head, n, &info, &sub) != 0) {
    rc = bs_fail(err, EINVAL, sub.off, key, "%s%s", sub.code == EAGAIN ? "truncated: " : "",
                 sub.msg);
  } else if (info.header_len + info.nbytes != e->size) {
    char sh[256];
    bs_shape_format(sh, sizeof sh, info.rank, info.shape);
    rc = bs_fail(err, EINVAL, BS_OFF_NONE, key,
                 ".npy header says %s %s (%llu bytes of data) but the file holds %llu after it",
                 bs_dtype_name(info.dtype), sh, (unsigned long long)info.nbytes,
                 (unsigned long long)(e->size - info.header_len));
  } else {
    rc = -1;
    char *name = bs_malloc(kl - 3);
    struct bs_tensor *t = NULL;
    if (!name) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, key, "out of memory");
    } else {
      memcpy(name, key, kl - 4);
      name[kl - 4] = '\0';
      /* A dtype set on the file (rsync -aX from an npy view: BF16 behind
       * its <u2) wins over the header's stand-in of the same width. */
      enum bs_dtype dt = info.dtype;
      if (e->has_dtype && bs_dtype_bits(e->dtype) == bs_dtype_bits(info.dtype))
        dt = e->dtype;
      t = bs_catalog_add(out, name, dt, info.rank, info.shape, BS_OFF_NONE, err);
    }
    uint32_t idx;
    if (t && bs_catalog_add_src(out, &s, &idx, err) == 0) {
      t = &out->tensors[out->count - 1];
      t->src = idx;
      t->off = info.header_len;
      if (info.fortran_order && info.rank >= 2) {
        /* Column-major data: read through strides (1, d0, d0*d1...) into
         * the row-major bytes every writer expects; nothing is copied now. */
        struct bs_tensor_x *x = bs_tensor_x(out, t);
        if (!x || !(x->strides = bs_malloc(info.rank * sizeof *x->strides))) {
          bs_fail(err, ENOMEM, BS_OFF_NONE, key, "out of memory");
          goto done;
        }
        uint64_t st = 1;
        for (uint32_t d = 0; d < info.rank; d++) {
          x->strides[d] = (int64_t)st;
          st *= info.shape[d] ? info.shape[d] : 1; /* no overflow: nbytes was checked */
        }
        x->storage_off = 0;
        x->storage_bytes = t->nbytes;
        if (bs_tensor_check_view(t, info.header_len, err) != 0)
          goto done;
      }
      if (!e->has_param_id || set_param_id(out, t, e->param_id, err) == 0)
        rc = 0;
    }
  done:
    bs_free(name);
  }
  bs_free(head);
  bs_src_destroy(&s); /* zeroed when the catalog took it */
  return rc;
}

static int add_file(const struct bs_edit *ed, const struct bs_stage_dir *stg,
                    struct bs_catalog *out, uint64_t ino, bs_err *err)
{
  const struct bs_node *nd = &ed->tree->nodes[ino];
  const struct bs_entry *e = bs_tree_user(ed->tree, ino);
  if (!e)
    return bs_fail(err, EINVAL, BS_OFF_NONE, nd->name, "file has no entry");
  char *key = bs_tree_key(ed->tree, ino, ed->flat);
  if (!key)
    return bs_fail(err, errno == ENOMEM ? ENOMEM : EINVAL, BS_OFF_NONE, nd->name,
                   "cannot turn the file name into a key");
  /* No include/exclude here: the tree holds only what the mount shows, and
   * files the user created or renamed are written whatever their name. */
  int npy = add_npy(stg, out, nd, e, key, err);
  if (npy <= 0) {
    bs_free(key);
    return npy;
  }
  const struct bs_tensor *src = bs_entry_origin(ed, e);
  struct bs_eff eff;
  bs_entry_effective(ed, e, &eff);
  if (!eff.whole) {
    unsigned bits = bs_dtype_bits(eff.dtype);
    int rc = bits ? bs_fail(err, EINVAL, BS_OFF_NONE, key,
                            "size %llu bytes is not a whole number of %s elements (%u bits each)",
                            (unsigned long long)e->size, bs_dtype_name(eff.dtype), bits)
                  : bs_fail(err, EINVAL, BS_OFF_NONE, key,
                            "size %llu bytes is not a whole number of %s blocks",
                            (unsigned long long)e->size, bs_dtype_name(eff.dtype));
    bs_free(key);
    return rc;
  }
  if (eff.dtype_inferred) {
    /* A file without user.burnstore.dtype (copied without xattrs) is written
     * as raw bytes; the write-back report names it. */
    char line[BS_MAX_KEY_LEN + 160];
    snprintf(line, sizeof line,
             "%s: no user.burnstore.dtype (copied without xattrs?): written as U8 [%llu]", key,
             (unsigned long long)e->size);
    if (bs_catalog_note(out, line, err) != 0) {
      bs_free(key);
      return -1;
    }
  }
  bs_err sub;
  bs_err_clear(&sub);
  struct bs_tensor *t = bs_catalog_add(out, key, eff.dtype, eff.rank, eff.shape, BS_OFF_NONE, &sub);
  if (!t) {
    int rc = bs_fail(err, sub.code, BS_OFF_NONE, key, "%s", sub.msg);
    bs_free(key);
    return rc;
  }
  bs_free(key);
  if (e->stage) {
    uint32_t idx;
    struct bs_src s;
    if (open_staged(stg, e, &s, err) != 0 || bs_catalog_add_src(out, &s, &idx, err) != 0)
      return -1;
    t = &out->tensors[out->count - 1];
    t->src = idx;
    t->off = 0;
  } else if (src) {
    /* The origin's strides index its own shape in elements of its own
     * width: read through another shape or width they give other bytes. */
    if (src->x->strides &&
        (t->rank != src->rank || bs_dtype_bits(t->dtype) != bs_dtype_bits(src->dtype) ||
         (src->rank && memcmp(t->shape, src->shape, src->rank * sizeof *src->shape) != 0)))
      return bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
                     "the dtype or shape of a strided tensor changed while its bytes were not "
                     "copied: it cannot be written");
    if (copy_location(out, t, src, err) != 0)
      return -1;
    if (src->x->unsupported)
      return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name, "cannot be written: %s",
                     src->x->unsupported);
  } else {
    t->src = UINT32_MAX; /* an empty new file: no bytes to read */
  }
  /* The origin's dtype as the file encoded it (QFloat's scheme) stays with
   * the bytes as long as the dtype does. */
  if (src && eff.dtype == src->dtype && copy_dtype_raw(out, t, src, err) != 0)
    return -1;
  if (eff.dtype == BS_DT_QFLOAT)
    t->nbytes = e->size;
  if (t->nbytes != e->size)
    return bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
                   "file size %llu bytes does not match its shape x %s = %llu bytes (set "
                   "user.burnstore.shape / user.burnstore.dtype to match the data)",
                   (unsigned long long)e->size, bs_dtype_name(eff.dtype),
                   (unsigned long long)t->nbytes);
  if (e->has_param_id)
    return set_param_id(out, t, e->param_id, err);
  if (src && src->has_param_id)
    return set_param_id(out, t, src->x->param_id, err);
  return 0;
}

static int add_dir(const struct bs_edit *ed, const struct bs_stage_dir *stg, struct bs_catalog *out,
                   uint64_t dir, unsigned depth, bs_err *err)
{
  if (depth > 4096)
    return bs_fail(err, ELOOP, BS_OFF_NONE, NULL, "directory tree too deep");
  const struct bs_node *nd = &ed->tree->nodes[dir];
  for (size_t i = 0; i < nd->nkids; i++) {
    uint64_t kid = bs_node_kids(nd)[i];
    if (!kid)
      continue;
    const struct bs_node *kn = &ed->tree->nodes[kid];
    int rc =
        kn->is_dir ? add_dir(ed, stg, out, kid, depth + 1, err) : add_file(ed, stg, out, kid, err);
    if (rc)
      return rc;
  }
  return 0;
}

static int cmp_name(const void *a, const void *b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Two files whose paths give the same key (a/b.c and a/b/c) would collide.
 * Gives the names sorted in *sorted (borrowed strings; caller frees the
 * array). The strings are the tensors' own, which stay put when the
 * catalog's array grows. */
static int check_duplicates(const struct bs_catalog *out, const char ***sorted, bs_err *err)
{
  size_t n = out->count;
  const char **v = bs_malloc((n ? n : 1) * sizeof *v);
  if (!v)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < n; i++)
    v[i] = out->tensors[i].name;
  qsort(v, n, sizeof *v, cmp_name);
  for (size_t i = 1; i < n; i++) {
    if (strcmp(v[i - 1], v[i]) == 0) {
      int rc = bs_fail(err, EEXIST, BS_OFF_NONE, v[i],
                       "two files give the same key (a dot in a file name splits like a '/': "
                       "rename one of them)");
      bs_free(v);
      return rc;
    }
  }
  *sorted = v;
  return 0;
}

/* The source tensors the view hides, at their names, after the view's. */
static int add_hidden(const struct bs_edit *ed, struct bs_catalog *out, bs_err *err)
{
  const char **sorted = NULL;
  if (check_duplicates(out, &sorted, err) != 0)
    return -1;
  size_t nview = out->count;
  int rc = 0;
  for (size_t i = 0; i < ed->src->count && !rc; i++) {
    const struct bs_tensor *s = &ed->src->tensors[i];
    const char *name = s->name;
    if (!s->hidden || bsearch(&name, sorted, nview, sizeof *sorted, cmp_name))
      continue;
    bs_err sub;
    bs_err_clear(&sub);
    struct bs_tensor *t = bs_catalog_add(out, s->name, s->dtype, s->rank, s->shape, s->off, &sub);
    if (!t) {
      rc = bs_fail(err, sub.code, BS_OFF_NONE, s->name, "%s", sub.msg);
      break;
    }
    if (s->dtype == BS_DT_QFLOAT)
      t->nbytes = s->nbytes;
    if ((s->has_param_id && set_param_id(out, t, s->x->param_id, err) != 0) ||
        copy_location(out, t, s, err) != 0 || copy_dtype_raw(out, t, s, err) != 0)
      rc = -1;
    else if (s->x->unsupported)
      rc = bs_fail(err, ENOTSUP, BS_OFF_NONE, s->name, "cannot be written: %s", s->x->unsupported);
  }
  bs_free(sorted);
  return rc;
}

static int edit_catalog(const struct bs_edit *ed, const struct bs_stage_dir *stg, bool keep_hidden,
                        bool borrow_meta, struct bs_catalog *out, bs_err *err);

int bs_edit_catalog(const struct bs_edit *ed, const struct bs_stage_dir *stg, bool keep_hidden,
                    struct bs_catalog *out, bs_err *err)
{
  return edit_catalog(ed, stg, keep_hidden, false, out, err);
}

int bs_edit_catalog_view(const struct bs_edit *ed, const struct bs_stage_dir *stg, bool keep_hidden,
                         struct bs_catalog *out, bs_err *err)
{
  return edit_catalog(ed, stg, keep_hidden, true, out, err);
}

/* bs_edit_catalog; with borrow_meta, the metadata entries are ed's,
 * borrowed (not copied). */
static int edit_catalog(const struct bs_edit *ed, const struct bs_stage_dir *stg, bool keep_hidden,
                        bool borrow_meta, struct bs_catalog *out, bs_err *err)
{
  /* The source's byte sources, borrowed, at the same indices, so clean
   * tensors keep their src index. */
  for (size_t i = 0; i < ed->src->nsrcs; i++) {
    struct bs_src s;
    uint32_t idx;
    /* Fails if the source changed since the mount: its clean tensors
     * would be copied from changed bytes (and an rw target overwritten). */
    if (bs_src_init_borrowed(&s, &ed->src->srcs[i], err) != 0 ||
        bs_catalog_add_src(out, &s, &idx, err) != 0)
      return -1;
  }
  if (add_dir(ed, stg, out, BS_TREE_ROOT, 0, err) != 0)
    return -1;
  if (keep_hidden) {
    if (add_hidden(ed, out, err) != 0)
      return -1;
  } else {
    const char **sorted = NULL;
    if (check_duplicates(out, &sorted, err) != 0)
      return -1;
    bs_free(sorted);
  }
  if (borrow_meta) {
    if (ed->nmeta && !(out->meta = bs_malloc(ed->nmeta * sizeof *out->meta)))
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    out->metacap = ed->nmeta;
    for (size_t i = 0; i < ed->nmeta; i++) {
      const struct bs_kv *kv = &ed->meta[i];
      out->meta[out->nmeta++] = (struct bs_kv){kv->key, kv->value, kv->ref, true};
    }
    return 0;
  }
  for (size_t i = 0; i < ed->nmeta; i++)
    if (bs_catalog_add_meta_kv(out, &ed->meta[i], err) != 0)
      return -1;
  return 0;
}
