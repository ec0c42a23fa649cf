/* The staging journal's replay and --finish from it (journal_replay.h). */
#include "policy/journal_replay.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/safe_open.h"
#include "core/strmap.h"
#include "formats/formats.h"
#include "formats/writers.h"

_Static_assert(BS_STAGE_INDEX_MAX + 4096u <= BS_JOURNAL_RECORD_MAX,
               "a BASE record holds a whole INDEX");

/* ---- Replay --------------------------------------------------------------------------------- */

struct item {
  char *inostr; /* owned: the strmap's key */
  uint64_t ino;
  struct bs_entry *e; /* owned until the tree takes it */
  char *key;          /* owned */
  bool gone;
};

struct state {
  struct item *items;
  size_t n, cap;
  struct bs_strmap map;
};

static void state_destroy(struct state *s)
{
  for (size_t i = 0; i < s->n; i++) {
    bs_free(s->items[i].inostr);
    bs_free(s->items[i].key);
    bs_entry_free(s->items[i].e);
  }
  bs_free(s->items);
  bs_strmap_destroy(&s->map);
}

static struct item *find(struct state *s, uint64_t ino)
{
  char k[24];
  snprintf(k, sizeof k, "%llu", (unsigned long long)ino);
  size_t i;
  return bs_strmap_get(&s->map, k, &i) ? &s->items[i] : NULL;
}

static struct item *add_item(struct state *s, uint64_t ino, bs_err *err)
{
  char k[24];
  snprintf(k, sizeof k, "%llu", (unsigned long long)ino);
  char *ks = bs_strdup(k);
  if (!ks || bs_grow((void **)&s->items, &s->cap, s->n + 1, sizeof *s->items) != 0 ||
      bs_strmap_put(&s->map, ks, s->n) != 0) {
    bs_free(ks);
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    return NULL;
  }
  struct item *it = &s->items[s->n++];
  memset(it, 0, sizeof *it);
  it->inostr = ks;
  it->ino = ino;
  return it;
}

/* A NUL-terminated copy of a record's string field, refusing inner NULs. */
static char *field_str(const uint8_t *p, size_t n)
{
  if (memchr(p, '\0', n)) {
    errno = EINVAL;
    return NULL;
  }
  char *s = bs_strndup((const char *)p, n);
  if (!s)
    errno = ENOMEM;
  return s;
}

static int bad(bs_err *err, uint64_t off, const char *what)
{
  return bs_fail(err, EINVAL, off, NULL, "journal record at offset %llu: %s",
                 (unsigned long long)off, what);
}

