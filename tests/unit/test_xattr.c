/* The xattr table (core/xattr.h) without FUSE: every row's get, set, remove
 * and listing, on a file, a directory and the root, of a read-only and a
 * writable mount; the reserved namespace; the listing bound. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "policy/xattr.h"

static bs_err err;
static struct bs_catalog cat;
static struct bs_tree tree;
static struct bs_edit ed;
static struct bs_xa_mount ro, rw;
static uint8_t bytes[64];

static char *key_of(void *arg, uint64_t ino)
{
  (void)arg;
  return bs_tree_key(&tree, ino, false);
}

static void setup(void)
{
  bs_err_clear(&err);
  bs_catalog_init(&cat);
  cat.format = BS_FMT_BURNPACK;
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&s, bytes, sizeof bytes, "mem", &err), 0);
  cr_assert_eq(bs_catalog_add_src(&cat, &s, &idx, &err), 0);
  uint64_t s23[2] = {2, 3};
  struct bs_tensor *t = bs_catalog_add(&cat, "enc.w", BS_DT_F32, 2, s23, 0, &err);
  cr_assert_not_null(t);
  t->src = 0;
  t->has_param_id = true;
  cr_assert_not_null(bs_tensor_x(&cat, t));
  t->x->param_id = 5;
  cr_assert_eq(bs_catalog_add_meta(&cat, "author", "me", &err), 0);
  cat.values_json = bs_strdup("{\"epoch\":3}");
  cr_assert_eq(bs_catalog_note(&cat, "skipped x", &err), 0);
  cr_assert_eq(bs_tree_init(&tree, &err), 0);
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_edit_init(&ed, &cat, &tree, false, &err), 0);
  cr_assert_eq(bs_xa_mount_init(&ro, &cat, &ed, NULL, &err), 0);
  ro.key_of = key_of;
  cr_assert_eq(bs_xa_mount_init(&rw, &cat, &ed, bs_writer_for_format(BS_FMT_BURNPACK), &err), 0);
  rw.key_of = key_of;
}

static void teardown(void)
{
  bs_xa_mount_destroy(&ro);
  bs_xa_mount_destroy(&rw);
  bs_edit_destroy(&ed);
  bs_tree_destroy(&tree);
  bs_catalog_destroy(&cat);
}
TestSuite(xattr, .init = setup, .fini = teardown);

/* A writable mount's entries (what bs_edit_attach gives, without owners). */
static void attach_all(void)
{
  for (uint64_t ino = BS_TREE_ROOT; ino < tree.n; ino++) {
    struct bs_node *nd = &tree.nodes[ino];
    if (!nd->live || bs_tree_user(&tree, ino))
      continue;
    long ti = nd->is_dir ? -1 : nd->tensor;
    struct bs_entry *e = bs_entry_new(ti, ti >= 0 ? cat.tensors[ti].nbytes : 0, nd->is_dir, 0644);
    cr_assert_not_null(e);
    cr_assert_eq(bs_tree_set_user(&tree, ino, e), 0);
  }
}

/* A node of the read-only (writable: entries attached) mount. */
static struct bs_xa_node node(const char *path, bool writable)
{
  uint64_t ino = BS_TREE_ROOT;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = strtok(buf, "/"); p; p = strtok(NULL, "/")) {
    ino = bs_tree_lookup(&tree, ino, p);
    cr_assert_neq(ino, 0, "no %s", path);
  }
  if (writable)
    attach_all();
  const struct bs_node *nd = &tree.nodes[ino];
  return (struct bs_xa_node){ino, nd->is_dir, ino == BS_TREE_ROOT, nd->is_dir ? -1 : nd->tensor,
                             writable ? bs_edit_entry(&ed, ino) : NULL};
}

/* getxattr as text: the value, or NULL with *code the errno. */
static char *get(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *name,
                 int *code)
{
  struct bs_buf b = {0};
  bs_err e;
  bs_err_clear(&e);
  *code = bs_xa_get(m, n, name, &b, &e) ? e.code : 0;
  if (*code) {
    bs_buf_destroy(&b);
    return NULL;
  }
  char *s = bs_strndup(b.data ? (const char *)b.data : "", b.len);
  bs_buf_destroy(&b);
  return s;
}

