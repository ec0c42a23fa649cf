/* The .npy views of a read-only mount (-o npy, -o npy=only): a node NAME.npy
 * per tensor serving a NumPy header (npy.c) and then the tensor's bytes
 * through the same read path as NAME. The hooks in fs_ops.c call these. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/npy.h"
#include "fs_views.h"

int fs_npy_build(struct fs *fs, int mode, bs_err *err)
{
  fs->npy_mode = mode;
  if (mode == FS_NPY_OFF)
    return 0;
  size_t n = fs->tree.n; /* the nodes before the views */
  /* One entry per node, the views added by npy (at most one a node) included. */
  size_t cap = mode == FS_NPY_BOTH ? 2 * n : n;
  if (n > SIZE_MAX / 2 || !(fs->npy_hlen = bs_calloc(cap, sizeof *fs->npy_hlen)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  fs->npy_n = cap;
  for (uint64_t ino = BS_TREE_ROOT; ino < n; ino++) {
    struct bs_node *nd = bs_tree_node(&fs->tree, ino);
    if (!nd || nd->is_dir || nd->tensor < 0)
      continue;
    const struct bs_tensor *t = &fs->cat.tensors[nd->tensor];
    if (!bs_npy_descr(t->dtype, NULL))
      continue; /* no .npy form (F4, F6, QFLOAT): the plain file stays, also with npy=only */
    size_t len = strlen(nd->name);
    if (len + 4 > BS_NAME_MAX)
      return bs_fail(err, ENAMETOOLONG, BS_OFF_NONE, t->name,
                     "its file name is too long for a .npy view (%zu + 4 bytes)", len);
    char *name = bs_malloc(len + 5);
    if (!name)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    memcpy(name, nd->name, len);
    memcpy(name + len, ".npy", 5);
    uint64_t parent = nd->parent, vino = 0;
    long tensor = nd->tensor;
    int rc;
    if (mode == FS_NPY_ONLY)
      rc = bs_tree_move(&fs->tree, ino, parent, name, err);
    else
      rc = bs_tree_add(&fs->tree, parent, name, false, tensor, &vino, err);
    if (rc != 0 && err->code == EEXIST)
      bs_fail(err, EEXIST, BS_OFF_NONE, t->name, "its .npy view '%s' is also a tensor's name",
              name);
    bs_free(name);
    if (rc != 0)
      return -1;
    /* The view's node: the moved file (npy=only) or the new one. */
    uint64_t view = mode == FS_NPY_ONLY ? ino : vino;
    if (view >= fs->npy_n)
      return bs_fail(err, EIO, BS_OFF_NONE, t->name,
                     "internal: .npy view node %" PRIu64 " past %zu", view, fs->npy_n);
    /* <= BS_NPY_MAX_HEADER: fits; nonzero for every view. */
    fs->npy_hlen[view] = (uint32_t)bs_npy_header_len(t->dtype, t->rank, t->shape);
  }
  return 0;
}

void fs_npy_destroy(struct fs *fs)
{
  bs_free(fs->npy_hlen);
  fs->npy_hlen = NULL;
  fs->npy_n = 0;
}

int fs_npy_read(const struct fs *fs, const struct bs_tensor *t, size_t size, uint64_t off,
                char **out, size_t *n)
{
  char hdr[BS_NPY_MAX_HEADER];
  size_t hl;
  *out = NULL;
  *n = 0;
  if (bs_npy_header(t->dtype, t->rank, t->shape, hdr, sizeof hdr, &hl, NULL) != 0)
    return -EIO;
  uint64_t total = hl + t->nbytes;
  if (off >= total)
    return 0;
  if (size > total - off)
    size = (size_t)(total - off);
  char *buf = bs_malloc(size ? size : 1);
  if (!buf)
    return -ENOMEM;
  size_t head = off < hl ? hl - (size_t)off : 0;
  if (head > size)
    head = size;
  memcpy(buf, hdr + off, head);
  size_t got = head;
  if (size > head) {
    long r = bs_tensor_read(&fs->cat, t, off + head - hl, buf + head, size - head);
    if (r < 0) {
      bs_free(buf);
      return (int)r;
    }
    got += (size_t)r;
  }
  *out = buf;
  *n = got;
  return 0;
}
