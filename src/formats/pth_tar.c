/* The torch 0.1-era tar container: ustar members sys_info (pickle), pickle
 * (the object, storages as ('storage', cls, key, location, numel) tuples) and
 * storages (pickled count, then per storage a pickled (key, location, cls),
 * a u64 LE element count and the bytes). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/checked.h"
#include "pth_private.h"

#define TAR_BLOCK 512u

struct tar_member {
  bool present;
  uint64_t off, size;
};

static int tar_size(const uint8_t *f, uint64_t *out)
{
  uint64_t v = 0;
  if (f[0] & 0x80) { /* GNU base-256 */
    for (int i = 1; i < 12; i++) {
      if (v >> 56)
        return -1;
      v = (v << 8) | f[i];
    }
    *out = v;
    return 0;
  }
  int i = 0;
  while (i < 12 && f[i] == ' ')
    i++;
  for (; i < 12 && f[i] >= '0' && f[i] <= '7'; i++) {
    if (v >> 60)
      return -1;
    v = v * 8 + (uint64_t)(f[i] - '0');
  }
  *out = v;
  return 0;
}

int pth_read_tar(struct pth_ctx *c)
{
  const struct bs_src *s = pth_src(c);
  struct tar_member sys = {0}, pkl = {0}, sto = {0};
  bool tensors = false;
  uint8_t h[TAR_BLOCK];
  for (uint64_t off = 0; bs_range_ok(off, TAR_BLOCK, s->size);) {
    if (bs_src_read(s, off, h, TAR_BLOCK, c->err) != 0)
      return -1;
    bool zero = true;
    for (unsigned i = 0; i < TAR_BLOCK && zero; i++)
      zero = h[i] == 0;
    if (zero)
      break;
    uint64_t size, padded;
    if (tar_size(h + 124, &size) != 0 || !bs_align_up(size, TAR_BLOCK, &padded) ||
        !bs_range_ok(off + TAR_BLOCK, size, s->size))
      return bs_fail(c->err, EINVAL, off, NULL, "corrupt tar header: member size out of range");
    char name[101];
    memcpy(name, h, 100);
    name[100] = '\0';
    const char *n = strncmp(name, "./", 2) == 0 ? name + 2 : name;
    if (h[156] == '0' || h[156] == '\0') {
      struct tar_member m = {true, off + TAR_BLOCK, size};
      if (strcmp(n, "sys_info") == 0)
        sys = m;
      else if (strcmp(n, "pickle") == 0)
        pkl = m;
      else if (strcmp(n, "storages") == 0)
        sto = m;
      else if (strcmp(n, "tensors") == 0)
        tensors = true;
    }
    if (!bs_add_u64(off + TAR_BLOCK, padded, &off))
      break;
  }
  if (tensors)
    return bs_fail(c->err, ENOTSUP, BS_OFF_NONE, NULL,
                   "tar checkpoint with a 'tensors' member (torch 0.1/0.2): not supported; load "
                   "it with an old torch and save it again");
  if (!pkl.present || !sto.present)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "tar file without 'pickle' and 'storages' members: not a PyTorch checkpoint");
  struct bs_pickle_opts po = {.strict = false};
  struct bs_pv *v;
  if (sys.present) {
    po.base_off = sys.off;
    if (bs_pickle_load(c->p, s, sys.off, sys.off + sys.size, &po, &v, NULL, c->err) != 0 ||
        pth_check_sys_info(c, v, sys.off) != 0)
      return -1;
  }
  /* storages: count, then per storage (key, location, class) + u64 count + bytes */
  uint64_t pos = sto.off, end = sto.off + sto.size;
  po.base_off = pos;
  if (bs_pickle_load(c->p, s, pos, end, &po, &v, &pos, c->err) != 0)
    return -1;
  if (v->kind != BS_PV_INT || v->u.i < 0 || (uint64_t)v->u.i > sto.size / 8)
    return bs_fail(c->err, EINVAL, sto.off, NULL, "tar 'storages': bad storage count");
  int64_t count = v->u.i;
  for (int64_t i = 0; i < count; i++) {
    uint64_t at = pos;
    po.base_off = pos;
    if (bs_pickle_load(c->p, s, pos, end, &po, &v, &pos, c->err) != 0)
      return -1;
    if (v->kind != BS_PV_TUPLE || v->u.seq.n != 3 || v->u.seq.items[0]->kind != BS_PV_STR ||
        v->u.seq.items[2]->kind != BS_PV_GLOBAL)
      return bs_fail(c->err, EINVAL, at, NULL,
                     "tar 'storages': entry %" PRId64 " is not (key, location, storage class)", i);
    const struct bs_pv *cls = v->u.seq.items[2];
    struct pth_rec *r = pth_rec_get(c, v->u.seq.items[0]->u.str.s);
    if (!r)
      return -1;
    if (r->located)
      return bs_fail(c->err, EINVAL, at, NULL, "tar 'storages': storage '%.64s' appears twice",
                     r->key);
    r->esize = cls->u.glob.kind == BS_PG_STORAGE ? cls->u.glob.esize : 0;
    if (!r->esize)
      return bs_fail(c->err, ENOTSUP, at, NULL, "tar 'storages': unknown storage class %s.%s",
                     cls->u.glob.module, cls->u.glob.name);
    if (pth_blob(c, r, &pos, end) != 0)
      return -1;
  }
  po.base_off = pkl.off;
  po.strict = c->opts->strict;
  if (bs_pickle_load(c->p, s, pkl.off, pkl.off + pkl.size, &po, &v, NULL, c->err) != 0)
    return -1;
  return pth_flatten(c, v) != 0 ? -1 : pth_conclude(c, NULL);
}