static int apply(struct bs_jreplay *r, struct state *s, uint64_t off, unsigned kind, uint64_t ino,
                 const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, bs_err *err)
{
  struct bs_edit *ed = &r->ed;
  struct item *it = find(s, ino);
  bs_err sub;
  bs_err_clear(&sub);
  int rc = 0;
  switch (kind) {
  case BS_J_ORIGIN: {
    if (alen != 8 || it)
      return bad(err, off, "ORIGIN of a file already known, or not a u64");
    uint64_t ti = bs_le64(a);
    if (ti >= r->base.cat.count)
      return bad(err, off, "ORIGIN names a tensor the BASE does not have");
    const struct bs_tensor *t = &r->base.cat.tensors[ti];
    if (!(it = add_item(s, ino, err)))
      return -1;
    it->key = bs_strdup(t->name);
    it->e = bs_entry_new((long)ti, t->nbytes, false, 0644);
    if (!it->key || !it->e)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    it->e->ino = ino;
    return 0;
  }
  case BS_J_KEY: {
    if (alen == 0 || alen > BS_MAX_KEY_LEN)
      return bad(err, off, "KEY empty or too long");
    char *k = field_str(a, alen);
    if (!k)
      return errno == ENOMEM ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory")
                             : bad(err, off, "a NUL inside a key");
    if (!it) {
      if (!(it = add_item(s, ino, err)) || !(it->e = bs_entry_new(-1, 0, false, 0644))) {
        bs_free(k);
        return it ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory") : -1;
      }
      it->e->ino = ino;
    }
    bs_free(it->key);
    it->key = k;
    return 0;
  }
  case BS_J_GONE:
    /* Inodes are never reused: a removed file stays removed. */
    if (!it && !(it = add_item(s, ino, err)))
      return -1;
    it->gone = true;
    return 0;
  default: break;
  }
  if (kind == BS_J_MSET || kind == BS_J_MRM) {
    char *k = field_str(a, alen);
    if (!k)
      return errno == ENOMEM ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory")
                             : bad(err, off, "a NUL inside a metadata key");
    if (kind == BS_J_MSET && memchr(b, '\0', blen)) {
      bs_free(k);
      return bad(err, off, "a NUL inside a metadata value");
    }
    if (kind == BS_J_MSET)
      rc = bs_edit_set_meta(ed, k, (const char *)b, blen, &sub);
    else if (bs_edit_remove_meta(ed, k, &sub) != 0 && sub.code == ENODATA)
      bs_err_clear(&sub), rc = 0;
    else
      rc = sub.code ? -1 : 0;
    bs_free(k);
    return rc ? bs_fail(err, sub.code, off, NULL, "journal record at offset %llu: %s",
                        (unsigned long long)off, sub.msg)
              : 0;
  }
  if (!it || (!it->gone && !it->e))
    return bad(err, off, "a change of a file the journal never created");
  if (it->gone)
    return 0; /* changes logged while it was being removed */
  struct bs_entry *e = it->e;
  const char *v = (const char *)a;
  switch (kind) {
  case BS_J_STAGE:
    if (alen != 8 || bs_le64(a) == 0)
      return bad(err, off, "STAGE without a staging file number");
    e->stage = bs_le64(a);
    break;
  case BS_J_DTYPE: rc = bs_entry_set_dtype(ed, e, v, alen, &sub); break;
  case BS_J_DTYPE_CLR: bs_entry_clear_dtype(NULL, e); break;
  case BS_J_SHAPE: rc = bs_entry_set_shape(NULL, e, v, alen, &sub); break;
  case BS_J_SHAPE_CLR: bs_entry_clear_shape(NULL, e); break;
  case BS_J_PARAM_ID: rc = bs_entry_set_param_id(NULL, e, v, alen, &sub); break;
  case BS_J_PARAM_ID_CLR: bs_entry_clear_param_id(NULL, e); break;
  case BS_J_XSET:
  case BS_J_XRM: {
    char *name = field_str(a, alen);
    if (!name)
      return errno == ENOMEM ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory")
                             : bad(err, off, "a NUL inside an xattr name");
    if (kind == BS_J_XSET)
      rc = bs_entry_set_xattr(ed, e, name, b, blen, 0, &sub);
    else if (bs_entry_remove_xattr(ed, e, name, &sub) != 0 && sub.code == ENODATA)
      bs_err_clear(&sub);
    else
      rc = sub.code ? -1 : 0;
    bs_free(name);
    break;
  }
  default: return bad(err, off, "unknown record kind");
  }
  if (rc)
    return bs_fail(err, sub.code, off, it->key, "journal record at offset %llu: %s",
                   (unsigned long long)off, sub.msg);
  return 0;
}

static int cmp_ino(const void *x, const void *y)
{
  const struct item *a = *(const struct item *const *)x, *b = *(const struct item *const *)y;
  return a->ino < b->ino ? -1 : a->ino > b->ino;
}

/* The live files as a flat tree (named by their escaped keys), in inode
 * order; base tensors no file came from were hidden at mount. */
