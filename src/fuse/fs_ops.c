/* The low-level FUSE operations. Each op_x decodes its arguments, calls the
 * core (tree, editable catalog, catalog) or the staging helpers, and replies
 * exactly once; the do_x helpers return an errno. The xattr ops are in
 * fs_xattr.c.
 *
 * Locks, in the order they may be taken (never the other way round):
 *
 *   1. fs->lock, the tree lock (rwlock): the names (struct bs_tree, which
 *      may move its node array on any add). Held only for in-memory work on
 *      the tree: no I/O and no wait for another lock while holding it. An
 *      op looks its node up under it (fs_ref_get), lets it go, then works
 *      on the node's entry, whose address is stable until unmount.
 *   2. e->lock, one per file or directory (rwlock in struct bs_entry): the
 *      entry's fields, its staging fd and its staged bytes. Reads of staged
 *      bytes and fsync take it shared; writes, truncation, staging (the
 *      first-write copy of a whole tensor), open/release take it exclusive.
 *      I/O happens under it, and it blocks only ops on that one file. The
 *      root entry's lock also guards the root metadata (fs->edit.meta).
 *      At most one entry lock is held at a time.
 *   3. fs->stage_lock (mutex): creating the staging directory and handing
 *      out staging file ids; nothing else is taken while it is held.
 *
 * fs->dirty and the xattr budget are atomics. Read-only mounts have no
 * entries and never change the tree: they only ever take the tree lock
 * shared. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/journal.h"
#include "core/utf8.h"
#include "fs.h"
#include "fs_views.h"
#include "policy/names.h"

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

void fs_mark_dirty(struct fs *fs)
{
  atomic_store(&fs->dirty, true);
}

/* A node by ino, also one that was unlinked but is still open. Tree lock held. */
static struct bs_node *node_any(struct fs *fs, fuse_ino_t ino)
{
  if (ino == 0 || ino >= fs->tree.n)
    return NULL;
  struct bs_node *nd = &fs->tree.nodes[ino];
  return nd->name ? nd : NULL;
}

static void ref_of(const struct fs *fs, uint64_t ino, struct fs_ref *r)
{
  const struct bs_node *nd = &fs->tree.nodes[ino];
  r->is_dir = nd->is_dir;
  r->live = nd->live;
  r->tensor = nd->tensor;
  r->e = bs_tree_user(&fs->tree, ino);
}

int fs_ref_get(struct fs *fs, fuse_ino_t ino, struct fs_ref *r)
{
  rdlock(fs);
  struct bs_node *nd = node_any(fs, ino);
  if (nd)
    ref_of(fs, ino, r);
  unlock(fs);
  return nd ? 0 : ENOENT;
}

static const struct bs_tensor *ro_tensor(struct fs *fs, const struct fs_ref *r)
{
  return r->tensor >= 0 && (size_t)r->tensor < fs->cat.count ? &fs->cat.tensors[r->tensor] : NULL;
}

/* Attributes; for a writable mount the caller holds r->e->lock. */
static void fill_attr_locked(struct fs *fs, fuse_ino_t ino, const struct fs_ref *r, struct stat *st)
{
  memset(st, 0, sizeof *st);
  st->st_ino = ino;
  st->st_atim = st->st_mtim = st->st_ctim = fs->mtime;
  const struct bs_entry *e = r->e;
  st->st_uid = e ? e->uid : fs->owner.uid;
  st->st_gid = e ? e->gid : fs->owner.gid;
  if (r->is_dir) {
    st->st_mode = S_IFDIR | (e ? e->mode : fs->owner.dir_mode);
    st->st_nlink = 2;
  } else {
    st->st_mode = S_IFREG | (e ? e->mode : fs->owner.file_mode);
    st->st_nlink = r->live ? 1 : 0;
    const struct bs_tensor *t = e ? NULL : ro_tensor(fs, r);
    uint64_t size = e ? e->size : t ? t->nbytes : 0;
    if (t)
      size += fs_npy_view_hlen(fs, ino);
    else if (fs_view_is(fs, ino))
      size = fs->view.size;
    st->st_size = (off_t)size;
    st->st_blocks = (blkcnt_t)((size + 511) / 512);
  }
  /* glibc sizes its getdents64 buffer by st_blksize, and the kernel
   * allocates one of that size per READDIR: 4 KiB for directories. Files:
   * 128 KiB, the size of the kernel's read requests (its read-ahead cap). */
  st->st_blksize = r->is_dir ? 4096 : 128 << 10;
  if (e && (e->mtime.tv_sec || e->mtime.tv_nsec))
    st->st_mtim = st->st_ctim = e->mtime;
}

static void fill_attr(struct fs *fs, fuse_ino_t ino, const struct fs_ref *r, struct stat *st)
{
  if (r->e)
    pthread_rwlock_rdlock(&r->e->lock);
  fill_attr_locked(fs, ino, r, st);
  if (r->e)
    pthread_rwlock_unlock(&r->e->lock);
}

