/* The public API (include/burnstore.h), writing side: a builder of an output
 * catalog (tensors from caller memory, or borrowed from open checkpoints,
 * and metadata) written as `burnstore convert` writes: the writer the
 * output's extension names (bs_wb_writer), its checks, the target lock and
 * the atomic commit. */
#include <errno.h>
#include <string.h>

#include "api.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/target.h"
#include "formats/writers.h"
#include "policy/open.h"
#include "policy/writeback.h"

/* A checkpoint whose sources this writer borrows: they are cat.srcs[base..]. */
struct lent {
  const burnstore_checkpoint *ck;
  uint32_t base;
};

struct burnstore_writer {
  char *path;
  const struct bs_writer *w;
  uint64_t max_shard_size;
  struct bs_catalog cat; /* the output: every tensor visible */
  struct bs_strmap keys; /* tensor key -> index in cat (keys borrowed from cat) */
  struct lent *lent;
  size_t nlent, lentcap;
  bool saved;
};

burnstore_writer *burnstore_writer_new(const char *path, const char *options)
{
  if (bs_api_begin("burnstore_writer_new", "path", path) != 0)
    return NULL;
  bs_err err;
  bs_err_clear(&err);
  uint64_t shard = 0;
  const struct bs_writer *w = NULL;
  if (bs_write_spec_parse(options, &shard, &err) != 0 ||
      !(w = bs_wb_writer(path, path, shard, &err))) {
    bs_api_fail(NULL, &err);
    return NULL;
  }
  burnstore_writer *bw = bs_calloc(1, sizeof *bw);
  if (!bw || !(bw->path = bs_strdup(path))) {
    bs_free(bw);
    bs_api_failf(ENOMEM, "out of memory");
    return NULL;
  }
  bw->w = w;
  bw->max_shard_size = shard;
  bs_catalog_init(&bw->cat);
  return bw;
}

void burnstore_writer_free(burnstore_writer *w)
{
  if (!w)
    return;
  bs_strmap_destroy(&w->keys);
  bs_catalog_destroy(&w->cat);
  bs_free(w->lent);
  bs_free(w->path);
  bs_free(w);
}

const char *burnstore_writer_format(const burnstore_writer *w)
{
  return w ? w->w->name : NULL;
}

/* The keys again after a rollback took tensors away (the map has no
 * removal; a failed add is rare). */
static int rekey(burnstore_writer *w)
{
  bs_strmap_destroy(&w->keys);
  memset(&w->keys, 0, sizeof w->keys);
  for (size_t i = 0; i < w->cat.count; i++)
    if (bs_strmap_put(&w->keys, w->cat.tensors[i].name, i) < 0)
      return -1;
  return 0;
}

/* Give back what an add took since mark m (tensors, sources, metadata,
 * borrowed checkpoints from nlent on), and record the error. */
static int undo(burnstore_writer *w, const struct bs_catalog_mark *m, size_t nlent,
                const bs_err *err)
{
  bs_catalog_rollback(&w->cat, m);
  w->nlent = nlent;
  int rc = bs_api_fail(w->path, err);
  if (rekey(w) != 0)
    rc = bs_api_failf(ENOMEM, "%s: out of memory", w->path);
  return rc;
}

static int check_key(burnstore_writer *w, const char *key, bs_err *err)
{
  size_t i;
  if (!key)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "a tensor without a key");
  if (bs_strmap_get(&w->keys, key, &i))
    return bs_fail(err, EEXIST, BS_OFF_NONE, key, "added twice");
  return 0;
}

/* The tensor just added (the last): can the format store it? Then its key
 * is taken. */