static int build_tree(struct bs_jreplay *r, struct state *s, bs_err *err)
{
  struct item **live = bs_malloc((s->n ? s->n : 1) * sizeof *live);
  r->inos = bs_malloc((s->n ? s->n : 1) * sizeof *r->inos);
  if (!live || !r->inos) {
    bs_free(live);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  size_t n = 0;
  for (size_t i = 0; i < r->base.cat.count; i++)
    r->base.cat.tensors[i].hidden = true;
  for (size_t i = 0; i < s->n; i++) {
    struct item *it = &s->items[i];
    if (it->e && it->e->tensor >= 0)
      r->base.cat.tensors[it->e->tensor].hidden = false;
    if (!it->gone && it->e && it->key)
      live[n++] = it;
  }
  qsort(live, n, sizeof *live, cmp_ino);
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    struct item *it = live[i];
    bool shortened;
    char *name = bs_component_name(it->key, strlen(it->key), &shortened);
    uint64_t ino;
    if (!name) {
      rc = bs_fail(err, ENOMEM, BS_OFF_NONE, it->key, "out of memory");
      break;
    }
    rc = bs_tree_add(&r->tree, BS_TREE_ROOT, name, false, it->e->tensor, &ino, err);
    bs_free(name);
    if (rc) {
      if (err->code == EEXIST)
        bs_fail(err, EEXIST, BS_OFF_NONE, it->key, "two files of the journal have this key");
      break;
    }
    if (shortened && bs_tree_set_seg(&r->tree, ino, it->key, strlen(it->key)) != 0) {
      rc = bs_fail(err, ENOMEM, BS_OFF_NONE, it->key, "out of memory");
      break;
    }
    if (bs_tree_set_user(&r->tree, ino, it->e) != 0) {
      rc = bs_fail(err, ENOMEM, BS_OFF_NONE, it->key, "out of memory");
      break;
    }
    it->e = NULL;
    r->inos[r->nfiles++] = it->ino;
  }
  bs_free(live);
  return rc;
}

/* A whole, valid record of a kind after BASE at o (its payload's length in
 * *plen); *budget (bytes checksummed) is spent. */
static bool record_at(const uint8_t *p, size_t len, size_t o, uint32_t *plen, uint64_t *budget)
{
  if (len - o < BS_JOURNAL_HDR + BS_JOURNAL_PAYLOAD)
    return false;
  uint32_t n = bs_le32(p + o);
  unsigned kind = p[o + BS_JOURNAL_HDR];
  if (n < BS_JOURNAL_PAYLOAD || n > BS_JOURNAL_RECORD_MAX || n > len - o - BS_JOURNAL_HDR ||
      kind <= BS_J_BASE || kind >= BS_J_KIND_END ||
      bs_le32(p + o + BS_JOURNAL_HDR + 9) > n - BS_JOURNAL_PAYLOAD || *budget < n)
    return false;
  *budget -= n;
  *plen = n;
  return bs_fnv1a(BS_FNV1A_INIT, p + o + BS_JOURNAL_HDR, n) == bs_le64(p + o + 4);
}

/* The first offset after `from` where a valid record starts, or
 * BS_JREPLAY_NONE; *unsure when the search ran out of its budget first. */
static uint64_t next_record(const uint8_t *p, size_t len, size_t from, uint64_t *budget,
                            bool *unsure)
{
  for (size_t o = from; o < len && len - o >= BS_JOURNAL_HDR + BS_JOURNAL_PAYLOAD; o++) {
    uint32_t n;
    if (record_at(p, len, o, &n, budget))
      return o;
    if (*budget < BS_JOURNAL_PAYLOAD) {
      *unsure = true;
      return BS_JREPLAY_NONE;
    }
  }
  return BS_JREPLAY_NONE;
}

static bool all_zero(const uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return false;
  return true;
}

/* The record at off is not whole and valid (why): the torn tail of the
 * last append, or damage (journal_replay.h has the rule). */
static void end_of_records(struct bs_jreplay *r, const uint8_t *p, size_t len, size_t off, bool cut,
                           const char *why)
{
  r->torn = len - off;
  if (len - off < BS_JOURNAL_HDR || all_zero(p + off, len - off))
    return; /* a header cut by the kill, or a crash's unwritten (zeroed) blocks */
  uint64_t budget = BS_JREPLAY_SCAN_BUDGET;
  bool unsure = false;
  uint64_t next = next_record(p, len, off + 1, &budget, &unsure);
  if (cut && next == BS_JREPLAY_NONE && !unsure)
    return; /* the last append, cut by the kill: nothing was written after it */
  r->torn = 0;
  r->damaged = true;
  r->damage_off = off;
  r->damage_rec = r->records + 1;
  r->damage_next = next;
  r->damage_why = unsure ? "and what follows it could not all be checked" : why;
}