static void fill_entry(struct fs *fs, fuse_ino_t ino, const struct fs_ref *r,
                       struct fuse_entry_param *e)
{
  memset(e, 0, sizeof *e);
  e->ino = ino;
  e->attr_timeout = e->entry_timeout = fs->timeout;
  fill_attr(fs, ino, r, &e->attr);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
  struct fs *fs = userdata;
  /* One fd per open staged file, plus the source: give the daemon all the
   * fds the hard limit allows (it runs in the daemon, after the fork). */
  fs_raise_nofile();
  bs_journal_begin(fs->journal); /* its flusher thread: here, after the fork */
  fs_io_init(fs, conn);          /* FUSE_HANDLE_KILLPRIV_V2 (fs_io.c) */
  if (conn->capable & FUSE_CAP_SPLICE_WRITE)
    conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE)
    conn->want |= FUSE_CAP_SPLICE_MOVE;

  /* The write-back cache for writable mounts: a write(2) completes in the
   * page cache and the kernel sends large WRITEs later (at the latest on
   * close). A signal no longer loses them (fs_stop.c). */
  conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
  if (fs->writable && (conn->capable & FUSE_CAP_WRITEBACK_CACHE)) {
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    fs->writeback = true;
  }
#ifdef FUSE_CAP_HANDLE_KILLPRIV_V2
  /* libfuse >= 3.16: we drop set-id bits on write ourselves (op_write_buf), so
   * the kernel marks the superblock SB_NOSEC and stops asking for
   * security.capability before every write(2). libfuse 3.14 cannot ask for
   * it: there each write(2) costs one GETXATTR (answered EOPNOTSUPP at once,
   * fs_xattr.c). */
  if (fs->writable && (conn->capable & FUSE_CAP_HANDLE_KILLPRIV_V2))
    conn->want |= FUSE_CAP_HANDLE_KILLPRIV_V2;
#endif
  /* Lookups and readdir of one directory in parallel: the tree lock is a
   * rwlock (creates and removes take it exclusive). */
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
    conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  /* READDIRPLUS for read-only mounts, where the kernel chooses (AUTO):
   * plus for a directory whose entries get looked up (ls -l), plain
   * READDIR for one that is only listed (find). */
  if (!fs->writable && (conn->capable & FUSE_CAP_READDIRPLUS)) {
    conn->want |= FUSE_CAP_READDIRPLUS;
    if (conn->capable & FUSE_CAP_READDIRPLUS_AUTO)
      conn->want |= FUSE_CAP_READDIRPLUS_AUTO;
  } else {
    conn->want &= ~(unsigned)(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO);
  }
  if (fs->max_read)
    conn->max_read = fs->max_read;
  /* The kernel's read-ahead READs go out as background requests, 12 at
   * once by default: readers stuck on a stalled URL range would hold them
   * all, and every other file's reads would queue behind (fs_prepare.c gives a
   * URL mount more, fs_main.c more workers). */
  if (fs->max_background) {
    conn->max_background = fs->max_background;
    conn->congestion_threshold = fs->max_background * 3 / 4;
  }
  /* WRITEs of 1 MiB less 4 KiB on writable mounts: libfuse's receive buffer
   * is then max_write + 4 KiB = 1 MiB, a pipe that size is within the
   * default pipe-max-size for every user, and libfuse splices WRITEs from
   * /dev/fuse into it (FUSE_CAP_SPLICE_READ, wanted by default) and
   * op_write_buf on into the staging file: one copy of the bytes fewer. At
   * 1 MiB the pipe had to be 1 MiB + 4 KiB, which only CAP_SYS_RESOURCE may
   * set, and every WRITE was read(2) into memory and written from there. */
  if (fs->writable)
    conn->max_write = (1u << 20) - 4096;
  else if (conn->max_write < (1u << 20))
    conn->max_write = 1u << 20;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
  struct fs *fs = fs_data(req);
  struct fs_ref r;
  rdlock(fs);
  struct bs_node *p = bs_tree_node(&fs->tree, parent);
  int rc = !p ? ENOENT : !p->is_dir ? ENOTDIR : 0;
  uint64_t ino = rc ? 0 : bs_tree_lookup(&fs->tree, parent, name);
  if (ino)
    ref_of(fs, ino, &r);
  unlock(fs);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  struct fuse_entry_param e;
  if (!ino) {
    /* A negative entry may be cached only while nothing can create it. */
    memset(&e, 0, sizeof e);
    e.entry_timeout = fs->writable ? 0 : fs->timeout;
    fuse_reply_entry(req, &e);
    return;
  }
  fill_entry(fs, ino, &r, &e);
  fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  struct stat st;
  struct fs_ref r;
  if (atomic_load(&fs->wb_error) && atomic_load(&fs->wb_error_ino) == ino) {
    int err = atomic_exchange(&fs->wb_error, 0);
    if (err) {
      fuse_reply_err(req, err);
      return;
    }
  }
  if (fs_ref_get(fs, ino, &r) != 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  fill_attr(fs, ino, &r, &st);
  fuse_reply_attr(req, &st, fs->timeout);
}

