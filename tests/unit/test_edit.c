/* The editable catalog of writable mounts, without FUSE: effective dtype and
 * shape (inferred or explicit), xattrs and their budget, root metadata, and
 * the output catalog the writer drains. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/edit.h"

static bs_err err;
static struct bs_catalog cat;
static struct bs_tree tree;
static struct bs_edit ed;
static uint8_t bytes[64];
static const uint8_t scheme[] = {0xa1, 0x61, 0x71, 0x01}; /* an opaque QFloat scheme */

static struct bs_tensor *add(const char *key, enum bs_dtype dt, uint32_t rank,
                             const uint64_t *shape, uint64_t off)
{
  struct bs_tensor *t = bs_catalog_add(&cat, key, dt, rank, shape, 0, &err);
  cr_assert_not_null(t, "%s", err.msg);
  t->src = 0;
  t->off = off;
  return t;
}

static void setup(void)
{
  bs_err_clear(&err);
  bs_catalog_init(&cat);
  for (size_t i = 0; i < sizeof bytes; i++)
    bytes[i] = (uint8_t)i;
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&s, bytes, sizeof bytes, "mem", &err), 0);
  cr_assert_eq(bs_catalog_add_src(&cat, &s, &idx, &err), 0);
  uint64_t s23[2] = {2, 3}, s4[1] = {4}, s2[1] = {2};
  add("enc.w", BS_DT_F32, 2, s23, 0); /* 24 bytes */
  struct bs_tensor *q = add("enc.q", BS_DT_QFLOAT, 1, s4, 24);
  q->nbytes = 8;
  cr_assert_not_null(bs_tensor_x(&cat, q));
  q->x->dtype_raw = bs_malloc(sizeof scheme);
  memcpy(q->x->dtype_raw, scheme, sizeof scheme);
  q->x->dtype_raw_len = sizeof scheme;
  struct bs_tensor *h = add("dec.b", BS_DT_U16, 1, s2, 32); /* hidden by a filter */
  h->hidden = true;
  h->has_param_id = true;
  cr_assert_not_null(bs_tensor_x(&cat, h));
  h->x->param_id = 7;
  cr_assert_eq(bs_catalog_add_meta(&cat, "author", "me", &err), 0);
  cr_assert_eq(bs_tree_init(&tree, &err), 0);
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_edit_init(&ed, &cat, &tree, false, &err), 0);
  cr_assert_eq(bs_edit_attach(&ed, NULL, NULL, &err), 0);
}

static void teardown(void)
{
  bs_edit_destroy(&ed);
  bs_tree_destroy(&tree);
  bs_catalog_destroy(&cat);
}
TestSuite(edit, .init = setup, .fini = teardown);

static const struct bs_stage_dir nostage = {-1, "/nonexistent"};

static uint64_t ino_of(const char *dir, const char *name)
{
  uint64_t d = bs_tree_lookup(&tree, BS_TREE_ROOT, dir);
  cr_assert_neq(d, 0, "no %s", dir);
  return bs_tree_lookup(&tree, d, name);
}

static struct bs_entry *entry(const char *dir, const char *name)
{
  struct bs_entry *e = bs_edit_entry(&ed, ino_of(dir, name));
  cr_assert_not_null(e, "no entry %s/%s", dir, name);
  return e;
}

/* A new empty file dir/name. */
static struct bs_entry *create(const char *dir, const char *name)
{
  uint64_t ino;
  uint64_t d = bs_tree_lookup(&tree, BS_TREE_ROOT, dir);
  cr_assert_eq(bs_tree_add(&tree, d, name, false, -1, &ino, &err), 0, "%s", err.msg);
  struct bs_entry *e = bs_entry_new(-1, 0, false, 0644);
  cr_assert_not_null(e);
  cr_assert_eq(bs_tree_set_user(&tree, ino, e), 0);
  return e;
}

Test(edit, source_files_take_the_tensor_dtype_and_shape)
{
  struct bs_entry *e = entry("enc", "w");
  struct bs_eff eff;
  bs_entry_effective(&ed, e, &eff);
  cr_assert_eq(eff.dtype, BS_DT_F32);
  cr_assert_eq(eff.rank, 2);
  cr_assert_eq(eff.shape[0], 2);
  cr_assert_eq(eff.shape[1], 3);
  cr_assert(!eff.dtype_inferred && !eff.shape_inferred);
  cr_assert_eq(e->size, 24);
  /* Another dtype: the origin's shape no longer applies, 1-D by size. */
  cr_assert_eq(bs_entry_set_dtype(&ed, e, "F16\n", 4, &err), 0);
  bs_entry_effective(&ed, e, &eff);
  cr_assert_eq(eff.dtype, BS_DT_F16);
  cr_assert(eff.shape_inferred && eff.whole);
  cr_assert_eq(eff.rank, 1);
  cr_assert_eq(eff.shape[0], 12);
  bs_entry_clear_dtype(NULL, e);
  bs_entry_effective(&ed, e, &eff);
  cr_assert_eq(eff.dtype, BS_DT_F32);
  cr_assert_eq(eff.rank, 2);
}

