/* The editable catalog of a writable mount: what the user changed on top of
 * a source catalog, kept in the core so that the FUSE ops only translate
 * requests and the writers read one model.
 *
 * Each file or directory of the tree (bs_node.user) is a bs_entry. A file's
 * bytes are either still a tensor of the source catalog (clean) or a staged
 * file (stage != 0) in a staging directory that the caller manages; an
 * entry that has neither is empty. dtype, shape and param_id are each
 * either explicit (set by the user, has_x) or inferred: from the origin
 * tensor, else U8 and a 1-D shape by size (docs/user-guide.md, section 3).
 * bs_entry_effective is the one place that rule lives.
 *
 * No function here locks: the caller serializes access to an entry (the
 * FUSE layer holds its per-file lock) and to the tree and root metadata. */
#ifndef BURNSTORE_EDIT_H
#define BURNSTORE_EDIT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/catalog.h"
#include "core/err.h"
#include "core/tree.h"

struct bs_journal;

/* The bound on the user xattrs (names + values, every file and the root
 * metadata together) that one writable mount holds in memory. */
#define BS_EDIT_XATTR_BUDGET (64u << 20)

struct bs_xattr {
  char *name;  /* owned, full name ("user.foo") */
  char *value; /* owned */
  size_t len;
};

struct bs_entry {
  uint64_t ino; /* its node (journal records name files by it); 0: none */
  bool is_dir;
  long tensor;    /* origin: the source tensor the file came from, or -1 */
  uint64_t stage; /* the staging file holding the bytes (name "%llu"); 0: none */
  uint64_t size;  /* bytes */
  bool has_dtype, has_shape, has_param_id; /* explicit: set by the user */
  enum bs_dtype dtype;
  uint32_t rank;
  uint64_t *shape; /* owned */
  uint64_t param_id;
  struct bs_xattr *xattrs; /* owned: other user.* xattrs, kept as set */
  size_t nxattrs;
  uint32_t mode;     /* permission bits */
  uint32_t uid, gid; /* owner, for the life of the mount (chown) */
  struct timespec mtime;
  unsigned nopen;        /* open handles (the FUSE layer counts them) */
  int fd;                /* the caller's: the staging file, open while nopen > 0; else -1 */
  bool unlinked;         /* removed from the tree; staged bytes go at the last close */
  pthread_rwlock_t lock; /* the caller's per-file lock; see fs_ops.c */
};

struct bs_edit {
  const struct bs_catalog *src; /* borrowed: the source checkpoint */
  struct bs_tree *tree;         /* borrowed: names; bs_node.user is a bs_entry */
  bool flat;
  struct bs_kv *meta; /* owned: root metadata shown and written */
  size_t nmeta, metacap;
  _Atomic uint64_t xattr_bytes; /* user xattrs held (names + values) */
  uint64_t xattr_budget;        /* BS_EDIT_XATTR_BUDGET unless a test lowers it */
  struct bs_journal *journal;   /* borrowed, or NULL: where every change is appended */
};

/* Take a copy of src's metadata (read-only mounts use this much too). */
BS_NODISCARD int bs_edit_init(struct bs_edit *ed, const struct bs_catalog *src,
                              struct bs_tree *tree, bool flat, bs_err *err);
/* Who owns the files a mount shows from its source, and their permission
 * bits (directories: file_mode plus x where r is). */
struct bs_owner {
  uint32_t uid, gid;
  uint32_t file_mode, dir_mode;
};
/* Attach an entry to every live node of the tree that has none (writable),
 * owned as `own` says (NULL: uid 0, gid 0, 0644 and 0755). */
BS_NODISCARD int bs_edit_attach(struct bs_edit *ed, const struct timespec *mtime,
                                const struct bs_owner *own, bs_err *err);
/* Frees every entry (also of removed nodes) and the metadata. */
void bs_edit_destroy(struct bs_edit *ed);

struct bs_entry *bs_entry_new(long tensor, uint64_t size, bool is_dir, uint32_t mode);
void bs_entry_free(struct bs_entry *e);
/* The entry of node ino (also a removed one), or NULL. Reads the tree: the
 * caller holds whatever guards it. */
struct bs_entry *bs_edit_entry(const struct bs_edit *ed, uint64_t ino);
/* The origin tensor, or NULL. */
const struct bs_tensor *bs_entry_origin(const struct bs_edit *ed, const struct bs_entry *e);

/* A file's effective dtype and shape. shape points into the entry, the
 * origin tensor or eff->dim0. */
struct bs_eff {
  enum bs_dtype dtype;
  uint32_t rank;
  const uint64_t *shape;
  uint64_t dim0;
  bool dtype_inferred; /* not set, and no origin tensor: the U8 default */
  bool shape_inferred; /* not set, and not the origin's: 1-D by size */
  bool whole;          /* the size is a whole number of elements (1-D case) */
};
void bs_entry_effective(const struct bs_edit *ed, const struct bs_entry *e, struct bs_eff *eff);