/* The staging fd of e (held: e->lock): its own while open, else a new one
 * in *tmp that the caller closes. Returns the fd or -errno. */
static int stage_fd(struct fs *fs, struct bs_entry *e, int *tmp)
{
  *tmp = -1;
  if (e->fd >= 0)
    return e->fd;
  int fd = fs_stage_open(fs, e, O_RDWR);
  if (fd >= 0)
    *tmp = fd;
  return fd;
}

/* Set e's size to `want` (held: e->lock exclusive). Returns 0 or an errno. */
static int truncate_entry(struct fs *fs, struct bs_entry *e, uint64_t want)
{
  if (want == e->size)
    return 0; /* not a change: nothing to stage */
  if (want > INT64_MAX)
    return EFBIG;
  if (!e->stage) {
    int rc = fs_stage(fs, e, want < e->size ? want : e->size);
    if (rc)
      return -rc;
  }
  int tmp, fd = stage_fd(fs, e, &tmp);
  if (fd < 0)
    return -fd;
  int rc = ftruncate(fd, (off_t)want) != 0 ? errno : 0;
  if (tmp >= 0)
    close(tmp);
  if (rc)
    return rc;
  e->size = want;
  fs_mark_dirty(fs);
  return 0;
}

static int do_setattr(struct fs *fs, fuse_ino_t ino, struct stat *attr, int to_set,
                      struct stat *out)
{
  struct fs_ref r;
  if (fs_ref_get(fs, ino, &r) != 0)
    return ENOENT;
  struct bs_entry *e = r.e;
  if (!e)
    return EROFS;
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (r.is_dir)
      return EISDIR;
    if (attr->st_size < 0)
      return EINVAL;
  }
  int rc = 0;
  pthread_rwlock_wrlock(&e->lock);
  if (to_set & FUSE_SET_ATTR_SIZE)
    rc = truncate_entry(fs, e, (uint64_t)attr->st_size);
  if (!rc) {
    /* The kernel has checked who may chmod and chown (default_permissions,
     * always on: fs_main.c, serve); they hold until unmount, the output keeps no
     * owner nor mode. */
    if (to_set & FUSE_SET_ATTR_MODE)
      e->mode = attr->st_mode & 07777;
    if (to_set & FUSE_SET_ATTR_UID)
      e->uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID)
      e->gid = attr->st_gid;
    /* With FUSE_HANDLE_KILLPRIV_V2 (fs_io.c) the kernel leaves it to us:
     * truncation and chown drop set-id bits, as write does (op_write_buf). */
    if (atomic_load(&fs->killpriv) && !(to_set & FUSE_SET_ATTR_MODE) &&
        (to_set & (FUSE_SET_ATTR_SIZE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)))
      e->mode &= ~(unsigned)(S_ISUID | S_ISGID);
    if (to_set & FUSE_SET_ATTR_MTIME)
      e->mtime = attr->st_mtim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
      clock_gettime(CLOCK_REALTIME, &e->mtime);
    /* atime: accepted, not kept (reads do not change it either). */
    fill_attr_locked(fs, ino, &r, out);
  }
  pthread_rwlock_unlock(&e->lock);
  return rc;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  struct stat st;
  int rc = fs->writable ? do_setattr(fs, ino, attr, to_set, &st) : EROFS;
  if (rc)
    fuse_reply_err(req, rc);
  else
    fuse_reply_attr(req, &st, fs->timeout);
}

/* A read-only mount answers ENOSYS: the kernel then never sends OPENDIR
 * nor RELEASEDIR again and opens every directory with FOPEN_KEEP_CACHE |
 * FOPEN_CACHE_DIR (its no-opendir default), so a second listing is served
 * from its cache without a round trip. Writable mounts open normally and do
 * not cache (their directories change). */
static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  struct fs *fs = fs_data(req);
  if (!fs->writable) {
    fuse_reply_err(req, ENOSYS);
    return;
  }
  rdlock(fs);
  struct bs_node *nd = bs_tree_node(&fs->tree, ino);
  int rc = !nd ? ENOENT : !nd->is_dir ? ENOTDIR : 0;
  unlock(fs);
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fuse_reply_open(req, fi);
}

/* Directory offsets: 1 is ".", 2 is "..", 3 + i is kids[i]. Removed kids
 * keep their slot, so offsets stay valid while `rm -r` deletes entries.
 * READDIRPLUS (read-only mounts only: attributes are filled under the tree
 * lock, and only a read-only mount's need no entry lock) also hands the
 * kernel each entry's attributes, saving `ls -l` a LOOKUP per name; "." and
 * ".." go without (ino 0: the kernel links nothing for them). */
