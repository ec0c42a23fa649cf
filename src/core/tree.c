#include "core/tree.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"

#define SLOT_DELETED UINT32_MAX

static uint64_t hash_name(uint64_t parent, const char *name)
{
  uint64_t h = bs_fnv1a_str(BS_FNV1A_INIT ^ (parent * 0x9e3779b97f4a7c15ull), name);
  return h ^ (h >> 29);
}

/* A slot is 32 bits: the ino in its low ino_bits (log2 of the table's
 * size, which is always above every ino: hash_insert grows the table
 * first) and the top bits of the name's hash above them, compared before a
 * probe touches the node (a cache miss per probe, most of a large mount's
 * tree build otherwise). */
#define MAX_NODES (UINT32_MAX - 1u)
#define SLOT_INO(t, s) ((s) & (uint32_t)((t)->nslots - 1))
static uint32_t slot_tag(unsigned ino_bits, uint64_t h)
{
  return ino_bits >= 32 ? 0 : (uint32_t)(h >> 32) >> ino_bits << ino_bits;
}

static unsigned log2_of(size_t pow2)
{
  unsigned b = 0;
  while (((size_t)1 << b) < pow2)
    b++;
  return b;
}

static int rehash(struct bs_tree *t, size_t nslots)
{
  if (nslots > ((size_t)1 << 32) || nslots < 2)
    return -1;
  uint32_t *slots = bs_calloc(nslots, sizeof *slots);
  if (!slots)
    return -1;
  unsigned bits = log2_of(nslots);
  size_t used = 0;
  for (size_t i = 0; i < t->nslots; i++) {
    uint32_t s = t->slots[i];
    if (s == 0 || s == SLOT_DELETED)
      continue;
    uint32_t ino = SLOT_INO(t, s);
    const struct bs_node *nd = &t->nodes[ino];
    uint64_t h = hash_name(nd->parent, nd->name);
    size_t j = h & (nslots - 1);
    while (slots[j])
      j = (j + 1) & (nslots - 1);
    slots[j] = ino | slot_tag(bits, h);
    used++;
  }
  bs_free(t->slots);
  t->slots = slots;
  t->nslots = nslots;
  t->ino_bits = bits;
  t->nused = used;
  return 0;
}

/* The slot of (parent, name), or where it would go; *tagp (if not NULL) gets
 * the name's slot tag, so an insert need not hash again. */
static size_t find_slot(const struct bs_tree *t, uint64_t parent, const char *name, bool *found,
                        uint32_t *tagp)
{
  uint64_t h = hash_name(parent, name);
  uint32_t tag = slot_tag(t->ino_bits, h), inomask = (uint32_t)(t->nslots - 1);
  if (tagp)
    *tagp = tag;
  size_t mask = t->nslots - 1, j = h & mask;
  size_t first_free = SIZE_MAX;
  for (;;) {
    uint32_t s = t->slots[j], ino = s & inomask;
    if (s == 0) {
      *found = false;
      return first_free != SIZE_MAX ? first_free : j;
    }
    if (s == SLOT_DELETED) {
      if (first_free == SIZE_MAX)
        first_free = j;
    } else if ((s & ~inomask) == tag && t->nodes[ino].parent == parent &&
               strcmp(t->nodes[ino].name, name) == 0) {
      *found = true;
      return j;
    }
    j = (j + 1) & mask;
  }
}

/* Node names live in an arena of blocks: one malloc per name cost 16-32
 * bytes of overhead per tensor. A renamed node's new name is its own
 * allocation (name_owned); arena names are freed with the tree. */
struct bs_name_block {
  struct bs_name_block *next;
  size_t used, cap;
  char text[];
};

#define NAME_BLOCK (64u << 10)

static char *name_dup(struct bs_tree *t, const char *name)
{
  size_t len = strlen(name) + 1;
  struct bs_name_block *b = t->names;
  if (!b || b->cap - b->used < len) {
    size_t cap = len > NAME_BLOCK ? len : NAME_BLOCK;
    b = bs_malloc(sizeof *b + cap);
    if (!b)
      return NULL;
    b->used = 0;
    b->cap = cap;
    if (len > NAME_BLOCK && t->names) {
      /* A long name gets a block of its own, behind the current one. */
      b->next = t->names->next;
      t->names->next = b;
    } else {
      b->next = t->names;
      t->names = b;
    }
  }
  char *p = b->text + b->used;
  memcpy(p, name, len);
  b->used += len;
  return p;
}

