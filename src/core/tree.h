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

#include "core/catalog.h"
#include "core/err.h"

#define BS_TREE_ROOT 1u
#define BS_SELF_NAME "%%" /* a tensor whose key is also a directory's key */

/* Path components are at most BS_NAME_MAX bytes (Linux NAME_MAX). A segment
 * whose escaped form is longer is shown under a shortened name: the first
 * bytes of the escaped form (at most BS_SHORT_PREFIX, never cutting a %XX
 * escape or a UTF-8 sequence), then BS_SHORT_MARK, then 16 lowercase hex
 * digits of a 64-bit FNV-1a hash of the whole segment. "%~" is not an
 * escape, so a shortened name never equals the escaped form of a segment;
 * the node keeps the whole segment (bs_node_seg), so the key stays known. */
#define BS_NAME_MAX 255
#define BS_SHORT_PREFIX 200
#define BS_SHORT_MARK "%~"

/* 40 bytes a node (issue 34: a million tensors in 150 bytes each): inos,
 * tensor indices and child counts are 32-bit (a tree holds fewer than
 * 2^32 - 2 nodes), and the rare whole segment of a shortened name lives
 * behind the name in its own block (bs_node_seg); the FUSE layer's data
 * is in a table of its own (bs_tree_user), which a read-only mount has not. */
#define BS_NODE_KIDS_INLINE 2
struct bs_node {
  char *name;        /* the component as shown (escaped); "" for the root; in the
                        tree's arena, or its own block (name_owned) */
  union {            /* dirs only: child inos in creation order (bs_node_kids); 0 = removed slot */
    uint32_t *kheap; /* owned, when kidcap > BS_NODE_KIDS_INLINE */
    uint32_t kin[BS_NODE_KIDS_INLINE]; /* else here (a directory of one file: most of
                                          an LLM's experts' weights) */
  };
  uint32_t parent; /* parent's ino; the root is its own parent */
  int32_t tensor;  /* index into the catalog, or -1 */
  uint32_t nkids, kidcap;
  uint32_t nlive; /* live children */
  bool is_dir;
  bool live;       /* false once removed */
  bool name_owned; /* name is its own allocation (else it lies in the tree's arena) */
  bool has_seg;    /* name is shortened: the whole key segment follows its NUL */
};

struct bs_tree {
  struct bs_node *nodes; /* owned; index = ino; nodes[0] unused */
  size_t n, cap;
  uint32_t *slots; /* owned: hash of (parent, name) -> ino (low bits) and a tag of
                      the name's hash (the bits above nslots); 0 empty, UINT32_MAX deleted */
  size_t nslots, nused;
  unsigned ino_bits; /* log2(nslots): the bits of a slot that hold the ino */
  void **users;      /* owned, NULL until a first bs_tree_set_user: by ino, the FUSE layer's
                        per-node data (not owned by the tree); a read-only mount has none */
  size_t ucap;       /* entries of users (grown with nodes) */
  struct bs_name_block *names; /* owned: the arena of node names (bs_tree_add) */
};

/* The FUSE layer's data of node ino (NULL: none, or ino out of range). */
void *bs_tree_user(const struct bs_tree *t, uint64_t ino);
/* Set it (ino < n). Fails (-1, out of memory) only when the table of
 * them is made, at the first one that is not NULL. */
BS_NODISCARD int bs_tree_set_user(struct bs_tree *t, uint64_t ino, void *p);
/* A directory's nkids children (inos, 0 for a removed one), in creation order. */
const uint32_t *bs_node_kids(const struct bs_node *nd);
/* The whole key segment a shortened name stands for, or NULL. */
const char *bs_node_seg(const struct bs_node *nd);
/* Give node ino the whole segment seg[0..len) of its shortened name. 0, or
 * -1 out of memory (the node unchanged). */
BS_NODISCARD int bs_tree_set_seg(struct bs_tree *t, uint64_t ino, const char *seg, size_t len);

BS_NODISCARD int bs_tree_init(struct bs_tree *t, bs_err *err);
void bs_tree_destroy(struct bs_tree *t);

/* Build the tree of every non-hidden tensor of cat (by t->name): the file
 * nodes' names may point into those names, so cat outlives the tree and
 * keeps them. With flat,
 * one file per key in the root, named by the escaped key. Duplicate names
 * are an error naming both keys, and so are two segments that shorten to
 * the same name (EEXIST). */
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
/* Move a node to (newparent, newname); the target name must be free. A
 * node that keeps its name keeps its segment (bs_node_seg); one renamed drops it,
 * its key then comes from the new name. */
BS_NODISCARD int bs_tree_move(struct bs_tree *t, uint64_t ino, uint64_t newparent,
                              const char *newname, bs_err *err);

/* Escape one key segment into a path component ('%' and '/' as %25 and %2F;
 * "." "..", "" as %2E, %2E%2E, %). Returns a bs_malloc'd string or NULL. */
char *bs_escape_component(const char *seg, size_t len);
/* The name a key segment is shown under: bs_escape_component, shortened
 * (see BS_SHORT_MARK) when that is longer than BS_NAME_MAX; *shortened says
 * which. Returns a bs_malloc'd string or NULL. */
char *bs_component_name(const char *seg, size_t len, bool *shortened);
/* Whether name has the form of a shortened name (ends in %~ and 16 hex). */
bool bs_name_is_shortened(const char *name);
/* Reverse bs_escape_component. Returns a bs_malloc'd segment, or NULL with
 * errno EINVAL for a name that is not a valid escape, ENOMEM. */
char *bs_unescape_component(const char *name);
/* The key of a file node: its path's components unescaped (a shortened
 * one gives its node's seg), joined with '.' (a %% component stands for its
 * directory itself). With flat, the name
 * unescaped. Returns bs_malloc'd, or NULL (errno EINVAL / ENOMEM). */
char *bs_tree_key(const struct bs_tree *t, uint64_t ino, bool flat);

#endif