static void reply_dir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus)
{
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
    fuse_reply_err(req, !nd ? ENOENT : ENOTDIR);
    return;
  }
  for (uint64_t pos = off < 0 ? 0 : (uint64_t)off;; pos++) {
    struct fuse_entry_param ep;
    memset(&ep, 0, sizeof ep);
    struct stat *st = &ep.attr;
    const char *name;
    if (pos == 0) {
      name = ".";
      st->st_ino = ino;
      st->st_mode = S_IFDIR;
    } else if (pos == 1) {
      name = "..";
      st->st_ino = nd->parent;
      st->st_mode = S_IFDIR;
    } else {
      uint64_t k = pos - 2;
      if (k >= nd->nkids)
        break;
      uint64_t kid = bs_node_kids(nd)[k];
      if (!kid)
        continue;
      const struct bs_node *kn = &fs->tree.nodes[kid];
      name = kn->name;
      if (plus) {
        struct fs_ref r;
        ref_of(fs, kid, &r);
        ep.ino = kid;
        ep.attr_timeout = ep.entry_timeout = fs->timeout;
        fill_attr_locked(fs, kid, &r, st); /* r.e is NULL: read-only */
      } else {
        st->st_ino = kid;
        st->st_mode = kn->is_dir ? S_IFDIR : S_IFREG;
      }
    }
    size_t need =
        plus ? fuse_add_direntry_plus(req, buf + used, size - used, name, &ep, (off_t)(pos + 1))
             : fuse_add_direntry(req, buf + used, size - used, name, st, (off_t)(pos + 1));
    if (need > size - used)
      break;
    used += need;
  }
  unlock(fs);
  fuse_reply_buf(req, buf, used);
  bs_free(buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
  (void)fi;
  reply_dir(req, ino, size, off, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi)
{
  (void)fi;
  reply_dir(req, ino, size, off, true);
}

/* Writable: count the handle, and truncate on O_TRUNC. Opening for writing
 * changes nothing by itself: the bytes are staged at the first change. */
static int open_entry(struct fs *fs, struct bs_entry *e, int flags)
{
  int rc = 0;
  pthread_rwlock_wrlock(&e->lock);
  e->nopen++;
  if (flags & O_TRUNC)
    rc = truncate_entry(fs, e, 0);
  if (!rc && (flags & O_TRUNC) && atomic_load(&fs->killpriv))
    e->mode &= ~(unsigned)(S_ISUID | S_ISGID); /* (do_setattr) */
  if (!rc && e->stage && e->fd < 0) {
    int fd = fs_stage_open(fs, e, O_RDWR);
    if (fd < 0)
      rc = -fd;
    else
      e->fd = fd;
  }
  if (rc)
    e->nopen--;
  pthread_rwlock_unlock(&e->lock);
  return rc;
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
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc && r.is_dir)
    rc = EISDIR;
  if (!rc && !r.e) {
    const struct bs_tensor *t = ro_tensor(fs, &r);
    if (t && t->x->unsupported) {
      fuse_log(FUSE_LOG_ERR, "burnstore: %s: cannot read: %s\n", t->key, t->x->unsupported);
      rc = ENOTSUP;
    }
  } else if (!rc) {
    rc = open_entry(fs, r.e, wants_write ? fi->flags : fi->flags & ~O_TRUNC);
  }
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  fs_readahead_apply(fs);         /* (once: before the kernel takes a file's read-ahead) */
  fi->keep_cache = !fs->writable; /* the files of a read-only mount never change */
  /* -o direct_io: no page cache, requests up to max_read (fs_main.c sets it
   * just under libfuse's 1 MiB splice pipe). libfuse 3.14 cannot allow
   * shared mmap of such files (FUSE_DIRECT_IO_ALLOW_MMAP is 3.16): ENODEV. */
  fi->direct_io = fs->direct_io;
  fuse_reply_open(req, fi);
}

/* Bytes of a source that changed since the mount are never served: EIO,
 * and one log line per source (fs_log.c: the mount's log, syslog, and
 * stderr in the foreground). */
bool fs_src_changed(struct fs *fs, uint32_t src)
{
  if (src >= fs->cat.nsrcs)
    return false;
  struct bs_src *s = &fs->cat.srcs[src];
  char why[128];
  if (!bs_src_changed(s, why, sizeof why))
    return false;
  if (!__atomic_exchange_n(&s->change_logged, true, __ATOMIC_RELAXED)) {
    fuse_log(FUSE_LOG_ERR, "burnstore: %s changed since it was mounted (%s): reads fail with EIO\n",
             s->name, why);
  }
  return true;
}

static bool source_changed(struct fs *fs, const struct bs_tensor *t)
{
  return fs_src_changed(fs, t->src);
}

/* Reply with up to `size` bytes at off of an fd range [base, base + len). */
static void reply_fd(fuse_req_t req, int fd, uint64_t base, uint64_t len, size_t size, off_t off)
{
  if ((uint64_t)off >= len) {
    fuse_reply_buf(req, NULL, 0);
    return;
  }
  if (size > len - (uint64_t)off)
    size = (size_t)(len - (uint64_t)off);
  if (fs_data(req)->direct_io) {
    /* direct_io requests are ~1 MiB: spliced, they ran at 80 MB/s here (the
     * reply needs a pipe grown past 1 MiB and 257 buffers for an unaligned
     * range); a pread into memory and one copy ran at 500 MB/s. */
    char *buf = bs_malloc(size);
    ssize_t n = buf ? pread(fd, buf, size, (off_t)(base + (uint64_t)off)) : -1;
    if (n < 0)
      fuse_reply_err(req, buf ? errno : ENOMEM);
    else
      fuse_reply_buf(req, buf, (size_t)n);
    bs_free(buf);
    return;
  }
  /* Straight from the backing file: the kernel can splice it. */
  struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
  bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY;
  bv.buf[0].fd = fd;
  bv.buf[0].pos = (off_t)(base + (uint64_t)off);
  fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
}

