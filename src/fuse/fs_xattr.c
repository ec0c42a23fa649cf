/* The xattr ops: user.burnstore.* shows a file's dtype, shape, key and
 * param_id and the root's format, values, notes and meta.*; other user.*
 * xattrs of a writable mount are kept as set (within the editable
 * catalog's budget). The model is the core's (core/edit.h); locks as
 * described at the top of fs_ops.c (the tree lock only to find the node or
 * its key, then the file's own lock; the root's lock guards the metadata).
 *
 * What listxattr names is what a copy (cp -a, rsync -X) carries over: a
 * dtype or shape that was never set and has no source tensor behind it is
 * inferred, so it is answered by getxattr but not listed, and a copy leaves
 * it inferred. Removing a computed name (key, format, ...) succeeds and
 * changes nothing, as rsync -X removes what its source lacks. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/xattr.h>

#include "burnstore/formats.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "formats/st_index.h"
#include "fs.h"

#define XA_PREFIX "user.burnstore."
#define XA_DTYPE XA_PREFIX "dtype"
#define XA_SHAPE XA_PREFIX "shape"
#define XA_KEY XA_PREFIX "key"
#define XA_PARAM_ID XA_PREFIX "param_id"
#define XA_FORMAT XA_PREFIX "format"
#define XA_VALUES XA_PREFIX "values"
#define XA_NOTES XA_PREFIX "notes"
#define XA_META XA_PREFIX "meta."
#define XA_SHARD XA_PREFIX "shard"

static bool has_prefix(const char *s, const char *p)
{
  return strncmp(s, p, strlen(p)) == 0;
}

struct xbuf {
  char *data;
  size_t len, cap;
};

static int xadd(struct xbuf *b, const void *p, size_t n)
{
  if (bs_grow((void **)&b->data, &b->cap, b->len + n + 1, 1) != 0)
    return -1;
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

static int xadds(struct xbuf *b, const char *s)
{
  return xadd(b, s, strlen(s)) ? ENOMEM : 0;
}

static int xaddu(struct xbuf *b, uint64_t v)
{
  char tmp[24];
  snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  return xadds(b, tmp);
}

static void lock_rd(struct bs_entry *e)
{
  if (e)
    pthread_rwlock_rdlock(&e->lock);
}
static void lock_wr(struct bs_entry *e)
{
  if (e)
    pthread_rwlock_wrlock(&e->lock);
}
static void unlock_e(struct bs_entry *e)
{
  if (e)
    pthread_rwlock_unlock(&e->lock);
}

/* The entry that describes a file: its own (writable mounts), or for a
 * read-only mount a clean one over its tensor (never locked). */
static const struct bs_entry *view_entry(struct fs *fs, const struct fs_ref *r,
                                         struct bs_entry *tmp)
{
  if (r->e)
    return r->e;
  memset(tmp, 0, sizeof *tmp);
  tmp->tensor = r->tensor;
  const struct bs_tensor *t = bs_entry_origin(&fs->edit, tmp);
  tmp->size = t ? t->nbytes : 0;
  return tmp;
}

static struct bs_entry *root_entry(struct fs *fs)
{
  struct fs_ref r;
  return fs->writable && fs_ref_get(fs, BS_TREE_ROOT, &r) == 0 ? r.e : NULL;
}

/* Value of a root xattr into b. Returns 0, ENODATA (not a root name) or an errno. */
static int get_root(struct fs *fs, const char *name, struct xbuf *b)
{
  if (strcmp(name, XA_FORMAT) == 0)
    /* A new mount has no source: it is what its output will be. */
    return xadds(b, fs->cat.format != BS_FMT_NONE ? bs_format_name(fs->cat.format)
                    : fs->writer                  ? fs->writer->name
                                                  : "burnpack");
  if (strcmp(name, XA_VALUES) == 0 && fs->cat.values_json)
    return xadds(b, fs->cat.values_json);
  if (strcmp(name, XA_NOTES) == 0 && fs->cat.notes)
    return xadds(b, fs->cat.notes);
  if (has_prefix(name, XA_META)) {
    struct bs_entry *re = root_entry(fs);
    lock_rd(re);
    const char *v = bs_edit_get_meta(&fs->edit, name + strlen(XA_META));
    /* Longer than Linux lets an xattr be (a GGUF tokenizer vocabulary):
     * E2BIG, still listed; `burnstore info FILE --meta KEY` prints it. */
    int rc = !v ? ENODATA : strlen(v) > BS_MAX_XATTR_VALUE ? E2BIG : xadds(b, v);
    unlock_e(re);
    return rc;
  }
  return ENODATA;
}

