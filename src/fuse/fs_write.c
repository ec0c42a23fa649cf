/* Writable mounts: staging on disk and the write-back on unmount.
 *
 * A file's bytes stay in the source checkpoint until it is first written;
 * then they move to a staging file (one per tensor) in a staging directory
 * beside the output. At unmount the tree becomes a catalog whose tensors
 * point either at the source or at staging files, and the writer chosen at
 * mount (fs->writer) serializes it atomically. Nothing is held whole in memory, and no
 * fd is held per staged file: a file's staging fd is open only while the
 * file is (bs_entry.fd), other uses open it for the call.
 *
 * The model (which bytes, dtype, shape) is the core's editable catalog
 * (core/edit.h); this file does the staging I/O. Locks: see fs_ops.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "burnstore/writers.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/stage_index.h"
#include "fs.h"

/* fs->staging is a template ending in XXXXXX until the directory exists:
 * mkdtemp makes a fresh one (never one another daemon uses, whatever PIDs
 * are reused), and an flock on its "lock" file, held until the daemon exits,
 * tells `burnstore --finish` and other daemons that it is alive. */
static int staging_try(struct fs *fs)
{
  if (!mkdtemp(fs->staging))
    return -errno;
  int fd = open(fs->staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int lk = openat(fd, BS_STAGE_LOCK_NAME, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  struct stat held, now;
  /* Another daemon removing dead daemons' empty staging directories
   * (fs_run_sweep_staging) may take or remove this one between the create
   * and the lock: then try a new one. */
  bool ok = lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) == 0 && fstat(lk, &held) == 0 &&
            fstatat(fd, BS_STAGE_LOCK_NAME, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
            held.st_ino == now.st_ino;
  if (!ok) {
    int e = lk >= 0 ? EAGAIN : errno;
    if (lk >= 0)
      close(lk);
    unlinkat(fd, BS_STAGE_LOCK_NAME, 0);
    close(fd);
    rmdir(fs->staging);
    return -e;
  }
  fs->staging_fd = fd;
  fs->staging_lock = lk;
  return 0;
}

int fs_staging_create(struct fs *fs)
{
  if (fs->staging_fd >= 0)
    return 0;
  size_t len = strlen(fs->staging);
  if (len < 6)
    return -EINVAL;
  int rc = -EAGAIN;
  for (int tries = 0; rc == -EAGAIN && tries < 5; tries++) {
    memcpy(fs->staging + len - 6, "XXXXXX", 6);
    rc = staging_try(fs);
  }
  return rc;
}

static void stage_name(const struct bs_entry *e, char *name, size_t n)
{
  snprintf(name, n, "%llu", (unsigned long long)e->stage);
}

int fs_stage(struct fs *fs, struct bs_entry *e, uint64_t keep)
{
  pthread_mutex_lock(&fs->stage_lock);
  int rc = fs_staging_create(fs);
  unsigned long id = ++fs->next_stage;
  int dirfd = fs->staging_fd;
  pthread_mutex_unlock(&fs->stage_lock);
  if (rc)
    return rc;
  char name[32];
  snprintf(name, sizeof name, "%lu", id);
  int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return -errno;
  /* Copy the clean bytes we keep, in chunks (never the whole tensor). Only
   * this file's lock is held: other files stay readable meanwhile. */
  const struct bs_tensor *t = e->stage == 0 ? bs_entry_origin(&fs->edit, e) : NULL;
  if (t && keep > e->size)
    keep = e->size;
  if (t && keep) {
    enum { CHUNK = 1 << 20 };
    char *buf = bs_malloc(CHUNK);
    if (!buf) {
      close(fd);
      unlinkat(dirfd, name, 0);
      return -ENOMEM;
    }
    for (uint64_t off = 0; off < keep;) {
      size_t n = keep - off < CHUNK ? (size_t)(keep - off) : CHUNK;
      long r = bs_tensor_read(&fs->cat, t, off, buf, n);
      if (r <= 0 || pwrite(fd, buf, (size_t)r, (off_t)off) != r) {
        int err = r < 0 ? (int)-r : errno ? errno : EIO;
        bs_free(buf);
        close(fd);
        unlinkat(dirfd, name, 0);
        return -err;
      }
      off += (uint64_t)r;
    }
    bs_free(buf);
  }
  e->stage = id;
  e->size = t ? keep : 0;
  if (e->nopen > 0) {
    if (e->fd >= 0)
      close(e->fd);
    e->fd = fd;
  } else {
    close(fd);
  }
  return 0;
}

int fs_stage_open(struct fs *fs, const struct bs_entry *e, int flags)
{
  char name[32];
  stage_name(e, name, sizeof name);
  int fd = openat(fs->staging_fd, name, flags | O_CLOEXEC);
  return fd < 0 ? -errno : fd;
}

void fs_stage_free(struct fs *fs, struct bs_entry *e)
{
  if (e->fd >= 0) {
    close(e->fd);
    e->fd = -1;
  }
  if (e->stage) {
    char name[32];
    stage_name(e, name, sizeof name);
    if (unlinkat(fs->staging_fd, name, 0) != 0)
      fuse_log(FUSE_LOG_ERR, "burnstore: %s/%s: cannot remove: %s\n", fs->staging, name,
               strerror(errno));
  }
  bs_entry_drop(&fs->edit, e);
}

void fs_raise_nofile(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      fuse_log(FUSE_LOG_WARNING, "burnstore: cannot raise RLIMIT_NOFILE: %s\n", strerror(errno));
  }
}

void fs_staging_remove(struct fs *fs)
{
  /* Only a directory this daemon created and still holds the lock of. */
  if (fs->staging_fd < 0 || fs->staging_lock < 0)
    return;
  bs_stage_dir_remove(fs->staging_fd, fs->staging);
  close(fs->staging_fd);
  fs->staging_fd = -1;
  close(fs->staging_lock);
  fs->staging_lock = -1;
}

/* What the INDEX says besides the catalog: target, pid, checkpoint. */
static int index_head(struct fs *fs, struct bs_stage_index *idx, bs_err *err)
{
  bs_stage_index_init(idx);
  idx->pid = (long)getpid();
  idx->target = fs->output;
  idx->format = fs->writer->format;
  idx->max_shard_size = fs->wopts.max_shard_size;
  idx->ncksrcs = fs->cat.nsrcs;
  if (fs->cat.nsrcs) {
    struct stat st;
    if (fs->cat.srcs[0].fd < 0 || fstat(fs->cat.srcs[0].fd, &st) != 0)
      return bs_fail(err, EIO, BS_OFF_NONE, NULL, "%s: cannot stat the checkpoint", fs->source);
    idx->ck.path = fs->source;
    idx->ck.size = (uint64_t)st.st_size;
    idx->ck.dev = (uint64_t)st.st_dev;
    idx->ck.ino = (uint64_t)st.st_ino;
    idx->ck.mtime_sec = (int64_t)st.st_mtim.tv_sec;
    idx->ck.mtime_nsec = st.st_mtim.tv_nsec;
  }
  return 0;
}

/* Serialize and save the INDEX (the borrowed fields of idx are not freed). */
static int save_index(struct fs *fs, struct bs_stage_index *idx, const struct bs_catalog *out,
                      bs_err *err)
{
  struct bs_buf buf = {0};
  int rc = bs_stage_index_format(idx, out, fs->staging, &buf, err);
  if (rc == 0)
    rc = bs_stage_index_save(fs->staging_fd, &buf, err);
  bs_buf_destroy(&buf);
  return rc;
}

/* When the output catalog cannot be built (a file is inconsistent), an INDEX
 * marked incomplete still names every staged file (key, dtype, shape), so a
 * user can recover the bytes by hand; --finish refuses it. It walks the
 * tree, not the output catalog, which stops at the first bad file. */
static void write_staging_index(struct fs *fs, const char *why)
{
  if (fs->staging_fd < 0)
    return;
  bs_err err;
  bs_err_clear(&err);
  struct bs_stage_index idx;
  if (index_head(fs, &idx, &err) != 0)
    return;
  idx.ncksrcs = 0;
  idx.incomplete = (char *)why;
  size_t cap = 0;
  for (uint64_t ino = BS_TREE_ROOT; ino < fs->tree.n; ino++) {
    const struct bs_node *nd = &fs->tree.nodes[ino];
    const struct bs_entry *e = nd->user;
    if (!nd->live || nd->is_dir || !e || !e->stage)
      continue;
    if (bs_grow((void **)&idx.files, &cap, idx.nfiles + 1, sizeof *idx.files) != 0)
      break;
    struct bs_stage_file *sf = &idx.files[idx.nfiles];
    struct bs_eff eff;
    bs_entry_effective(&fs->edit, e, &eff);
    char name[32];
    stage_name(e, name, sizeof name);
    sf->file = bs_strdup(name);
    sf->key = bs_tree_key(&fs->tree, ino, fs->flat);
    if (!sf->key)
      sf->key = bs_strdup(nd->name);
    sf->dtype = eff.dtype;
    /* "-" (not set: 1-D if the size allows) unless explicit or the origin's. */
    sf->has_shape = !eff.shape_inferred;
    sf->rank = eff.shape_inferred ? 0 : eff.rank;
    sf->shape = eff.shape_inferred ? NULL : (uint64_t *)eff.shape; /* borrowed, never freed */
    if (!sf->file || !sf->key) { /* out of memory: list the files so far */
      bs_free(sf->file);
      bs_free(sf->key);
      break;
    }
    idx.nfiles++;
  }
  (void)save_index(fs, &idx, NULL, &err);
  for (size_t i = 0; i < idx.nfiles; i++) {
    bs_free(idx.files[i].file);
    bs_free(idx.files[i].key);
  }
  bs_free(idx.files);
}

int fs_writeback(struct fs *fs, bs_err *err)
{
  struct bs_catalog out;
  bs_catalog_init(&out);
  out.format = fs->writer->format;
  int rc = -1;
  bool built = false;
  bs_free(fs->report);
  fs->report = NULL;
  /* A filter on a checkpoint written back in place restricts the view; it
   * never deletes what it hides. An extraction writes what the mount shows. */
  bool keep_hidden = fs->cat.format != BS_FMT_NONE && !fs->force_write;
  if (bs_edit_catalog(&fs->edit, fs->staging, keep_hidden, &out, err) != 0)
    goto out;
  if (fs->writer->default_meta && fs->writer->default_meta(&out, err) != 0)
    goto out;
  built = true;
  /* The INDEX, on disk and fsynced before the writer starts: a daemon
   * killed from here on leaves a staging directory `burnstore --finish`
   * completes. An INDEX that cannot be saved fails the write-back. */
  int sc = fs_staging_create(fs);
  if (sc != 0) {
    bs_fail(err, -sc, BS_OFF_NONE, NULL, "cannot create the staging directory for the INDEX: %s",
            strerror(-sc));
    goto out;
  }
  struct bs_stage_index sidx;
  if (index_head(fs, &sidx, err) != 0 || save_index(fs, &sidx, &out, err) != 0)
    goto out;
  rc = bs_writer_write_file_opts(fs->writer, &out, fs->output, &fs->wopts, err);
  if (rc == 0 && out.notes)
    fs->report = out.notes, out.notes = NULL;
out:
  if (rc != 0 && !built) {
    char line[700];
    write_staging_index(fs, bs_err_format(err, NULL, line, sizeof line));
  }
  bs_catalog_destroy(&out);
  return rc;
}