static void read_clean(fuse_req_t req, struct fs *fs, const struct bs_tensor *t, uint64_t len,
                       size_t size, off_t off, bool lend);

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  if (off < 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  if (fs_view_is(fs, ino)) { /* -o view=: the one file */
    fs_view_read(req, fs, size, (uint64_t)off);
    return;
  }
  struct fs_ref r = {0};
  if (fs_ref_get(fs, ino, &r) != 0 || r.is_dir) {
    fuse_reply_err(req, r.is_dir ? EISDIR : ENOENT);
    return;
  }
  long tensor = r.tensor;
  uint64_t len = 0;
  struct bs_entry *e = r.e;
  if (e) {
    pthread_rwlock_rdlock(&e->lock);
    if (e->stage) {
      /* Staged bytes, read under the file's lock (shared). */
      int tmp, fd = stage_fd(fs, e, &tmp);
      if (fd < 0)
        fuse_reply_err(req, -fd);
      else
        reply_fd(req, fd, 0, e->size, size, off);
      pthread_rwlock_unlock(&e->lock);
      if (tmp >= 0)
        close(tmp);
      return;
    }
    tensor = e->tensor;
    len = e->size;
    pthread_rwlock_unlock(&e->lock);
    if (tensor < 0) {
      fuse_reply_buf(req, NULL, 0); /* a new, empty file */
      return;
    }
  }
  /* Clean bytes: the source catalog does not change while mounted, but the
   * file behind it might (then EIO, never wrong bytes). */
  const struct bs_tensor *t =
      tensor >= 0 && (size_t)tensor < fs->cat.count ? &fs->cat.tensors[tensor] : NULL;
  if (!t || source_changed(fs, t)) {
    fuse_reply_err(req, EIO);
    return;
  }
  if (!e)
    len = t->nbytes;
  uint64_t hl = e ? 0 : fs_npy_view_hlen(fs, ino);
  if (hl) { /* a .npy view: the header, then the same bytes */
    if ((uint64_t)off < hl) {
      char *b;
      size_t n;
      int rc = fs_npy_read(fs, t, size, (uint64_t)off, &b, &n);
      if (rc < 0)
        fuse_reply_err(req, -rc);
      else
        fuse_reply_buf(req, b, n);
      bs_free(b);
      return;
    }
    off -= (off_t)hl;
  }
  read_clean(req, fs, t, len, size, off, !e);
}

/* Reply with up to `size` bytes at off of clean tensor t (len bytes of it:
 * a writable mount's entry may be shorter): spliced from its file, lent
 * from a URL's cache (lend), or read. */
static void read_clean(fuse_req_t req, struct fs *fs, const struct bs_tensor *t, uint64_t len,
                       size_t size, off_t off, bool lend)
{
  int fd;
  uint64_t base;
  if (bs_tensor_fd_range(&fs->cat, t, &fd, &base)) {
    reply_fd(req, fd, base, len, size, off);
    bs_tensor_fd_put(&fs->cat, t, fd);
    return;
  }
  if ((uint64_t)off >= len) {
    fuse_reply_buf(req, NULL, 0);
    return;
  }
  if (size > len - (uint64_t)off)
    size = (size_t)(len - (uint64_t)off);
  /* Bytes the source holds in memory (a URL's cache blocks): sent from
   * there, pinned until the reply is written, not copied first. */
  struct bs_src_view v;
  int vr = !lend ? -ENOTSUP : bs_tensor_view(&fs->cat, t, (uint64_t)off, size, &v);
  if (vr == 0) {
    struct iovec iov[BS_SRC_SPANS];
    for (size_t i = 0; i < v.count; i++)
      iov[i] = (struct iovec){.iov_base = (void *)(uintptr_t)v.p[i], .iov_len = v.n[i]};
    fuse_reply_iov(req, iov, (int)v.count);
    bs_tensor_view_put(&fs->cat, t, &v);
    return;
  }
  if (vr != -EAGAIN && vr != -ENOTSUP) {
    if (vr == -EIO)
      source_changed(fs, t);
    fuse_reply_err(req, -vr);
    return;
  }
  char *buf = bs_malloc(size);
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  long n = bs_tensor_read(&fs->cat, t, (uint64_t)off, buf, size);
  if (n == -EIO)
    source_changed(fs, t); /* logs a change during the read */
  if (n < 0)
    fuse_reply_err(req, (int)-n);
  else
    fuse_reply_buf(req, buf, (size_t)n);
  bs_free(buf);
}

