/* PyTorch checkpoints, three containers (docs/formats.md says how they are detected):
 *
 * ZIP (torch >= 1.6, first bytes "PK\3\4", pth_zip.c): records
 *   <prefix>/data.pkl (the pickle), <prefix>/data/<key> (one storage, raw LE
 *   bytes), <prefix>/byteorder ("little"/"big"), version, ...
 * LEGACY (torch < 1.6, pth_legacy.c): five pickles back to back (magic
 *   0x1950a86a20f9469cfc6c, protocol 1001, sys_info dict, the object, list of
 *   storage keys), then per key in list order: u64 LE element count + count *
 *   element size bytes.
 * TAR (torch 0.1-era, pth_tar.c): ustar members sys_info (pickle), pickle
 *   (the object) and storages (pickled count, then per storage a pickled
 *   (key, location, cls) + u64 LE element count + bytes).
 * The unpickled object is flattened by pth_values.c; tensors are
 * _rebuild_tensor_v2(storage, offset, size, stride, ...): their bytes stay
 * where they are in the file, and strided views are gathered on read. This
 * file dispatches and turns found tensors into catalog entries. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/decode.h"
#include "pth_private.h"

static void ctx_destroy(struct pth_ctx *c)
{
  bs_zip_close(&c->zip);
  if (c->has_tmp)
    close(c->tmp_fd);
  bs_free(c->prefix);
  for (size_t i = 0; i < c->nrecs; i++)
    bs_free(c->recs[i].key);
  bs_free(c->recs);
  bs_strmap_destroy(&c->recmap);
  bs_free(c->found);
  bs_strmap_destroy(&c->keys);
  for (size_t i = 0; i < c->nowned; i++)
    bs_free(c->owned_keys[i]);
  bs_free(c->owned_keys);
  bs_free(c->values);
  bs_free(c->path);
  bs_free(c->stack);
  bs_pickle_free(c->p);
}

int pth_nomem(struct pth_ctx *c)
{
  return bs_fail(c->err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
}

struct pth_rec *pth_rec_get(struct pth_ctx *c, const char *key)
{
  size_t idx;
  if (bs_strmap_get(&c->recmap, key, &idx))
    return &c->recs[idx];
  if (bs_grow((void **)&c->recs, &c->reccap, c->nrecs + 1, sizeof *c->recs) != 0) {
    pth_nomem(c);
    return NULL;
  }
  struct pth_rec *r = &c->recs[c->nrecs];
  memset(r, 0, sizeof *r);
  if (!(r->key = bs_strdup(key))) {
    pth_nomem(c);
    return NULL;
  }
  if (bs_strmap_put(&c->recmap, r->key, c->nrecs) < 0) {
    bs_free(r->key);
    pth_nomem(c);
    return NULL;
  }
  c->nrecs++;
  return r;
}

/* ---- tensors -------------------------------------------------------------------------------- */

static bool row_major(const struct bs_pv *t)
{
  uint64_t expect = 1;
  for (uint32_t d = t->u.tensor.rank; d-- > 0;) {
    uint64_t n = t->u.tensor.shape[d];
    if (n == 0)
      return true; /* empty: any strides */
    if (n != 1 && (t->u.tensor.stride[d] < 0 || (uint64_t)t->u.tensor.stride[d] != expect))
      return false;
    if (!bs_mul_u64(expect, n, &expect))
      return false;
  }
  return true;
}