Test(edit, new_files_are_u8_by_size_until_set)
{
  struct bs_entry *e = create("enc", "n");
  e->size = 6;
  struct bs_eff eff;
  bs_entry_effective(&ed, e, &eff);
  cr_assert_eq(eff.dtype, BS_DT_U8);
  cr_assert(eff.dtype_inferred && eff.shape_inferred && eff.whole);
  cr_assert_eq(eff.shape[0], 6);
  cr_assert_eq(bs_entry_set_dtype(&ed, e, "F32", 3, &err), 0);
  bs_entry_effective(&ed, e, &eff);
  cr_assert(!eff.dtype_inferred && eff.shape_inferred && !eff.whole); /* 6 bytes of F32 */
  cr_assert_eq(bs_entry_set_dtype(&ed, e, "F4", 2, &err), 0);
  bs_entry_effective(&ed, e, &eff);
  cr_assert(eff.whole);
  cr_assert_eq(eff.shape[0], 12, "two F4 elements per byte");
  cr_assert_eq(bs_entry_set_shape(NULL, e, " [3, 4] ", 8, &err), 0);
  bs_entry_effective(&ed, e, &eff);
  cr_assert(!eff.shape_inferred);
  cr_assert_eq(eff.rank, 2);
  bs_entry_clear_shape(NULL, e);
  bs_entry_effective(&ed, e, &eff);
  cr_assert(eff.shape_inferred);
}

Test(edit, bad_values_are_einval)
{
  struct bs_entry *e = entry("enc", "w");
  const char *shapes[] = {"[1,", "[-1]", "3", "[1]x", "[99999999999999999999999]", ""};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    bs_err_clear(&err);
    cr_assert_eq(bs_entry_set_shape(NULL, e, shapes[i], strlen(shapes[i]), &err), -1, "%s",
                 shapes[i]);
    cr_assert_eq(err.code, EINVAL);
  }
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_set_dtype(&ed, e, "F99", 3, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_set_param_id(NULL, e, "x", 1, &err), -1);
  cr_assert_eq(bs_entry_set_param_id(NULL, e, "42\n", 3, &err), 0);
  cr_assert(e->has_param_id && e->param_id == 42);
  cr_assert(!e->has_shape && !e->has_dtype, "failed sets leave the entry as it was");
}

Test(edit, qfloat_is_kept_and_settable_back_only_on_a_qfloat_file)
{
  struct bs_entry *q = entry("enc", "q");
  struct bs_eff eff;
  bs_entry_effective(&ed, q, &eff);
  cr_assert_eq(eff.dtype, BS_DT_QFLOAT);
  cr_assert_eq(bs_entry_set_dtype(&ed, q, "U8", 2, &err), 0);
  cr_assert_eq(bs_entry_set_dtype(&ed, q, "QFLOAT", 6, &err), 0, "%s", err.msg);
  bs_entry_effective(&ed, q, &eff);
  cr_assert_eq(eff.dtype, BS_DT_QFLOAT);
  struct bs_entry *n = create("enc", "n");
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_set_dtype(&ed, n, "QFLOAT", 6, &err), -1);
  cr_assert_eq(err.code, EINVAL);
}