/* A clean file whose origin is a strided view (a tensor that is not
 * contiguous in its storage): its bytes are gathered through the origin's shape, strides
 * and element width, so its dtype or shape may change only after its bytes
 * were staged (the caller stages it first; bs_edit_catalog refuses a
 * clean file whose view would no longer match). */
bool bs_entry_strided_clean(const struct bs_edit *ed, const struct bs_entry *e);

/* Setting dtype, shape and param_id from their xattr text. EINVAL for a bad
 * value (QFLOAT only on a file whose origin is QFLOAT: its scheme is kept).
 * These and the xattr and metadata setters append the change to
 * ed->journal (journal.h); ed may be NULL where no journal is kept. */
BS_NODISCARD int bs_entry_set_dtype(const struct bs_edit *ed, struct bs_entry *e, const char *v,
                                    size_t len, bs_err *err);
BS_NODISCARD int bs_entry_set_shape(const struct bs_edit *ed, struct bs_entry *e, const char *v,
                                    size_t len, bs_err *err);
BS_NODISCARD int bs_entry_set_param_id(const struct bs_edit *ed, struct bs_entry *e, const char *v,
                                       size_t len, bs_err *err);
/* Back to inferred. */
void bs_entry_clear_dtype(const struct bs_edit *ed, struct bs_entry *e);
void bs_entry_clear_shape(const struct bs_edit *ed, struct bs_entry *e);
void bs_entry_clear_param_id(const struct bs_edit *ed, struct bs_entry *e);

/* Other user xattrs. flags: XATTR_CREATE / XATTR_REPLACE values (1 / 2).
 * ENOSPC past the mount's xattr budget, EEXIST / ENODATA per flags. */
BS_NODISCARD int bs_entry_set_xattr(struct bs_edit *ed, struct bs_entry *e, const char *name,
                                    const void *value, size_t len, int flags, bs_err *err);
const struct bs_xattr *bs_entry_get_xattr(const struct bs_entry *e, const char *name);
BS_NODISCARD int bs_entry_remove_xattr(struct bs_edit *ed, struct bs_entry *e, const char *name,
                                       bs_err *err);

/* Root metadata (counted in the xattr budget). */
/* The entry of `key`, or NULL; its text when it is text (NULL also when
 * its value is left in the source file: bs_meta_text makes it). */
const struct bs_kv *bs_edit_find_meta(const struct bs_edit *ed, const char *key);
const char *bs_edit_get_meta(const struct bs_edit *ed, const char *key);
BS_NODISCARD int bs_edit_set_meta(struct bs_edit *ed, const char *key, const char *value,
                                  size_t len, bs_err *err);
BS_NODISCARD int bs_edit_remove_meta(struct bs_edit *ed, const char *key, bs_err *err);

/* Journal the tree's changes (the caller holds the tree, and e's lock for
 * _stage): a file created or renamed, or every file under a directory
 * renamed (their keys); a file removed or replaced; a file whose bytes
 * moved to staging file e->stage. No-ops without ed->journal. */
void bs_edit_log_key(const struct bs_edit *ed, uint64_t ino);
void bs_edit_log_gone(const struct bs_edit *ed, uint64_t ino);
void bs_edit_log_stage(const struct bs_edit *ed, const struct bs_entry *e);

/* Forget an entry's staged bytes and its xattrs (after the caller removed
 * the staging file): an unlinked file that nobody has open. */
void bs_entry_drop(struct bs_edit *ed, struct bs_entry *e);

/* A staging directory, held open: every staged file is reached relative to
 * fd (core/safe_open.h); path names it in messages and in the INDEX. */
struct bs_stage_dir {
  int fd; /* -1: none (nothing staged) */
  const char *path;
};

/* The output catalog: every file of the tree as a tensor named by its key,
 * bytes from the source (sources borrowed at the same indices) or from its
 * staging file <stage> beneath stg (opened per read), plus the root
 * metadata. With keep_hidden, the source tensors the key options hid are
 * kept too (a filtered view of a checkpoint written back in place must not
 * delete what it hides); a file of the view with the same key wins. Fails
 * on a file whose size does not fit its dtype and shape, or two files that
 * give one key. `out` must be freshly initialised; destroy it either way. */
BS_NODISCARD int bs_edit_catalog(const struct bs_edit *ed, const struct bs_stage_dir *stg,
                                 bool keep_hidden, struct bs_catalog *out, bs_err *err);
/* The same, its metadata entries ed's (borrowed, not copied; a writer that
 * changes one makes it its own, bs_kv_set_value): for a catalog destroyed
 * before ed's metadata changes (the journal's BASE, a write-back: a
 * file may hold a million values; issue 34). */
BS_NODISCARD int bs_edit_catalog_view(const struct bs_edit *ed, const struct bs_stage_dir *stg,
                                      bool keep_hidden, struct bs_catalog *out, bs_err *err);

#endif