static void expect_value(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *name,
                         const char *want)
{
  int code;
  char *v = get(m, n, name, &code);
  if (want) {
    cr_expect_eq(code, 0, "%s: errno %d", name, code);
    cr_expect_str_eq(v ? v : "(null)", want, "%s", name);
  } else {
    cr_expect_eq(code, ENODATA, "%s: %s", name, v ? v : "(error)");
  }
  bs_free(v);
}

/* The listing as "a,b,c". */
static char *list(const struct bs_xa_mount *m, const struct bs_xa_node *n)
{
  struct bs_buf b = {0};
  bs_err e;
  bs_err_clear(&e);
  cr_assert_eq(bs_xa_list(m, n, &b, &e), 0, "%s", e.msg);
  for (size_t i = 0; i + 1 < b.len; i++)
    if (b.data[i] == '\0')
      b.data[i] = ',';
  char *s = bs_strndup(b.data ? (const char *)b.data : "", b.len ? b.len - 1 : 0);
  bs_buf_destroy(&b);
  return s;
}

static void expect_list(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *want)
{
  char *s = list(m, n);
  cr_expect_str_eq(s, want);
  bs_free(s);
}

static int set(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *name,
               const char *v, size_t len, bool *dirty)
{
  bs_err e;
  bs_err_clear(&e);
  bool d;
  int rc = bs_xa_set(m, n, name, v, len, 0, dirty ? dirty : &d, &e) ? e.code : 0;
  if (rc)
    cr_expect_neq(e.msg[0], '\0', "an error says why");
  return rc;
}

static int rm(const struct bs_xa_mount *m, const struct bs_xa_node *n, const char *name,
              bool *dirty)
{
  bs_err e;
  bs_err_clear(&e);
  bool d;
  return bs_xa_remove(m, n, name, dirty ? dirty : &d, &e) ? e.code : 0;
}

#define S(s) s, strlen(s)
#define X(n) "user.burnstore." n

Test(xattr, the_table_has_every_name_once)
{
  static const char *const want[] = {"dtype",    "shape",   "stored_dtype", "key",
                                     "param_id", "shard",   "format",       "values",
                                     "notes",    "omitted", "meta."};
  cr_assert_eq(bs_xa_nrows, sizeof want / sizeof want[0]);
  for (size_t i = 0; i < bs_xa_nrows; i++) {
    struct bs_xa_info r;
    bs_xa_row_info(i, &r);
    cr_expect_str_eq(r.name, want[i]);
    bool root = strcmp(r.name, "format") == 0 || strcmp(r.name, "values") == 0 ||
                strcmp(r.name, "notes") == 0 || strcmp(r.name, "omitted") == 0 ||
                strcmp(r.name, "meta.") == 0;
    cr_expect_eq(r.scope, root ? (unsigned)BS_XA_ROOT : (unsigned)BS_XA_FILE, "%s", r.name);
  }
  cr_expect(bs_xa_unlocked(X("key")), "key is read under the tree lock only");
  cr_expect(!bs_xa_unlocked(X("dtype")));
  cr_expect(!bs_xa_unlocked("user.key"));
}

Test(xattr, omitted_is_the_views_list_on_the_root)
{
  struct bs_xa_node f = node("enc/w", false), r = node("", false);
  expect_value(&ro, &r, X("omitted"), NULL); /* no view, or nothing left out */
  ro.omitted = "2 non-tensor values of the source not written: epoch, loss\n";
  expect_value(&ro, &r, X("omitted"), ro.omitted);
  expect_value(&ro, &f, X("omitted"), NULL); /* the root's only */
  ro.omitted = NULL;
}

