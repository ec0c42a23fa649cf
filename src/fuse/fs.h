/* The FUSE layer's session state. Ops translate kernel requests into core
 * calls (catalog, tree, writer); they hold no format knowledge. */
#ifndef BURNSTORE_FS_H
#define BURNSTORE_FS_H

#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 12)
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

#include "core/catalog.h"
#include "core/edit.h"
#include "core/keys.h"
#include "core/layout.h"
#include "core/tree.h"
#include "formats/writers.h"
#include "policy/xattr.h"

struct fs {
  struct bs_catalog cat; /* the source checkpoint (empty for a new file) */
  struct bs_tree tree;   /* lock: `lock` (writable mounts change it) */
  struct bs_edit edit;   /* root metadata (lock: the root entry's); writable
                            mounts: an entry per node (lock: the entry's) */
  struct bs_keyopts keys;
  bool flat;
  bool writable;
  bool writeback; /* the kernel's write-back cache is on (set at init) */
  /* fs_io.c: the session's I/O is ours (writable mounts), and the INIT
   * reply asks for FUSE_HANDLE_KILLPRIV_V2: then the daemon drops set-id
   * bits on truncation and chown too (killpriv, set once INIT is answered). */
  bool custom_io;
  atomic_bool killpriv_pending;
  atomic_bool killpriv;
  /* Write-back cache: a WRITE that failed (ENOSPC...) is reported to the
   * writer by failing the next GETATTR of that file once, which the kernel
   * sends from write(2) when the attributes expire (1 s). Else a writer
   * that never closes (dd without count=) would fill the page cache
   * forever, as the kernel only records the error on the mapping. */
  _Atomic int wb_error;
  _Atomic fuse_ino_t wb_error_ino;
  unsigned max_read;          /* -o max_read= (direct_io sets one), 0: libfuse's */
  bool direct_io;             /* -o direct_io (read-only): files opened FOPEN_DIRECT_IO */
  bool unvalidated;           /* a URL source read without a strong ETag (-o unvalidated) */
  unsigned readahead_kb;      /* -o readahead= (a URL's default: 1024), 0: the kernel's */
  unsigned max_background;    /* the kernel's READs in flight at once (a URL's: 48), 0: 12 */
  bool readahead_given;       /* -o readahead= was given (a failure to apply it is logged) */
  char bdi[32];               /* the mount's "MAJOR:MINOR" (serve), "" if not found */
  atomic_bool readahead_done; /* fs_readahead_apply ran */
  _Atomic bool dirty;         /* something changed since mount */
  bool force_write;           /* output= differs from source: always write */
  char *source;               /* absolute path of SOURCE */
  char *output;               /* absolute path written back, NULL when read-only */
  char *staging;              /* staging directory (mkdtemp'd at mount) */
  int staging_fd;             /* lock: `stage_lock`; -1 until created */
  int staging_lock;           /* flock'd "lock" file inside staging, held for life */
  char *report;               /* owned: the last write-back's report lines, or NULL */
  struct bs_journal *journal; /* owned: the staging journal (edit.journal), or NULL */
  int journal_sync_err;       /* the journal's first failed fdatasync (errno), once stopped */
  bool nojournal;             /* -o nojournal */
  unsigned long next_stage;   /* lock: `stage_lock` */
  struct timespec mtime;      /* timestamps of the read-only view */
  /* -o uid=, gid= (default: the mounting user's); the modes of SOURCE's
   * files and directories: its own less umask= (fs_prepare.c) */
  struct bs_owner owner;
  double timeout;             /* entry/attr cache timeout */
  pthread_rwlock_t lock;      /* the tree lock: names only (fs_ops.c) */
  pthread_mutex_t stage_lock; /* staging directory and ids */

  /* The output's format, chosen at mount from output's extension; NULL when read-only. */
  const struct bs_writer *writer;
  struct bs_write_opts wopts; /* -o max_shard_size= */
  bool *fixed;        /* owned, NULL: none. Per catalog tensor: a rewrite in place keeps it where
                         it is (writer->in_place_ok), so it is neither removed nor renamed */
  bool has_output_as; /* -o output_as=: the dtype floats are written as */
  enum bs_dtype output_as;
  struct bs_xa_mount xa; /* the xattr table's view of the mount (fs_xattr.c) */

  /* The .npy views (fs_npy.c, fs_views.h): -o npy / npy=only. */
  int npy_mode;       /* FS_NPY_OFF, FS_NPY_BOTH, FS_NPY_ONLY */
  uint32_t *npy_hlen; /* per ino: its header's length if the node is a .npy view, else 0;
                         NULL without views. Built once at mount */
  size_t npy_n;       /* entries in npy_hlen */