int bs_journal_replay(const void *data, size_t len, struct bs_jreplay *r, bs_err *err)
{
  memset(r, 0, sizeof *r);
  bs_stage_index_init(&r->base);
  r->damage_next = r->unsynced_off = BS_JREPLAY_NONE;
  const uint8_t *p = data;
  if (len < BS_JOURNAL_MAGIC_LEN || memcmp(p, BS_JOURNAL_MAGIC, BS_JOURNAL_MAGIC_LEN) != 0)
    return bs_fail(err, EINVAL, 0, NULL, "not a burnstore staging journal (bad magic)");
  if (bs_tree_init(&r->tree, err) != 0)
    return -1;
  struct state s = {0};
  int rc = 0;
  size_t off = BS_JOURNAL_MAGIC_LEN;
  bool based = false;
  while (!rc && off < len) {
    if (len - off < BS_JOURNAL_HDR) {
      end_of_records(r, p, len, off, true, "cut");
      break;
    }
    uint32_t plen = bs_le32(p + off);
    uint64_t sum = bs_le64(p + off + 4);
    if (plen < BS_JOURNAL_PAYLOAD || plen > BS_JOURNAL_RECORD_MAX) {
      end_of_records(r, p, len, off, false, "its length is impossible");
      break;
    }
    if (plen > len - off - BS_JOURNAL_HDR) {
      end_of_records(r, p, len, off, true, "it runs past the end of the file");
      break;
    }
    const uint8_t *q = p + off + BS_JOURNAL_HDR;
    if (bs_fnv1a(BS_FNV1A_INIT, q, plen) != sum) {
      end_of_records(r, p, len, off, false, "its checksum does not match");
      break;
    }
    unsigned kind = q[0];
    uint64_t ino = bs_le64(q + 1);
    uint32_t alen = bs_le32(q + 9);
    if (alen > plen - BS_JOURNAL_PAYLOAD) {
      rc = bad(err, off, "field longer than its record");
      break;
    }
    const uint8_t *a = q + BS_JOURNAL_PAYLOAD, *b = a + alen;
    size_t blen = plen - BS_JOURNAL_PAYLOAD - alen;
    if (!based) {
      if (kind != BS_J_BASE) {
        rc = bad(err, off, "the first record is not BASE");
        break;
      }
      rc = bs_stage_index_parse(a, alen, &r->base, err);
      if (!rc && r->base.incomplete)
        rc = bad(err, off, "BASE is an incomplete INDEX");
      if (!rc) {
        rc = bs_edit_init(&r->ed, &r->base.cat, &r->tree, true, err);
        r->ed_init = true;
      }
      /* Then (inode, tensor) pairs: the ORIGIN of every file as mounted. */
      if (!rc && blen % 16)
        rc = bad(err, off, "BASE's origins are not (inode, tensor) pairs");
      for (size_t i = 0; !rc && i < blen; i += 16)
        rc = apply(r, &s, off, BS_J_ORIGIN, bs_le64(b + i), b + i + 8, 8, NULL, 0, err);
      based = true;
    } else if (kind == BS_J_BASE || kind >= BS_J_KIND_END || kind == 0) {
      rc = bad(err, off, "unknown record kind, or a second BASE");
    } else if (kind == BS_J_UNSYNCED) {
      if (alen != 4)
        rc = bad(err, off, "UNSYNCED without an errno");
      else if (r->unsynced_off == BS_JREPLAY_NONE) {
        r->unsynced_off = off;
        r->unsynced_rec = r->records + 1;
        r->unsynced_errno = (int)bs_le32(a);
      }
    } else {
      rc = apply(r, &s, off, kind, ino, a, alen, b, blen, err);
    }
    r->records++;
    off += BS_JOURNAL_HDR + plen;
  }
  if (!rc && !based && r->damaged) /* (not a cut: records follow it) */
    rc = bs_fail(err, EBADMSG, r->damage_off, NULL,
                 "record 1 (BASE, offset %llu) is damaged (%s): nothing can be applied, the "
                 "staging directory is kept (burnstore --list-staging lists its files)",
                 (unsigned long long)r->damage_off, r->damage_why);
  else if (!rc && !based)
    rc = bs_fail(err, EINVAL, BS_JOURNAL_MAGIC_LEN, NULL,
                 "the journal has no BASE record (cut at mount?)");
  if (!rc)
    rc = build_tree(r, &s, err);
  state_destroy(&s);
  return rc;
}

