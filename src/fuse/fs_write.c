/* Writable mounts: staging on disk and the write-back on unmount.
 *
 * A file's bytes stay in the source checkpoint until it is first written;
 * then they move to a staging file (one per tensor) in a staging directory
 * beside the output. At unmount the tree becomes a catalog whose tensors
 * point either at the source or at staging files, and the writer chosen at
 * mount (fs->writer) serializes it atomically. Nothing is held whole in memory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "burnstore/alloc.h"
#include "burnstore/bpk_write.h"
#include "burnstore/checked.h"
#include "burnstore/stage_index.h"
#include "burnstore/writers.h"
#include "fs.h"

struct fs_file *fs_file_new(long tensor, uint64_t size, mode_t mode)
{
  struct fs_file *f = bs_calloc(1, sizeof *f);
  if (!f)
    return NULL;
  f->tensor = tensor;
  f->fd = -1;
  f->size = size;
  f->mode = mode;
  return f;
}

void fs_file_free(struct fs_file *f)
{
  if (!f)
    return;
  if (f->fd >= 0)
    close(f->fd);
  bs_free(f->shape);
  for (size_t i = 0; i < f->nxattrs; i++) {
    bs_free(f->xattrs[i].name);
    bs_free(f->xattrs[i].value);
  }
  bs_free(f->xattrs);
  bs_free(f);
}

/* fs->staging is a template ending in XXXXXX until the directory exists:
 * mkdtemp makes a fresh one (never one another daemon uses, whatever PIDs
 * are reused), and an flock on its "lock" file, held until the daemon exits,
 * tells `burnstore --finish` and other daemons that it is alive. */
