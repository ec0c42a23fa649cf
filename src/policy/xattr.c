/* The xattr table (see xattr.h). */
#include "policy/xattr.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"
#include "formats/safetensors_sharded.h"

/* What a row works on: the mount, the node and the entry that describes it
 * (its own, or for a read-only mount a clean one over its tensor). */
struct ctx {
  const struct bs_xa_mount *m;
  const struct bs_xa_node *n;
  const struct bs_entry *e;
  const char *sub; /* a prefix row's part of the name after the prefix */
};

struct bs_xa_row {
  const char *name; /* after BS_XA_PREFIX; ending in '.': a prefix */
  unsigned scope;
  enum bs_xa_set_kind kind;
  bool unlocked; /* get runs without the entry lock (key_of) */
  int (*get)(const struct ctx *c, struct bs_buf *out, bs_err *err);
  /* Listed here? NULL with list: the row lists its own names. */
  bool (*listed)(const struct ctx *c);
  int (*list)(const struct ctx *c, struct bs_buf *out, bs_err *err);
  /* BS_XA_SETTABLE rows (held: the entry's lock for writing). */
  int (*set)(const struct ctx *c, const char *v, size_t len, bool *dirty, bs_err *err);
  int (*remove)(const struct ctx *c, bool *dirty, bs_err *err);
};

static int put(struct bs_buf *b, const char *s, bs_err *err)
{
  return bs_buf_put(b, s, strlen(s)) ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory") : 0;
}

static int none(bs_err *err)
{
  return bs_fail(err, ENODATA, BS_OFF_NONE, NULL, "no such attribute here");
}

static struct bs_entry *wr(const struct ctx *c)
{
  return c->n->e; /* settable rows run on writable mounts only */
}

static const struct bs_tensor *origin(const struct ctx *c)
{
  return bs_entry_origin(c->m->edit, c->e);
}

/* ---- dtype, shape, param_id ---------------------------------------------------------------- */

static int get_dtype(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  struct bs_eff eff;
  bs_entry_effective(c->m->edit, c->e, &eff);
  return put(out, bs_dtype_name(eff.dtype), err);
}

static bool listed_dtype(const struct ctx *c)
{
  struct bs_eff eff;
  bs_entry_effective(c->m->edit, c->e, &eff);
  return !eff.dtype_inferred;
}

/* A clean strided tensor is read through its origin's view, which a new
 * dtype or shape would not fit: its bytes are staged first. */
static int stage_strided(const struct ctx *c, bs_err *err)
{
  if (!bs_entry_strided_clean(c->m->edit, c->e))
    return 0;
  int rc = c->m->stage ? c->m->stage(c->m->arg, wr(c)) : ENOTSUP;
  return rc ? bs_fail(err, rc, BS_OFF_NONE, NULL, "cannot copy the file's bytes to staging: %s",
                      strerror(rc))
            : 0;
}

static int set_dtype(const struct ctx *c, const char *v, size_t len, bool *dirty, bs_err *err)
{
  if (stage_strided(c, err) != 0 || bs_entry_set_dtype(c->m->edit, wr(c), v, len, err) != 0)
    return -1;
  *dirty = true;
  return 0;
}

static int remove_dtype(const struct ctx *c, bool *dirty, bs_err *err)
{
  (void)err;
  *dirty = wr(c)->has_dtype;
  bs_entry_clear_dtype(c->m->edit, wr(c));
  return 0;
}

static int get_shape(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  struct bs_eff eff;
  bs_entry_effective(c->m->edit, c->e, &eff);
  char *s = bs_shape_json(eff.rank, eff.shape);
  int rc = s ? put(out, s, err) : bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  bs_free(s);
  return rc;
}

static bool listed_shape(const struct ctx *c)
{
  struct bs_eff eff;
  bs_entry_effective(c->m->edit, c->e, &eff);
  return !eff.shape_inferred;
}