Test(edit, xattrs_within_a_budget)
{
  ed.xattr_budget = 100;
  struct bs_entry *e = entry("enc", "w");
  char v[60];
  memset(v, 'x', sizeof v);
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.a", v, sizeof v, 0, &err), 0);
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.b", v, sizeof v, 0, &err), -1);
  cr_assert_eq(err.code, ENOSPC);
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.a", v, 30, 0, &err), 0, "replacing shrinks");
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.b", v, 30, 0, &err), 0, "%s", err.msg);
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.b", v, 1, 1 /* XATTR_CREATE */, &err), -1);
  cr_assert_eq(err.code, EEXIST);
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.c", v, 1, 2 /* XATTR_REPLACE */, &err), -1);
  cr_assert_eq(err.code, ENODATA);
  const struct bs_xattr *x = bs_entry_get_xattr(e, "user.b");
  cr_assert(x && x->len == 30);
  cr_assert_eq(bs_entry_remove_xattr(&ed, e, "user.a", &err), 0);
  cr_assert_eq(bs_entry_remove_xattr(&ed, e, "user.b", &err), 0);
  cr_assert_eq(atomic_load(&ed.xattr_bytes), 8, "only the source metadata left");
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_remove_xattr(&ed, e, "user.a", &err), -1);
  cr_assert_eq(err.code, ENODATA);
  /* Root metadata shares the budget. */
  cr_assert_eq(bs_edit_set_meta(&ed, "big", v, sizeof v, &err), 0);
  bs_err_clear(&err);
  cr_assert_eq(bs_edit_set_meta(&ed, "big2", v, sizeof v, &err), -1);
  cr_assert_eq(err.code, ENOSPC);
  /* A dropped (unlinked) file gives its xattrs back. */
  cr_assert_eq(bs_edit_remove_meta(&ed, "big", &err), 0);
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.a", v, sizeof v, 0, &err), 0);
  bs_entry_drop(&ed, e);
  cr_assert_eq(atomic_load(&ed.xattr_bytes), 8);
}

/* A value longer than any xattr (a journal record could hold one; setxattr
 * never passes one) is refused for its own size, not as the mount's budget
 * ("the mount holds 30 bytes of xattrs, the bound is 67108864" before). */
Test(edit, an_over_long_value_is_e2big_for_its_size)
{
  struct bs_entry *e = entry("enc", "w");
  char v[1] = {'x'};
  size_t huge = 100u << 20; /* refused before a byte of it is read */
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.a", v, huge, 0, &err), -1);
  cr_assert_eq(err.code, E2BIG, "%d %s", err.code, err.msg);
  cr_assert(strstr(err.msg, "'user.a': a value of 104857600 bytes, over the 65536 bytes"), "%s",
            err.msg);
  bs_err_clear(&err);
  cr_assert_eq(bs_edit_set_meta(&ed, "general.name", v, huge, &err), -1);
  cr_assert_eq(err.code, E2BIG, "%d %s", err.code, err.msg);
  cr_assert(strstr(err.msg, "metadata 'general.name': a value of 104857600 bytes"), "%s", err.msg);
  cr_assert_eq(atomic_load(&ed.xattr_bytes), 8, "nothing taken from the budget");
  /* the budget's own refusal names what was asked and the bound */
  ed.xattr_budget = 20;
  bs_err_clear(&err);
  cr_assert_eq(bs_entry_set_xattr(&ed, e, "user.b", "0123456789abcdef", 16, 0, &err), -1);
  cr_assert_eq(err.code, ENOSPC);
  cr_assert(strstr(err.msg, "xattr 'user.b': 22 more bytes would pass the mount's bound of 20"),
            "%s", err.msg);
}

Test(edit, root_metadata)
{
  cr_assert_str_eq(bs_edit_get_meta(&ed, "author"), "me");
  cr_assert_eq(bs_edit_set_meta(&ed, "a", "1", 1, &err), 0);
  cr_assert_eq(bs_edit_set_meta(&ed, "author", "you", 3, &err), 0);
  cr_assert_str_eq(bs_edit_get_meta(&ed, "author"), "you");
  cr_assert_eq(bs_edit_remove_meta(&ed, "author", &err), 0);
  cr_assert_null(bs_edit_get_meta(&ed, "author"));
  cr_assert_eq(ed.nmeta, 1);
  bs_err_clear(&err);
  cr_assert_eq(bs_edit_remove_meta(&ed, "author", &err), -1);
  cr_assert_eq(err.code, ENODATA);
}

static const struct bs_tensor *find(const struct bs_catalog *c, const char *name)
{
  long i = bs_catalog_find(c, name);
  return i < 0 ? NULL : &c->tensors[i];
}