static int add_tensor(struct pth_ctx *c, const struct pth_found *f, pth_locate_fn locate)
{
  const struct bs_pv *t = f->t;
  const char *key = f->key;
  if (t->u.tensor.unsupported) {
    struct bs_tensor *bt = bs_catalog_add(c->cat, key, BS_DT_U8, t->u.tensor.rank,
                                          t->u.tensor.shape, BS_OFF_NONE, c->err);
    if (!bt)
      return -1;
    bt->src = c->src;
    bt->nbytes = 0;
    if (!bs_tensor_x(c->cat, bt) || !(bt->x->unsupported = bs_strdup(t->u.tensor.unsupported)))
      return pth_nomem(c);
    return 0;
  }
  const struct bs_pv *st = t->u.tensor.storage;
  struct pth_rec *r = pth_rec_get(c, st->u.storage.key);
  if (!r)
    return -1;
  if (!r->located) {
    if (!locate)
      return bs_fail(c->err, EINVAL, BS_OFF_NONE, key,
                     "storage '%.64s' is not in the file's storage list", st->u.storage.key);
    if (locate(c, r, key) != 0)
      return -1;
  }
  uint64_t want;
  if (!bs_mul_u64(st->u.storage.numel, st->u.storage.esize, &want) || want != r->len)
    return bs_fail(c->err, EINVAL, r->off, key,
                   "storage '%.64s' has %" PRIu64 " bytes but its persistent id declares %" PRIu64
                   " elements of %u bytes",
                   r->key, r->len, st->u.storage.numel, st->u.storage.esize);
  uint64_t base = r->off, slen = r->len;
  if (st->u.storage.has_view) { /* legacy: a slice of the root storage, in elements */
    uint64_t vo, vl, vend;
    if (!bs_add_u64(st->u.storage.view_off, st->u.storage.view_numel, &vend) ||
        vend > st->u.storage.numel ||
        !bs_mul_u64(st->u.storage.view_off, st->u.storage.esize, &vo) ||
        !bs_mul_u64(st->u.storage.view_numel, st->u.storage.esize, &vl))
      return bs_fail(c->err, EINVAL, r->off, key,
                     "storage view [%" PRIu64 ", +%" PRIu64
                     ") is outside storage '%.64s' of %" PRIu64 " elements",
                     st->u.storage.view_off, st->u.storage.view_numel, r->key, st->u.storage.numel);
    base += vo;
    slen = vl;
  }
  enum bs_dtype dt = t->u.tensor.dtype;
  uint64_t esize = dt == BS_DT_F4 ? 1 : bs_dtype_bits(dt) / 8; /* F4: offset in bytes */
  struct bs_tensor *bt =
      bs_catalog_add(c->cat, key, dt, t->u.tensor.rank, t->u.tensor.shape, base, c->err);
  if (!bt)
    return -1;
  bt->src = r->src;
  if (row_major(t)) {
    uint64_t doff;
    if (bt->nbytes == 0) {
      bt->off = base;
      return 0;
    }
    if (!bs_mul_u64(t->u.tensor.offset, esize, &doff) || doff > slen || bt->nbytes > slen - doff)
      return bs_fail(c->err, EINVAL, base, key,
                     "tensor needs bytes [%" PRIu64 " x %" PRIu64 ", +%" PRIu64
                     ") but storage '%.64s' has %" PRIu64,
                     t->u.tensor.offset, esize, bt->nbytes, r->key, slen);
    bt->off = base + doff;
    return 0;
  }
  if (!bs_tensor_x(c->cat, bt) ||
      !(bt->x->strides = bs_malloc(t->u.tensor.rank * sizeof *bt->x->strides)))
    return pth_nomem(c);
  memcpy(bt->x->strides, t->u.tensor.stride, t->u.tensor.rank * sizeof *bt->x->strides);
  bt->x->storage_off = t->u.tensor.offset;
  bt->x->storage_bytes = slen;
  bt->off = base;
  return bs_tensor_check_view(bt, base, c->err);
}

/* A quantizer's scales or zero points: a 1-D contiguous tensor of n
 * elements, read from the archive and converted as torch's
 * make_per_channel_affine_quantizer converts them, into out: `want` F64
 * (n doubles, from F64 or F32: scales.to(kDouble)), I64 (n int64, from I64)
 * or F32 (n floats, from F32 or F64: .to(kFloat), nearest). 0; 1 when the
 * tensor is none of those (the quantizer is then not kept); -1 with err. */