static int set_shape(const struct ctx *c, const char *v, size_t len, bool *dirty, bs_err *err)
{
  if (stage_strided(c, err) != 0 || bs_entry_set_shape(c->m->edit, wr(c), v, len, err) != 0)
    return -1;
  *dirty = true;
  return 0;
}

static int remove_shape(const struct ctx *c, bool *dirty, bs_err *err)
{
  (void)err;
  *dirty = wr(c)->has_shape;
  bs_entry_clear_shape(c->m->edit, wr(c));
  return 0;
}

static int get_param_id(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  const struct bs_tensor *t = origin(c);
  uint64_t v;
  if (c->e->has_param_id)
    v = c->e->param_id;
  else if (t && t->has_param_id)
    v = t->x->param_id;
  else
    return none(err);
  char tmp[24];
  snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  return put(out, tmp, err);
}

static bool listed_param_id(const struct ctx *c)
{
  const struct bs_tensor *t = origin(c);
  return c->e->has_param_id || (t && t->has_param_id);
}

static int set_param_id(const struct ctx *c, const char *v, size_t len, bool *dirty, bs_err *err)
{
  if (bs_entry_set_param_id(c->m->edit, wr(c), v, len, err) != 0)
    return -1;
  *dirty = true;
  return 0;
}

static int remove_param_id(const struct ctx *c, bool *dirty, bs_err *err)
{
  (void)err;
  *dirty = wr(c)->has_param_id;
  bs_entry_clear_param_id(c->m->edit, wr(c));
  return 0;
}

/* ---- computed: key, shard, format, values, notes ------------------------------------------- */

static bool always(const struct ctx *c)
{
  (void)c;
  return true;
}

/* The source key in a read-only mount, else the key of the file's path. */
static int get_key(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  const struct bs_catalog *cat = c->m->cat;
  if (!c->n->e && c->n->tensor >= 0 && (size_t)c->n->tensor < cat->count)
    return put(out, cat->tensors[c->n->tensor].key, err);
  char *key = c->m->key_of ? c->m->key_of(c->m->arg, c->n->ino) : NULL;
  if (!key)
    return none(err);
  int rc = put(out, key, err);
  bs_free(key);
  return rc;
}

static const char *shard_of(const struct ctx *c)
{
  const struct bs_tensor *t = c->e->stage ? NULL : origin(c);
  return t ? bs_st_index_shard_of(c->m->cat, t) : NULL;
}

static int get_shard(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  const char *s = shard_of(c);
  return s ? put(out, s, err) : none(err);
}

static bool listed_shard(const struct ctx *c)
{
  return shard_of(c) != NULL;
}

/* A new mount has no source: it is what its output will be. */
static int get_format(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  const struct bs_xa_mount *m = c->m;
  return put(out,
             m->cat->format != BS_FMT_NONE ? bs_format_name(m->cat->format)
             : m->writer                   ? m->writer->name
                                           : "burnpack",
             err);
}

static int get_values(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  return c->m->cat->values_json ? put(out, c->m->cat->values_json, err) : none(err);
}

static bool listed_values(const struct ctx *c)
{
  return c->m->cat->values_json != NULL;
}

static int get_omitted(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  return c->m->omitted ? put(out, c->m->omitted, err) : none(err);
}

static bool listed_omitted(const struct ctx *c)
{
  return c->m->omitted != NULL;
}

static int get_notes(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  return c->m->cat->notes ? put(out, c->m->cat->notes, err) : none(err);
}

static bool listed_notes(const struct ctx *c)
{
  return c->m->cat->notes != NULL;
}

/* ---- meta.NAME: the root's metadata ------------------------------------------------------- */