void fs_read_tensor(fuse_req_t req, struct fs *fs, const struct bs_tensor *t, size_t size,
                    uint64_t off)
{
  if (source_changed(fs, t))
    fuse_reply_err(req, EIO);
  else
    read_clean(req, fs, t, t->nbytes, size, (off_t)off, true);
}

/* A WRITE's bytes go to the staging file as libfuse holds them: in memory,
 * or in the pipe it spliced the request into from /dev/fuse (libfuse wants
 * FUSE_CAP_SPLICE_READ by default): then spliced on into the file, never
 * copied through this process (as libfuse's passthrough_hp does). libfuse
 * 3.14 splices only into a pipe of max_write + 4 KiB: op_init keeps that
 * within the default pipe-max-size; elsewhere it read(2)s the request into
 * memory. */
static void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in, off_t off,
                         struct fuse_file_info *fi)
{
  size_t size = fuse_buf_size(in);
  struct fs *fs = fs_data(req);
  if (!fs->writable) {
    fuse_reply_err(req, EROFS);
    return;
  }
  if (off < 0) {
    fuse_reply_err(req, EINVAL);
    return;
  }
  struct fs_ref r;
  int rc = fs_ref_get(fs, ino, &r);
  if (!rc && (r.is_dir || !r.e))
    rc = r.is_dir ? EISDIR : EROFS;
  if (rc) {
    fuse_reply_err(req, rc);
    return;
  }
  struct bs_entry *e = r.e;
  ssize_t w = 0;
  pthread_rwlock_wrlock(&e->lock);
  if (!e->stage)
    rc = -fs_stage(fs, e, e->size); /* the first write: copy the clean bytes */
  int tmp = -1, fd = rc ? -1 : stage_fd(fs, e, &tmp);
  if (!rc && fd < 0)
    rc = -fd;
  if (!rc) {
    /* With the write-back cache the kernel places appends itself. */
    uint64_t pos = (fi->flags & O_APPEND) && !fs->writeback ? e->size : (uint64_t)off;
    struct fuse_bufvec out = FUSE_BUFVEC_INIT(size);
    out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    out.buf[0].fd = fd;
    out.buf[0].pos = (off_t)pos;
    w = fuse_buf_copy(&out, in, FUSE_BUF_SPLICE_MOVE);
    if (w < 0)
      rc = (int)-w;
    else if (pos + (uint64_t)w > e->size)
      e->size = pos + (uint64_t)w;
    e->mode &= ~(unsigned)(S_ISUID | S_ISGID); /* a write drops set-id bits */
    fs_mark_dirty(fs);
    clock_gettime(CLOCK_REALTIME, &e->mtime);
  }
  pthread_rwlock_unlock(&e->lock);
  if (tmp >= 0)
    close(tmp);
  if (fs->writeback && (rc || (size_t)w < size)) {
    /* A page the kernel already acknowledged to the writer is lost: tell
     * the writer at its next write(2) (see wb_error in fs.h). */
    atomic_store(&fs->wb_error_ino, ino);
    atomic_store(&fs->wb_error, rc ? rc : ENOSPC);
  }
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
  struct fs_ref r;
  int rc = 0;
  if (fs_ref_get(fs, ino, &r) == 0 && r.e) {
    struct bs_entry *e = r.e;
    pthread_rwlock_rdlock(&e->lock);
    if (e->stage) {
      int tmp, fd = stage_fd(fs, e, &tmp);
      if (fd < 0)
        rc = -fd;
      else if ((datasync ? fdatasync(fd) : fsync(fd)) != 0)
        rc = errno;
      if (tmp >= 0)
        close(tmp);
    }
    pthread_rwlock_unlock(&e->lock);
  }
  fuse_reply_err(req, rc);
}

/* The last handle of a file closes its staging fd; an unlinked file's
 * staged bytes go then. Held: nothing. */
static void close_entry(struct fs *fs, struct bs_entry *e)
{
  pthread_rwlock_wrlock(&e->lock);
  if (e->nopen)
    e->nopen--;
  if (e->nopen == 0) {
    if (e->fd >= 0) {
      close(e->fd);
      e->fd = -1;
    }
    if (e->unlinked)
      fs_stage_free(fs, e);
  }
  pthread_rwlock_unlock(&e->lock);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
  (void)fi;
  struct fs *fs = fs_data(req);
  struct fs_ref r;
  if (fs_ref_get(fs, ino, &r) == 0 && r.e)
    close_entry(fs, r.e);
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
    rdlock(fs);
    sv.f_files = fs->tree.n;
    unlock(fs);
  }
  sv.f_namemax = 255;
  fuse_reply_statfs(req, &sv);
}

/* --- creating, removing, renaming (writable mounts) --------------------- */

/* A name users may create or rename to (bs_name_check: the output format
 * holds its key, one name a key). Tree lock held; the caller logs *nerr
 * after letting it go. */
static int check_name(struct fs *fs, fuse_ino_t parent, const char *name, bool dir, uint64_t moving,
                      bs_err *nerr)
{
  if (bs_name_check(&fs->tree, fs->flat, fs->writer, parent, name, dir, moving, nerr) == 0)
    return 0;
  return nerr->code;
}