/* A record's text field for a line: control characters as '?', cut. */
static void field(char *out, size_t n, const uint8_t *f, size_t len)
{
  size_t k = 0;
  for (size_t i = 0; i < len && k + 4 < n && i < 100; i++)
    out[k++] = f[i] < 0x20 || f[i] == 0x7f ? '?' : (char)f[i];
  if (len > 100 && k + 4 < n)
    out[k++] = '.', out[k++] = '.', out[k++] = '.';
  out[k] = '\0';
}

/* "'KEY' (file INO)" for a file the state before the damage knows, else
 * "file INO" (one the dropped records made). */
static void file_name(const struct bs_jreplay *r, uint64_t ino, char *out, size_t n)
{
  for (size_t i = 0; i < r->nfiles; i++)
    if (r->inos[i] == ino) {
      char *key = bs_tree_key(&r->tree, BS_TREE_ROOT + 1 + i, true);
      char f[110];
      if (key)
        field(f, sizeof f, (const uint8_t *)key, strlen(key));
      snprintf(out, n, "'%s' (file %llu)", key ? f : "?", (unsigned long long)ino);
      bs_free(key);
      return;
    }
  snprintf(out, n, "file %llu", (unsigned long long)ino);
}

static void describe(const struct bs_jreplay *r, const uint8_t *q, const char *dir, char *line,
                     size_t n)
{
  static const char *const what[BS_J_KIND_END] = {[BS_J_ORIGIN] = "origin",
                                                  [BS_J_KEY] = "named",
                                                  [BS_J_GONE] = "removed",
                                                  [BS_J_STAGE] = "bytes staged",
                                                  [BS_J_DTYPE] = "dtype set to",
                                                  [BS_J_DTYPE_CLR] = "dtype cleared",
                                                  [BS_J_SHAPE] = "shape set to",
                                                  [BS_J_SHAPE_CLR] = "shape cleared",
                                                  [BS_J_PARAM_ID] = "param_id set to",
                                                  [BS_J_PARAM_ID_CLR] = "param_id cleared",
                                                  [BS_J_XSET] = "xattr set",
                                                  [BS_J_XRM] = "xattr removed",
                                                  [BS_J_MSET] = "metadata set",
                                                  [BS_J_MRM] = "metadata removed",
                                                  [BS_J_UNSYNCED] = "fdatasync failed"};
  unsigned kind = q[0];
  uint32_t alen = bs_le32(q + 9);
  char f[110], file[240];
  field(f, sizeof f, q + BS_JOURNAL_PAYLOAD, alen);
  file_name(r, bs_le64(q + 1), file, sizeof file);
  if (kind == BS_J_STAGE && alen == 8)
    snprintf(line, n, "%s: its bytes, staged file %s/%llu (kept)", file, dir,
             (unsigned long long)bs_le64(q + BS_JOURNAL_PAYLOAD));
  else if (kind == BS_J_MSET || kind == BS_J_MRM)
    snprintf(line, n, "%s '%s'", what[kind], f);
  else if (kind == BS_J_UNSYNCED)
    snprintf(line, n, "%s", what[kind]);
  else if (kind == BS_J_GONE || kind == BS_J_DTYPE_CLR || kind == BS_J_SHAPE_CLR ||
           kind == BS_J_PARAM_ID_CLR)
    snprintf(line, n, "%s: %s", file, what[kind]);
  else
    snprintf(line, n, "%s: %s '%s'", file, what[kind] ? what[kind] : "?", f);
}