static int get_meta(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  const struct bs_kv *kv = bs_edit_find_meta(c->m->edit, c->sub);
  if (!kv)
    return none(err);
  uint64_t n = bs_kv_text_len(kv);
  /* Longer than Linux lets an xattr be (a GGUF tokenizer vocabulary);
   * `burnstore info FILE --meta KEY` prints it. */
  if (n > BS_MAX_XATTR_VALUE)
    return bs_fail(err, E2BIG, BS_OFF_NONE, NULL,
                   "metadata '%.100s' holds %" PRIu64 " bytes, more than an xattr can (%u)", c->sub,
                   n, BS_MAX_XATTR_VALUE);
  bool cut; /* a value left in the source file (GGUF) is made text now, this one only */
  return bs_meta_text(c->m->cat, kv, n, out, &cut, err);
}

/* The keys whose names fit in what is left of BS_XA_LIST_MAX, in order,
 * and whose values getxattr can return. */
static int list_meta(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  const struct bs_edit *ed = c->m->edit;
  static const char pre[] = BS_XA_PREFIX "meta.";
  for (size_t i = 0; i < ed->nmeta; i++) {
    size_t kl = strlen(ed->meta[i].key);
    if (out->len >= BS_XA_LIST_MAX || sizeof pre + kl > BS_XA_LIST_MAX - out->len)
      continue; /* a shorter one further on may still fit */
    if (bs_kv_text_len(&ed->meta[i]) > BS_MAX_XATTR_VALUE)
      continue;
    if (bs_buf_put(out, pre, sizeof pre - 1) || bs_buf_put(out, ed->meta[i].key, kl + 1))
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  return 0;
}

static int set_meta(const struct ctx *c, const char *v, size_t len, bool *dirty, bs_err *err)
{
  const struct bs_xa_mount *m = c->m;
  if (bs_writer_check_meta(m->writer, m->rules, c->sub, v, len, err) != 0 ||
      bs_edit_set_meta(m->edit, c->sub, v, len, err) != 0)
    return -1;
  *dirty = true;
  return 0;
}

static int remove_meta(const struct ctx *c, bool *dirty, bs_err *err)
{
  if (bs_edit_remove_meta(c->m->edit, c->sub, err) != 0)
    return -1;
  *dirty = true;
  return 0;
}

/* ---- stored_dtype: a decoded view's (-o as=F32) stored dtype ----------------------------------
 */

static const struct bs_tensor *decoded_origin(const struct ctx *c)
{
  const struct bs_tensor *t = c->e ? origin(c) : NULL;
  return t && t->decoded ? t : NULL;
}

static int get_stored_dtype(const struct ctx *c, struct bs_buf *out, bs_err *err)
{
  const struct bs_tensor *t = decoded_origin(c);
  return t ? put(out, bs_dtype_name((enum bs_dtype)t->stored_dtype), err) : none(err);
}

static bool listed_stored_dtype(const struct ctx *c)
{
  return decoded_origin(c) != NULL;
}

/* ---- The table --------------------------------------------------------------------------------
 */

static const struct bs_xa_row rows[] = {
    {"dtype", BS_XA_FILE, BS_XA_SETTABLE, false, get_dtype, listed_dtype, NULL, set_dtype,
     remove_dtype},
    {"shape", BS_XA_FILE, BS_XA_SETTABLE, false, get_shape, listed_shape, NULL, set_shape,
     remove_shape},
    {"stored_dtype", BS_XA_FILE, BS_XA_FIXED, false, get_stored_dtype, listed_stored_dtype, NULL,
     NULL, NULL},
    {"key", BS_XA_FILE, BS_XA_IGNORED, true, get_key, always, NULL, NULL, NULL},
    {"param_id", BS_XA_FILE, BS_XA_SETTABLE, false, get_param_id, listed_param_id, NULL,
     set_param_id, remove_param_id},
    {"shard", BS_XA_FILE, BS_XA_FIXED, false, get_shard, listed_shard, NULL, NULL, NULL},
    {"format", BS_XA_ROOT, BS_XA_IGNORED, false, get_format, always, NULL, NULL, NULL},
    {"values", BS_XA_ROOT, BS_XA_FIXED, false, get_values, listed_values, NULL, NULL, NULL},
    {"notes", BS_XA_ROOT, BS_XA_FIXED, false, get_notes, listed_notes, NULL, NULL, NULL},
    {"omitted", BS_XA_ROOT, BS_XA_FIXED, false, get_omitted, listed_omitted, NULL, NULL, NULL},
    /* last: what a long metadata list leaves out is the tail of the listing */
    {"meta.", BS_XA_ROOT, BS_XA_SETTABLE, false, get_meta, NULL, list_meta, set_meta, remove_meta},
};
const size_t bs_xa_nrows = sizeof rows / sizeof rows[0];

void bs_xa_row_info(size_t i, struct bs_xa_info *out)
{
  out->name = rows[i].name;
  out->scope = rows[i].scope;
  out->set = rows[i].kind;
}

static bool has_prefix(const char *s, const char *p)
{
  return strncmp(s, p, strlen(p)) == 0;
}

static bool reserved(const char *name)
{
  return has_prefix(name, BS_XA_PREFIX);
}

/* The row of a reserved name, or NULL; *sub gets a prefix row's rest. */
static const struct bs_xa_row *lookup(const char *name, const char **sub)
{
  const char *s = name + strlen(BS_XA_PREFIX);
  for (size_t i = 0; i < bs_xa_nrows; i++) {
    size_t n = strlen(rows[i].name);
    bool prefix = rows[i].name[n - 1] == '.';
    if (prefix ? strncmp(s, rows[i].name, n) == 0 : strcmp(s, rows[i].name) == 0) {
      *sub = s + (prefix ? n : 0);
      return &rows[i];
    }
  }
  return NULL;
}

static bool in_scope(const struct bs_xa_row *r, const struct bs_xa_node *n)
{
  unsigned where = n->is_root ? BS_XA_ROOT : n->is_dir ? BS_XA_DIR : BS_XA_FILE;
  return (r->scope & where) != 0;
}

bool bs_xa_unlocked(const char *name)
{
  const char *sub;
  const struct bs_xa_row *r = reserved(name) ? lookup(name, &sub) : NULL;
  return r && r->unlocked;
}

/* The context of node n; tmp holds a read-only mount's view entry. */
static void ctx_init(struct ctx *c, const struct bs_xa_mount *m, const struct bs_xa_node *n,
                     struct bs_entry *tmp)
{
  c->m = m;
  c->n = n;
  c->sub = "";
  if (n->e) {
    c->e = n->e;
    return;
  }
  memset(tmp, 0, sizeof *tmp);
  tmp->is_dir = n->is_dir;
  tmp->tensor = n->is_dir ? -1 : n->tensor;
  const struct bs_tensor *t = bs_entry_origin(m->edit, tmp);
  tmp->size = t ? t->nbytes : 0;
  c->e = tmp;
}

int bs_xa_mount_init(struct bs_xa_mount *m, const struct bs_catalog *cat, struct bs_edit *edit,
                     const struct bs_writer *writer, bs_err *err)
{
  memset(m, 0, sizeof *m);
  m->cat = cat;
  m->edit = edit;
  m->writer = writer;
  return writer ? bs_writer_meta_rules(writer, cat, &m->rules, err) : 0;
}

void bs_xa_mount_destroy(struct bs_xa_mount *m)
{
  if (m->writer)
    bs_writer_meta_rules_free(m->writer, m->rules);
  m->rules = NULL;
}

int bs_xa_get(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *name,
              struct bs_buf *out, bs_err *err)
{
  struct bs_entry tmp;
  struct ctx c;
  ctx_init(&c, m, n, &tmp);
  if (reserved(name)) {
    const struct bs_xa_row *r = lookup(name, &c.sub);
    return r && in_scope(r, n) ? r->get(&c, out, err) : none(err);
  }
  const struct bs_xattr *x = bs_entry_get_xattr(c.e, name);
  if (!x)
    return none(err);
  return bs_buf_put(out, x->value, x->len)
             ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory")
             : 0;
}

int bs_xa_list(const struct bs_xa_mount *m, const struct bs_xa_node *n, struct bs_buf *out,
               bs_err *err)
{
  struct bs_entry tmp;
  struct ctx c;
  ctx_init(&c, m, n, &tmp);
  const struct bs_xa_row *prefixed = NULL;
  for (size_t i = 0; i < bs_xa_nrows; i++) {
    const struct bs_xa_row *r = &rows[i];
    if (!in_scope(r, n))
      continue;
    if (r->list) {
      prefixed = r;
      continue;
    }
    if (!r->listed(&c))
      continue;
    if (put(out, BS_XA_PREFIX, err) != 0 || bs_buf_put(out, r->name, strlen(r->name) + 1) != 0)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  for (size_t i = 0; i < c.e->nxattrs; i++) {
    const char *x = c.e->xattrs[i].name;
    if (!reserved(x) && bs_buf_put(out, x, strlen(x) + 1) != 0)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  return prefixed ? prefixed->list(&c, out, err) : 0;
}

/* A computed name: a set that would change nothing is accepted (see xattr.h). */
static int set_computed(const struct bs_xa_row *r, const struct ctx *c, const char *name,
                        const char *v, size_t len, bs_err *err)
{
  if (r->kind == BS_XA_IGNORED)
    return 0;
  struct bs_buf cur = {0};
  bs_err sub;
  bs_err_clear(&sub);
  int rc = r->get(c, &cur, &sub);
  bool same = rc == 0 && cur.len == len && (len == 0 || memcmp(cur.data, v, len) == 0);
  bs_buf_destroy(&cur);
  if (rc != 0 && sub.code != ENODATA)
    return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "%s", sub.msg);
  if (rc == 0 && !same)
    return bs_fail(err, EPERM, BS_OFF_NONE, NULL,
                   "%s is computed by the mount and cannot be set to another value", name);
  return 0;
}

int bs_xa_set(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *name,
              const char *value, size_t len, int flags, bool *dirty, bs_err *err)
{
  *dirty = false;
  if (!m->writer || !n->e)
    return bs_fail(err, EROFS, BS_OFF_NONE, NULL, "a read-only mount");
  if (!has_prefix(name, "user."))
    return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "only user.* xattrs can be set");
  if (len > BS_MAX_XATTR_VALUE)
    return bs_fail(err, E2BIG, BS_OFF_NONE, NULL, "a value of %zu bytes (at most %u)", len,
                   BS_MAX_XATTR_VALUE);
  struct bs_entry tmp;
  struct ctx c;
  ctx_init(&c, m, n, &tmp);
  if (!reserved(name))
    return bs_entry_set_xattr(m->edit, n->e, name, value, len, flags, err);
  const struct bs_xa_row *r = lookup(name, &c.sub);
  if (!r)
    return bs_fail(err, EPERM, BS_OFF_NONE, NULL,
                   "%s: no such attribute (the user.burnstore. names are reserved)", name);
  if (!in_scope(r, n))
    return bs_fail(err, EPERM, BS_OFF_NONE, NULL, "%s is only on %s", name,
                   r->scope == BS_XA_ROOT ? "the mount's root" : "files");
  if (r->kind != BS_XA_SETTABLE)
    return set_computed(r, &c, name, value, len, err);
  return r->set(&c, value, len, dirty, err);
}

int bs_xa_remove(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *name,
                 bool *dirty, bs_err *err)
{
  *dirty = false;
  if (!m->writer || !n->e)
    return bs_fail(err, EROFS, BS_OFF_NONE, NULL, "a read-only mount");
  struct bs_entry tmp;
  struct ctx c;
  ctx_init(&c, m, n, &tmp);
  if (!reserved(name))
    return bs_entry_remove_xattr(m->edit, n->e, name, err);
  const struct bs_xa_row *r = lookup(name, &c.sub);
  if (!r || !in_scope(r, n))
    return none(err);
  return r->kind == BS_XA_SETTABLE ? r->remove(&c, dirty, err) : 0;
}
