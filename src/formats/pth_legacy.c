/* torch.save's legacy container (torch < 1.6): five pickles back to back
 * (magic number, protocol version 1001, sys_info, the object, the list of
 * storage keys), then per listed key a u64 LE element count and the bytes. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/checked.h"
#include "pth_private.h"

static const struct bs_pv *dict_get(const struct bs_pv *d, const char *key)
{
  if (d->kind != BS_PV_DICT)
    return NULL;
  for (size_t i = 0; i < d->u.dict.keys.n; i++) {
    const struct bs_pv *k = d->u.dict.keys.items[i];
    if (k->kind == BS_PV_STR && strcmp(k->u.str.s, key) == 0)
      return d->u.dict.vals.items[i];
  }
  return NULL;
}

int pth_check_sys_info(struct pth_ctx *c, const struct bs_pv *si, uint64_t off)
{
  const struct bs_pv *le = dict_get(si, "little_endian");
  if (le && le->kind == BS_PV_BOOL && !le->u.b)
    return bs_fail(c->err, ENOTSUP, off, NULL,
                   "big-endian checkpoint (sys_info little_endian is False): not supported");
  return 0;
}

/* Element sizes of the storages the tensors use, from their storage classes. */
static int learn_esizes(struct pth_ctx *c)
{
  for (size_t i = 0; i < c->nfound; i++) {
    const struct bs_pv *t = c->found[i].t;
    if (!t->u.tensor.storage) /* unsupported tensors still size their storage if they can */
      continue;
    const struct bs_pv *st = t->u.tensor.storage;
    struct pth_rec *r = pth_rec_get(c, st->u.storage.key);
    if (!r)
      return -1;
    if (r->esize && st->u.storage.esize && r->esize != st->u.storage.esize)
      return bs_fail(c->err, EINVAL, BS_OFF_NONE, c->found[i].key,
                     "storage '%.64s' is used with element sizes %u and %u", r->key, r->esize,
                     st->u.storage.esize);
    if (st->u.storage.esize)
      r->esize = st->u.storage.esize;
  }
  return 0;
}

/* One blob: u64 LE element count, then the bytes. */
int pth_blob(struct pth_ctx *c, struct pth_rec *r, uint64_t *pos, uint64_t limit)
{
  uint8_t h[8];
  if (!bs_range_ok(*pos, 8, limit))
    return bs_fail(c->err, EINVAL, *pos, NULL,
                   "truncated: storage '%.64s' header at %" PRIu64 " is past the end (%" PRIu64 ")",
                   r->key, *pos, limit);
  if (bs_src_read(pth_src(c), *pos, h, 8, c->err) != 0)
    return -1;
  uint64_t n = bs_le64(h), len;
  if (!bs_mul_u64(n, r->esize, &len) || !bs_range_ok(*pos + 8, len, limit))
    return bs_fail(c->err, EINVAL, *pos, NULL,
                   "truncated: storage '%.64s' declares %" PRIu64
                   " elements of %u bytes but only %" PRIu64 " bytes follow",
                   r->key, n, r->esize, limit - *pos - 8);
  r->src = c->src;
  r->off = *pos + 8;
  r->len = len;
  r->located = true;
  *pos += 8 + len;
  return 0;
}

int pth_read_legacy(struct pth_ctx *c)
{
  const struct bs_src *s = pth_src(c);
  struct bs_pickle_opts po = {.strict = false};
  struct bs_pv *v[5];
  uint64_t pos = 0;
  for (int i = 0; i < 5; i++) {
    po.base_off = pos;
    po.strict = i == 3 && c->opts->strict;
    uint64_t start = pos;
    if (bs_pickle_load(c->p, s, pos, s->size, &po, &v[i], &pos, c->err) != 0)
      return -1;
    if (i == 0 && (v[0]->kind != BS_PV_BIGINT || v[0]->u.str.len != 10 ||
                   memcmp(v[0]->u.str.s, bs_pth_legacy_magic, 10) != 0))
      return bs_fail(c->err, EINVAL, 0, NULL,
                     "not a PyTorch checkpoint: the first pickle is not torch's magic number");
    if (i == 1 && (v[1]->kind != BS_PV_INT || v[1]->u.i != 1001))
      return bs_fail(c->err, ENOTSUP, start, NULL,
                     "legacy checkpoint protocol version is not 1001");
    if (i == 2 && pth_check_sys_info(c, v[2], start) != 0)
      return -1;
    if (i == 4 && v[4]->kind != BS_PV_LIST)
      return bs_fail(c->err, EINVAL, start, NULL, "the storage key list is a %s, not a list",
                     bs_pv_kind_name(v[4]->kind));
  }
  if (pth_flatten(c, v[3]) != 0 || learn_esizes(c) != 0)
    return -1;
  const struct bs_pv *keys = v[4];
  for (size_t i = 0; i < keys->u.seq.n; i++) {
    const struct bs_pv *k = keys->u.seq.items[i];
    char kb[64];
    const char *key = k->kind == BS_PV_STR ? k->u.str.s : NULL;
    if (k->kind == BS_PV_INT) {
      snprintf(kb, sizeof kb, "%" PRId64, k->u.i);
      key = kb;
    }
    if (!key)
      return bs_fail(c->err, EINVAL, pos, NULL, "storage key %zu is a %s", i,
                     bs_pv_kind_name(k->kind));
    struct pth_rec *r = pth_rec_get(c, key);
    if (!r)
      return -1;
    if (r->esize == 0)
      return bs_fail(c->err, ENOTSUP, pos, NULL,
                     "storage '%.64s' is listed but no readable tensor uses it, so its element "
                     "size (and where the next storage starts) is unknown",
                     key);
    if (r->located)
      return bs_fail(c->err, EINVAL, pos, NULL, "storage '%.64s' is listed twice", key);
    if (pth_blob(c, r, &pos, s->size) != 0)
      return -1;
  }
  return pth_conclude(c, NULL);
}