  /* The one-file view (fs_view.c, fs_views.h): -o view=. */
  struct bs_layout view; /* the plan of its bytes; empty without a view */
  uint64_t view_ino;     /* its node; 0: no view */
  char *view_omitted;    /* owned: what it leaves out of the source, a line each; NULL: nothing */
};
enum { FS_NPY_OFF, FS_NPY_BOTH, FS_NPY_ONLY };

static inline struct fs *fs_data(fuse_req_t req)
{
  return fuse_req_userdata(req);
}

extern const struct fuse_lowlevel_ops fs_ops;

/* A node as one op sees it, looked up under the tree lock (fs_ops.c). The
 * entry pointer stays valid until unmount (entries are never freed while
 * mounted), so it is used after the tree lock is let go. */
struct fs_ref {
  bool is_dir, live;
  long tensor;        /* read-only mounts: the catalog tensor, or -1 */
  struct bs_entry *e; /* writable mounts: the node's entry */
};
/* 0, or ENOENT. Takes and releases the tree lock. */
int fs_ref_get(struct fs *fs, fuse_ino_t ino, struct fs_ref *r);
void fs_mark_dirty(struct fs *fs);

/* The xattr ops (fs_xattr.c). init after the editable catalog (it prepares
 * the writer's metadata rules once); destroy is safe on a zeroed fs. */
int fs_xattr_init(struct fs *fs, bs_err *err);
void fs_xattr_destroy(struct fs *fs);
void fs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void fs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void fs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                    size_t size, int flags);
void fs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

/* Writable mounts (fs_write.c). The caller holds e->lock for writing. */
/* Make e's bytes live in a staging file, copying the first `keep` bytes of
 * its clean data. Returns 0 or -errno. */
int fs_stage(struct fs *fs, struct bs_entry *e, uint64_t keep);
/* Open e's staging file (flags O_RDONLY / O_RDWR). Returns an fd or -errno. */
int fs_stage_open(struct fs *fs, const struct bs_entry *e, int flags);
/* Free an unlinked entry nobody has open: remove its staging file. */
void fs_stage_free(struct fs *fs, struct bs_entry *e);
/* Raise the soft RLIMIT_NOFILE to the hard limit. */
void fs_raise_nofile(void);
/* Serialize the tree to fs->output (atomic) through the core's write-back
 * (core/writeback.h: output catalog, INDEX, writer). Returns 0, or -1 with
 * err set; on failure the staged data is kept for `burnstore --finish`. */
int fs_writeback(struct fs *fs, bs_err *err);

/* fs_io.c: the session's /dev/fuse I/O, after fuse_session_mount: 0, or -1
 * (libfuse's own I/O stays). fs_io_init, from op_init, arms the INIT
 * reply's FUSE_HANDLE_KILLPRIV_V2. */
int fs_io_begin(struct fuse_session *se, struct fs *fs);
void fs_io_init(struct fs *fs, const struct fuse_conn_info *conn);
/* Start the staging journal (unless -o nojournal); a failure is printed and
 * the mount goes on without one. fs_journal_stop syncs and closes it. */
void fs_journal_start(struct fs *fs);
void fs_journal_stop(struct fs *fs);
/* The line a write-back reports when the journal stopped being durable
 * while mounted (into buf), or NULL. */
const char *fs_journal_note(const struct fs *fs, char *buf, size_t n);
/* Create the staging directory exclusively from the template in
 * fs->staging (mkdtemp) and lock it for the life of the daemon. 0 or -errno. */
int fs_staging_create(struct fs *fs);
/* Remove the staging directory and its files (after a successful write);
 * only the one this daemon created and holds the lock of. */
void fs_staging_remove(struct fs *fs);

/* After a failed mount by a user other than root (fs_mount_diag.c): the
 * cause, in one line into out, if it is /dev/fuse's mode, fusermount3 not
 * setuid root, or allow_other/allow_root (in the FUSE option string `opts`)
 * without user_allow_other in /etc/fuse.conf. false (out "") otherwise. */
bool fs_mount_diagnose(const char *opts, char *out, size_t n);

/* Write fs->readahead_kb to the mount's bdi once (the first call: op_open,
 * after the kernel took the INIT reply); a failure is logged when the
 * option was given. */
void fs_readahead_apply(struct fs *fs);
/* readahead=KIB of a local SOURCE: say in one line when the daemon's reads
 * of that size cannot be spliced here (pipe-max-size), and what can. */
void fs_readahead_warn(unsigned kib);

/* Writable mounts (fs_stop.c): from just before the session loop until just
 * after it, SIGTERM, SIGINT and SIGHUP flush and unmount the mount while
 * the loop serves (the kernel then ends the loop), instead of ending the
 * loop at once. Call begin in the process that runs the loop (after
 * fuse_daemonize). 0, or -1 (libfuse's handlers stay). */
int fs_stop_begin(struct fuse_session *se, const char *mnt);
void fs_stop_end(void);

#endif
