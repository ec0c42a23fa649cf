/* The low-level FUSE operations. Each op_x decodes its arguments, calls the
 * core (tree, catalog) or the write-back helpers, and replies exactly once;
 * the do_x helpers return an errno.
 *
 * Locking: fs->lock is the only lock. Read-only mounts never change the tree,
 * so readers share it; writable mounts take it exclusively in every op that
 * changes the tree, a file's metadata or the root metadata. Data reads and
 * writes of staging files use pread/pwrite on an fd taken under the lock. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

#include "burnstore/alloc.h"
#include "burnstore/checked.h"
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

static void rdlock(struct fs *fs)
{
  pthread_rwlock_rdlock(&fs->lock);
}
static void wrlock(struct fs *fs)
{
  pthread_rwlock_wrlock(&fs->lock);
}
static void unlock(struct fs *fs)
{
  pthread_rwlock_unlock(&fs->lock);
}

/* A node by ino, also one that was unlinked but is still open. */
static struct bs_node *node_any(struct fs *fs, fuse_ino_t ino)
{
  if (ino == 0 || ino >= fs->tree.n)
    return NULL;
  struct bs_node *nd = &fs->tree.nodes[ino];
  return nd->name ? nd : NULL;
}

static const struct bs_tensor *node_tensor(struct fs *fs, const struct bs_node *nd)
{
  long i = nd->user ? ((struct fs_file *)nd->user)->tensor : nd->tensor;
  return i >= 0 && (size_t)i < fs->cat.count ? &fs->cat.tensors[i] : NULL;
}

static uint64_t node_size(struct fs *fs, const struct bs_node *nd)
{
  if (nd->user)
    return ((struct fs_file *)nd->user)->size;
  const struct bs_tensor *t = node_tensor(fs, nd);
  return t ? t->nbytes : 0;
}

static void fill_attr(struct fs *fs, fuse_ino_t ino, const struct bs_node *nd, struct stat *st)
{
  memset(st, 0, sizeof *st);
  st->st_ino = ino;
  st->st_uid = fs->uid;
  st->st_gid = fs->gid;
  st->st_atim = st->st_mtim = st->st_ctim = fs->mtime;
  const struct fs_file *f = nd->user;
  if (nd->is_dir) {
    st->st_mode = S_IFDIR | (f ? f->mode : (fs->writable ? 0755 : 0555));
    st->st_nlink = 2;
  } else {
    st->st_mode = S_IFREG | (f ? f->mode : (fs->writable ? 0644 : 0444));
    st->st_nlink = nd->live ? 1 : 0;
    uint64_t size = node_size(fs, nd);
    st->st_size = (off_t)size;
    st->st_blocks = (blkcnt_t)((size + 511) / 512);
  }
  st->st_blksize = 1 << 20;
  if (f && (f->mtime.tv_sec || f->mtime.tv_nsec))
    st->st_mtim = st->st_ctim = f->mtime;
}

static void fill_entry(struct fs *fs, fuse_ino_t ino, struct fuse_entry_param *e)
{
  memset(e, 0, sizeof *e);
  e->ino = ino;
  e->attr_timeout = e->entry_timeout = fs->timeout;
  fill_attr(fs, ino, &fs->tree.nodes[ino], &e->attr);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
  (void)userdata;
  if (conn->capable & FUSE_CAP_SPLICE_WRITE)
    conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE)
    conn->want |= FUSE_CAP_SPLICE_MOVE;
  conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
  if (conn->max_write < (1u << 20))
    conn->max_write = 1u << 20;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
  struct fs *fs = fs_data(req);
  rdlock(fs);
  struct bs_node *p = bs_tree_node(&fs->tree, parent);
  uint64_t ino = p && p->is_dir ? bs_tree_lookup(&fs->tree, parent, name) : 0;
  if (!p || !p->is_dir) {
    unlock(fs);
    fuse_reply_err(req, p ? ENOTDIR : ENOENT);
    return;
  }
  if (!ino) {
    unlock(fs);
    /* A negative entry may be cached only while nothing can create it. */
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.entry_timeout = fs->writable ? 0 : fs->timeout;
    fuse_reply_entry(req, &e);
    return;
  }
  struct fuse_entry_param e;
  fill_entry(fs, ino, &e);
  unlock(fs);
  fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  struct stat st;
  rdlock(fs);
  struct bs_node *nd = node_any(fs, ino);
  if (nd)
    fill_attr(fs, ino, nd, &st);
  unlock(fs);
  if (!nd)
    fuse_reply_err(req, ENOENT);
  else
    fuse_reply_attr(req, &st, fs->timeout);
}