Test(xattr, read_only_mount_answers_and_refuses_changes)
{
  struct bs_xa_node f = node("enc/w", false), d = node("enc", false), r = node("", false);
  expect_value(&ro, &f, X("dtype"), "F32");
  expect_value(&ro, &f, X("shape"), "[2,3]");
  expect_value(&ro, &f, X("key"), "enc.w");
  expect_value(&ro, &f, X("param_id"), "5");
  expect_value(&ro, &f, X("shard"), NULL);
  expect_value(&ro, &f, X("stored_dtype"), NULL); /* only under -o as=F32 */
  expect_value(&ro, &f, X("format"), NULL);
  expect_value(&ro, &f, X("meta.author"), NULL);
  expect_value(&ro, &r, X("format"), "burnpack");
  expect_value(&ro, &r, X("values"), "{\"epoch\":3}");
  expect_value(&ro, &r, X("notes"), "skipped x\n");
  expect_value(&ro, &r, X("meta.author"), "me");
  expect_value(&ro, &r, X("meta.nobody"), NULL);
  expect_value(&ro, &r, X("dtype"), NULL);
  expect_value(&ro, &d, X("format"), NULL);
  expect_value(&ro, &d, X("key"), NULL);
  expect_list(&ro, &f, X("dtype") "," X("shape") "," X("key") "," X("param_id"));
  expect_list(&ro, &d, "");
  expect_list(&ro, &r, X("format") "," X("values") "," X("notes") "," X("meta.author"));
  for (size_t i = 0; i < 3; i++) {
    const struct bs_xa_node *n = i == 0 ? &f : i == 1 ? &d : &r;
    cr_expect_eq(set(&ro, n, X("dtype"), S("F16"), NULL), EROFS);
    cr_expect_eq(set(&ro, n, X("meta.x"), S("1"), NULL), EROFS);
    cr_expect_eq(set(&ro, n, "user.foo", S("1"), NULL), EROFS);
    cr_expect_eq(rm(&ro, n, X("dtype"), NULL), EROFS);
  }
}

Test(xattr, writable_file_rows)
{
  struct bs_xa_node f = node("enc/w", true);
  bool dirty;
  /* dtype: set, shown, listed; removed: the source's again */
  cr_expect_eq(set(&rw, &f, X("dtype"), S("I32\n"), &dirty), 0);
  cr_expect(dirty);
  expect_value(&rw, &f, X("dtype"), "I32");
  cr_expect_eq(set(&rw, &f, X("dtype"), S("F99"), &dirty), EINVAL);
  cr_expect_eq(rm(&rw, &f, X("dtype"), &dirty), 0);
  cr_expect(dirty);
  expect_value(&rw, &f, X("dtype"), "F32");
  cr_expect_eq(rm(&rw, &f, X("dtype"), &dirty), 0);
  cr_expect(!dirty, "nothing was set");
  /* shape */
  cr_expect_eq(set(&rw, &f, X("shape"), S("[3, 2]"), &dirty), 0);
  cr_expect(dirty);
  expect_value(&rw, &f, X("shape"), "[3,2]");
  cr_expect_eq(set(&rw, &f, X("shape"), S("3x2"), NULL), EINVAL);
  cr_expect_eq(rm(&rw, &f, X("shape"), &dirty), 0);
  expect_value(&rw, &f, X("shape"), "[2,3]");
  /* param_id */
  cr_expect_eq(set(&rw, &f, X("param_id"), S("77"), &dirty), 0);
  cr_expect(dirty);
  expect_value(&rw, &f, X("param_id"), "77");
  cr_expect_eq(set(&rw, &f, X("param_id"), S("-1"), NULL), EINVAL);
  cr_expect_eq(rm(&rw, &f, X("param_id"), &dirty), 0);
  expect_value(&rw, &f, X("param_id"), "5");
  /* key: computed from the path; a copy's key is accepted, nothing kept */
  cr_expect_eq(set(&rw, &f, X("key"), S("other.name"), &dirty), 0);
  cr_expect(!dirty);
  expect_value(&rw, &f, X("key"), "enc.w");
  cr_expect_eq(rm(&rw, &f, X("key"), NULL), 0);
  expect_value(&rw, &f, X("key"), "enc.w");
  /* shard: this file has none, so a copy's is accepted and not kept */
  cr_expect_eq(set(&rw, &f, X("shard"), S("x"), &dirty), 0);
  cr_expect(!dirty);
  expect_value(&rw, &f, X("shard"), NULL);
  cr_expect_eq(rm(&rw, &f, X("shard"), NULL), 0);
  cr_expect_eq(f.e->nxattrs, 0, "no reserved name is ever stored");
  expect_list(&rw, &f, X("dtype") "," X("shape") "," X("key") "," X("param_id"));
}