static int qparam_bytes(struct pth_ctx *c, const char *key, const struct bs_pv *t,
                        enum bs_dtype want, uint64_t n, pth_locate_fn locate, uint8_t *out)
{
  const char *what = want == BS_DT_I64 ? "zero points" : "scales";
  if (t->u.tensor.unsupported || !t->u.tensor.dtype_ok || t->u.tensor.rank != 1 ||
      t->u.tensor.shape[0] != n || (n > 1 && t->u.tensor.stride[0] != 1))
    return 1;
  const enum bs_dtype have = t->u.tensor.dtype;
  if (want == BS_DT_I64 ? have != BS_DT_I64 : (have != BS_DT_F64 && have != BS_DT_F32))
    return 1;
  const uint64_t esz = have == BS_DT_F32 ? 4 : 8, osz = want == BS_DT_F32 ? 4 : 8;
  const struct bs_pv *st = t->u.tensor.storage;
  struct pth_rec *r = pth_rec_get(c, st->u.storage.key);
  if (!r)
    return -1;
  if (!r->located && (!locate || locate(c, r, key) != 0))
    return locate ? -1
                  : bs_fail(c->err, EINVAL, BS_OFF_NONE, key,
                            "quantizer %s: storage '%.64s' is not in the file's storage list", what,
                            st->u.storage.key);
  uint64_t base = r->off, slen = r->len, skip, start;
  if (st->u.storage.has_view) { /* legacy: a slice of the root storage, in elements */
    if (!bs_mul_u64(st->u.storage.view_off, esz, &skip) || skip > slen)
      return bs_fail(c->err, EINVAL, r->off, key, "quantizer %s: bad storage view", what);
    base += skip;
    slen -= skip;
  }
  if (!bs_mul_u64(t->u.tensor.offset, esz, &start) || start > slen || n > (slen - start) / esz)
    return bs_fail(c->err, EINVAL, base, key,
                   "quantizer %s: %" PRIu64 " elements from %" PRIu64
                   " do not fit storage '%.64s' of %" PRIu64 " bytes",
                   what, n, t->u.tensor.offset, r->key, slen);
  /* read into the end of out (n * osz >= n * esz unless F64 to F32, read
   * then in halves), then convert forwards: element i is read before
   * output element i (at or before it) is written */
  uint8_t *in = osz >= esz ? out + n * (osz - esz) : NULL;
  uint8_t tmp[8 * 64];
  for (uint64_t done = 0; done < n;) {
    uint64_t k = in ? n : (n - done < 64 ? n - done : 64);
    uint8_t *dst = in ? in : tmp;
    long got =
        bs_src_pread(&c->cat->srcs[r->src], base + start + done * esz, dst, (size_t)(k * esz));
    if (got < 0 || (uint64_t)got != k * esz)
      return bs_fail(c->err, EIO, base + start, key, "quantizer %s: cannot read them", what);
    for (uint64_t i = 0; i < k; i++) { /* little-endian in the file, host order here */
      const uint8_t *e = dst + i * esz;
      uint8_t *o = out + (done + i) * osz;
      if (have == BS_DT_F32) {
        uint32_t u = bs_le32(e);
        float f;
        memcpy(&f, &u, 4);
        if (want == BS_DT_F32) {
          memcpy(o, &f, 4);
        } else {
          double d = f;
          memcpy(o, &d, 8);
        }
      } else {
        uint64_t u = bs_le64(e);
        if (want == BS_DT_F32) {
          double d;
          memcpy(&d, &u, 8);
          float f = (float)d;
          memcpy(o, &f, 4);
        } else {
          memcpy(o, &u, 8);
        }
      }
    }
    done += k;
  }
  return 0;
}

/* A torch quantized tensor's quantizer, into its dtype_raw (decode.h's
 * struct bs_torch_q), so that as=F32 can dequantize it. One whose
 * quantizer is not kept shows its stored integers, as before. */