static int do_setattr(struct fs *fs, fuse_ino_t ino, struct stat *attr, int to_set,
                      struct stat *out)
{
  struct bs_node *nd = node_any(fs, ino);
  if (!nd)
    return ENOENT;
  struct fs_file *f = nd->user;
  if (!f)
    return EROFS;
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (nd->is_dir)
      return EISDIR;
    if (attr->st_size < 0)
      return EINVAL;
    uint64_t want = (uint64_t)attr->st_size;
    if (f->fd < 0) {
      int rc = fs_stage(fs, f, want < f->size ? want : f->size);
      if (rc)
        return -rc;
    }
    if (ftruncate(f->fd, attr->st_size) != 0)
      return errno;
    f->size = want;
    fs->dirty = true;
  }
  if (to_set & FUSE_SET_ATTR_MODE)
    f->mode = attr->st_mode & 07777;
  if (to_set & FUSE_SET_ATTR_MTIME)
    f->mtime = attr->st_mtim;
  if (to_set & FUSE_SET_ATTR_MTIME_NOW)
    clock_gettime(CLOCK_REALTIME, &f->mtime);
  /* uid/gid and atime: accepted, not kept (the file has one owner). */
  fill_attr(fs, ino, nd, out);
  return 0;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  struct stat st;
  wrlock(fs);
  int rc = fs->writable ? do_setattr(fs, ino, attr, to_set, &st) : EROFS;
  unlock(fs);
  if (rc)
    fuse_reply_err(req, rc);
  else
    fuse_reply_attr(req, &st, fs->timeout);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  struct fs *fs = fs_data(req);
  rdlock(fs);
  struct bs_node *nd = bs_tree_node(&fs->tree, ino);
  int rc = !nd ? ENOENT : !nd->is_dir ? ENOTDIR : 0;
  unlock(fs);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fi->cache_readdir = !fs->writable;
  fi->keep_cache = !fs->writable;
  fuse_reply_open(req, fi);
}

/* Directory offsets: 1 is ".", 2 is "..", 3 + i is kids[i]. Removed kids
 * keep their slot, so offsets stay valid while `rm -r` deletes entries. */
static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  if (size > (1u << 20))
    size = 1u << 20;
  char *buf = bs_malloc(size);
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  size_t used = 0;
  rdlock(fs);
  struct bs_node *nd = bs_tree_node(&fs->tree, ino);
  if (!nd || !nd->is_dir) {
    unlock(fs);
    bs_free(buf);
    fuse_reply_err(req, nd ? ENOTDIR : ENOENT);
    return;
  }
  for (uint64_t pos = off < 0 ? 0 : (uint64_t)off;; pos++) {
    struct stat st;
    memset(&st, 0, sizeof st);
    const char *name;
    if (pos == 0) {
      name = ".";
      st.st_ino = ino;
      st.st_mode = S_IFDIR;
    } else if (pos == 1) {
      name = "..";
      st.st_ino = nd->parent;
      st.st_mode = S_IFDIR;
    } else {
      uint64_t k = pos - 2;
      if (k >= nd->nkids)
        break;
      uint64_t kid = nd->kids[k];
      if (!kid)
        continue;
      const struct bs_node *kn = &fs->tree.nodes[kid];
      name = kn->name;
      st.st_ino = kid;
      st.st_mode = kn->is_dir ? S_IFDIR : S_IFREG;
    }
    size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)(pos + 1));
    if (need > size - used)
      break;
    used += need;
  }
  unlock(fs);
  fuse_reply_buf(req, buf, used);
  bs_free(buf);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  struct fs *fs = fs_data(req);
  int acc = fi->flags & O_ACCMODE;
  bool wants_write = acc != O_RDONLY || (fi->flags & O_TRUNC);
  if (wants_write && !fs->writable) {
    fuse_reply_err(req, EROFS);
    return;
  }
  int rc = 0;
  if (wants_write)
    wrlock(fs);
  else
    rdlock(fs);
  struct bs_node *nd = bs_tree_node(&fs->tree, ino);
  if (!nd)
    rc = ENOENT;
  else if (nd->is_dir)
    rc = EISDIR;
  else if (!nd->user) {
    const struct bs_tensor *t = node_tensor(fs, nd);
    if (t && t->unsupported) {
      fuse_log(FUSE_LOG_ERR, "burnstore: %s: cannot read: %s\n", t->key, t->unsupported);
      rc = ENOTSUP;
    }
  } else if (wants_write) {
    struct fs_file *f = nd->user;
    if (f->fd < 0)
      rc = -fs_stage(fs, f, (fi->flags & O_TRUNC) ? 0 : f->size);
    if (!rc && (fi->flags & O_TRUNC) && f->size) {
      if (ftruncate(f->fd, 0) != 0)
        rc = errno;
      else
        f->size = 0;
    }
    if (!rc)
      fs->dirty = true;
  }
  unlock(fs);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fi->keep_cache = !fs->writable; /* the files of a read-only mount never change */
  fuse_reply_open(req, fi);
}

