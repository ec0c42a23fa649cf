/* The xattr ops: the names and their rules are the core's table
 * (core/xattr.h); these ops find the node, take its lock and translate.
 * Locks as described at the top of fs_ops.c: the tree lock only to find
 * the node (or, for user.burnstore.key, its key), then the node's own
 * entry lock (the root's also guards the metadata). Read-only mounts have
 * no entries and take no entry lock. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/npy.h"
#include "fs.h"
#include "fs_views.h"

static void lock_rd(struct bs_entry *e);
static void unlock_e(struct bs_entry *e);

/* A staged NAME.npy that numpy wrote (its bytes start with NumPy's magic)
 * is written back as tensor NAME (core/edit.c, add_npy). */
static bool staged_npy(struct fs *fs, const struct fs_ref *r, const char *key)
{
  if (!r->e || !bs_npy_name(key, strlen(key)))
    return false;
  bool npy = false;
  lock_rd(r->e);
  if (r->e->stage && r->e->size >= 10) {
    int fd = fs_stage_open(fs, r->e, O_RDONLY);
    uint8_t head[10];
    npy = fd >= 0 && pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head &&
          bs_npy_is_npy(head, sizeof head);
    if (fd >= 0)
      close(fd);
  }
  unlock_e(r->e);
  return npy;
}

/* The key of a file of a writable mount: its path's, less the .npy of a
 * staged NAME.npy (called without the entry lock). */
static char *key_of(void *arg, uint64_t ino)
{
  struct fs *fs = arg;
  pthread_rwlock_rdlock(&fs->lock);
  char *key = bs_tree_key(&fs->tree, ino, fs->flat);
  pthread_rwlock_unlock(&fs->lock);
  struct fs_ref r;
  if (key && fs_ref_get(fs, ino, &r) == 0 && staged_npy(fs, &r, key))
    key[strlen(key) - 4] = '\0';
  return key;
}

static int stage(void *arg, struct bs_entry *e)
{
  return -fs_stage(arg, e, e->size);
}

int fs_xattr_init(struct fs *fs, bs_err *err)
{
  if (bs_xa_mount_init(&fs->xa, &fs->cat, &fs->edit, fs->writer, err) != 0)
    return -1;
  fs->xa.key_of = key_of;
  fs->xa.stage = stage;
  fs->xa.arg = fs;
  fs->xa.omitted = fs->view_omitted;
  return 0;
}

void fs_xattr_destroy(struct fs *fs)
{
  bs_xa_mount_destroy(&fs->xa);
}

static void node_of(fuse_ino_t ino, const struct fs_ref *r, struct bs_xa_node *n)
{
  n->ino = ino;
  n->is_root = ino == BS_TREE_ROOT;
  n->is_dir = r->is_dir;
  n->tensor = r->tensor;
  n->e = r->e;
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

static void reply_xattr(fuse_req_t req, const struct bs_buf *b, size_t size)
{
  if (size == 0)
    fuse_reply_xattr(req, b->len);
  else if (b->len > size)
    fuse_reply_err(req, ERANGE);
  else
    fuse_reply_buf(req, b->data ? (const char *)b->data : "", b->len);
}

/* Namespaces no file of a mount ever has (only user.* can be set): asked
 * for, they answer EOPNOTSUPP, not ENODATA. ls -l asks for security.selinux
 * and the POSIX ACLs of every entry, and coreutils remembers EOPNOTSUPP
 * per device, so a listing asks once instead of ~2.5 times per entry; the
 * kernel's per-write check for security.capability gets it too (any error
 * means "no capability to drop"). */
static bool foreign_namespace(const char *name)
{
  return strncmp(name, "security.", 9) == 0 || strncmp(name, "system.", 7) == 0 ||
         strncmp(name, "trusted.", 8) == 0;
}

void fs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
  struct fs *fs = fs_data(req);
  if (foreign_namespace(name)) {
    fuse_reply_err(req, EOPNOTSUPP); /* no lock, no lookup: once per write(2) */
    return;
  }
  if (fs_view_is(fs, ino)) { /* -o view=: a file, of no tensor */
    fuse_reply_err(req, ENODATA);
    return;
  }
  struct bs_buf b = {0};
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc) {
    struct bs_xa_node n;
    node_of(ino, &r, &n);
    bs_err err;
    bs_err_clear(&err);
    struct bs_entry *e = bs_xa_unlocked(name) ? NULL : r.e;
    lock_rd(e);
    rc = bs_xa_get(&fs->xa, &n, name, &b, &err) ? err.code : 0;
    unlock_e(e);
  }
  if (rc)
    fuse_reply_err(req, rc);
  else
    reply_xattr(req, &b, size);
  bs_buf_destroy(&b);
}

void fs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
  struct fs *fs = fs_data(req);
  struct bs_buf b = {0};
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc && !fs_view_is(fs, ino)) { /* (-o view='s file lists none) */
    struct bs_xa_node n;
    node_of(ino, &r, &n);
    bs_err err;
    bs_err_clear(&err);
    lock_rd(r.e);
    rc = bs_xa_list(&fs->xa, &n, &b, &err) ? err.code : 0;
    unlock_e(r.e);
  }
  if (rc)
    fuse_reply_err(req, rc);
  else
    reply_xattr(req, &b, size);
  bs_buf_destroy(&b);
}

/* A refused setxattr's reason, for the user who only got the errno: the
 * mount's log (fs_log.c), syslog, stderr in the foreground. */
static void log_refusal(struct fs *fs, const char *op, fuse_ino_t ino, const char *name, int rc,
                        const bs_err *err)
{
  pthread_rwlock_rdlock(&fs->lock);
  char *key = ino == BS_TREE_ROOT ? NULL : bs_tree_key(&fs->tree, ino, fs->flat);
  pthread_rwlock_unlock(&fs->lock);
  fuse_log(FUSE_LOG_ERR, "burnstore: %s %s on %s refused (%s): %s\n", op, name,
           ino == BS_TREE_ROOT ? "the mount's root"
           : key               ? key
                               : "a file",
           strerror(rc), err->msg[0] ? err->msg : strerror(rc));
  bs_free(key);
}

void fs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                    size_t size, int flags)
{
  struct fs *fs = fs_data(req);
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  struct bs_xa_node n;
  node_of(ino, &r, &n);
  bs_err err;
  bs_err_clear(&err);
  bool dirty = false;
  lock_wr(r.e);
  rc = bs_xa_set(&fs->xa, &n, name, value, size, flags, &dirty, &err) ? err.code : 0;
  unlock_e(r.e);
  if (dirty)
    fs_mark_dirty(fs);
  if (rc)
    log_refusal(fs, "setxattr", ino, name, rc, &err);
  fuse_reply_err(req, rc);
}

void fs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
  struct fs *fs = fs_data(req);
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  struct bs_xa_node n;
  node_of(ino, &r, &n);
  bs_err err;
  bs_err_clear(&err);
  bool dirty = false;
  lock_wr(r.e);
  rc = bs_xa_remove(&fs->xa, &n, name, &dirty, &err) ? err.code : 0;
  unlock_e(r.e);
  if (dirty)
    fs_mark_dirty(fs);
  if (rc && rc != ENODATA)
    log_refusal(fs, "removexattr", ino, name, rc, &err);
  fuse_reply_err(req, rc);
}