Test(xattr, writable_root_rows)
{
  struct bs_xa_node r = node("", true);
  bool dirty;
  /* format: the output decides; any copy's value is accepted and dropped */
  cr_expect_eq(set(&rw, &r, X("format"), S("safetensors"), &dirty), 0);
  cr_expect(!dirty);
  expect_value(&rw, &r, X("format"), "burnpack");
  cr_expect_eq(rm(&rw, &r, X("format"), NULL), 0);
  /* values, notes: the same value is a no-op, another is refused */
  cr_expect_eq(set(&rw, &r, X("values"), S("{\"epoch\":3}"), &dirty), 0);
  cr_expect(!dirty);
  cr_expect_eq(set(&rw, &r, X("values"), S("{}"), NULL), EPERM);
  expect_value(&rw, &r, X("values"), "{\"epoch\":3}");
  cr_expect_eq(set(&rw, &r, X("notes"), S("forged"), NULL), EPERM);
  cr_expect_eq(rm(&rw, &r, X("notes"), NULL), 0);
  expect_value(&rw, &r, X("notes"), "skipped x\n");
  /* meta.NAME: set, listed, removed; the writer's rules at the edge */
  cr_expect_eq(set(&rw, &r, X("meta.lr"), S("0.1"), &dirty), 0);
  cr_expect(dirty);
  expect_value(&rw, &r, X("meta.lr"), "0.1");
  cr_expect_eq(set(&rw, &r, X("meta.lr"), "a\0b", 3, NULL), EINVAL);
  cr_expect_eq(set(&rw, &r, X("meta.lr"), S("caf\xe9"), NULL), EINVAL);
  expect_value(&rw, &r, X("meta.lr"), "0.1");
  expect_list(&rw, &r,
              X("format") "," X("values") "," X("notes") "," X("meta.author") "," X("meta.lr"));
  cr_expect_eq(rm(&rw, &r, X("meta.lr"), &dirty), 0);
  cr_expect(dirty);
  expect_value(&rw, &r, X("meta.lr"), NULL);
  cr_expect_eq(rm(&rw, &r, X("meta.lr"), NULL), ENODATA);
  cr_expect_eq(r.e->nxattrs, 0, "no reserved name is ever stored");
}

Test(xattr, reserved_names_are_never_stored)
{
  struct bs_xa_node f = node("enc/w", true), d = node("enc", false), r = node("", false);
  d.e = bs_edit_entry(&ed, d.ino);
  r.e = bs_edit_entry(&ed, r.ino);
  static const struct {
    const char *path, *name;
  } refused[] = {
      {"f", X("bogus")},       {"f", X("shard.x")},  {"f", X("meta.k")}, {"f", X("format")},
      {"f", X("values")},      {"d", X("dtype")},    {"d", X("key")},    {"d", X("meta.k")},
      {"r", X("shape")},       {"r", X("param_id")}, {"r", X("bogus")},  {"r", X("shard")},
      {"f", "user.burnstore"}, {"r", X("")},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    const struct bs_xa_node *n = refused[i].path[0] == 'f'   ? &f
                                 : refused[i].path[0] == 'd' ? &d
                                                             : &r;
    const char *name = refused[i].name;
    if (strcmp(name, "user.burnstore") == 0) {
      /* not the namespace: a foreign user.* name like any other */
      cr_expect_eq(set(&rw, n, name, S("1"), NULL), 0);
      cr_expect_eq(rm(&rw, n, name, NULL), 0);
      continue;
    }
    cr_expect_eq(set(&rw, n, name, S("1"), NULL), EPERM, "%s on %s", name, refused[i].path);
    expect_value(&rw, n, name, NULL);
    cr_expect_eq(rm(&rw, n, name, NULL), ENODATA, "%s", name);
    char *l = list(&rw, n);
    cr_expect_null(strstr(l, "bogus"), "%s", l);
    bs_free(l);
    cr_expect_eq(n->e->nxattrs, 0, "%s stored", name);
  }
}