static int take(burnstore_writer *w, bs_err *err)
{
  const struct bs_tensor *t = &w->cat.tensors[w->cat.count - 1];
  if (w->w->can_write(t, err) != 0)
    return -1;
  if (bs_strmap_put(&w->keys, t->name, w->cat.count - 1) < 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
  return 0;
}

int burnstore_writer_add(burnstore_writer *w, const char *key, burnstore_dtype dtype, unsigned rank,
                         const uint64_t *shape, const void *data, uint64_t len)
{
  if (!w)
    return bs_api_failf(EINVAL, "burnstore_writer_add: no writer");
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog_mark m = bs_catalog_mark(&w->cat);
  enum bs_dtype dt;
  uint64_t need;
  if (check_key(w, key, &err) != 0)
    return undo(w, &m, w->nlent, &err);
  bool known = bs_api_core_dtype(dtype, &dt);
  if (!known || dt == BS_DT_QFLOAT) {
    bs_fail(&err, EINVAL, BS_OFF_NONE, key, "dtype %d %s", (int)dtype,
            known ? "(QFLOAT) has its scheme in the file: copy it with "
                    "burnstore_writer_add_tensor"
                  : "is none of burnstore_dtype's");
    return undo(w, &m, w->nlent, &err);
  }
  if (rank > BS_MAX_RANK || (rank && !shape) || (len && !data)) {
    bs_fail(&err, EINVAL, BS_OFF_NONE, key, "%s",
            rank > BS_MAX_RANK ? "more dimensions than burnstore takes (64)"
            : len && !data     ? "no data"
                               : "no shape");
    return undo(w, &m, w->nlent, &err);
  }
  if (bs_dtype_nbytes(dt, rank, shape, &need, key, BS_OFF_NONE, &err) != 0)
    return undo(w, &m, w->nlent, &err);
  if (need != len || len > SIZE_MAX) {
    char sh[256];
    bs_shape_format(sh, sizeof sh, rank, shape);
    bs_fail(&err, EINVAL, BS_OFF_NONE, key, "%llu bytes of data, but %s %s takes %llu",
            (unsigned long long)len, bs_dtype_name(dt), sh, (unsigned long long)need);
    return undo(w, &m, w->nlent, &err);
  }
  static const uint8_t empty[1];
  struct bs_src s;
  uint32_t idx;
  struct bs_tensor *t;
  if (bs_src_init_mem(&s, len ? data : empty, (size_t)len, key, &err) != 0 ||
      bs_catalog_add_src(&w->cat, &s, &idx, &err) != 0 ||
      !(t = bs_catalog_add(&w->cat, key, dt, rank, shape, BS_OFF_NONE, &err))) {
    bs_src_destroy(&s);
    return undo(w, &m, w->nlent, &err);
  }
  t->src = idx;
  t->off = 0;
  if (take(w, &err) != 0)
    return undo(w, &m, w->nlent, &err);
  return 0;
}

/* The index of ck's first source among the writer's, its sources borrowed
 * the first time. */
static int lend(burnstore_writer *w, const burnstore_checkpoint *ck, uint32_t *base, bs_err *err)
{
  for (size_t i = 0; i < w->nlent; i++)
    if (w->lent[i].ck == ck) {
      *base = w->lent[i].base;
      return 0;
    }
  if (bs_grow((void **)&w->lent, &w->lentcap, w->nlent + 1, sizeof *w->lent) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  *base = (uint32_t)w->cat.nsrcs;
  for (size_t i = 0; i < ck->cat.nsrcs; i++) {
    struct bs_src s;
    uint32_t idx;
    /* Fails if the source changed since it was opened. */
    if (bs_src_init_borrowed(&s, &ck->cat.srcs[i], err) != 0 ||
        bs_catalog_add_src(&w->cat, &s, &idx, err) != 0)
      return -1;
  }
  w->lent[w->nlent++] = (struct lent){.ck = ck, .base = *base};
  return 0;
}

/* Add tensor c (of checkpoint ck, whose sources start at base here) as key. */
static int add_copy(burnstore_writer *w, const char *key, const burnstore_checkpoint *ck,
                    const struct bs_tensor *c, uint32_t base, bs_err *err)
{
  if (check_key(w, key, err) != 0)
    return -1;
  if (c->x->unsupported)
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, key, "%s: cannot be read: %s", ck->name,
                   c->x->unsupported);
  struct bs_tensor *t = bs_catalog_add(&w->cat, key, c->dtype, c->rank, c->shape, c->off, err);
  if (!t)
    return -1;
  /* Where its bytes are and how they are read (a view, a decoding): the
   * same as in ck, in ck's sources as borrowed here. */
  t->nbytes = c->nbytes;
  t->src = base + c->src;
  t->off = c->off;
  t->has_param_id = c->has_param_id;
  t->decoded = c->decoded;
  t->stored_dtype = c->stored_dtype;
  if (bs_tensor_copy_x(&w->cat, t, c) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, key, "out of memory");
  return take(w, err);
}

int burnstore_writer_add_tensor(burnstore_writer *w, const char *key, const burnstore_tensor *t)
{
  if (!w || !t)
    return bs_api_failf(EINVAL, "burnstore_writer_add_tensor: no %s", w ? "tensor" : "writer");
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog_mark m = bs_catalog_mark(&w->cat);
  size_t nlent = w->nlent;
  const struct bs_tensor *c = &t->ck->cat.tensors[t->i];
  uint32_t base;
  if (lend(w, t->ck, &base, &err) != 0 || add_copy(w, key ? key : c->name, t->ck, c, base, &err))
    return undo(w, &m, nlent, &err);
  return 0;
}

/* Set key to a copy of kv's value (its text, or its ref into ck's sources,
 * borrowed here from base on): replaces an entry of key. */
static int put_meta(burnstore_writer *w, const char *key, const struct bs_kv *kv, uint32_t base,
                    bs_err *err)
{
  struct bs_kv copy;
  if (bs_kv_copy(&copy, kv) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (copy.ref)
    copy.ref->src += base;
  for (size_t i = 0; i < w->cat.nmeta; i++)
    if (strcmp(w->cat.meta[i].key, key) == 0) {
      bs_kv_destroy(&w->cat.meta[i]);
      w->cat.meta[i] = copy;
      return 0;
    }
  int rc = bs_catalog_add_meta_kv(&w->cat, &copy, err);
  bs_kv_destroy(&copy);
  return rc;
}

int burnstore_writer_add_checkpoint(burnstore_writer *w, const burnstore_checkpoint *ck)
{
  if (!w || !ck)
    return bs_api_failf(EINVAL, "burnstore_writer_add_checkpoint: no %s",
                        w ? "checkpoint" : "writer");
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog_mark m = bs_catalog_mark(&w->cat);
  size_t nlent = w->nlent;
  uint32_t base;
  if (lend(w, ck, &base, &err) != 0)
    return undo(w, &m, nlent, &err);
  for (size_t i = 0; i < ck->nvisible; i++) {
    const struct bs_tensor *c = &ck->cat.tensors[ck->visible[i].i];
    if (add_copy(w, c->name, ck, c, base, &err) != 0)
      return undo(w, &m, nlent, &err);
  }
  /* Metadata: what convert carries (a format without a place for it drops
   * it); an entry the writer has already is replaced. The mark does not
   * cover a replaced entry: metadata goes last, after every failure but
   * running out of memory. */
  for (size_t i = 0; i < ck->cat.nmeta && !w->w->drops_meta; i++)
    if (put_meta(w, ck->cat.meta[i].key, &ck->cat.meta[i], base, &err) != 0)
      return undo(w, &m, nlent, &err);
  return 0;
}

int burnstore_writer_set_meta(burnstore_writer *w, const char *key, const char *value)
{
  if (!w || !key || !value)
    return bs_api_failf(EINVAL, "burnstore_writer_set_meta: no %s",
                        !w     ? "writer"
                        : !key ? "key"
                               : "value");
  if (w->w->drops_meta)
    return bs_api_failf(ENOTSUP, "%s: %s has no place for metadata ('%s' is not written)", w->path,
                        w->w->name, key);
  bs_err err;
  bs_err_clear(&err);
  struct bs_kv kv = {.key = (char *)key, .value = (char *)value};
  if (bs_writer_check_meta(w->w, NULL, key, value, strlen(value), &err) != 0 ||
      put_meta(w, key, &kv, 0, &err) != 0)
    return bs_api_fail(w->path, &err);
  return 0;
}

int burnstore_writer_save(burnstore_writer *w)
{
  if (!w)
    return bs_api_failf(EINVAL, "burnstore_writer_save: no writer");
  if (w->saved)
    return bs_api_failf(EINVAL, "%s: saved already (a writer saves once)", w->path);
  bs_err err;
  bs_err_clear(&err);
  const struct bs_writer *wr = w->w;
  w->cat.format = wr->format;
  /* A new output is as private as its sources' files (cp keeps the mode). */
  struct bs_write_opts wo = {.max_shard_size = w->max_shard_size,
                             .has_mode = true,
                             .mode = bs_sources_mode(&w->cat, w->cat.nsrcs, 0666)};
  int lk = -1, rc = -1;
  bs_log_hold(true); /* a source's failure is told in this call's message */
  if (bs_writer_check(wr, &w->cat, &err) != 0 ||
      (wr->default_meta && wr->default_meta(&w->cat, &err) != 0))
    bs_api_fail(w->path, &err);
  else if ((lk = bs_writer_lock(w->path, "libburnstore", &err)) < 0) /* one writer per target */
    bs_api_fail(NULL, &err);
  else if (bs_writer_write_file_opts(wr, &w->cat, w->path, &wo, &err) != 0)
    bs_api_fail(NULL, &err);
  else
    rc = 0;
  bs_target_unlock(lk);
  bs_log_hold(false);
  if (rc != 0)
    return burnstore_errcode();
  w->saved = true;
  return 0;
}