int bs_jreplay_dropped(const void *data, size_t len, const struct bs_jreplay *r, const char *dir,
                       struct bs_buf *out)
{
  if (!r->damaged)
    return 0;
  const uint8_t *p = data;
  char line[1200];
  int bad = 0;
  snprintf(line, sizeof line, "dropped: record %zu at offset %llu: damaged (%s)\n", r->damage_rec,
           (unsigned long long)r->damage_off, r->damage_why);
  bad |= bs_buf_put(out, line, strlen(line));
  uint64_t budget = BS_JREPLAY_SCAN_BUDGET;
  bool unsure = false;
  for (uint64_t o = r->damage_next; o != BS_JREPLAY_NONE && o < len && !bad;) {
    uint32_t plen;
    char what[1024];
    if (!record_at(p, len, (size_t)o, &plen, &budget)) {
      o = next_record(p, len, (size_t)o + 1, &budget, &unsure);
      continue;
    }
    describe(r, p + o + BS_JOURNAL_HDR, dir, what, sizeof what);
    snprintf(line, sizeof line, "dropped: the record at offset %llu: %s\n", (unsigned long long)o,
             what);
    bad |= bs_buf_put(out, line, strlen(line));
    o += BS_JOURNAL_HDR + plen;
  }
  if (unsure && !bad) {
    snprintf(line, sizeof line, "dropped: and what follows could not all be read\n");
    bad |= bs_buf_put(out, line, strlen(line));
  }
  return bad ? -1 : 0;
}

void bs_jreplay_destroy(struct bs_jreplay *r)
{
  if (r->ed_init)
    bs_edit_destroy(&r->ed);
  else
    for (uint64_t i = 0; i < r->tree.n; i++)
      bs_entry_free(bs_tree_user(&r->tree, i));
  bs_tree_destroy(&r->tree);
  bs_stage_index_destroy(&r->base);
  bs_free(r->inos);
  memset(r, 0, sizeof *r);
}

/* ---- --finish from the journal --------------------------------------------------------------- */

/* The staged files' sizes are what the daemon wrote before it died. */
static int size_staged(struct bs_jreplay *r, const struct bs_stage_dir *stg, bs_err *err)
{
  for (uint64_t ino = BS_TREE_ROOT; ino < r->tree.n; ino++) {
    struct bs_entry *e = bs_tree_user(&r->tree, ino);
    if (!e || !e->stage)
      continue;
    char name[24];
    snprintf(name, sizeof name, "%llu", (unsigned long long)e->stage);
    struct stat st;
    errno = 0;
    if (fstatat(stg->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
      char *key = bs_tree_key(&r->tree, ino, true);
      int rc = bs_fail(err, errno ? errno : EINVAL, BS_OFF_NONE, key,
                       "%s/%s: the journal's staged file is missing", stg->path, name);
      bs_free(key);
      return rc;
    }
    e->size = (uint64_t)st.st_size;
  }
  return 0;
}

/* A line into notes (best effort: notes are what --finish says). */
static void note(struct bs_buf *notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct bs_buf *notes, const char *fmt, ...)
{
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n > 0)
    if (bs_buf_put(notes, line, strlen(line)) != 0) {
      /* best effort: the notes are what --finish says */
    }
}

/* The JOURNAL beneath the held directory (a FIFO or a link refused, never
 * opened), mapped: 0 (*map, *len; NULL and 0 for an empty file), 1: there
 * is none, -1 with err. */
static int map_journal(const struct bs_stage_dir *stg, void **map, size_t *len, bs_err *err)
{
  const char *dir = stg->path;
  bs_err sub;
  bs_err_clear(&sub);
  struct stat st;
  int fd = bs_safe_openat(stg->fd, dir, BS_JOURNAL_NAME, O_RDONLY, 0, BS_SAFE_REG | BS_SAFE_PRIVATE,
                          &st, &sub);
  if (fd < 0) {
    if (sub.code == ENOENT)
      return 1;
    return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "%s", sub.msg);
  }
  *map = NULL;
  *len = 0;
  if (st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX)
    *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (*map == MAP_FAILED)
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s/" BS_JOURNAL_NAME ": cannot read it: %s", dir,
                   strerror(e));
  *len = (size_t)st.st_size;
  return 0;
}

bool bs_journal_nothing_to_finish(const struct bs_stage_dir *stg)
{
  if (!bs_journal_unchanged(stg->fd)) /* (its first record's length: no replay) */
    return false;
  void *map;
  size_t len;
  bs_err err;
  bs_err_clear(&err);
  int m = map_journal(stg, &map, &len, &err);
  if (m != 0 || len == 0)
    return m == 1 || (m == 0 && len == 0); /* none, or empty (killed as it was created) */
  struct bs_jreplay r;
  int rc = bs_journal_replay(map, len, &r, &err);
  /* BASE alone, or BASE cut by a kill at mount (all after the magic a torn
   * tail); not a BASE whose length a flipped bit made run past records
   * that follow it (damage). */
  bool nothing = !r.damaged && (rc == 0 ? r.records == 1
                                        : r.records == 0 && r.torn == len - BS_JOURNAL_MAGIC_LEN);
  bs_jreplay_destroy(&r);
  munmap(map, len);
  return nothing;
}