/* Bytes of a source that changed since the mount are never served: EIO,
 * and one log line per source (syslog, and stderr in the foreground). */
static bool source_changed(struct fs *fs, const struct bs_tensor *t)
{
  if (t->src >= fs->cat.nsrcs)
    return false;
  struct bs_src *s = &fs->cat.srcs[t->src];
  char why[128];
  if (!bs_src_changed(s, why, sizeof why))
    return false;
  if (!__atomic_exchange_n(&s->change_logged, true, __ATOMIC_RELAXED)) {
    syslog(LOG_USER | LOG_ERR, "%s changed since it was mounted (%s): reads fail with EIO", s->name,
           why);
    fuse_log(FUSE_LOG_ERR, "burnstore: %s changed since it was mounted (%s): reads fail with EIO\n",
             s->name, why);
  }
  return true;
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  if (off < 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  rdlock(fs);
  struct bs_node *nd = node_any(fs, ino);
  if (!nd || nd->is_dir) {
    unlock(fs);
    fuse_reply_err(req, nd ? EISDIR : ENOENT);
    return;
  }
  const struct fs_file *f = nd->user;
  int fd = -1;
  uint64_t base = 0, len = node_size(fs, nd);
  const struct bs_tensor *t = NULL;
  if (f && f->fd >= 0) {
    fd = f->fd;
  } else {
    t = node_tensor(fs, nd);
    if (t && !bs_tensor_fd_range(&fs->cat, t, &fd, &base))
      fd = -1;
  }
  unlock(fs);
  if ((uint64_t)off >= len) {
    fuse_reply_buf(req, NULL, 0);
    return;
  }
  if (size > len - (uint64_t)off)
    size = (size_t)(len - (uint64_t)off);
  if (t && source_changed(fs, t)) {
    fuse_reply_err(req, EIO);
    return;
  }
  if (fd >= 0) {
    /* Straight from the backing file: the kernel can splice it. */
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
    bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY;
    bv.buf[0].fd = fd;
    bv.buf[0].pos = (off_t)(base + (uint64_t)off);
    fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
    return;
  }
  if (!t) {
    fuse_reply_err(req, EIO);
    return;
  }
  char *buf = bs_malloc(size);
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  long r = bs_tensor_read(&fs->cat, t, (uint64_t)off, buf, size);
  if (r == -EIO)
    source_changed(fs, t); /* logs a change during the read */
  if (r < 0)
    fuse_reply_err(req, (int)-r);
  else
    fuse_reply_buf(req, buf, (size_t)r);
  bs_free(buf);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
  struct fs *fs = fs_data(req);
  if (!fs->writable) {
    fuse_reply_err(req, EROFS);
    return;
  }
  if (off < 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  wrlock(fs);
  struct bs_node *nd = node_any(fs, ino);
  struct fs_file *f = nd ? nd->user : NULL;
  int rc = 0;
  if (!f || nd->is_dir)
    rc = nd ? EISDIR : ENOENT;
  else if (f->fd < 0)
    rc = -fs_stage(fs, f, f->size);
  uint64_t pos = (fi->flags & O_APPEND) && f ? f->size : (uint64_t)off;
  ssize_t w = 0;
  if (!rc) {
    w = pwrite(f->fd, buf, size, (off_t)pos);
    if (w < 0)
      rc = errno;
    else if (pos + (uint64_t)w > f->size)
      f->size = pos + (uint64_t)w;
    fs->dirty = true;
    clock_gettime(CLOCK_REALTIME, &f->mtime);
  }
  unlock(fs);
  if (rc)
    fuse_reply_err(req, rc);
  else
    fuse_reply_write(req, (size_t)w);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  (void)ino;
  (void)fi;
  fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  rdlock(fs);
  struct bs_node *nd = node_any(fs, ino);
  int fd = nd && nd->user ? ((struct fs_file *)nd->user)->fd : -1;
  int rc = 0;
  if (fd >= 0 && (datasync ? fdatasync(fd) : fsync(fd)) != 0)
    rc = errno;
  unlock(fs);
  fuse_reply_err(req, rc);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  (void)ino;
  (void)fi;
  fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
  (void)ino;
  struct fs *fs = fs_data(req);
  struct statvfs sv;
  memset(&sv, 0, sizeof sv);
  if (fs->writable && fs->output) {
    /* Report the space where staged data and the output go. */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", fs->output);
    char *slash = strrchr(dir, '/');
    if (slash)
      *(slash == dir ? slash + 1 : slash) = '\0';
    if (statvfs(dir, &sv) != 0)
      memset(&sv, 0, sizeof sv);
  } else {
    uint64_t total = 0;
    for (size_t i = 0; i < fs->cat.count; i++)
      total += fs->cat.tensors[i].nbytes / 4096 + 1;
    sv.f_bsize = sv.f_frsize = 4096;
    sv.f_blocks = total;
    sv.f_files = fs->tree.n;
  }
  sv.f_namemax = 255;
  fuse_reply_statfs(req, &sv);
}

/* --- creating, removing, renaming (writable mounts) --------------------- */

/* A name users may create: it must unescape (so the key is known). Hidden
 * names are let through: rsync, editors and mkstemp make temporary files
 * like ".%%.Xa81Q" that are renamed (and checked) before they matter; one
 * still there at unmount fails the write-back, naming it. */
static int check_name(const char *name)
{
  if (strlen(name) > 255)
    return ENAMETOOLONG;
  if (strcmp(name, BS_SELF_NAME) == 0 || name[0] == '.')
    return 0;
  char *seg = bs_unescape_component(name);
  if (!seg)
    return errno == ENOMEM ? ENOMEM : EINVAL;
  bs_free(seg);
  return 0;
}

static int do_mknode(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode, bool dir,
                     uint64_t *ino)
{
  if (!fs->writable)
    return EROFS;
  int rc = check_name(name);
  if (rc)
    return rc;
  if (fs->flat && dir)
    return EPERM; /* a flat mount has no directories */
  struct fs_file *f = fs_file_new(-1, 0, mode & 07777);
  if (!f)
    return ENOMEM;
  bs_err err;
  bs_err_clear(&err);
  if (bs_tree_add(&fs->tree, parent, name, dir, -1, ino, &err) != 0) {
    fs_file_free(f);
    return err.code;
  }
  fs->tree.nodes[*ino].user = f;
  fs->dirty = true;
  return 0;
}

/* mkdir and mknod: a new node, replied as an entry. */
static void reply_mknode(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, bool dir)
{
  struct fs *fs = fs_data(req);
  uint64_t ino = 0;
  wrlock(fs);
  int rc = do_mknode(fs, parent, name, mode, dir, &ino);
  struct fuse_entry_param e;
  if (!rc)
    fill_entry(fs, ino, &e);
  unlock(fs);
  if (rc)
    fuse_reply_err(req, rc);
  else
    fuse_reply_entry(req, &e);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
  reply_mknode(req, parent, name, mode, true);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
  (void)rdev;
  if (!S_ISREG(mode))
    fuse_reply_err(req, fs_data(req)->writable ? EPERM : EROFS);
  else
    reply_mknode(req, parent, name, mode, false);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
  struct fs *fs = fs_data(req);
  uint64_t ino = 0;
  wrlock(fs);
  int rc = do_mknode(fs, parent, name, mode, false, &ino);
  struct fuse_entry_param e;
  if (!rc) {
    rc = -fs_stage(fs, fs->tree.nodes[ino].user, 0);
    if (rc) {
      bs_err err;
      bs_err_clear(&err);
      fs_file_free(fs->tree.nodes[ino].user);
      fs->tree.nodes[ino].user = NULL;
      if (bs_tree_remove(&fs->tree, ino, &err) != 0)
        fuse_log(FUSE_LOG_ERR, "burnstore: %s\n", err.msg);
    }
  }
  if (!rc)
    fill_entry(fs, ino, &e);
  unlock(fs);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fi->keep_cache = 0;
  fuse_reply_create(req, &e, fi);
}

static int do_remove(struct fs *fs, fuse_ino_t parent, const char *name, bool dir)
{
  if (!fs->writable)
    return EROFS;
  uint64_t ino = bs_tree_lookup(&fs->tree, parent, name);
  if (!ino)
    return ENOENT;
  struct bs_node *nd = &fs->tree.nodes[ino];
  if (dir && !nd->is_dir)
    return ENOTDIR;
  if (!dir && nd->is_dir)
    return EISDIR;
  bs_err err;
  bs_err_clear(&err);
  if (bs_tree_remove(&fs->tree, ino, &err) != 0)
    return err.code;
  /* The node's data stays until unmount: an open fd may still read it. */
  fs->dirty = true;
  return 0;
}

static void reply_remove(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir)
{
  struct fs *fs = fs_data(req);
  wrlock(fs);
  int rc = do_remove(fs, parent, name, dir);
  unlock(fs);
  fuse_reply_err(req, rc);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
  reply_remove(req, parent, name, false);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
  reply_remove(req, parent, name, true);
}

static int do_rename(struct fs *fs, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                     const char *newname, unsigned int flags)
{
  if (!fs->writable)
    return EROFS;
  if (flags & ~(unsigned)RENAME_NOREPLACE)
    return EINVAL; /* RENAME_EXCHANGE / WHITEOUT: not supported */
  /* A name kept as it is (a move to another directory) stays valid: a
   * shortened name keeps its node's key segment (bs_tree_move). */
  int rc = strcmp(name, newname) == 0 ? 0 : check_name(newname);
  if (rc)
    return rc;
  uint64_t ino = bs_tree_lookup(&fs->tree, parent, name);
  if (!ino)
    return ENOENT;
  struct bs_node *np = bs_tree_node(&fs->tree, newparent);
  if (!np)
    return ENOENT;
  if (!np->is_dir)
    return ENOTDIR;
  bs_err err;
  bs_err_clear(&err);
  uint64_t target = bs_tree_lookup(&fs->tree, newparent, newname);
  if (target == ino)
    return 0;
  if (target) {
    if (flags & RENAME_NOREPLACE)
      return EEXIST;
    struct bs_node *tn = &fs->tree.nodes[target];
    bool src_dir = fs->tree.nodes[ino].is_dir;
    if (tn->is_dir && !src_dir)
      return EISDIR;
    if (!tn->is_dir && src_dir)
      return ENOTDIR;
    if (bs_tree_remove(&fs->tree, target, &err) != 0)
      return err.code;
  }
  if (bs_tree_move(&fs->tree, ino, newparent, newname, &err) != 0)
    return err.code;
  fs->dirty = true;
  return 0;
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
  struct fs *fs = fs_data(req);
  wrlock(fs);
  int rc = do_rename(fs, parent, name, newparent, newname, flags);
  unlock(fs);
  fuse_reply_err(req, rc);
}

/* --- xattrs -------------------------------------------------------------- */

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

static int xaddf(struct xbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int xaddf(struct xbuf *b, const char *fmt, ...)
{
  char tmp[64];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  return n < 0 ? -1 : xadd(b, tmp, (size_t)n);
}

static int shape_json(struct xbuf *b, uint32_t rank, const uint64_t *shape)
{
  if (xadd(b, "[", 1))
    return -1;
  for (uint32_t i = 0; i < rank; i++)
    if (xaddf(b, i ? ",%llu" : "%llu", (unsigned long long)shape[i]))
      return -1;
  return xadd(b, "]", 1);
}

/* The effective dtype and shape of a file: set by xattr, else the source
 * tensor's, else U8 / 1-D by size (interface.md §5). */
static void file_dtype_shape(struct fs *fs, const struct bs_node *nd, enum bs_dtype *dt,
                             uint32_t *rank, const uint64_t **shape, uint64_t *dim0)
{
  const struct fs_file *f = nd->user;
  const struct bs_tensor *t = node_tensor(fs, nd);
  *dt = f && f->has_dtype ? f->dtype : t ? t->dtype : BS_DT_U8;
  if (f && f->has_shape) {
    *rank = f->rank;
    *shape = f->shape;
  } else if (t && (!f || !f->has_dtype || f->dtype == t->dtype)) {
    *rank = t->rank;
    *shape = t->shape;
  } else {
    unsigned bits = bs_dtype_bits(*dt);
    *dim0 = bits >= 8 ? node_size(fs, nd) / (bits / 8) : node_size(fs, nd);
    *rank = 1;
    *shape = dim0;
  }
}

/* Value of xattr `name` on node nd into b. Returns 0 or an errno. */
static int get_xattr(struct fs *fs, fuse_ino_t ino, const struct bs_node *nd, const char *name,
                     struct xbuf *b)
{
  if (ino == BS_TREE_ROOT) {
    if (strcmp(name, XA_FORMAT) == 0)
      return xaddf(b, "%s",
                   fs->cat.format == BS_FMT_NONE ? "burnpack" : bs_format_name(fs->cat.format))
                 ? ENOMEM
                 : 0;
    if (strcmp(name, XA_VALUES) == 0 && fs->cat.values_json)
      return xadd(b, fs->cat.values_json, strlen(fs->cat.values_json)) ? ENOMEM : 0;
    if (strcmp(name, XA_NOTES) == 0 && fs->cat.notes)
      return xadd(b, fs->cat.notes, strlen(fs->cat.notes)) ? ENOMEM : 0;
    if (strncmp(name, XA_META, strlen(XA_META)) == 0) {
      for (size_t i = 0; i < fs->nmeta; i++)
        if (strcmp(fs->meta[i].key, name + strlen(XA_META)) == 0)
          return xadd(b, fs->meta[i].value, strlen(fs->meta[i].value)) ? ENOMEM : 0;
    }
  }
  const struct fs_file *f = nd->user;
  if (f) {
    for (size_t i = 0; i < f->nxattrs; i++)
      if (strcmp(f->xattrs[i].name, name) == 0)
        return xadd(b, f->xattrs[i].value, f->xattrs[i].len) ? ENOMEM : 0;
  }
  if (nd->is_dir)
    return ENODATA;
  const struct bs_tensor *t = node_tensor(fs, nd);
  if (strcmp(name, XA_DTYPE) == 0 || strcmp(name, XA_SHAPE) == 0) {
    enum bs_dtype dt;
    uint32_t rank;
    const uint64_t *shape;
    uint64_t dim0;
    file_dtype_shape(fs, nd, &dt, &rank, &shape, &dim0);
    if (name[strlen(XA_PREFIX)] == 'd')
      return xaddf(b, "%s", bs_dtype_name(dt)) ? ENOMEM : 0;
    return shape_json(b, rank, shape) ? ENOMEM : 0;
  }
  if (strcmp(name, XA_KEY) == 0) {
    if (t && !f)
      return xadd(b, t->key, strlen(t->key)) ? ENOMEM : 0;
    char *key = bs_tree_key(&fs->tree, ino, fs->flat);
    if (!key)
      return ENODATA;
    int rc = xadd(b, key, strlen(key)) ? ENOMEM : 0;
    bs_free(key);
    return rc;
  }
  if (strcmp(name, XA_PARAM_ID) == 0) {
    if (f && f->has_param_id)
      return xaddf(b, "%llu", (unsigned long long)f->param_id) ? ENOMEM : 0;
    if (t && t->has_param_id)
      return xaddf(b, "%llu", (unsigned long long)t->param_id) ? ENOMEM : 0;
  }
  return ENODATA;
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

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
  struct fs *fs = fs_data(req);
  struct xbuf b = {0};
  rdlock(fs);
  struct bs_node *nd = node_any(fs, ino);
  int rc = nd ? get_xattr(fs, ino, nd, name, &b) : ENOENT;
  unlock(fs);
  if (rc)
    fuse_reply_err(req, rc);
  else
    reply_xattr(req, &b, size);
  bs_free(b.data);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
  struct fs *fs = fs_data(req);
  struct xbuf b = {0};
  int rc = 0;
  rdlock(fs);
  struct bs_node *nd = node_any(fs, ino);
  if (!nd) {
    rc = ENOENT;
  } else {
#define NAME(s) (xadd(&b, s, strlen(s) + 1) ? ENOMEM : 0)
    if (ino == BS_TREE_ROOT) {
      rc = NAME(XA_FORMAT);
      if (!rc && fs->cat.values_json)
        rc = NAME(XA_VALUES);
      if (!rc && fs->cat.notes)
        rc = NAME(XA_NOTES);
      for (size_t i = 0; !rc && i < fs->nmeta; i++)
        if (xadd(&b, XA_META, strlen(XA_META)) || NAME(fs->meta[i].key))
          rc = ENOMEM;
    } else if (!nd->is_dir) {
      rc = NAME(XA_DTYPE);
      if (!rc)
        rc = NAME(XA_SHAPE);
      if (!rc)
        rc = NAME(XA_KEY);
      struct xbuf tmp = {0};
      if (!rc && get_xattr(fs, ino, nd, XA_PARAM_ID, &tmp) == 0)
        rc = NAME(XA_PARAM_ID);
      bs_free(tmp.data);
    }
    const struct fs_file *f = nd->user;
    for (size_t i = 0; !rc && f && i < f->nxattrs; i++)
      rc = NAME(f->xattrs[i].name);
#undef NAME
  }
  unlock(fs);
  if (rc)
    fuse_reply_err(req, rc);
  else
    reply_xattr(req, &b, size);
  bs_free(b.data);
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

static int parse_u64(const char *v, size_t len, uint64_t *out)
{
  while (len && (v[len - 1] == '\n' || v[len - 1] == '\0'))
    len--;
  if (len == 0 || len > 20)
    return -1;
  uint64_t x = 0;
  for (size_t i = 0; i < len; i++) {
    if (v[i] < '0' || v[i] > '9' || !bs_mul_u64(x, 10, &x) ||
        !bs_add_u64(x, (uint64_t)(v[i] - '0'), &x))
      return -1;
  }
  *out = x;
  return 0;
}

static int set_meta(struct fs *fs, const char *key, const char *value, size_t len)
{
  char *v = bs_strndup(value, len);
  if (!v)
    return ENOMEM;
  for (size_t i = 0; i < fs->nmeta; i++) {
    if (strcmp(fs->meta[i].key, key) == 0) {
      bs_free(fs->meta[i].value);
      fs->meta[i].value = v;
      return 0;
    }
  }
  char *k = bs_strdup(key);
  if (!k || bs_grow((void **)&fs->meta, &fs->metacap, fs->nmeta + 1, sizeof *fs->meta) != 0) {
    bs_free(k);
    bs_free(v);
    return ENOMEM;
  }
  fs->meta[fs->nmeta].key = k;
  fs->meta[fs->nmeta].value = v;
  fs->nmeta++;
  return 0;
}

static int set_other_xattr(struct fs_file *f, const char *name, const char *value, size_t len,
                           int flags)
{
  for (size_t i = 0; i < f->nxattrs; i++) {
    if (strcmp(f->xattrs[i].name, name) != 0)
      continue;
    if (flags & XATTR_CREATE)
      return EEXIST;
    char *v = bs_malloc(len + 1);
    if (!v)
      return ENOMEM;
    memcpy(v, value, len);
    bs_free(f->xattrs[i].value);
    f->xattrs[i].value = v;
    f->xattrs[i].len = len;
    return 0;
  }
  if (flags & XATTR_REPLACE)
    return ENODATA;
  char *n = bs_strdup(name), *v = bs_malloc(len + 1);
  size_t cap = f->nxattrs;
  if (!n || !v || bs_grow((void **)&f->xattrs, &cap, f->nxattrs + 1, sizeof *f->xattrs) != 0) {
    bs_free(n);
    bs_free(v);
    return ENOMEM;
  }
  memcpy(v, value, len);
  f->xattrs[f->nxattrs++] = (struct fs_xattr){n, v, len};
  return 0;
}

static int do_setxattr(struct fs *fs, fuse_ino_t ino, const char *name, const char *value,
                       size_t len, int flags)
{
  struct bs_node *nd = node_any(fs, ino);
  if (!nd)
    return ENOENT;
  if (!fs->writable)
    return EROFS;
  if (strncmp(name, "user.", 5) != 0)
    return ENOTSUP;
  if (len > BS_MAX_XATTR_VALUE)
    return E2BIG;
  if (ino == BS_TREE_ROOT && strncmp(name, XA_META, strlen(XA_META)) == 0) {
    fs->dirty = true;
    return set_meta(fs, name + strlen(XA_META), value, len);
  }
  struct fs_file *f = nd->user;
  if (!f)
    return EROFS;
  if (strncmp(name, XA_PREFIX, strlen(XA_PREFIX)) == 0 && !nd->is_dir) {
    if (strcmp(name, XA_DTYPE) == 0) {
      char tmp[32];
      while (len && (value[len - 1] == '\n' || value[len - 1] == '\0'))
        len--;
      enum bs_dtype dt;
      if (len == 0 || len >= sizeof tmp)
        return EINVAL;
      memcpy(tmp, value, len);
      tmp[len] = '\0';
      if (bs_dtype_from_name(tmp, &dt) != 0 || dt == BS_DT_QFLOAT)
        return EINVAL;
      f->dtype = dt;
      f->has_dtype = true;
      fs->dirty = true;
      return 0;
    }
    if (strcmp(name, XA_SHAPE) == 0) {
      uint64_t dims[BS_MAX_RANK];
      uint32_t rank;
      if (parse_shape(value, len, &rank, dims) != 0)
        return EINVAL;
      uint64_t *shape = NULL;
      if (rank) {
        shape = bs_malloc(rank * sizeof *shape);
        if (!shape)
          return ENOMEM;
        memcpy(shape, dims, rank * sizeof *shape);
      }
      bs_free(f->shape);
      f->shape = shape;
      f->rank = rank;
      f->has_shape = true;
      fs->dirty = true;
      return 0;
    }
    if (strcmp(name, XA_PARAM_ID) == 0) {
      uint64_t id;
      if (parse_u64(value, len, &id) != 0)
        return EINVAL;
      f->param_id = id;
      f->has_param_id = true;
      fs->dirty = true;
      return 0;
    }
    if (strcmp(name, XA_KEY) == 0)
      return 0; /* the key is the path; rsync -X copies it, so accept it */
  }
  if (ino == BS_TREE_ROOT && strncmp(name, XA_PREFIX, strlen(XA_PREFIX)) == 0)
    return 0; /* format, values, notes: computed, not settable (accepted for rsync -X) */
  return set_other_xattr(f, name, value, len, flags);
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                        size_t size, int flags)
{
  struct fs *fs = fs_data(req);
  wrlock(fs);
  int rc = do_setxattr(fs, ino, name, value, size, flags);
  unlock(fs);
  fuse_reply_err(req, rc);
}

static int do_removexattr(struct fs *fs, fuse_ino_t ino, const char *name)
{
  struct bs_node *nd = node_any(fs, ino);
  if (!nd)
    return ENOENT;
  if (!fs->writable)
    return EROFS;
  struct fs_file *f = nd->user;
  if (ino == BS_TREE_ROOT && strncmp(name, XA_META, strlen(XA_META)) == 0) {
    for (size_t i = 0; i < fs->nmeta; i++) {
      if (strcmp(fs->meta[i].key, name + strlen(XA_META)) == 0) {
        bs_free(fs->meta[i].key);
        bs_free(fs->meta[i].value);
        fs->meta[i] = fs->meta[--fs->nmeta];
        fs->dirty = true;
        return 0;
      }
    }
    return ENODATA;
  }
  if (!f)
    return EROFS;
  if (strcmp(name, XA_DTYPE) == 0 || strcmp(name, XA_SHAPE) == 0 ||
      strcmp(name, XA_PARAM_ID) == 0) {
    if (name[strlen(XA_PREFIX)] == 'd')
      f->has_dtype = false;
    else if (name[strlen(XA_PREFIX)] == 's')
      f->has_shape = false;
    else
      f->has_param_id = false;
    fs->dirty = true;
    return 0;
  }
  for (size_t i = 0; i < f->nxattrs; i++) {
    if (strcmp(f->xattrs[i].name, name) == 0) {
      bs_free(f->xattrs[i].name);
      bs_free(f->xattrs[i].value);
      f->xattrs[i] = f->xattrs[--f->nxattrs];
      return 0;
    }
  }
  return ENODATA;
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
  struct fs *fs = fs_data(req);
  wrlock(fs);
  int rc = do_removexattr(fs, ino, name);
  unlock(fs);
  fuse_reply_err(req, rc);
}

const struct fuse_lowlevel_ops fs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .flush = op_flush,
    .fsync = op_fsync,
    .release = op_release,
    .statfs = op_statfs,
    .mkdir = op_mkdir,
    .mknod = op_mknod,
    .create = op_create,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .setxattr = op_setxattr,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .removexattr = op_removexattr,
};