/* A name of its own (name_owned): name, and seg (if not NULL) after its NUL. */
static char *name_block(const char *name, const char *seg)
{
  size_t nl = strlen(name) + 1, sl = seg ? strlen(seg) + 1 : 0;
  char *b = bs_malloc(nl + sl);
  if (b) {
    memcpy(b, name, nl);
    if (seg)
      memcpy(b + nl, seg, sl);
  }
  return b;
}

int bs_tree_init(struct bs_tree *t, bs_err *err)
{
  memset(t, 0, sizeof *t);
  if (bs_grow((void **)&t->nodes, &t->cap, 2, sizeof *t->nodes) != 0 || rehash(t, 64) != 0) {
    bs_tree_destroy(t);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  memset(t->nodes, 0, 2 * sizeof *t->nodes);
  struct bs_node *root = &t->nodes[BS_TREE_ROOT];
  root->name = bs_strdup("");
  root->name_owned = true;
  if (!root->name) {
    bs_tree_destroy(t);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  root->parent = BS_TREE_ROOT;
  root->is_dir = true;
  root->live = true;
  root->tensor = -1;
  t->n = 2;
  return 0;
}

void bs_tree_destroy(struct bs_tree *t)
{
  if (!t)
    return;
  for (size_t i = 0; i < t->n; i++) {
    if (t->nodes[i].name_owned)
      bs_free(t->nodes[i].name);
    if (t->nodes[i].kidcap > BS_NODE_KIDS_INLINE)
      bs_free(t->nodes[i].kheap);
  }
  bs_free(t->nodes);
  bs_free(t->users);
  bs_free(t->slots);
  while (t->names) {
    struct bs_name_block *next = t->names->next;
    bs_free(t->names);
    t->names = next;
  }
  memset(t, 0, sizeof *t);
}

struct bs_node *bs_tree_node(const struct bs_tree *t, uint64_t ino)
{
  if (ino == 0 || ino >= t->n || !t->nodes[ino].live)
    return NULL;
  return &t->nodes[ino];
}

uint64_t bs_tree_lookup(const struct bs_tree *t, uint64_t parent, const char *name)
{
  bool found;
  size_t j = find_slot(t, parent, name, &found, NULL);
  return found ? SLOT_INO(t, t->slots[j]) : 0;
}

/* Room for one more child of p (doubling). */
void *bs_tree_user(const struct bs_tree *t, uint64_t ino)
{
  return t->users && ino < t->ucap ? t->users[ino] : NULL;
}

int bs_tree_set_user(struct bs_tree *t, uint64_t ino, void *p)
{
  if (!t->users) {
    if (!p)
      return 0;
    if (!(t->users = bs_calloc(t->cap, sizeof *t->users)))
      return -1;
    t->ucap = t->cap;
  }
  t->users[ino] = p;
  return 0;
}

const uint32_t *bs_node_kids(const struct bs_node *nd)
{
  return nd->kidcap > BS_NODE_KIDS_INLINE ? nd->kheap : nd->kin;
}

static uint32_t *kids_of(struct bs_node *nd)
{
  return nd->kidcap > BS_NODE_KIDS_INLINE ? nd->kheap : nd->kin;
}

/* Room for one more child of p: in the node up to BS_NODE_KIDS_INLINE,
 * then a block of its own (doubling). */
static int kids_room(struct bs_node *p)
{
  uint32_t cap = p->kidcap > BS_NODE_KIDS_INLINE ? p->kidcap : BS_NODE_KIDS_INLINE;
  if (p->nkids < cap)
    return 0;
  if (cap >= MAX_NODES / 2)
    return -1;
  bool heap = p->kidcap > BS_NODE_KIDS_INLINE;
  uint32_t *k = bs_realloc(heap ? p->kheap : NULL, (size_t)cap * 2 * sizeof *k);
  if (!k)
    return -1;
  if (!heap)
    memcpy(k, p->kin, sizeof p->kin);
  p->kheap = k;
  p->kidcap = cap * 2;
  return 0;
}

static int link_kid(struct bs_tree *t, uint64_t parent, uint64_t ino)
{
  struct bs_node *p = &t->nodes[parent];
  if (kids_room(p) != 0)
    return -1;
  kids_of(p)[p->nkids++] = (uint32_t)ino;
  p->nlive++;
  return 0;
}

static void unlink_kid(struct bs_tree *t, uint64_t parent, uint64_t ino)
{
  struct bs_node *p = &t->nodes[parent];
  uint32_t *kids = kids_of(p);
  for (size_t i = 0; i < p->nkids; i++) {
    if (kids[i] == ino) {
      kids[i] = 0;
      p->nlive--;
      break;
    }
  }
  /* Trailing removed slots can go; inner ones stay so readdir offsets hold. */
  while (p->nkids && kids[p->nkids - 1] == 0)
    p->nkids--;
}

static int hash_insert(struct bs_tree *t, uint64_t ino)
{
  /* Below 7/8 full (the slots' tags keep a probe off the nodes: a fuller
   * table costs little time, and a table of 4 bytes a slot a fifth of an
   * LLM's tree), and every ino below nslots - 1 (a slot's ino bits; never
   * all ones, which with an all-ones tag would read as SLOT_DELETED). */
  size_t want = t->nslots;
  while ((t->nused + 1) * 8 >= want * 7 || ino >= want - 1)
    want *= 2;
  if (want != t->nslots && rehash(t, want) != 0)
    return -1;
  bool found;
  const struct bs_node *nd = &t->nodes[ino];
  uint32_t tag;
  size_t j = find_slot(t, nd->parent, nd->name, &found, &tag);
  if (t->slots[j] == 0)
    t->nused++;
  t->slots[j] = (uint32_t)ino | tag;
  return 0;
}

static void hash_delete(struct bs_tree *t, uint64_t ino)
{
  bool found;
  size_t j = find_slot(t, t->nodes[ino].parent, t->nodes[ino].name, &found, NULL);
  if (found)
    t->slots[j] = SLOT_DELETED;
}

/* bs_tree_add; with borrowed, the node points at name (which outlives the
 * tree) instead of a copy. */
static int tree_add(struct bs_tree *t, uint64_t parent, const char *name, bool is_dir, long tensor,
                    bool borrowed, uint64_t *ino, bs_err *err)
{
  struct bs_node *p = bs_tree_node(t, parent);
  if (!p || !p->is_dir)
    return bs_fail(err, ENOTDIR, BS_OFF_NONE, NULL, "parent of '%s' is not a directory", name);
  if (bs_tree_lookup(t, parent, name))
    return bs_fail(err, EEXIST, BS_OFF_NONE, NULL, "'%s' exists", name);
  if (t->n >= MAX_NODES || bs_grow((void **)&t->nodes, &t->cap, t->n + 1, sizeof *t->nodes) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (t->users && t->ucap < t->cap) {
    void **u = bs_realloc(t->users, t->cap * sizeof *u);
    if (!u)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    memset(u + t->ucap, 0, (t->cap - t->ucap) * sizeof *u);
    t->users = u;
    t->ucap = t->cap;
  }
  uint64_t id = t->n;
  struct bs_node *nd = &t->nodes[id];
  memset(nd, 0, sizeof *nd);
  nd->name = borrowed ? (char *)name : name_dup(t, name);
  if (!nd->name)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  nd->parent = (uint32_t)parent;
  nd->is_dir = is_dir;
  nd->live = true;
  nd->tensor = (int32_t)tensor;
  t->n++;
  if (hash_insert(t, id) != 0 || link_kid(t, parent, id) != 0) {
    hash_delete(t, id);
    nd->name = NULL; /* (its bytes stay in the arena) */
    nd->live = false;
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  *ino = id;
  return 0;
}

int bs_tree_add(struct bs_tree *t, uint64_t parent, const char *name, bool is_dir, long tensor,
                uint64_t *ino, bs_err *err)
{
  return tree_add(t, parent, name, is_dir, tensor, false, ino, err);
}

int bs_tree_remove(struct bs_tree *t, uint64_t ino, bs_err *err)
{
  struct bs_node *nd = bs_tree_node(t, ino);
  if (!nd || ino == BS_TREE_ROOT)
    return bs_fail(err, ino == BS_TREE_ROOT ? EBUSY : ENOENT, BS_OFF_NONE, NULL, "no such node");
  if (nd->is_dir && nd->nlive)
    return bs_fail(err, ENOTEMPTY, BS_OFF_NONE, NULL, "directory '%s' is not empty", nd->name);
  hash_delete(t, ino);
  unlink_kid(t, nd->parent, ino);
  nd->live = false;
  return 0;
}

int bs_tree_move(struct bs_tree *t, uint64_t ino, uint64_t newparent, const char *newname,
                 bs_err *err)
{
  struct bs_node *nd = bs_tree_node(t, ino);
  struct bs_node *np = bs_tree_node(t, newparent);
  if (!nd || !np || ino == BS_TREE_ROOT)
    return bs_fail(err, ENOENT, BS_OFF_NONE, NULL, "no such node");
  if (!np->is_dir)
    return bs_fail(err, ENOTDIR, BS_OFF_NONE, NULL, "target is not a directory");
  if (bs_tree_lookup(t, newparent, newname))
    return bs_fail(err, EEXIST, BS_OFF_NONE, NULL, "'%s' exists", newname);
  /* A directory may not move into itself. */
  for (uint64_t a = newparent;; a = t->nodes[a].parent) {
    if (a == ino)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "cannot move a directory into itself");
    if (a == BS_TREE_ROOT)
      break;
  }
  /* A node that keeps its name keeps its segment; a new name drops it (the
   * key now comes from the new name). */
  const char *seg = strcmp(nd->name, newname) == 0 ? bs_node_seg(nd) : NULL;
  char *name = name_block(newname, seg);
  if (!name || kids_room(np) != 0) {
    bs_free(name);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  hash_delete(t, ino);
  unlink_kid(t, nd->parent, ino);
  if (nd->name_owned)
    bs_free(nd->name);
  nd->name = name;
  nd->name_owned = true;
  nd->has_seg = seg != NULL;
  nd->parent = (uint32_t)newparent;
  if (hash_insert(t, ino) != 0 || link_kid(t, newparent, ino) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  return 0;
}

char *bs_escape_component(const char *seg, size_t len)
{
  if (len == 0)
    return bs_strdup("%");
  if (len == 1 && seg[0] == '.')
    return bs_strdup("%2E");
  if (len == 2 && seg[0] == '.' && seg[1] == '.')
    return bs_strdup("%2E%2E");
  size_t extra = 0;
  for (size_t i = 0; i < len; i++)
    if (seg[i] == '%' || seg[i] == '/')
      extra += 2;
  char *out = bs_malloc(len + extra + 1), *o = out;
  if (!out)
    return NULL;
  for (size_t i = 0; i < len; i++) {
    if (seg[i] == '%' || seg[i] == '/') {
      *o++ = '%';
      *o++ = '2';
      *o++ = seg[i] == '%' ? '5' : 'F';
    } else {
      *o++ = seg[i];
    }
  }
  *o = '\0';
  return out;
}

char *bs_component_name(const char *seg, size_t len, bool *shortened)
{
  *shortened = false;
  char *esc = bs_escape_component(seg, len);
  size_t elen = esc ? strlen(esc) : 0;
  if (!esc || elen <= BS_NAME_MAX)
    return esc;
  /* Cut at most BS_SHORT_PREFIX bytes, neither inside a %XX escape nor
   * inside a UTF-8 sequence (so a UTF-8 key gives a UTF-8 name). */
  size_t cut = BS_SHORT_PREFIX;
  while (cut > 0 && (((unsigned char)esc[cut] & 0xC0) == 0x80 || esc[cut - 1] == '%' ||
                     (cut >= 2 && esc[cut - 2] == '%')))
    cut--;
  char *out = bs_malloc(cut + sizeof BS_SHORT_MARK - 1 + 16 + 1);
  if (out) {
    memcpy(out, esc, cut);
    snprintf(out + cut, sizeof BS_SHORT_MARK + 16, "%s%016llx", BS_SHORT_MARK,
             (unsigned long long)bs_fnv1a(BS_FNV1A_INIT, seg, len));
    *shortened = true;
  }
  bs_free(esc);
  return out;
}

bool bs_name_is_shortened(const char *name)
{
  size_t len = strlen(name), tail = sizeof BS_SHORT_MARK - 1 + 16;
  if (len < tail || memcmp(name + len - tail, BS_SHORT_MARK, sizeof BS_SHORT_MARK - 1) != 0)
    return false;
  for (const char *p = name + len - 16; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
      return false;
  return true;
}

char *bs_unescape_component(const char *name)
{
  if (strcmp(name, "%") == 0)
    return bs_strdup("");
  size_t len = strlen(name);
  char *out = bs_malloc(len + 1), *o = out;
  if (!out) {
    errno = ENOMEM;
    return NULL;
  }
  for (size_t i = 0; i < len; i++) {
    if (name[i] != '%') {
      *o++ = name[i];
      continue;
    }
    int hi = i + 2 < len + 1 ? bs_hex_digit(name[i + 1]) : -1;
    int lo = hi >= 0 ? bs_hex_digit(name[i + 2]) : -1;
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
      bs_free(out);
      errno = EINVAL;
      return NULL;
    }
    *o++ = (char)(hi * 16 + lo);
    i += 2;
  }
  *o = '\0';
  return out;
}

char *bs_tree_key(const struct bs_tree *t, uint64_t ino, bool flat)
{
  const struct bs_node *nd = bs_tree_node(t, ino);
  if (!nd || ino == BS_TREE_ROOT) {
    errno = EINVAL;
    return NULL;
  }
  if (flat) {
    if (!nd->has_seg)
      return bs_unescape_component(nd->name);
    char *k = bs_strdup(bs_node_seg(nd));
    if (!k)
      errno = ENOMEM;
    return k;
  }
  /* Collect components from the leaf up, then join in order. */
  size_t depth = 0;
  for (uint64_t a = ino; a != BS_TREE_ROOT; a = t->nodes[a].parent)
    depth++;
  char **segs = bs_calloc(depth, sizeof *segs);
  if (!segs) {
    errno = ENOMEM;
    return NULL;
  }
  size_t i = depth, total = 0, nseg = 0;
  char *key = NULL;
  for (uint64_t a = ino; a != BS_TREE_ROOT; a = t->nodes[a].parent) {
    i--;
    if (a == ino && strcmp(t->nodes[a].name, BS_SELF_NAME) == 0)
      continue; /* the directory's own tensor */
    if (t->nodes[a].has_seg) {
      segs[i] = bs_strdup(bs_node_seg(&t->nodes[a]));
      if (!segs[i]) {
        errno = ENOMEM;
        goto out;
      }
    } else {
      segs[i] = bs_unescape_component(t->nodes[a].name);
      if (!segs[i])
        goto out;
    }
    total += strlen(segs[i]) + 1;
    nseg++;
  }
  if (nseg == 0) {
    errno = EINVAL;
    goto out;
  }
  key = bs_malloc(total);
  if (!key) {
    errno = ENOMEM;
    goto out;
  }
  char *o = key;
  bool first = true;
  for (size_t k = 0; k < depth; k++) {
    if (!segs[k])
      continue;
    if (!first)
      *o++ = '.';
    first = false;
    size_t l = strlen(segs[k]);
    memcpy(o, segs[k], l);
    o += l;
  }
  *o = '\0';
out:
  for (size_t k = 0; k < depth; k++)
    bs_free(segs[k]);
  bs_free(segs);
  return key;
}

const char *bs_node_seg(const struct bs_node *nd)
{
  return nd->has_seg ? nd->name + strlen(nd->name) + 1 : NULL;
}

int bs_tree_set_seg(struct bs_tree *t, uint64_t ino, const char *seg, size_t len)
{
  struct bs_node *nd = &t->nodes[ino];
  size_t nl = strlen(nd->name);
  char *b = bs_malloc(nl + 1 + len + 1);
  if (!b)
    return -1;
  memcpy(b, nd->name, nl + 1);
  memcpy(b + nl + 1, seg, len);
  b[nl + 1 + len] = '\0';
  if (nd->name_owned)
    bs_free(nd->name);
  nd->name = b;
  nd->name_owned = true;
  nd->has_seg = true;
  return 0;
}

/* Give node ino the whole segment its shortened name stands for. */
static int set_seg(struct bs_tree *t, uint64_t ino, const char *seg, size_t len, const char *key,
                   bs_err *err)
{
  return bs_tree_set_seg(t, ino, seg, len) == 0
             ? 0
             : bs_fail(err, ENOMEM, BS_OFF_NONE, key, "out of memory");
}

/* Two different segments with one shortened name: refused, never merged. */
static int check_same_seg(const struct bs_tree *t, uint64_t ino, const char *seg, size_t len,
                          const char *key, bs_err *err)
{
  const char *have = bs_node_seg(&t->nodes[ino]);
  if (!have || (strlen(have) == len && memcmp(have, seg, len) == 0))
    return 0;
  return bs_fail(err, EEXIST, BS_OFF_NONE, key,
                 "two key segments longer than %d bytes shorten to the same name '%.60s...': "
                 "'%.60s...' and '%.60s...' (rename one with remap=)",
                 BS_NAME_MAX, t->nodes[ino].name, have, seg);
}

/* The directory for segment seg[0..len) (shown as `name`) under parent,
 * created if needed. A file already there moves into the new directory
 * as %%. */
static int ensure_dir(struct bs_tree *t, uint64_t parent, const char *name, bool shortened,
                      const char *seg, size_t len, const char *key, uint64_t *out, bs_err *err)
{
  uint64_t ino = bs_tree_lookup(t, parent, name);
  if (ino && check_same_seg(t, ino, seg, len, key, err) != 0)
    return -1;
  if (ino && t->nodes[ino].is_dir) {
    *out = ino;
    return 0;
  }
  uint64_t dir, f;
  if (ino) {
    long tensor = t->nodes[ino].tensor;
    if (bs_tree_remove(t, ino, err) != 0 ||
        bs_tree_add(t, parent, name, true, -1, &dir, err) != 0 ||
        bs_tree_add(t, dir, BS_SELF_NAME, false, tensor, &f, err) != 0)
      return -1;
  } else if (bs_tree_add(t, parent, name, true, -1, &dir, err) != 0) {
    return -1;
  }
  if (shortened && set_seg(t, dir, seg, len, key, err) != 0)
    return -1;
  *out = dir;
  return 0;
}

int bs_tree_build(struct bs_tree *t, const struct bs_catalog *cat, bool flat, bs_err *err)
{
  /* The hash table sized once for the files and some directories, not
   * rehashed twenty times on the way. */
  size_t want = t->nslots;
  while (want / 8 * 7 < cat->count + cat->count / 4 && want < SIZE_MAX / 4)
    want *= 2;
  if (want > t->nslots && rehash(t, want) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *ten = &cat->tensors[i];
    if (ten->hidden)
      continue;
    const char *key = ten->name;
    uint64_t dir = BS_TREE_ROOT;
    const char *seg = key, *dot;
    char *comp = NULL;
    bool shortened;
    if (!flat) {
      while ((dot = strchr(seg, '.')) != NULL) {
        size_t len = (size_t)(dot - seg);
        comp = bs_component_name(seg, len, &shortened);
        if (!comp)
          return bs_fail(err, ENOMEM, BS_OFF_NONE, key, "out of memory");
        int rc = ensure_dir(t, dir, comp, shortened, seg, len, key, &dir, err);
        bs_free(comp);
        if (rc != 0)
          return -1;
        seg = dot + 1;
      }
    }
    size_t len = strlen(seg);
    comp = bs_component_name(seg, len, &shortened);
    if (!comp)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, key, "out of memory");
    uint64_t ino = bs_tree_lookup(t, dir, comp);
    if (ino && check_same_seg(t, ino, seg, len, key, err) != 0) {
      bs_free(comp);
      return -1;
    }
    uint64_t parent = dir;
    const char *fname = comp;
    if (ino && t->nodes[ino].is_dir) {
      parent = ino;
      fname = BS_SELF_NAME;
      ino = bs_tree_lookup(t, parent, fname);
      shortened = false; /* the %% file; its directory holds the segment */
    }
    if (ino) {
      long other = t->nodes[ino].tensor;
      bs_free(comp);
      return bs_fail(err, EEXIST, BS_OFF_NONE, key, "two tensors have the same name: '%s' and '%s'",
                     other >= 0 ? cat->tensors[other].key : "?", ten->key);
    }
    /* A file's name that is its key's last segment as it is (most) points
     * into the catalog's name: no copy (issue 34). */
    bool borrow = !shortened && fname == comp && strcmp(comp, seg) == 0;
    uint64_t f;
    int rc = tree_add(t, parent, borrow ? seg : fname, false, (long)i, borrow, &f, err);
    bs_free(comp);
    if (rc != 0 || (shortened && set_seg(t, f, seg, len, key, err) != 0))
      return -1;
  }
  /* Exact sizes: the child arrays grew by doubling (a failed shrink keeps
   * the larger block). */
  for (size_t i = 1; i < t->n; i++) {
    struct bs_node *nd = &t->nodes[i];
    if (nd->kidcap <= BS_NODE_KIDS_INLINE || nd->kidcap == nd->nkids)
      continue;
    if (nd->nkids <= BS_NODE_KIDS_INLINE) { /* back into the node */
      uint32_t *heap = nd->kheap;
      memcpy(nd->kin, heap, nd->nkids * sizeof *heap);
      bs_free(heap);
      nd->kidcap = 0;
    } else {
      uint32_t *k = bs_realloc(nd->kheap, (size_t)nd->nkids * sizeof *k);
      if (k) {
        nd->kheap = k;
        nd->kidcap = nd->nkids;
      }
    }
  }
  return 0;
}
