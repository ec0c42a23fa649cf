/* The .npy views of a read-only mount (-o npy, -o npy=only): a node NAME.npy
 * per tensor serving a NumPy header (npy.c) and then the tensor's bytes
 * through the same read path as NAME. The hooks in fs_ops.c call these. */
#include <errno.h>
#include <string.h>

#include "burnstore/alloc.h"
#include "burnstore/npy.h"
#include "fs_views.h"

int fs_npy_build(struct fs *fs, int mode, bs_err *err)
{
  fs->npy_mode = mode;
  fs->npy_first = fs->tree.n;
  if (mode == FS_NPY_OFF)
    return 0;
  size_t n = fs->tree.n; /* the nodes before the views */
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
    uint64_t parent = nd->parent, vino;
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
  }
  return 0;
}

bool fs_npy_is_view(const struct fs *fs, uint64_t ino)
{
  if (fs->npy_mode == FS_NPY_OFF)
    return false;
  if (fs->npy_mode == FS_NPY_ONLY) {
    const struct bs_node *nd = bs_tree_node(&fs->tree, ino);
    size_t n = nd && nd->name ? strlen(nd->name) : 0;
    return n > 4 && memcmp(nd->name + n - 4, ".npy", 4) == 0 && nd->tensor >= 0 &&
           bs_npy_descr(fs->cat.tensors[nd->tensor].dtype, NULL);
  }
  return ino >= fs->npy_first;
}

uint64_t fs_npy_header_len(const struct bs_tensor *t)
{
  return bs_npy_header_len(t->dtype, t->rank, t->shape);
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