static int add_quantizer(struct pth_ctx *c, const struct pth_found *f, pth_locate_fn locate)
{
  const struct bs_pv *t = f->t;
  struct bs_tensor *bt = &c->cat->tensors[c->cat->count - 1];
  /* A strided view (torch makes them of per-tensor quantized tensors only:
   * t(), slices) keeps its quantizer too: a read gathers its elements in
   * row-major order, and an element's channel is a function of that index. */
  const struct bs_pv_quant *tq = t->u.tensor.q;
  if (!tq || bt->x->unsupported || bt->nbytes == 0 ||
      (bt->dtype != BS_DT_QI8 && bt->dtype != BS_DT_QU8 && bt->dtype != BS_DT_QI32))
    return 0;
  struct bs_torch_q h = {.scheme = tq->scheme, .scale = tq->scale, .zp = tq->zp};
  uint64_t len = sizeof h;
  const struct bs_pv *zps = tq->zps;
  if (h.scheme == BS_TQ_PER_CHANNEL && zps && zps->kind == BS_PV_TENSOR &&
      (zps->u.tensor.dtype == BS_DT_F32 || zps->u.tensor.dtype == BS_DT_F64))
    h.scheme = BS_TQ_PER_CHANNEL_FQ; /* float zero points: float_qparams, as torch makes it */
  if (h.scheme != BS_TQ_PER_TENSOR) {
    int64_t ax = tq->axis;
    if (ax < 0 || (uint64_t)ax >= bt->rank || bt->shape[ax] == 0)
      return bs_fail(c->err, EINVAL, bt->off, f->key,
                     "per-channel quantizer axis %" PRId64 " of a rank-%u tensor", ax, bt->rank);
    h.axis = (uint32_t)ax;
    h.nch = bt->shape[ax];
    h.inner = 1;
    for (uint32_t d = h.axis + 1; d < bt->rank; d++)
      if (!bs_mul_u64(h.inner, bt->shape[d] ? bt->shape[d] : 1, &h.inner))
        return bs_fail(c->err, EINVAL, bt->off, f->key, "shape overflows");
    /* nch <= numel (none is 0) <= the tensor's bytes, checked against the file;
     * but the keys of one shared tensor each keep a copy: bounded in all */
    const uint64_t qb = h.nch * (h.scheme == BS_TQ_PER_CHANNEL ? 16 : 8);
    const uint64_t fsize = pth_src(c)->size;
    uint64_t limit = fsize > (UINT64_MAX - PTH_QPARAM_SLACK) / PTH_QPARAM_RATIO
                         ? UINT64_MAX
                         : fsize * PTH_QPARAM_RATIO + PTH_QPARAM_SLACK;
    if (qb > limit - c->qbytes)
      return bs_fail(c->err, EFBIG, bt->off, f->key,
                     "per-channel quantizers of more than %" PRIu64
                     " bytes (%u x the file + 16 MiB; shared references multiply them)",
                     limit, PTH_QPARAM_RATIO);
    c->qbytes += qb;
    len += qb;
  }
  uint8_t *blob = bs_malloc((size_t)len);
  if (!blob)
    return pth_nomem(c);
  memcpy(blob, &h, sizeof h);
  if (h.scheme != BS_TQ_PER_TENSOR) {
    const bool fq = h.scheme == BS_TQ_PER_CHANNEL_FQ;
    const uint64_t w = fq ? 4 : 8;
    int rc = qparam_bytes(c, f->key, tq->scales, fq ? BS_DT_F32 : BS_DT_F64, h.nch, locate,
                          blob + sizeof h);
    if (rc == 0)
      rc = qparam_bytes(c, f->key, zps, fq ? BS_DT_F32 : BS_DT_I64, h.nch, locate,
                        blob + sizeof h + h.nch * w);
    if (rc != 0) {
      bs_free(blob);
      return rc < 0 ? -1 : 0;
    }
  }
  bt = &c->cat->tensors[c->cat->count - 1]; /* pth_rec_get may not move it, but be sure */
  if (!bs_tensor_x(c->cat, bt)) {
    bs_free(blob);
    return pth_nomem(c);
  }
  bs_free(bt->x->dtype_raw);
  bt->x->dtype_raw = blob;
  bt->x->dtype_raw_len = (size_t)len;
  return 0;
}

int pth_conclude(struct pth_ctx *c, pth_locate_fn locate)
{
  if (bs_catalog_reserve(c->cat, c->nfound) != 0) /* exactly: no array doubled */
    return pth_nomem(c);
  for (size_t i = 0; i < c->nfound; i++)
    if (add_tensor(c, &c->found[i], locate) != 0 || add_quantizer(c, &c->found[i], locate) != 0)
      return -1;
  for (size_t i = 0; i < bs_pickle_nnotes(c->p); i++)
    if (bs_catalog_note(c->cat, bs_pickle_note(c->p, i), c->err) != 0)
      return -1;
  return pth_values_json(c, &c->cat->values_json);
}

int bs_pth_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts, bs_err *err)
{
  static const struct bs_open_opts defaults = {0};
  struct pth_ctx c;
  memset(&c, 0, sizeof c);
  c.cat = cat;
  c.src = src;
  c.opts = opts ? opts : &defaults;
  c.err = err;
  enum bs_pth_container kind;
  bs_formats_init();
  if (src >= cat->nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "no source %u", src);
  if (bs_pth_container(&cat->srcs[src], &kind, err) != 0)
    return -1;
  const struct bs_catalog_mark mark = bs_catalog_mark(cat);
  if (!(c.p = bs_pickle_new()))
    return pth_nomem(&c);
  int rc;
  switch (kind) {
  case BS_PTH_ZIP: rc = pth_read_zip(&c); break;
  case BS_PTH_LEGACY: rc = pth_read_legacy(&c); break;
  case BS_PTH_TAR: rc = pth_read_tar(&c); break;
  default: rc = bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "not a PyTorch container"); break;
  }
  ctx_destroy(&c);
  if (rc != 0)
    bs_catalog_rollback(cat, &mark); /* with the decompressed copies */
  return rc;
}
