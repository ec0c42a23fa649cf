/* The xattrs of a mount: one table of the user.burnstore.* names (where each
 * exists, how it is read, set, removed and listed), plus the other user.*
 * xattrs a writable mount keeps as set. The FUSE layer looks names up here,
 * takes the locks and translates errors; it knows no name.
 *
 * The user.burnstore. namespace is reserved: a name the table does not know,
 * or one of its names where it does not exist (dtype on a directory, meta.*
 * off the root), is never stored: getxattr and removexattr answer ENODATA,
 * setxattr EPERM. A computed name (key, shard, format, values, notes) is
 * never stored either; a copy between mounts (rsync -aX, cp -a) carries it,
 * so setting it is accepted when it changes nothing: always for key and
 * format (the destination decides them: its path, its output), for the
 * others when the value is the one the mount shows or the node has none
 * (a file copied in from a sharded mount). Any other value: EPERM. */
#ifndef BURNSTORE_XATTR_H
#define BURNSTORE_XATTR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "core/edit.h"
#include "core/err.h"
#include "core/sink.h"
#include "formats/writers.h"

#define BS_XA_PREFIX "user.burnstore."
/* What one listxattr may return (Linux's XATTR_LIST_MAX): beyond it the
 * call fails with E2BIG, and with it getfattr -d and rsync -aX. */
#define BS_XA_LIST_MAX 65536u

/* A mount as the table sees it. */
struct bs_xa_mount {
  const struct bs_catalog *cat;   /* borrowed: the source */
  struct bs_edit *edit;           /* borrowed: entries (writable) and the root metadata */
  const struct bs_writer *writer; /* borrowed: the output's row; NULL: a read-only mount */
  struct bs_meta_rules *rules;    /* owned: the writer's metadata rules (bs_xa_mount_init) */
  /* The key node ino is written under (a writable mount: from its path),
   * bs_malloc'd, or NULL. The caller's: it needs the tree, which the
   * caller locks. Called without the node's entry lock (see unlocked). */
  char *(*key_of)(void *arg, uint64_t ino);
  /* Copy a clean file's bytes to staging (held: e->lock for writing):
   * 0 or an errno. */
  int (*stage)(void *arg, struct bs_entry *e);
  void *arg;
  /* -o view=: what the view's file leaves out of the source, a line each
   * (the root's "omitted"), borrowed; NULL: nothing, or no view. */
  const char *omitted;
};

/* One node as an op sees it. */
struct bs_xa_node {
  uint64_t ino;
  bool is_dir, is_root;
  long tensor;        /* read-only mounts: the source tensor, or -1 */
  struct bs_entry *e; /* writable mounts: the node's entry (the caller holds its lock) */
};

/* Prepare the writer's metadata rules once (GGUF: the source's key types),
 * so a setxattr never re-reads the source. Fields other than rules are the
 * caller's to fill. */
BS_NODISCARD int bs_xa_mount_init(struct bs_xa_mount *m, const struct bs_catalog *cat,
                                  struct bs_edit *edit, const struct bs_writer *writer,
                                  bs_err *err);
void bs_xa_mount_destroy(struct bs_xa_mount *m);

/* Does `name` read without the node's entry lock (its value comes from
 * key_of, which takes the tree lock: taking it under an entry lock would
 * invert the lock order)? */
bool bs_xa_unlocked(const char *name);

/* The value of `name` on node n, appended to out. 0, or -1 with err:
 * ENODATA (none here), E2BIG (longer than Linux lets an xattr be), ENOMEM. */
BS_NODISCARD int bs_xa_get(const struct bs_xa_mount *m, const struct bs_xa_node *n,
                           const char *name, struct bs_buf *out, bs_err *err);
/* The names node n lists, each NUL-terminated, appended to out: the names
 * a copy carries (a dtype or shape nobody set and no tensor gives is
 * answered but not listed), within BS_XA_LIST_MAX (a root with more
 * metadata lists the keys that fit, and no value over 64 KiB; every key
 * still answers getxattr, and `burnstore info --meta` prints them all). */
BS_NODISCARD int bs_xa_list(const struct bs_xa_mount *m, const struct bs_xa_node *n,
                            struct bs_buf *out, bs_err *err);
/* Set `name` (writable mounts; flags: XATTR_CREATE / XATTR_REPLACE, which
 * only the other user.* xattrs heed). *dirty: the change is one the write-back must
 * write. 0, or -1 with err: EROFS (read-only mount), EPERM (reserved, see
 * above), EINVAL (a bad value; err says why), ENOSPC (the mount's xattr
 * budget), EEXIST / ENODATA (flags), E2BIG, ENOMEM. */
BS_NODISCARD int bs_xa_set(const struct bs_xa_mount *m, const struct bs_xa_node *n,
                           const char *name, const char *value, size_t len, int flags, bool *dirty,
                           bs_err *err);
/* Remove `name`: back to inferred (dtype, shape, param_id), gone (meta.*,
 * other user.*), nothing for a computed name (rsync -X removes what its
 * source lacks). 0, or -1 with err: EROFS, ENODATA. */
BS_NODISCARD int bs_xa_remove(const struct bs_xa_mount *m, const struct bs_xa_node *n,
                              const char *name, bool *dirty, bs_err *err);

/* The table, for tests and docs: one row per name (a name ending in '.' is
 * a prefix: meta.NAME). */
enum { BS_XA_FILE = 1, BS_XA_DIR = 2, BS_XA_ROOT = 4 };
enum bs_xa_set_kind {
  BS_XA_SETTABLE, /* set and removed on writable mounts */
  BS_XA_IGNORED,  /* computed; any set accepted, nothing stored (key, format) */
  BS_XA_FIXED,    /* computed; a set that changes nothing accepted, else EPERM */
};
struct bs_xa_info {
  const char *name;
  unsigned scope; /* BS_XA_FILE | BS_XA_DIR | BS_XA_ROOT: where it exists */
  enum bs_xa_set_kind set;
};
extern const size_t bs_xa_nrows;
void bs_xa_row_info(size_t i, struct bs_xa_info *out);

#endif
