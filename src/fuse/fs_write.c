/* Writable mounts: staging on disk and the write-back on unmount.
 *
 * A file's bytes stay in the source checkpoint until it is first written;
 * then they move to a staging file (one per tensor) in a staging directory
 * beside the output. At unmount the tree becomes a catalog whose tensors
 * point either at the source or at staging files, and the core's Burnpack
 * writer serializes it atomically. Nothing is held whole in memory, and no
 * fd is held per staged file: a file's staging fd is open only while the
 * file is (bs_entry.fd), other uses open it for the call.
 *
 * The model (which bytes, dtype, shape) is the core's editable catalog
 * (burnstore/edit.h); this file does the staging I/O. Locks: see fs_ops.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "burnstore/alloc.h"
#include "burnstore/bpk_write.h"
#include "fs.h"

static int ensure_staging(struct fs *fs)
{
  if (fs->staging_fd >= 0)
    return 0;
  if (mkdir(fs->staging, 0700) != 0 && errno != EEXIST)
    return -errno;
  int fd = open(fs->staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  fs->staging_fd = fd;
  return 0;
}

static void stage_name(const struct bs_entry *e, char *name, size_t n)
{
  snprintf(name, n, "%llu", (unsigned long long)e->stage);
}

int fs_stage(struct fs *fs, struct bs_entry *e, uint64_t keep)
{
  pthread_mutex_lock(&fs->stage_lock);
  int rc = ensure_staging(fs);
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
  if (fs->staging_fd < 0)
    return;
  DIR *d = fdopendir(dup(fs->staging_fd));
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
      if (de->d_name[0] != '.')
        unlinkat(fs->staging_fd, de->d_name, 0);
    closedir(d);
  }
  close(fs->staging_fd);
  fs->staging_fd = -1;
  rmdir(fs->staging);
}

/* An index of the staging directory so that a user can recover data by
 * hand after a failed write-back: staging file, key, dtype, shape. It walks
 * the tree, not the output catalog, which stops at the first bad file. */
static void write_staging_index(struct fs *fs)
{
  if (fs->staging_fd < 0)
    return;
  int fd = openat(fs->staging_fd, "INDEX", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return;
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    return;
  }
  fprintf(f, "# staging file <TAB> key <TAB> dtype <TAB> shape (burnstore write-back)\n");
  for (uint64_t ino = BS_TREE_ROOT; ino < fs->tree.n; ino++) {
    const struct bs_node *nd = &fs->tree.nodes[ino];
    const struct bs_entry *e = nd->user;
    if (!nd->live || nd->is_dir || !e || !e->stage)
      continue;
    char *key = bs_tree_key(&fs->tree, ino, fs->flat);
    struct bs_eff eff;
    bs_entry_effective(&fs->edit, e, &eff);
    char *shape = eff.shape_inferred ? NULL : bs_shape_json(eff.rank, eff.shape);
    /* "-": not set, 1-D if the size allows. */
    fprintf(f, "%llu\t%s\t%s\t%s\n", (unsigned long long)e->stage, key ? key : nd->name,
            bs_dtype_name(eff.dtype), shape ? shape : "-");
    bs_free(shape);
    bs_free(key);
  }
  fclose(f);
}

int fs_writeback(struct fs *fs, bs_err *err)
{
  struct bs_catalog out;
  bs_catalog_init(&out);
  out.format = BS_FMT_BURNPACK;
  int rc = -1;
  /* A filter on a checkpoint written back in place restricts the view; it
   * never deletes what it hides. An extraction writes what the mount shows. */
  bool keep_hidden = fs->cat.format != BS_FMT_NONE && !fs->force_write;
  if (bs_edit_catalog(&fs->edit, fs->staging, keep_hidden, &out, err) != 0)
    goto out;
  if (bs_bpk_default_meta(&out, err) != 0)
    goto out;
  rc = bs_bpk_write_file(&out, NULL, fs->output, err);
out:
  if (rc != 0)
    write_staging_index(fs);
  bs_catalog_destroy(&out);
  return rc;
}