/* One log line for a name refused by check_name (no lock held). */
static void log_name(const char *op, const char *name, const bs_err *nerr)
{
  if (!nerr->code || nerr->code == ENOMEM)
    return;
  char line[700], pname[128];
  fuse_log(FUSE_LOG_ERR, "burnstore: %s '%s' refused: %s\n", op,
           bs_name_printable(name, pname, sizeof pname),
           bs_err_format(nerr, NULL, line, sizeof line));
}

/* A refused new name, in one log line (after the tree lock is let go: no
 * I/O under it): bs_name_check's reason, or what else refused it. */
static void log_name_refusal(struct fs *fs, const char *what, const char *name, int rc,
                             const bs_err *nerr)
{
  if (nerr->code)
    log_name(what, name, nerr);
  else if (rc == EINVAL)
    fuse_log(
        FUSE_LOG_ERR,
        "burnstore: %s %s refused: a %% in a name starts an escape (%%2F, %%25, %%2E) or is the "
        "whole name\n",
        what, name);
  else if (rc == EPERM && fs->flat)
    fuse_log(FUSE_LOG_ERR, "burnstore: %s %s refused: a flat mount has no directories\n", what,
             name);
}

/* A new file or directory (tree lock held exclusive), owned by `who`, or in
 * a set-group-ID directory by its group (a directory inherits the bit). A
 * new file has no bytes and no staging file until it is written. */
static int do_mknode(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode, bool dir,
                     const struct fuse_ctx *who, bool opened, uint64_t *ino, struct fs_ref *r,
                     bs_err *nerr)
{
  if (!fs->writable)
    return EROFS;
  int rc = check_name(fs, parent, name, dir, 0, nerr);
  if (rc)
    return rc;
  if (fs->flat && dir)
    return EPERM; /* a flat mount has no directories */
  struct bs_node *pn = bs_tree_node(&fs->tree, parent);
  if (!pn || !pn->is_dir)
    return !pn ? ENOENT : ENOTDIR;
  struct bs_entry *pe = bs_tree_user(&fs->tree, parent);
  struct bs_entry *e = bs_entry_new(-1, 0, dir, mode & 07777);
  if (!e)
    return ENOMEM;
  e->uid = who->uid;
  e->gid = who->gid;
  if (pe) {
    pthread_rwlock_rdlock(&pe->lock);
    if (pe->mode & S_ISGID) {
      e->gid = pe->gid;
      if (dir)
        e->mode |= S_ISGID;
    }
    pthread_rwlock_unlock(&pe->lock);
  }
  e->nopen = opened ? 1 : 0;
  clock_gettime(CLOCK_REALTIME, &e->mtime);
  bs_err err;
  bs_err_clear(&err);
  if (bs_tree_add(&fs->tree, parent, name, dir, -1, ino, &err) != 0) {
    bs_entry_free(e);
    return err.code;
  }
  if (bs_tree_set_user(&fs->tree, *ino, e) != 0) { /* (a writable mount has the table) */
    int code = bs_tree_remove(&fs->tree, *ino, &err) != 0 ? err.code : ENOMEM;
    bs_entry_free(e);
    return code;
  }
  e->ino = *ino;
  if (!dir)
    bs_edit_log_key(&fs->edit, *ino);
  ref_of(fs, *ino, r);
  fs_mark_dirty(fs);
  return 0;
}

/* mkdir, mknod and create: a new node, replied as an entry. */
static void reply_mknode(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, bool dir,
                         struct fuse_file_info *fi)
{
  struct fs *fs = fs_data(req);
  uint64_t ino = 0;
  struct fs_ref r;
  bs_err nerr;
  bs_err_clear(&nerr);
  wrlock(fs);
  int rc = do_mknode(fs, parent, name, mode, dir, fuse_req_ctx(req), fi != NULL, &ino, &r, &nerr);
  unlock(fs);
  if (rc) {
    log_name_refusal(fs, dir ? "mkdir" : "create", name, rc, &nerr);
    fuse_reply_err(req, rc);
    return;
  }
  struct fuse_entry_param e;
  fill_entry(fs, ino, &r, &e);
  if (fi) {
    fi->keep_cache = 0;
    fuse_reply_create(req, &e, fi);
  } else {
    fuse_reply_entry(req, &e);
  }
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
  reply_mknode(req, parent, name, mode, true, NULL);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
  (void)rdev;
  if (!S_ISREG(mode)) {
    if (fs_data(req)->writable)
      fuse_log(FUSE_LOG_ERR,
               "burnstore: mknod %s refused: a checkpoint holds regular files only (no devices, "
               "fifos or sockets)\n",
               name);
    fuse_reply_err(req, fs_data(req)->writable ? EPERM : EROFS);
  } else
    reply_mknode(req, parent, name, mode, false, NULL);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
  reply_mknode(req, parent, name, mode, false, fi);
}

