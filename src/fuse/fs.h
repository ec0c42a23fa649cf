/* The FUSE layer's session state. Ops translate kernel requests into core
 * calls (catalog, tree, writer); they hold no format knowledge. */
#ifndef BURNSTORE_FS_H
#define BURNSTORE_FS_H

#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 12)
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

#include "burnstore/catalog.h"
#include "burnstore/keys.h"
#include "burnstore/tree.h"
#include "burnstore/writers.h"

struct fs_xattr {
  char *name;  /* owned, full name ("user.foo") */
  char *value; /* owned */
  size_t len;
};

/* A file or directory of a writable mount (bs_node.user). Clean files read
 * their bytes from the source catalog; the first write copies them to a
 * staging file on disk (never to RAM). Directories use mode/mtime only. */
struct fs_file {
  long tensor; /* source tensor still backing the bytes, or -1 */
  int fd;      /* staging file, -1 while clean */
  uint64_t size;
  bool has_dtype, has_shape, has_param_id;
  enum bs_dtype dtype;
  uint32_t rank;
  uint64_t *shape; /* owned */
  uint64_t param_id;
  struct fs_xattr *xattrs; /* owned: other user.* xattrs, kept as set */
  size_t nxattrs;
  mode_t mode;
  struct timespec mtime;
  unsigned long stage_id; /* staging file name; 0 = none */
};

struct fs {
  struct bs_catalog cat; /* the source checkpoint (empty for a new file) */
  struct bs_tree tree;   /* lock: `lock` (writable mounts change it) */
  struct bs_keyopts keys;
  bool flat;
  bool writable;
  bool dirty;               /* lock: `lock`; something changed since mount */
  bool force_write;         /* output= differs from source: always write */
  char *source;             /* absolute path of SOURCE */
  char *output;             /* absolute path written back, NULL when read-only */
  char *staging;            /* staging directory (mkdtemp template until created) */
  int staging_fd;           /* lock: `lock`; -1 until created */
  int staging_lock;         /* flock'd "lock" file inside staging, held for life */
  char *report;             /* owned: the last write-back's report lines, or NULL */
  unsigned long next_stage; /* lock: `lock` */
  struct bs_kv *meta;       /* lock: `lock`; root metadata shown and written */
  size_t nmeta, metacap;
  struct timespec mtime; /* timestamps of the read-only view */
  uid_t uid;
  gid_t gid;
  double timeout;        /* entry/attr cache timeout */
  pthread_rwlock_t lock; /* the only lock: guards tree, files, meta */

  /* The output's format, chosen at mount from output's extension; NULL when read-only. */
  const struct bs_writer *writer;
};

static inline struct fs *fs_data(fuse_req_t req)
{
  return fuse_req_userdata(req);
}

extern const struct fuse_lowlevel_ops fs_ops;

/* Writable mounts (fs_write.c). */
struct fs_file *fs_file_new(long tensor, uint64_t size, mode_t mode);
void fs_file_free(struct fs_file *f);
/* Make f's bytes live in a staging file, copying the first `keep` bytes of
 * the clean data. Caller holds the write lock. Returns 0 or -errno. */
int fs_stage(struct fs *fs, struct fs_file *f, uint64_t keep);
/* Serialize the tree to fs->output (atomic). Returns 0, or -1 with err set;
 * on failure the staged data is kept and err names where it is. */
int fs_writeback(struct fs *fs, bs_err *err);
/* Create the staging directory exclusively from the template in
 * fs->staging (mkdtemp) and lock it for the life of the daemon. 0 or -errno. */
int fs_staging_create(struct fs *fs);
/* Remove the staging directory and its files (after a successful write);
 * only the one this daemon created and holds the lock of. */
void fs_staging_remove(struct fs *fs);

#endif
