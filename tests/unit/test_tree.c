/* The tree: dotted keys as directories, escaping, collisions, mutation. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "burnstore/alloc.h"
#include "burnstore/tree.h"

static bs_err err;
static struct bs_catalog cat;
static struct bs_tree tree;

static void setup(void)
{
  bs_err_clear(&err);
  bs_catalog_init(&cat);
  cr_assert_eq(bs_tree_init(&tree, &err), 0);
}
static void teardown(void)
{
  bs_tree_destroy(&tree);
  bs_catalog_destroy(&cat);
}
TestSuite(tree, .init = setup, .fini = teardown);

static void add(const char *key)
{
  uint64_t shape[1] = {1};
  cr_assert_not_null(bs_catalog_add(&cat, key, BS_DT_F32, 1, shape, 0, &err), "%s", err.msg);
}

static uint64_t walk(const char *path)
{
  uint64_t ino = BS_TREE_ROOT;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *s = strtok(buf, "/"); s; s = strtok(NULL, "/")) {
    ino = bs_tree_lookup(&tree, ino, s);
    if (!ino)
      return 0;
  }
  return ino;
}

static void expect_key(const char *path, const char *key)
{
  uint64_t ino = walk(path);
  cr_assert_neq(ino, 0, "no %s", path);
  char *k = bs_tree_key(&tree, ino, false);
  cr_assert_not_null(k);
  cr_assert_str_eq(k, key);
  cr_assert_str_eq(cat.tensors[tree.nodes[ino].tensor].key, key);
  bs_free(k);
}

Test(tree, dotted_keys_become_directories)
{
  add("encoder.layer0.weight");
  add("encoder.layer0.bias");
  add("head");
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0);
  expect_key("encoder/layer0/weight", "encoder.layer0.weight");
  expect_key("encoder/layer0/bias", "encoder.layer0.bias");
  expect_key("head", "head");
  cr_assert(tree.nodes[walk("encoder")].is_dir);
}

Test(tree, awkward_segments_are_escaped_reversibly)
{
  add("a..b");  /* empty segment */
  add(".x");    /* leading empty */
  add("p/q.r"); /* slash */
  add("50%.v"); /* percent */
  add("u.%2E"); /* looks like an escape */
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  expect_key("a/%/b", "a..b");
  expect_key("%/x", ".x");
  expect_key("p%2Fq/r", "p/q.r");
  expect_key("50%25/v", "50%.v");
  expect_key("u/%252E", "u.%2E");
}

Test(tree, a_key_that_is_also_a_directory_keeps_both)
{
  add("a.b");
  add("a.b.c");
  add("x.y.z");
  add("x.y");
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  expect_key("a/b/%%", "a.b");
  expect_key("a/b/c", "a.b.c");
  expect_key("x/y/%%", "x.y");
  expect_key("x/y/z", "x.y.z");
}

Test(tree, flat_names_are_whole_keys)
{
  add("a.b");
  add("c/d");
  cr_assert_eq(bs_tree_build(&tree, &cat, true, &err), 0);
  cr_assert_neq(bs_tree_lookup(&tree, BS_TREE_ROOT, "a.b"), 0);
  uint64_t ino = bs_tree_lookup(&tree, BS_TREE_ROOT, "c%2Fd");
  cr_assert_neq(ino, 0);
  char *k = bs_tree_key(&tree, ino, true);
  cr_assert_str_eq(k, "c/d");
  bs_free(k);
}

Test(tree, duplicate_names_are_an_error_naming_both)
{
  add("w");
  add("w");
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), -1);
  cr_assert_eq(err.code, EEXIST);
  cr_assert_not_null(strstr(err.msg, "same name"));
}

Test(tree, unescape_rejects_malformed_names)
{
  const char *bad[] = {"%", "a%", "a%2", "a%zz", "%00", "x%g1"};
  for (size_t i = 1; i < sizeof bad / sizeof *bad; i++) {
    errno = 0;
    cr_assert_null(bs_unescape_component(bad[i]), "%s", bad[i]);
    cr_assert_eq(errno, EINVAL);
  }
  char *e = bs_unescape_component("%");
  cr_assert_str_eq(e, "", "a lone % is the empty segment");
  bs_free(e);
}

Test(tree, add_move_remove)
{
  uint64_t d, f, g;
  cr_assert_eq(bs_tree_add(&tree, BS_TREE_ROOT, "d", true, -1, &d, &err), 0);
  cr_assert_eq(bs_tree_add(&tree, d, "f", false, -1, &f, &err), 0);
  cr_assert_eq(bs_tree_add(&tree, d, "f", false, -1, &g, &err), -1);
  cr_assert_eq(err.code, EEXIST);
  bs_err_clear(&err);
  cr_assert_eq(bs_tree_remove(&tree, d, &err), -1);
  cr_assert_eq(err.code, ENOTEMPTY);
  bs_err_clear(&err);
  cr_assert_eq(bs_tree_move(&tree, f, BS_TREE_ROOT, "g", &err), 0);
  cr_assert_eq(bs_tree_lookup(&tree, d, "f"), 0);
  cr_assert_eq(bs_tree_lookup(&tree, BS_TREE_ROOT, "g"), f);
  cr_assert_eq(bs_tree_move(&tree, d, d, "x", &err), -1, "no move into itself");
  bs_err_clear(&err);
  cr_assert_eq(bs_tree_remove(&tree, d, &err), 0);
  cr_assert_null(bs_tree_node(&tree, d));
  /* Many entries: the hash table grows. */
  char name[32];
  for (int i = 0; i < 5000; i++) {
    snprintf(name, sizeof name, "n%d", i);
    cr_assert_eq(bs_tree_add(&tree, BS_TREE_ROOT, name, false, -1, &g, &err), 0);
  }
  for (int i = 0; i < 5000; i += 7) {
    snprintf(name, sizeof name, "n%d", i);
    cr_assert_neq(bs_tree_lookup(&tree, BS_TREE_ROOT, name), 0);
  }
}
