/* The directory tree a mount shows: dotted keys split into directories, with
 * reversible escaping of path components. Inode numbers are stable node
 * indices (root = 1); removed nodes are never reused, so FUSE forget needs
 * no table. The tree has no locking of its own: the FUSE layer holds its
 * lock around every call. */
#ifndef BURNSTORE_TREE_H
#define BURNSTORE_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "burnstore/catalog.h"
#include "burnstore/err.h"

#define BS_TREE_ROOT 1u
#define BS_SELF_NAME "%%" /* a tensor whose key is also a directory's key */

struct bs_node {
  char *name;      /* owned: the component as shown (escaped); "" for the root */
  uint64_t parent; /* parent's ino; the root is its own parent */
  bool is_dir;
  bool live;      /* false once removed */
  long tensor;    /* index into the catalog, or -1 */
  uint64_t *kids; /* owned, dirs only: child inos in creation order; 0 = removed slot */
  size_t nkids, kidcap;
  size_t nlive; /* live children */
  void *user;   /* the FUSE layer's per-node data, not owned by the tree */
};

struct bs_tree {
  struct bs_node *nodes; /* owned; index = ino; nodes[0] unused */
  size_t n, cap;
  uint64_t *slots; /* owned: hash of (parent, name) -> ino; 0 empty, UINT64_MAX deleted */
  size_t nslots, nused;
};

BS_NODISCARD int bs_tree_init(struct bs_tree *t, bs_err *err);
void bs_tree_destroy(struct bs_tree *t);

/* Build the tree of every non-hidden tensor of cat (by t->name). With flat,
 * one file per key in the root, named by the escaped key. Duplicate names
 * are an error naming both keys. */
BS_NODISCARD int bs_tree_build(struct bs_tree *t, const struct bs_catalog *cat, bool flat,
                               bs_err *err);

/* The node, or NULL if ino is out of range or removed. Borrowed. */
struct bs_node *bs_tree_node(const struct bs_tree *t, uint64_t ino);
/* Child `name` of dir `parent`: its ino, or 0. */
uint64_t bs_tree_lookup(const struct bs_tree *t, uint64_t parent, const char *name);
/* Add a child; EEXIST if the name is taken, ENOTDIR if parent is no dir. */
BS_NODISCARD int bs_tree_add(struct bs_tree *t, uint64_t parent, const char *name, bool is_dir,
                             long tensor, uint64_t *ino, bs_err *err);
/* Unlink a node from its parent (a dir must be empty: ENOTEMPTY). */
BS_NODISCARD int bs_tree_remove(struct bs_tree *t, uint64_t ino, bs_err *err);
/* Move a node to (newparent, newname); the target name must be free. */
BS_NODISCARD int bs_tree_move(struct bs_tree *t, uint64_t ino, uint64_t newparent,
                              const char *newname, bs_err *err);

/* Escape one key segment into a path component ('%' and '/' as %25 and %2F;
 * "." "..", "" as %2E, %2E%2E, %). Returns a bs_malloc'd string or NULL. */
char *bs_escape_component(const char *seg, size_t len);
/* Reverse bs_escape_component. Returns a bs_malloc'd segment, or NULL with
 * errno EINVAL for a name that is not a valid escape, ENOMEM. */
char *bs_unescape_component(const char *name);
/* The key of a file node: its path's components unescaped, joined with '.'
 * (a %% component stands for its directory itself). With flat, the name
 * unescaped. Returns bs_malloc'd, or NULL (errno EINVAL / ENOMEM). */
char *bs_tree_key(const struct bs_tree *t, uint64_t ino, bool flat);

#endif