/* A file's or directory's xattr (held: e->lock shared, if writable). */
static int get_file(struct fs *fs, const struct fs_ref *r, const struct bs_entry *e,
                    const char *name, struct xbuf *b)
{
  const struct bs_xattr *x = bs_entry_get_xattr(e, name);
  if (x)
    return xadd(b, x->value, x->len) ? ENOMEM : 0;
  if (r->is_dir)
    return ENODATA;
  if (strcmp(name, XA_DTYPE) == 0 || strcmp(name, XA_SHAPE) == 0) {
    struct bs_eff eff;
    bs_entry_effective(&fs->edit, e, &eff);
    if (name[strlen(XA_PREFIX)] == 'd')
      return xadds(b, bs_dtype_name(eff.dtype));
    char *s = bs_shape_json(eff.rank, eff.shape);
    int rc = s ? xadds(b, s) : ENOMEM;
    bs_free(s);
    return rc;
  }
  if (strcmp(name, XA_SHARD) == 0) {
    const struct bs_tensor *t = e->stage ? NULL : bs_entry_origin(&fs->edit, e);
    const char *shard = t ? bs_st_index_shard_of(&fs->cat, t) : NULL;
    return shard ? xadds(b, shard) : ENODATA;
  }
  if (strcmp(name, XA_PARAM_ID) == 0) {
    const struct bs_tensor *t = bs_entry_origin(&fs->edit, e);
    if (e->has_param_id)
      return xaddu(b, e->param_id);
    if (t && t->has_param_id)
      return xaddu(b, t->param_id);
  }
  return ENODATA;
}

/* The key of a file: the source key in a read-only mount, else its path's. */
static int get_key(struct fs *fs, fuse_ino_t ino, const struct fs_ref *r, struct xbuf *b)
{
  if (!r->e) {
    const struct bs_tensor *t =
        r->tensor >= 0 && (size_t)r->tensor < fs->cat.count ? &fs->cat.tensors[r->tensor] : NULL;
    if (t)
      return xadds(b, t->key);
  }
  pthread_rwlock_rdlock(&fs->lock);
  char *key = bs_tree_key(&fs->tree, ino, fs->flat);
  pthread_rwlock_unlock(&fs->lock);
  if (!key)
    return ENODATA;
  int rc = xadds(b, key);
  bs_free(key);
  return rc;
}

static int get_xattr(struct fs *fs, fuse_ino_t ino, const struct fs_ref *r, const char *name,
                     struct xbuf *b)
{
  if (ino == BS_TREE_ROOT) {
    int rc = get_root(fs, name, b);
    if (rc != ENODATA)
      return rc;
  }
  if (!r->is_dir && strcmp(name, XA_KEY) == 0)
    return get_key(fs, ino, r, b);
  struct bs_entry tmp;
  const struct bs_entry *e = view_entry(fs, r, &tmp);
  lock_rd(r->e);
  int rc = get_file(fs, r, e, name, b);
  unlock_e(r->e);
  return rc;
}

static void reply_xattr(fuse_req_t req, const struct xbuf *b, size_t size)
{
  if (size == 0)
    fuse_reply_xattr(req, b->len);
  else if (b->len > size)
    fuse_reply_err(req, ERANGE);
  else
    fuse_reply_buf(req, b->data ? b->data : "", b->len);
}

/* Namespaces no file of a mount ever has (only user.* can be set): asked
 * for, they answer EOPNOTSUPP, not ENODATA. ls -l asks for security.selinux
 * and the POSIX ACLs of every entry, and coreutils remembers EOPNOTSUPP
 * per device, so a listing asks once instead of ~2.5 times per entry; the
 * kernel's per-write check for security.capability gets it too (any error
 * means "no capability to drop"). */