Test(edit, output_catalog)
{
  char *dir = bs_test_tmpdir("edit");
  struct bs_stage_dir stg = {open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), dir};
  cr_assert_geq(stg.fd, 0);
  /* enc/q staged with 8 new bytes: QFloat and its scheme stay. */
  struct bs_entry *q = entry("enc", "q");
  q->stage = 1;
  char path[512];
  snprintf(path, sizeof path, "%s/1", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, "ABCDEFGH", 8), 8);
  close(fd);
  /* enc/w renamed to top/w2 stays clean; a new empty file; root metadata. */
  uint64_t top;
  cr_assert_eq(bs_tree_add(&tree, BS_TREE_ROOT, "top", true, -1, &top, &err), 0);
  cr_assert_eq(bs_tree_set_user(&tree, top, bs_entry_new(-1, 0, true, 0755)), 0);
  cr_assert_eq(bs_tree_move(&tree, ino_of("enc", "w"), top, "w2", &err), 0);
  struct bs_entry *n = create("enc", "empty");
  cr_assert_eq(bs_entry_set_shape(NULL, n, "[0]", 3, &err), 0);
  cr_assert_eq(bs_edit_set_meta(&ed, "k", "v", 1, &err), 0);

  struct bs_catalog out;
  bs_catalog_init(&out);
  cr_assert_eq(bs_edit_catalog(&ed, &stg, false, &out, &err), 0, "%s", err.msg);
  cr_assert_eq(out.count, 3);
  const struct bs_tensor *w = find(&out, "top.w2"), *oq = find(&out, "enc.q");
  cr_assert(w && oq && find(&out, "enc.empty"));
  cr_assert_null(find(&out, "dec.b"), "an extraction writes only the view");
  uint8_t buf[24];
  cr_assert_eq(bs_tensor_read(&out, w, 0, buf, sizeof buf), 24);
  cr_assert_eq(memcmp(buf, bytes, 24), 0);
  cr_assert_eq(oq->dtype, BS_DT_QFLOAT);
  cr_assert_eq(oq->x->dtype_raw_len, sizeof scheme);
  cr_assert_eq(oq->nbytes, 8);
  cr_assert_eq(bs_tensor_read(&out, oq, 0, buf, 8), 8);
  cr_assert_eq(memcmp(buf, "ABCDEFGH", 8), 0);
  cr_assert_eq(out.nmeta, 2);
  bs_catalog_destroy(&out);

  /* In place: what the filter hid is kept, with its param_id. */
  bs_catalog_init(&out);
  cr_assert_eq(bs_edit_catalog(&ed, &stg, true, &out, &err), 0, "%s", err.msg);
  const struct bs_tensor *h = find(&out, "dec.b");
  cr_assert(h && h->has_param_id && h->x->param_id == 7);
  cr_assert_eq(bs_tensor_read(&out, h, 0, buf, 4), 4);
  cr_assert_eq(memcmp(buf, bytes + 32, 4), 0);
  bs_catalog_destroy(&out);

  /* A file of the view named like a hidden tensor wins over it. */
  struct bs_entry *d = create("enc", "d");
  (void)d;
  uint64_t dec;
  cr_assert_eq(bs_tree_add(&tree, BS_TREE_ROOT, "dec", true, -1, &dec, &err), 0);
  cr_assert_eq(bs_tree_set_user(&tree, dec, bs_entry_new(-1, 0, true, 0755)), 0);
  cr_assert_eq(bs_tree_move(&tree, ino_of("enc", "d"), dec, "b", &err), 0);
  bs_catalog_init(&out);
  cr_assert_eq(bs_edit_catalog(&ed, &stg, true, &out, &err), 0, "%s", err.msg);
  cr_assert_eq(find(&out, "dec.b")->nbytes, 0);
  cr_assert_eq(out.count, 4);
  bs_catalog_destroy(&out);

  /* Errors: a size that does not fit the shape; two files with one key. */
  n->size = 3;
  bs_catalog_init(&out);
  bs_err_clear(&err);
  cr_assert_eq(bs_edit_catalog(&ed, &stg, false, &out, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_str_eq(err.key, "enc.empty");
  bs_catalog_destroy(&out);
  n->size = 0;
  uint64_t dot;
  cr_assert_eq(bs_tree_add(&tree, BS_TREE_ROOT, "top.w2", false, -1, &dot, &err), 0);
  cr_assert_eq(bs_tree_set_user(&tree, dot, bs_entry_new(-1, 0, false, 0644)), 0);
  bs_catalog_init(&out);
  bs_err_clear(&err);
  cr_assert_eq(bs_edit_catalog(&ed, &stg, false, &out, &err), -1);
  cr_assert_eq(err.code, EEXIST);
  bs_catalog_destroy(&out);
  close(stg.fd);
  bs_test_rmrf(dir);
  free(dir);
}

/* A clean file of a strided origin is read through the origin's view: its
 * dtype width or shape cannot change without its bytes being staged. */
Test(edit, strided_origin_keeps_its_view_or_is_refused)
{
  long wi = bs_catalog_find(&cat, "enc.w");
  cr_assert_geq(wi, 0);
  struct bs_tensor *w = &cat.tensors[wi];
  cr_assert_not_null(bs_tensor_x(&cat, w));
  w->x->strides = bs_malloc(2 * sizeof *w->x->strides); /* [2, 3], the transpose of a [3, 2] */
  w->x->strides[0] = 1;
  w->x->strides[1] = 2;
  w->x->storage_off = 0;
  w->x->storage_bytes = 24;
  struct bs_entry *e = entry("enc", "w");
  cr_assert(bs_entry_strided_clean(&ed, e));
  uint8_t want[24], buf[24];
  cr_assert_eq(bs_tensor_read(&cat, w, 0, want, sizeof want), 24);

  /* Another dtype of the same width, with the shape kept: the same view. */
  cr_assert_eq(bs_entry_set_dtype(&ed, e, "I32", 3, &err), 0);
  cr_assert_eq(bs_entry_set_shape(NULL, e, "[2,3]", 5, &err), 0);
  struct bs_catalog out;
  bs_catalog_init(&out);
  cr_assert_eq(bs_edit_catalog(&ed, &nostage, false, &out, &err), 0, "%s", err.msg);
  const struct bs_tensor *o = find(&out, "enc.w");
  cr_assert(o && o->dtype == BS_DT_I32 && o->x->strides);
  cr_assert_eq(bs_tensor_read(&out, o, 0, buf, sizeof buf), 24);
  cr_assert_eq(memcmp(buf, want, sizeof buf), 0);
  bs_catalog_destroy(&out);

  /* Another shape (of another rank, or the same), or another width: refused. */
  static const char *const shapes[] = {"[6]", "[3, 2]", "[1, 2, 3]"};
  for (size_t i = 0; i < 3; i++) {
    cr_assert_eq(bs_entry_set_shape(NULL, e, shapes[i], strlen(shapes[i]), &err), 0);
    bs_catalog_init(&out);
    bs_err_clear(&err);
    cr_assert_eq(bs_edit_catalog(&ed, &nostage, false, &out, &err), -1, "%s", shapes[i]);
    cr_assert_eq(err.code, EINVAL);
    cr_assert_str_eq(err.key, "enc.w");
    bs_catalog_destroy(&out);
  }
  /* Another dtype without a shape: 1-D by size, another view. */
  bs_entry_clear_shape(NULL, e);
  bs_catalog_init(&out);
  bs_err_clear(&err);
  cr_assert_eq(bs_edit_catalog(&ed, &nostage, false, &out, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  bs_catalog_destroy(&out);
  cr_assert_eq(bs_entry_set_dtype(&ed, e, "F16", 3, &err), 0);
  cr_assert_eq(bs_entry_set_shape(NULL, e, "[2,3]", 5, &err), 0);
  bs_catalog_init(&out);
  bs_err_clear(&err);
  cr_assert_eq(bs_edit_catalog(&ed, &nostage, false, &out, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  bs_catalog_destroy(&out);

  /* Staged, its bytes are its own. */
  e->stage = 1;
  cr_assert_not(bs_entry_strided_clean(&ed, e));
}

Test(edit, shape_json)
{
  uint64_t s[3] = {2, 0, 18446744073709551615ull};
  char *j = bs_shape_json(3, s);
  cr_assert_str_eq(j, "[2,0,18446744073709551615]");
  bs_free(j);
  j = bs_shape_json(0, NULL);
  cr_assert_str_eq(j, "[]");
  bs_free(j);
}

Test(edit, attach_owns_as_told)
{
  /* Detach the fixture's entries, then attach again with an owner. */
  for (uint64_t i = BS_TREE_ROOT; i < tree.n; i++) {
    bs_entry_free(bs_tree_user(&tree, i));
    cr_assert_eq(bs_tree_set_user(&tree, i, NULL), 0);
  }
  struct bs_owner own = {.uid = 1234, .gid = 567, .file_mode = 0640, .dir_mode = 0750};
  cr_assert_eq(bs_edit_attach(&ed, NULL, &own, &err), 0);
  struct bs_entry *w = entry("enc", "w");
  cr_assert_eq(w->uid, 1234);
  cr_assert_eq(w->gid, 567);
  cr_assert_eq(w->mode, 0640, "%o", w->mode);
  cr_assert_eq(entry("enc", "q")->mode, 0640);
  struct bs_entry *root = bs_tree_user(&tree, BS_TREE_ROOT);
  cr_assert_eq(root->mode, 0750, "%o", root->mode);
  cr_assert_eq(root->uid, 1234);
}