int bs_journal_rebuild(const struct bs_stage_dir *stg, bool salvage, struct bs_buf *index,
                       struct bs_buf *notes, bool *salvaged, bs_err *err)
{
  const char *dir = stg->path;
  *salvaged = false;
  void *map;
  size_t maplen;
  int mapped = map_journal(stg, &map, &maplen, err);
  if (mapped != 0)
    return mapped;
  if (maplen == 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "%s/" BS_JOURNAL_NAME ": cannot read it (empty)",
                   dir);
  struct bs_jreplay r;
  struct bs_catalog out;
  bs_catalog_init(&out);
  int rc = -1;
  char m[sizeof err->msg];
  if (bs_journal_replay(map, maplen, &r, err) != 0) {
    snprintf(m, sizeof m, "%s", err->msg);
    err->msg[0] = '\0';
    int code = err->code;
    err->code = 0;
    bs_fail(err, code, err->off, err->key[0] ? err->key : NULL, "%s/" BS_JOURNAL_NAME ": %s", dir,
            m);
    goto out;
  }
  /* A journal copied from another staging directory: its BASE names that
   * one (and its target), its records this one's staged files. */
  if (r.records >= 1 && bs_stage_index_check_dir(&r.base, stg, BS_JOURNAL_NAME, err) != 0)
    goto out;
  /* A damaged record with records after it is not the end of the last
   * write: what follows it would be lost without a word. */
  if (r.damaged && !salvage) {
    bs_fail(err, EBADMSG, r.damage_off, NULL,
            "%s/" BS_JOURNAL_NAME ": record %zu (offset %llu) is damaged (%s) and is not the end "
            "of the journal: nothing applied, the staging directory is kept (--finish --salvage "
            "writes what precedes it)",
            dir, r.damage_rec, (unsigned long long)r.damage_off, r.damage_why);
    goto out;
  }
  if (r.unsynced_off != BS_JREPLAY_NONE)
    note(notes,
         "%s/" BS_JOURNAL_NAME ": the journal stopped being durable at record %zu (offset %llu): "
         "the mount's fdatasync failed (%s); records after it were read as the file holds them\n",
         dir, r.unsynced_rec, (unsigned long long)r.unsynced_off, strerror(r.unsynced_errno));
  if (r.torn)
    note(notes,
         "%s/" BS_JOURNAL_NAME ": the last %llu bytes (the append the kill cut) were not "
         "applied\n",
         dir, (unsigned long long)r.torn);
  if (r.damaged) {
    note(notes,
         "%s/" BS_JOURNAL_NAME
         ": salvaged: records 1 to %zu applied; from record %zu (offset %llu) "
         "on, dropped:\n",
         dir, r.records, r.damage_rec, (unsigned long long)r.damage_off);
    if (bs_jreplay_dropped(map, maplen, &r, dir, notes) != 0) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
    *salvaged = true;
  }
  if (bs_stage_index_attach(&r.base, stg, err) != 0 || size_staged(&r, stg, err) != 0 ||
      bs_edit_catalog(&r.ed, stg, true, &out, err) != 0)
    goto out;
  out.format = r.base.format;
  const struct bs_writer *w = bs_writer_for_format(r.base.format);
  if (w && w->default_meta && w->default_meta(&out, err) != 0)
    goto out;
  /* The INDEX a write-back at this point would have saved; a salvage's is
   * never saved (a later --finish would take it for the whole journal). */
  if (bs_stage_index_format(&r.base, &out, dir, index, err) != 0 ||
      (!r.damaged && bs_stage_index_save(stg->fd, index, err) != 0))
    goto out;
  rc = 0;
out:
  bs_catalog_destroy(&out);
  bs_jreplay_destroy(&r);
  munmap(map, maplen);
  return rc;
}