static bool foreign_namespace(const char *name)
{
  return has_prefix(name, "security.") || has_prefix(name, "system.") ||
         has_prefix(name, "trusted.");
}

void fs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
  struct fs *fs = fs_data(req);
  struct xbuf b = {0};
  if (foreign_namespace(name)) {
    fuse_reply_err(req, EOPNOTSUPP); /* no lock, no lookup: once per write(2) */
    return;
  }
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc)
    rc = get_xattr(fs, ino, &r, name, &b);
  if (rc)
    fuse_reply_err(req, rc);
  else
    reply_xattr(req, &b, size);
  bs_free(b.data);
}

#define NAME(s) (xadd(b, s, strlen(s) + 1) ? ENOMEM : 0)

static int list_root(struct fs *fs, struct xbuf *b)
{
  int rc = NAME(XA_FORMAT);
  if (!rc && fs->cat.values_json)
    rc = NAME(XA_VALUES);
  if (!rc && fs->cat.notes)
    rc = NAME(XA_NOTES);
  struct bs_entry *re = root_entry(fs);
  lock_rd(re);
  for (size_t i = 0; !rc && i < fs->edit.nmeta; i++)
    if (xadd(b, XA_META, strlen(XA_META)) || NAME(fs->edit.meta[i].key))
      rc = ENOMEM;
  unlock_e(re);
  return rc;
}

/* Held: e->lock shared, if writable. */
static int list_file(struct fs *fs, const struct fs_ref *r, const struct bs_entry *e,
                     struct xbuf *b)
{
  int rc = 0;
  if (!r->is_dir) {
    struct bs_eff eff;
    bs_entry_effective(&fs->edit, e, &eff);
    const struct bs_tensor *t = bs_entry_origin(&fs->edit, e);
    if (!eff.dtype_inferred)
      rc = NAME(XA_DTYPE);
    if (!rc && !eff.shape_inferred)
      rc = NAME(XA_SHAPE);
    if (!rc)
      rc = NAME(XA_KEY);
    if (!rc && (e->has_param_id || (t && t->has_param_id)))
      rc = NAME(XA_PARAM_ID);
    if (!rc && !e->stage && t && bs_st_index_shard_of(&fs->cat, t))
      rc = NAME(XA_SHARD);
  }
  for (size_t i = 0; !rc && i < e->nxattrs; i++)
    rc = NAME(e->xattrs[i].name);
  return rc;
}

#undef NAME

void fs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
  struct fs *fs = fs_data(req);
  struct xbuf b = {0};
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc && ino == BS_TREE_ROOT)
    rc = list_root(fs, &b);
  if (!rc) {
    struct bs_entry tmp;
    const struct bs_entry *e = view_entry(fs, &r, &tmp);
    lock_rd(r.e);
    rc = list_file(fs, &r, e, &b);
    unlock_e(r.e);
  }
  if (rc)
    fuse_reply_err(req, rc);
  else
    reply_xattr(req, &b, size);
  bs_free(b.data);
}

/* A name computed from the model, not stored: setting it is accepted (rsync
 * -X copies it) and removing it is a no-op. */
static bool computed(fuse_ino_t ino, const struct fs_ref *r, const char *name)
{
  if (!r->is_dir && strcmp(name, XA_KEY) == 0)
    return true;
  return ino == BS_TREE_ROOT && has_prefix(name, XA_PREFIX) && !has_prefix(name, XA_META);
}

