#include "policy/names.h"

#include <errno.h>
#include <string.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "core/npy.h"
#include "core/utf8.h"

/* Lookups one check may spend under the tree lock. The walk below visits
 * each node whose key is a prefix of the key at most once, trying each dot
 * after it, so only a tree of many dotted names (mkdir a.a, a.a.a...) comes
 * near; past the budget the answer is "free", and the write-back still
 * refuses two files for one key. */
#define TAKEN_BUDGET 20000u

/* Is key k[0..n) the key of a live file under dir (a file, or a directory's
 * %% file), other than the nodes skip1 and skip2? Tries each split of k at
 * its dots against the names that exist, so the walk stays within the
 * tree. 1 yes, 0 no (or the budget spent), -1 out of memory. */
static int taken(const struct bs_tree *t, uint64_t dir, const char *k, size_t n, uint64_t skip1,
                 uint64_t skip2, unsigned *budget)
{
  for (size_t i = 0; i <= n; i++) {
    if (i < n && k[i] != '.')
      continue;
    if (*budget == 0)
      return 0;
    --*budget;
    bool shortened;
    char *comp = bs_component_name(k, i, &shortened);
    if (!comp)
      return -1;
    uint64_t c = bs_tree_lookup(t, dir, comp);
    bs_free(comp);
    if (!c || c == skip1 || c == skip2)
      continue;
    const struct bs_node *nd = &t->nodes[c];
    if (i == n) {
      uint64_t self = nd->is_dir ? bs_tree_lookup(t, c, BS_SELF_NAME) : c;
      if (self && self != skip1 && self != skip2)
        return 1;
    } else if (nd->is_dir) {
      int r = taken(t, c, k + i + 1, n - i - 1, skip1, skip2, budget);
      if (r != 0)
        return r;
    }
  }
  return 0;
}

int bs_name_check(const struct bs_tree *t, bool flat, const struct bs_writer *w, uint64_t parent,
                  const char *name, bool is_dir, uint64_t moving, bs_err *err)
{
  size_t nl = strlen(name);
  if (nl > BS_NAME_MAX)
    return bs_fail(err, ENAMETOOLONG, BS_OFF_NONE, NULL,
                   "a name of %zu bytes, over the %d a path component has", nl, BS_NAME_MAX);
  if (strcmp(name, BS_SELF_NAME) == 0 || name[0] == '.')
    return 0;
  char pname[128];
  bs_name_printable(name, pname, sizeof pname);
  char *seg = bs_unescape_component(name);
  if (!seg)
    return errno == ENOMEM ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory")
                           : bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                                     "'%s': a '%%' starts an escape of two hex digits (not %%00); "
                                     "write %%25 for a '%%' itself",
                                     pname);
  char *canon = bs_escape_component(seg, strlen(seg));
  char *pkey = NULL, *key = NULL;
  int rc = -1;
  if (!canon) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  if (strcmp(canon, name) != 0) {
    char pcanon[128];
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
            "'%s' escapes what needs no escape: its key's name is '%s' (one name a key)", pname,
            bs_name_printable(canon, pcanon, sizeof pcanon));
    goto out;
  }
  const struct bs_node *pn = bs_tree_node(t, parent);
  if (!pn || !pn->is_dir) {
    rc = 0; /* no key to check: bs_tree_add / bs_tree_move refuse it */
    goto out;
  }
  /* The key the node stands for: its parent's key, a dot, its segment. */
  if (!flat && parent != BS_TREE_ROOT && !(pkey = bs_tree_key(t, parent, false))) {
    bs_fail(err, errno == ENOMEM ? ENOMEM : EINVAL, BS_OFF_NONE, NULL,
            "'%s': its directory has no key", pname);
    goto out;
  }
  size_t pl = pkey ? strlen(pkey) : 0, sl = strlen(seg);
  if (!(key = bs_malloc(pl + 1 + sl + 1))) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  memcpy(key, pkey ? pkey : "", pl);
  if (pkey)
    key[pl++] = '.';
  memcpy(key + pl, seg, sl + 1);
  size_t kl = pl + sl;
  bool npy = !is_dir && bs_npy_name(key, kl);
  if (npy)
    key[kl - 4] = '\0'; /* np.save's NAME.npy becomes tensor NAME */
  if (w && w->name_ok(key, err) != 0)
    goto out;
  if (npy)
    key[kl - 4] = '.';
  if (!flat && !is_dir) {
    unsigned budget = TAKEN_BUDGET;
    int r = taken(t, BS_TREE_ROOT, key, kl, moving, bs_tree_lookup(t, parent, name), &budget);
    if (r < 0) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
    if (r > 0) {
      char pkey2[128];
      bs_fail(err, EEXIST, BS_OFF_NONE, bs_name_printable(key, pkey2, sizeof pkey2),
              "'%s': another file already has this key (a dot in a name splits like a '/')", pname);
      goto out;
    }
  }
  rc = 0;
out:
  bs_free(seg);
  bs_free(canon);
  bs_free(pkey);
  bs_free(key);
  return rc;
}

/* The first fixed tensor at or under node ino, or -1. Depth-first through
 * the directories, on the stack: a key of BS_MAX_KEY_LEN bytes has at
 * most BS_MAX_KEY_LEN / 2 levels. */
static long first_fixed(const struct bs_tree *t, const bool *fixed, size_t n, uint64_t ino)
{
  const struct bs_node *nd = &t->nodes[ino];
  if (nd->tensor >= 0 && (size_t)nd->tensor < n && fixed[nd->tensor])
    return nd->tensor;
  for (size_t i = 0; nd->is_dir && i < nd->nkids; i++) {
    long f = bs_node_kids(nd)[i] ? first_fixed(t, fixed, n, bs_node_kids(nd)[i]) : -1;
    if (f >= 0)
      return f;
  }
  return -1;
}

int bs_name_check_fixed(const struct bs_tree *t, const struct bs_catalog *cat, const bool *fixed,
                        uint64_t ino, bs_err *err)
{
  if (!fixed || !bs_tree_node(t, ino))
    return 0;
  long f = first_fixed(t, fixed, cat->count, ino);
  if (f < 0)
    return 0;
  char pkey[128];
  return bs_fail(err, EPERM, BS_OFF_NONE,
                 bs_name_printable(cat->tensors[f].name, pkey, sizeof pkey),
                 "an item of a list in the source's pickle: a rewrite in place keeps it there, so "
                 "it can be neither removed nor renamed (its bytes, dtype and shape can change; "
                 "-o output=NEW writes a flat copy without it)");
}