Test(xattr, foreign_user_names_are_kept_as_set)
{
  struct bs_xa_node f = node("enc/w", true), d = node("enc", true);
  cr_expect_eq(set(&rw, &f, "user.rsync.junk", S("1"), NULL), 0);
  cr_expect_eq(set(&rw, &d, "user.comment", S("a dir"), NULL), 0);
  expect_value(&rw, &f, "user.rsync.junk", "1");
  expect_value(&rw, &d, "user.comment", "a dir");
  expect_list(&rw, &d, "user.comment");
  char *l = list(&rw, &f);
  cr_expect_not_null(strstr(l, ",user.rsync.junk"), "%s", l);
  bs_free(l);
  bs_err e;
  bs_err_clear(&e);
  bool dirty;
  cr_expect_eq(bs_xa_set(&rw, &f, "user.rsync.junk", "2", 1, 1 /* XATTR_CREATE */, &dirty, &e), -1);
  cr_expect_eq(e.code, EEXIST);
  cr_expect_eq(rm(&rw, &f, "user.rsync.junk", NULL), 0);
  expect_value(&rw, &f, "user.rsync.junk", NULL);
  cr_expect_eq(set(&rw, &f, "trusted.x", S("1"), NULL), ENOTSUP);
  static char big[BS_MAX_XATTR_VALUE + 1];
  cr_expect_eq(set(&rw, &f, "user.big", big, sizeof big, NULL), E2BIG);
}

Test(xattr, a_root_with_thousands_of_keys_lists_what_fits)
{
  /* 5,000 keys of ~40 bytes: 5000 * 61 bytes of names would fail
   * listxattr (and so getfattr -d, rsync -aX) with E2BIG. */
  for (int i = 0; i < 5000; i++) {
    char k[64];
    snprintf(k, sizeof k, "tokenizer.ggml.some_long_key_name_%05d", i);
    cr_assert_eq(bs_edit_set_meta(&ed, k, "v", 1, &err), 0, "%s", err.msg);
  }
  /* a value of the source longer than an xattr (setxattr cannot make one) */
  cr_assert_eq(bs_grow((void **)&ed.meta, &ed.metacap, ed.nmeta + 1, sizeof *ed.meta), 0);
  char *huge = bs_malloc(BS_MAX_XATTR_VALUE + 2);
  memset(huge, 'x', BS_MAX_XATTR_VALUE + 1);
  huge[BS_MAX_XATTR_VALUE + 1] = '\0';
  ed.meta[ed.nmeta++] = (struct bs_kv){bs_strdup("a.huge"), huge, NULL, false};
  struct bs_xa_node r = node("", false);
  struct bs_buf b = {0};
  cr_assert_eq(bs_xa_list(&ro, &r, &b, &err), 0);
  cr_expect_leq(b.len, BS_XA_LIST_MAX);
  cr_expect_gt(b.len, BS_XA_LIST_MAX - 80, "as many as fit");
  cr_expect_null(memmem(b.data, b.len, "a.huge", 6), "a value getxattr cannot return");
  /* every listed name reads back */
  size_t n = 0;
  for (size_t i = 0; i < b.len; i += strlen((char *)b.data + i) + 1, n++) {
    int code;
    char *v = get(&ro, &r, (char *)b.data + i, &code);
    cr_expect_eq(code, 0, "%s", (char *)b.data + i);
    bs_free(v);
  }
  cr_expect_gt(n, 1000);
  bs_buf_destroy(&b);
  /* and the ones left out still answer */
  expect_value(&ro, &r, X("meta.tokenizer.ggml.some_long_key_name_04999"), "v");
  int code;
  cr_expect_null(get(&ro, &r, X("meta.a.huge"), &code));
  cr_expect_eq(code, E2BIG);
}