int fs_staging_create(struct fs *fs)
{
  if (fs->staging_fd >= 0)
    return 0;
  if (!mkdtemp(fs->staging))
    return -errno;
  int fd = open(fs->staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int lk = openat(fd, BS_STAGE_LOCK_NAME, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (lk < 0 || flock(lk, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
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

static int ensure_staging(struct fs *fs)
{
  return fs_staging_create(fs);
}

int fs_stage(struct fs *fs, struct fs_file *f, uint64_t keep)
{
  int rc = ensure_staging(fs);
  if (rc)
    return rc;
  unsigned long id = ++fs->next_stage;
  char name[32];
  snprintf(name, sizeof name, "%lu", id);
  int fd = openat(fs->staging_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return -errno;
  /* Copy the clean bytes we keep, in chunks (never the whole tensor). */
  const struct bs_tensor *t =
      f->tensor >= 0 && (size_t)f->tensor < fs->cat.count ? &fs->cat.tensors[f->tensor] : NULL;
  if (t && keep > f->size)
    keep = f->size;
  if (t && keep) {
    enum { CHUNK = 1 << 20 };
    char *buf = bs_malloc(CHUNK);
    if (!buf) {
      close(fd);
      return -ENOMEM;
    }
    for (uint64_t off = 0; off < keep;) {
      size_t n = keep - off < CHUNK ? (size_t)(keep - off) : CHUNK;
      long r = bs_tensor_read(&fs->cat, t, off, buf, n);
      if (r <= 0 || pwrite(fd, buf, (size_t)r, (off_t)off) != r) {
        int e = r < 0 ? (int)-r : errno ? errno : EIO;
        bs_free(buf);
        close(fd);
        unlinkat(fs->staging_fd, name, 0);
        return -e;
      }
      off += (uint64_t)r;
    }
    bs_free(buf);
  }
  f->fd = fd;
  f->stage_id = id;
  f->size = t ? keep : 0;
  f->tensor = -1;
  if (t && !f->has_dtype) {
    /* The file keeps the source tensor's dtype and shape unless told otherwise. */
    f->dtype = t->dtype;
    f->has_dtype = t->dtype != BS_DT_QFLOAT;
    if (!f->has_shape && t->rank) {
      f->shape = bs_malloc(t->rank * sizeof *f->shape);
      if (f->shape) {
        memcpy(f->shape, t->shape, t->rank * sizeof *f->shape);
        f->rank = t->rank;
        f->has_shape = true;
      }
    } else if (!f->has_shape) {
      f->rank = 0;
      f->has_shape = true;
    }
    if (!f->has_param_id && t->has_param_id) {
      f->has_param_id = true;
      f->param_id = t->param_id;
    }
  }
  return 0;
}

void fs_staging_remove(struct fs *fs)
{
  /* Only a directory this daemon created and still holds the lock of. */
  if (fs->staging_fd < 0 || fs->staging_lock < 0)
    return;
  /* The INDEX goes first: a staging directory without one is never
   * finished, so a kill during this cleanup cannot redo the write. */
  unlinkat(fs->staging_fd, BS_STAGE_INDEX_NAME, 0);
  DIR *d = fdopendir(dup(fs->staging_fd));
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
      if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0 &&
          strcmp(de->d_name, BS_STAGE_LOCK_NAME) != 0)
        unlinkat(fs->staging_fd, de->d_name, 0);
    closedir(d);
  }
  /* The lock file goes last, while we still hold it. */
  unlinkat(fs->staging_fd, BS_STAGE_LOCK_NAME, 0);
  close(fs->staging_fd);
  fs->staging_fd = -1;
  rmdir(fs->staging);
  close(fs->staging_lock);
  fs->staging_lock = -1;
}

/* What the INDEX says besides the catalog: target, pid, checkpoint. */
static int index_head(struct fs *fs, struct bs_stage_index *idx, bs_err *err)
{
  bs_stage_index_init(idx);
  idx->pid = (long)getpid();
  idx->target = fs->output;
  idx->format = BS_FMT_BURNPACK;
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
    const struct fs_file *ff = nd->user;
    if (!nd->live || nd->is_dir || !ff || ff->fd < 0)
      continue;
    if (bs_grow((void **)&idx.files, &cap, idx.nfiles + 1, sizeof *idx.files) != 0)
      break;
    struct bs_stage_file *sf = &idx.files[idx.nfiles];
    char name[32];
    snprintf(name, sizeof name, "%lu", ff->stage_id);
    sf->file = bs_strdup(name);
    sf->key = bs_tree_key(&fs->tree, ino, fs->flat);
    if (!sf->key)
      sf->key = bs_strdup(nd->name);
    sf->dtype = ff->has_dtype ? ff->dtype : BS_DT_U8;
    sf->has_shape = ff->has_shape;
    sf->rank = ff->rank;
    sf->shape = ff->shape; /* borrowed */
    idx.nfiles++;
    if (!sf->file || !sf->key)
      break;
  }
  (void)save_index(fs, &idx, NULL, &err);
  for (size_t i = 0; i < idx.nfiles; i++) {
    bs_free(idx.files[i].file);
    bs_free(idx.files[i].key);
  }
  bs_free(idx.files);
}

/* Append the file node `ino` as a tensor of `out`. */
static int add_file(struct fs *fs, struct bs_catalog *out, uint64_t ino, bs_err *err)
{
  const struct bs_node *nd = &fs->tree.nodes[ino];
  const struct fs_file *f = nd->user;
  char *key = bs_tree_key(&fs->tree, ino, fs->flat);
  if (!key)
    return bs_fail(err, errno == ENOMEM ? ENOMEM : EINVAL, BS_OFF_NONE, nd->name,
                   "cannot turn the file name into a key");
  /* No include/exclude here: the tree holds only what the mount shows, and
   * files the user created or renamed are written whatever their name. */
  const struct bs_tensor *src =
      f->tensor >= 0 && (size_t)f->tensor < fs->cat.count ? &fs->cat.tensors[f->tensor] : NULL;
  enum bs_dtype dt = f->has_dtype ? f->dtype : src ? src->dtype : BS_DT_U8;
  uint32_t rank;
  const uint64_t *shape;
  uint64_t dim0;
  if (f->has_shape) {
    rank = f->rank;
    shape = f->shape;
  } else if (src && dt == src->dtype) {
    rank = src->rank;
    shape = src->shape;
  } else {
    unsigned bits = bs_dtype_bits(dt);
    uint64_t bytes = bits >= 8 ? bits / 8 : 1;
    if (f->size % bytes != 0) {
      int rc = bs_fail(err, EINVAL, BS_OFF_NONE, key,
                       "size %llu bytes is not a whole number of %s elements (%llu bytes each)",
                       (unsigned long long)f->size, bs_dtype_name(dt), (unsigned long long)bytes);
      bs_free(key);
      return rc;
    }
    dim0 = f->size / bytes;
    rank = 1;
    shape = &dim0;
  }
  if (!f->has_dtype && !src) {
    /* Report hook: a file without user.burnstore.dtype (copied without
     * xattrs) is written as raw bytes; the write-back report names it. */
    char line[BS_MAX_KEY_LEN + 160];
    snprintf(line, sizeof line,
             "%s: no user.burnstore.dtype (copied without xattrs?): written as U8 [%llu]", key,
             (unsigned long long)f->size);
    if (bs_catalog_note(out, line, err) != 0) {
      bs_free(key);
      return -1;
    }
  }
  bs_err sub;
  bs_err_clear(&sub);
  struct bs_tensor *t = bs_catalog_add(out, key, dt, rank, shape, BS_OFF_NONE, &sub);
  if (!t) {
    int rc = bs_fail(err, sub.code, BS_OFF_NONE, key, "%s", sub.msg);
    bs_free(key);
    return rc;
  }
  bs_free(key);
  if (f->fd >= 0) {
    uint32_t idx;
    struct bs_src s;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%lu", fs->staging, f->stage_id);
    if (bs_src_init_fd(&s, f->fd, false, path, err) != 0 ||
        bs_catalog_add_src(out, &s, &idx, err) != 0)
      return -1;
    t = &out->tensors[out->count - 1];
    t->src = idx;
    t->off = 0;
    if (dt == BS_DT_QFLOAT)
      t->nbytes = f->size;
  } else if (src) {
    t->src = src->src;
    t->off = src->off;
    t->storage_off = src->storage_off;
    t->storage_bytes = src->storage_bytes;
    if (src->strides) {
      t->strides = bs_malloc(src->rank * sizeof *t->strides);
      if (!t->strides)
        return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
      memcpy(t->strides, src->strides, src->rank * sizeof *t->strides);
    }
    if (src->dtype_raw && dt == src->dtype) {
      t->dtype_raw = bs_malloc(src->dtype_raw_len);
      if (!t->dtype_raw)
        return bs_fail(err, ENOMEM, BS_OFF_NONE, t->name, "out of memory");
      memcpy(t->dtype_raw, src->dtype_raw, src->dtype_raw_len);
      t->dtype_raw_len = src->dtype_raw_len;
    }
    if (dt == BS_DT_QFLOAT)
      t->nbytes = src->nbytes;
    if (src->unsupported)
      return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name, "cannot be written: %s", src->unsupported);
  } else {
    t->src = UINT32_MAX; /* an empty new file: no bytes to read */
  }
  if (t->nbytes != f->size)
    return bs_fail(err, EINVAL, BS_OFF_NONE, t->name,
                   "file size %llu bytes does not match its shape x %s = %llu bytes (set "
                   "user.burnstore.shape / user.burnstore.dtype to match the data)",
                   (unsigned long long)f->size, bs_dtype_name(dt), (unsigned long long)t->nbytes);
  if (f->has_param_id) {
    t->has_param_id = true;
    t->param_id = f->param_id;
  } else if (src && src->has_param_id) {
    t->has_param_id = true;
    t->param_id = src->param_id;
  }
  return 0;
}

static int add_dir(struct fs *fs, struct bs_catalog *out, uint64_t dir, unsigned depth, bs_err *err)
{
  if (depth > 4096)
    return bs_fail(err, ELOOP, BS_OFF_NONE, NULL, "directory tree too deep");
  const struct bs_node *nd = &fs->tree.nodes[dir];
  for (size_t i = 0; i < nd->nkids; i++) {
    uint64_t kid = fs->tree.nodes[dir].kids[i];
    if (!kid)
      continue;
    const struct bs_node *kn = &fs->tree.nodes[kid];
    int rc = kn->is_dir ? add_dir(fs, out, kid, depth + 1, err) : add_file(fs, out, kid, err);
    if (rc)
      return rc;
  }
  return 0;
}

static int cmp_name(const void *a, const void *b)
{
  const struct bs_tensor *x = *(const struct bs_tensor *const *)a;
  const struct bs_tensor *y = *(const struct bs_tensor *const *)b;
  return strcmp(x->name, y->name);
}

/* Two files whose paths give the same key (a/b.c and a/b/c) would collide. */
static int check_duplicates(const struct bs_catalog *out, bs_err *err)
{
  size_t n = out->count;
  if (n < 2)
    return 0;
  const struct bs_tensor **v = bs_malloc(n * sizeof *v);
  if (!v)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < n; i++)
    v[i] = &out->tensors[i];
  qsort(v, n, sizeof *v, cmp_name);
  int rc = 0;
  for (size_t i = 1; i < n && !rc; i++)
    if (strcmp(v[i - 1]->name, v[i]->name) == 0)
      rc = bs_fail(err, EEXIST, BS_OFF_NONE, v[i]->name,
                   "two files give the same key (a dot in a file name splits like a '/': "
                   "rename one of them)");
  bs_free(v);
  return rc;
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
  /* The source's byte sources, borrowed, at the same indices, so clean
   * tensors keep their src index. */
  for (size_t i = 0; i < fs->cat.nsrcs; i++) {
    struct bs_src s;
    uint32_t idx;
    /* Fails if the source changed since the mount: its clean tensors
     * would be copied from changed bytes (and an rw target overwritten). */
    if (bs_src_init_borrowed(&s, &fs->cat.srcs[i], err) != 0 ||
        bs_catalog_add_src(&out, &s, &idx, err) != 0)
      goto out;
  }
  if (add_dir(fs, &out, BS_TREE_ROOT, 0, err) != 0 || check_duplicates(&out, err) != 0)
    goto out;
  for (size_t i = 0; i < fs->nmeta; i++)
    if (bs_catalog_add_meta(&out, fs->meta[i].key, fs->meta[i].value, err) != 0)
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
  rc = bs_writer_write_file(fs->writer, &out, fs->output, err);
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