/* Links cannot become tensors: refused, with a line in the log. */
static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
  (void)parent;
  struct fs *fs = fs_data(req);
  if (fs->writable)
    fuse_log(FUSE_LOG_ERR, "burnstore: symlink %s -> %s refused: a checkpoint holds no links\n",
             name, link);
  fuse_reply_err(req, fs->writable ? EPERM : EROFS);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
  (void)ino;
  (void)newparent;
  struct fs *fs = fs_data(req);
  if (fs->writable)
    fuse_log(FUSE_LOG_ERR, "burnstore: hard link %s refused: a checkpoint holds no links\n",
             newname);
  fuse_reply_err(req, fs->writable ? EPERM : EROFS);
}

/* A node left the tree: its staged bytes go now, or at its last close.
 * Held: nothing (takes e->lock). */
static void forget_entry(struct fs *fs, struct bs_entry *e)
{
  if (!e)
    return;
  pthread_rwlock_wrlock(&e->lock);
  e->unlinked = true;
  if (e->nopen == 0)
    fs_stage_free(fs, e);
  pthread_rwlock_unlock(&e->lock);
}

static int do_remove(struct fs *fs, fuse_ino_t parent, const char *name, bool dir,
                     struct bs_entry **gone, bs_err *nerr)
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
  if (bs_name_check_fixed(&fs->tree, &fs->cat, fs->fixed, ino, nerr) != 0)
    return nerr->code;
  bs_err err;
  bs_err_clear(&err);
  if (bs_tree_remove(&fs->tree, ino, &err) != 0)
    return err.code;
  bs_edit_log_gone(&fs->edit, ino);
  *gone = bs_tree_user(&fs->tree, ino);
  fs_mark_dirty(fs);
  return 0;
}

static void reply_remove(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir)
{
  struct fs *fs = fs_data(req);
  struct bs_entry *gone = NULL;
  bs_err nerr;
  bs_err_clear(&nerr);
  wrlock(fs);
  int rc = do_remove(fs, parent, name, dir, &gone, &nerr);
  unlock(fs);
  log_name(dir ? "rmdir" : "unlink", name, &nerr);
  forget_entry(fs, gone);
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
                     const char *newname, unsigned int flags, struct bs_entry **gone, bs_err *nerr)
{
  if (!fs->writable)
    return EROFS;
  if (flags & ~(unsigned)RENAME_NOREPLACE)
    return EINVAL; /* RENAME_EXCHANGE / WHITEOUT: not supported */
  uint64_t ino = bs_tree_lookup(&fs->tree, parent, name);
  if (!ino)
    return ENOENT;
  struct bs_node *np = bs_tree_node(&fs->tree, newparent);
  if (!np)
    return ENOENT;
  if (!np->is_dir)
    return ENOTDIR;
  /* A shortened name kept as it is (a move to another directory) keeps its
   * node's key segment (bs_tree_move): its name is no escape to check. */
  int rc = strcmp(name, newname) == 0 && bs_name_is_shortened(newname)
               ? 0
               : check_name(fs, newparent, newname, fs->tree.nodes[ino].is_dir, ino, nerr);
  if (rc)
    return rc;
  bs_err err;
  bs_err_clear(&err);
  uint64_t target = bs_tree_lookup(&fs->tree, newparent, newname);
  if (target == ino)
    return 0;
  if (bs_name_check_fixed(&fs->tree, &fs->cat, fs->fixed, ino, nerr) != 0 ||
      (target && bs_name_check_fixed(&fs->tree, &fs->cat, fs->fixed, target, nerr) != 0))
    return nerr->code;
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
    bs_edit_log_gone(&fs->edit, target);
    *gone = bs_tree_user(&fs->tree, target); /* replaced: its bytes are freed */
  }
  if (bs_tree_move(&fs->tree, ino, newparent, newname, &err) != 0)
    return err.code;
  bs_edit_log_key(&fs->edit, ino);
  fs_mark_dirty(fs);
  return 0;
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
  struct fs *fs = fs_data(req);
  struct bs_entry *gone = NULL;
  bs_err nerr;
  bs_err_clear(&nerr);
  wrlock(fs);
  int rc = do_rename(fs, parent, name, newparent, newname, flags, &gone, &nerr);
  unlock(fs);
  if (rc == EINVAL && (flags & ~(unsigned)RENAME_NOREPLACE))
    fuse_log(FUSE_LOG_ERR, "burnstore: rename %s refused: only plain renames (and noreplace)\n",
             name);
  else if (rc)
    log_name_refusal(fs, "rename to", newname, rc, &nerr);
  forget_entry(fs, gone);
  fuse_reply_err(req, rc);
}

const struct fuse_lowlevel_ops fs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .readdirplus = op_readdirplus,
    .open = op_open,
    .read = op_read,
    .write_buf = op_write_buf,
    .flush = op_flush,
    .fsync = op_fsync,
    .release = op_release,
    .statfs = op_statfs,
    .mkdir = op_mkdir,
    .mknod = op_mknod,
    .create = op_create,
    .symlink = op_symlink,
    .link = op_link,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .setxattr = fs_op_setxattr,
    .getxattr = fs_op_getxattr,
    .listxattr = fs_op_listxattr,
    .removexattr = fs_op_removexattr,
};
