/* The views of a read-only mount beyond the plain tensor files: the .npy
 * views (fs_npy.c). Hooks for fs_ops.c, fs_prepare.c and fs_main.c. */
#ifndef BURNSTORE_FS_VIEWS_H
#define BURNSTORE_FS_VIEWS_H

#include "fs.h"

/* Add NAME.npy beside every tensor file whose dtype NumPy can hold
 * (FS_NPY_BOTH), or rename the file to it (FS_NPY_ONLY). After
 * bs_tree_build, before bs_edit_init; read-only mounts only. */
BS_NODISCARD int fs_npy_build(struct fs *fs, int mode, bs_err *err);
void fs_npy_destroy(struct fs *fs);
/* The length of node ino's .npy header if it is a view (its tensor is the
 * node's), else 0: a table lookup, on every GETATTR and READ. */
static inline uint64_t fs_npy_view_hlen(const struct fs *fs, uint64_t ino)
{
  return ino < fs->npy_n ? fs->npy_hlen[ino] : 0;
}
/* A read of the view that touches the header: header bytes, then data
 * gathered by bs_tensor_read, into *out (bs_malloc'd, *n bytes; NULL at
 * EOF). 0 or -errno. */
int fs_npy_read(const struct fs *fs, const struct bs_tensor *t, size_t size, uint64_t off,
                char **out, size_t *n);

/* The one-file view (fs_view.c): -o view=safetensors|gguf|bpk. */
/* The row of view `name` ("safetensors", "gguf", "bpk": a writer with a
 * layout, by its extension), or NULL. */
const struct bs_writer *fs_view_writer(const char *name);
/* After SOURCE is opened (read-only): prepare the catalog as convert does
 * (as: as=, or NULL), plan the file writer w writes, and make the tree: the
 * root and the view's file. 0, or -1 with err (the refusal). */
BS_NODISCARD int fs_view_build(struct fs *fs, const struct bs_writer *w, const enum bs_dtype *as,
                               bs_err *err);
void fs_view_destroy(struct fs *fs);
/* What the view leaves out, one fuse_log line each (once the log is open). */
void fs_view_log(const struct fs *fs);
static inline bool fs_view_is(const struct fs *fs, uint64_t ino)
{
  return fs->view_ino && ino == fs->view_ino;
}
/* A READ of the view's file. */
void fs_view_read(fuse_req_t req, struct fs *fs, size_t size, uint64_t off);
/* A READ of bytes [off, off + size) of tensor t, as a tensor file's (the
 * source checked, spliced, lent or read): fs_ops.c's path. */
void fs_read_tensor(fuse_req_t req, struct fs *fs, const struct bs_tensor *t, size_t size,
                    uint64_t off);
/* Whether source src of the catalog changed since the mount: then one log
 * line for that source, once (fs_ops.c). */
bool fs_src_changed(struct fs *fs, uint32_t src);

/* Write-back progress for `burnstore -u` (fs_progress.c). The daemon:
 * begin before fs_writeback (status_path: its status file), end after. The
 * waiter: wait for the daemon's lock on the status file (fd), drawing a
 * progress line when stderr is a terminal (or as mode says), from progress_fd
 * (fs_progress_open, before the unmount). */
void fs_progress_init(const char *status_path);   /* the empty file, at mount */
int fs_progress_open(const char *status_path);    /* the waiter's fd on it, or -1 */
void fs_progress_remove(const char *status_path); /* unlink it (its holder's, or a dead one's) */
void fs_progress_begin(struct fs *fs, const char *status_path);
void fs_progress_end(void);
void fs_progress_wait(int fd, int progress_fd, int mode); /* mode: BS_PROGRESS_* */

#endif