static int set_file(struct fs *fs, struct bs_entry *e, const struct fs_ref *r, const char *name,
                    const char *value, size_t len, int flags)
{
  bs_err err;
  bs_err_clear(&err);
  int rc = 0;
  bool model = !r->is_dir && (strcmp(name, XA_DTYPE) == 0 || strcmp(name, XA_SHAPE) == 0 ||
                              strcmp(name, XA_PARAM_ID) == 0);
  /* A clean strided tensor is read through its origin's view, which a new
   * dtype or shape would not fit: its bytes are staged first. */
  if (model && strcmp(name, XA_PARAM_ID) != 0 && bs_entry_strided_clean(&fs->edit, e)) {
    rc = -fs_stage(fs, e, e->size);
    if (rc)
      return rc;
  }
  if (strcmp(name, XA_DTYPE) == 0 && !r->is_dir)
    rc = bs_entry_set_dtype(&fs->edit, e, value, len, &err);
  else if (strcmp(name, XA_SHAPE) == 0 && !r->is_dir)
    rc = bs_entry_set_shape(&fs->edit, e, value, len, &err);
  else if (strcmp(name, XA_PARAM_ID) == 0 && !r->is_dir)
    rc = bs_entry_set_param_id(&fs->edit, e, value, len, &err);
  else
    rc = bs_entry_set_xattr(&fs->edit, e, name, value, len, flags, &err);
  if (rc)
    return err.code;
  if (model)
    fs_mark_dirty(fs);
  return 0;
}

void fs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                    size_t size, int flags)
{
  struct fs *fs = fs_data(req);
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc && !fs->writable)
    rc = EROFS;
  else if (!rc && !has_prefix(name, "user."))
    rc = ENOTSUP;
  else if (!rc && size > BS_MAX_XATTR_VALUE)
    rc = E2BIG;
  else if (!rc && !r.e)
    rc = EROFS;
  if (rc || computed(ino, &r, name)) {
    fuse_reply_err(req, rc);
    return;
  }
  bs_err err;
  bs_err_clear(&err);
  /* GGUF output: a typed key's new text must parse as its type (this
   * reads only the source catalog, so it runs before the lock). */
  if (ino == BS_TREE_ROOT && has_prefix(name, XA_META) && fs->writer &&
      fs->writer->format == BS_FMT_GGUF &&
      bs_gguf_check_meta(&fs->cat, name + strlen(XA_META), value, size, &err) != 0) {
    fuse_log(FUSE_LOG_ERR, "burnstore: setxattr %s: %s\n", name, err.msg);
    fuse_reply_err(req, err.code);
    return;
  }
  lock_wr(r.e);
  if (ino == BS_TREE_ROOT && has_prefix(name, XA_META)) {
    rc = bs_edit_set_meta(&fs->edit, name + strlen(XA_META), value, size, &err) ? err.code : 0;
    if (!rc)
      fs_mark_dirty(fs);
  } else {
    rc = set_file(fs, r.e, &r, name, value, size, flags);
  }
  unlock_e(r.e);
  if (rc == ENOSPC)
    fuse_log(FUSE_LOG_ERR, "burnstore: setxattr %s: %s\n", name, err.msg[0] ? err.msg : "no space");
  fuse_reply_err(req, rc);
}

void fs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
  struct fs *fs = fs_data(req);
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc && !fs->writable)
    rc = EROFS;
  else if (!rc && !r.e)
    rc = EROFS;
  if (rc || computed(ino, &r, name)) {
    fuse_reply_err(req, rc);
    return;
  }
  bs_err err;
  bs_err_clear(&err);
  struct bs_entry *e = r.e;
  lock_wr(e);
  if (ino == BS_TREE_ROOT && has_prefix(name, XA_META)) {
    rc = bs_edit_remove_meta(&fs->edit, name + strlen(XA_META), &err) ? err.code : 0;
    if (!rc)
      fs_mark_dirty(fs);
  } else if (!r.is_dir && strcmp(name, XA_DTYPE) == 0) {
    if (e->has_dtype)
      fs_mark_dirty(fs);
    bs_entry_clear_dtype(&fs->edit, e);
  } else if (!r.is_dir && strcmp(name, XA_SHAPE) == 0) {
    if (e->has_shape)
      fs_mark_dirty(fs);
    bs_entry_clear_shape(&fs->edit, e);
  } else if (!r.is_dir && strcmp(name, XA_PARAM_ID) == 0) {
    if (e->has_param_id)
      fs_mark_dirty(fs);
    bs_entry_clear_param_id(&fs->edit, e);
  } else {
    rc = bs_entry_remove_xattr(&fs->edit, e, name, &err) ? err.code : 0;
  }
  unlock_e(e);
  fuse_reply_err(req, rc);
}
