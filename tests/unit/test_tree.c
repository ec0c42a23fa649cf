/* The tree: dotted keys as directories, escaping, collisions, mutation; and
 * the names a writable mount lets users create in it (core/names.h):
 * escapes spelled one way, the output format's rule, one file a key. */
#include <criterion/criterion.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/tree.h"
#include "policy/names.h"

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

/* --- key segments longer than NAME_MAX ------------------------------------ */

static char *rep(const char *unit, size_t times)
{
  size_t u = strlen(unit);
  char *s = bs_malloc(u * times + 1);
  cr_assert_not_null(s);
  for (size_t i = 0; i < times; i++)
    memcpy(s + i * u, unit, u);
  s[u * times] = '\0';
  return s;
}

static char *cat3(const char *a, const char *b, const char *c)
{
  size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
  char *s = bs_malloc(la + lb + lc + 1);
  cr_assert_not_null(s);
  memcpy(s, a, la);
  memcpy(s + la, b, lb);
  memcpy(s + la + lb, c, lc + 1);
  return s;
}

/* The name a segment is shown under (asserting it was shortened or not). */
static char *shown(const char *seg, bool want_short)
{
  bool sh;
  char *n = bs_component_name(seg, strlen(seg), &sh);
  cr_assert_not_null(n);
  cr_assert_eq(sh, want_short, "%zu-byte segment: shortened %d", strlen(seg), sh);
  cr_assert_eq(bs_name_is_shortened(n), want_short);
  cr_assert_leq(strlen(n), BS_NAME_MAX);
  return n;
}

static void expect_full_key(uint64_t ino, const char *key, bool flat)
{
  cr_assert_neq(ino, 0);
  char *k = bs_tree_key(&tree, ino, flat);
  cr_assert_not_null(k);
  cr_assert_str_eq(k, key);
  cr_assert_str_eq(cat.tensors[tree.nodes[ino].tensor].key, key);
  bs_free(k);
}

Test(tree, long_segments_get_short_unique_names_that_find_the_node)
{
  char *x300 = rep("x", 300), *x1000 = rep("x", 1000), *x301 = rep("x", 301);
  char *k300 = cat3("d.", x300, ""), *k1000 = cat3("d.", x1000, ""), *k301 = cat3("d.", x301, "");
  add(k300);
  add(k1000);
  add(k301);
  add("d.normal");
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  uint64_t d = bs_tree_lookup(&tree, BS_TREE_ROOT, "d");
  char *n300 = shown(x300, true), *n1000 = shown(x1000, true), *n301 = shown(x301, true);
  /* Same 200-byte prefix, different names: the hash covers the whole segment. */
  cr_assert_eq(strncmp(n300, x300, BS_SHORT_PREFIX), 0);
  cr_assert_eq(n300[BS_SHORT_PREFIX], '%');
  cr_assert_str_neq(n300, n1000);
  cr_assert_str_neq(n300, n301);
  cr_assert_str_neq(n1000, n301);
  expect_full_key(bs_tree_lookup(&tree, d, n300), k300, false);
  expect_full_key(bs_tree_lookup(&tree, d, n1000), k1000, false);
  expect_full_key(bs_tree_lookup(&tree, d, n301), k301, false);
  expect_full_key(bs_tree_lookup(&tree, d, "normal"), "d.normal", false);
  cr_assert_eq(tree.nodes[d].nlive, 4);
  /* A shortened name is not an escape: it never unescapes to a key. */
  errno = 0;
  cr_assert_null(bs_unescape_component(n300));
  cr_assert_eq(errno, EINVAL);
  /* Stable: the same segment always gets the same name. */
  char *again = shown(x300, true);
  cr_assert_str_eq(again, n300);
  bs_free(again);
  bs_free(n300);
  bs_free(n1000);
  bs_free(n301);
  bs_free(k300);
  bs_free(k1000);
  bs_free(k301);
  bs_free(x300);
  bs_free(x1000);
  bs_free(x301);
}

Test(tree, long_directory_segments_hold_their_files)
{
  char *y = rep("y", 400);
  char *kw = cat3(y, ".sub.w", ""), *kv = cat3(y, ".v", ""), *kself = cat3("", y, "");
  add(kw);
  add(kv);
  add(kself); /* the long segment is also a tensor: the %% file */
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  char *ny = shown(y, true);
  uint64_t dir = bs_tree_lookup(&tree, BS_TREE_ROOT, ny);
  cr_assert_neq(dir, 0);
  cr_assert(tree.nodes[dir].is_dir);
  cr_assert_eq(tree.nodes[BS_TREE_ROOT].nlive, 1, "one directory for the three keys");
  expect_full_key(bs_tree_lookup(&tree, bs_tree_lookup(&tree, dir, "sub"), "w"), kw, false);
  expect_full_key(bs_tree_lookup(&tree, dir, "v"), kv, false);
  expect_full_key(bs_tree_lookup(&tree, dir, BS_SELF_NAME), kself, false);
  bs_free(ny);
  bs_free(kw);
  bs_free(kv);
  bs_free(kself);
  bs_free(y);
}

Test(tree, a_file_named_like_a_shortened_name_stays_distinct)
{
  char *z = rep("z", 300);
  char *nz = shown(z, true);
  /* A key segment spelled exactly like the shortened name: escaping its
   * '%' gives another name, so the two never meet. */
  char *klit = cat3("p.", nz, ""), *klong = cat3("p.", z, "");
  add(klong);
  add(klit);
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  uint64_t p = bs_tree_lookup(&tree, BS_TREE_ROOT, "p");
  cr_assert_eq(tree.nodes[p].nlive, 2);
  expect_full_key(bs_tree_lookup(&tree, p, nz), klong, false);
  char *esc = bs_escape_component(nz, strlen(nz));
  cr_assert_str_neq(esc, nz);
  expect_full_key(bs_tree_lookup(&tree, p, esc), klit, false);
  bs_free(esc);
  bs_free(klit);
  bs_free(klong);
  bs_free(nz);
  bs_free(z);
}

Test(tree, shortening_starts_past_name_max_and_cuts_cleanly)
{
  /* 255 escaped bytes fit; 256 do not. */
  char *a255 = rep("a", 255), *a256 = rep("a", 256), *p85 = rep("%", 85), *p86 = rep("%", 86);
  char *n = shown(a255, false);
  cr_assert_str_eq(n, a255);
  bs_free(n);
  bs_free(shown(a256, true));
  n = shown(p85, false); /* 85 x %25 = 255 bytes */
  cr_assert_eq(strlen(n), 255);
  bs_free(n);
  /* 86 x %25 = 258 bytes: the cut keeps whole escapes (66 of them). */
  n = shown(p86, true);
  char *want = rep("%25", 66);
  cr_assert_eq(strncmp(n, want, strlen(want)), 0);
  cr_assert_eq(strncmp(n + strlen(want), BS_SHORT_MARK, 2), 0, "%s", n);
  bs_free(n);
  bs_free(want);
  /* 100 x the 3-byte UTF-8 euro sign: the cut keeps whole characters. */
  char *eu = rep("\xe2\x82\xac", 100);
  n = shown(eu, true);
  cr_assert_eq(strncmp(n, eu, 198), 0);
  cr_assert_eq(strncmp(n + 198, BS_SHORT_MARK, 2), 0);
  cr_assert_eq(strlen(n), 198 + 2 + 16);
  bs_free(n);
  bs_free(eu);
  bs_free(a255);
  bs_free(a256);
  bs_free(p85);
  bs_free(p86);
}

Test(tree, flat_mounts_shorten_long_keys_too)
{
  char *k = rep("a.b", 200); /* 600 bytes, dots kept in a flat name */
  add(k);
  cr_assert_eq(bs_tree_build(&tree, &cat, true, &err), 0, "%s", err.msg);
  char *n = shown(k, true);
  expect_full_key(bs_tree_lookup(&tree, BS_TREE_ROOT, n), k, true);
  bs_free(n);
  bs_free(k);
}

Test(tree, two_segments_with_one_shortened_name_are_refused)
{
  /* A colliding pair is hard to find for a 64-bit hash, so plant a node
   * that has the name with another segment, as a collision would. */
  char *w = rep("w", 300), *other = rep("w", 299);
  char *n = shown(w, true);
  uint64_t ino;
  cr_assert_eq(bs_tree_add(&tree, BS_TREE_ROOT, n, false, -1, &ino, &err), 0);
  cr_assert_eq(bs_tree_set_seg(&tree, ino, other, strlen(other)), 0);
  add(w);
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), -1);
  cr_assert_eq(err.code, EEXIST);
  cr_assert_not_null(strstr(err.msg, "shorten to the same name"), "%s", err.msg);
  /* The same as a directory segment. */
  bs_err_clear(&err);
  bs_catalog_destroy(&cat);
  bs_catalog_init(&cat);
  char *kd = cat3(w, ".t", "");
  add(kd);
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), -1);
  cr_assert_eq(err.code, EEXIST);
  cr_assert_not_null(strstr(err.msg, "shorten to the same name"), "%s", err.msg);
  bs_free(kd);
  bs_free(n);
  bs_free(w);
  bs_free(other);
}

Test(tree, a_moved_shortened_name_keeps_its_key_and_a_renamed_one_takes_the_new)
{
  char *v = rep("v", 300);
  char *k = cat3("a.", v, "");
  add(k);
  add("b.x");
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  char *n = shown(v, true);
  uint64_t a = bs_tree_lookup(&tree, BS_TREE_ROOT, "a"),
           b = bs_tree_lookup(&tree, BS_TREE_ROOT, "b");
  uint64_t f = bs_tree_lookup(&tree, a, n);
  cr_assert_eq(bs_tree_move(&tree, f, b, n, &err), 0, "%s", err.msg);
  char *key = bs_tree_key(&tree, f, false), *want = cat3("b.", v, "");
  cr_assert_str_eq(key, want);
  bs_free(key);
  cr_assert_eq(bs_tree_move(&tree, f, b, "short", &err), 0, "%s", err.msg);
  key = bs_tree_key(&tree, f, false);
  cr_assert_str_eq(key, "b.short");
  cr_assert_null(bs_node_seg(&tree.nodes[f]));
  bs_free(key);
  bs_free(want);
  bs_free(n);
  bs_free(k);
  bs_free(v);
}

/* ---- core/names.h ---------------------------------------------------------------------- */

static void setup_names(void)
{
  setup();
  static const char *const keys[] = {"enc.w", "enc.b", "head", "x.y.z", "x"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    add(keys[i]);
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
}
TestSuite(names, .init = setup_names, .fini = teardown);

static int check(const struct bs_writer *w, uint64_t parent, const char *name, bool dir,
                 uint64_t moving)
{
  bs_err_clear(&err);
  int rc = bs_name_check(&tree, false, w, parent, name, dir, moving, &err);
  return rc == 0 ? 0 : err.code;
}

Test(names, escapes_are_spelled_one_way)
{
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "new", false, 0), 0);
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "50%25", false, 0), 0);
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "a%2Fb", false, 0), 0);
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "%2E", false, 0), 0, "the segment '.'");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "%", false, 0), 0, "the empty segment");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "%41", false, 0), EINVAL, "'A' spelled as an escape");
  cr_expect(strstr(err.msg, "its key's name is 'A'"), "%s", err.msg);
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "a%2Eb", false, 0), EINVAL);
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "a%2fb", false, 0), EINVAL, "lower-case hex");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "a%00b", false, 0), EINVAL, "a NUL is never a key byte");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "a%zz", false, 0), EINVAL);
  cr_expect(strstr(err.msg, "%25"), "%s", err.msg);
  /* Hidden temporaries and %% pass; they are renamed before they matter. */
  cr_expect_eq(check(NULL, BS_TREE_ROOT, ".caf\xe9.XXXX", false, 0), 0);
  /* A parent that is no directory: bs_tree_add says so, not the name check. */
  cr_expect_eq(check(NULL, bs_tree_lookup(&tree, BS_TREE_ROOT, "head"), "y", false, 0), 0);
  cr_expect_eq(check(NULL, 9999, "y", false, 0), 0);
  cr_expect_eq(check(NULL, BS_TREE_ROOT, BS_SELF_NAME, false, 0), 0);
  char big[300];
  memset(big, 'a', 256), big[256] = '\0';
  cr_expect_eq(check(NULL, BS_TREE_ROOT, big, false, 0), ENAMETOOLONG);
}

Test(names, the_output_format_decides_which_keys_it_holds)
{
  const struct bs_writer *gg = bs_writer_for_format(BS_FMT_GGUF);
  const struct bs_writer *st = bs_writer_for_format(BS_FMT_SAFETENSORS);
  uint64_t enc = bs_tree_lookup(&tree, BS_TREE_ROOT, "enc");
  cr_assert_neq(enc, 0);
  cr_expect_eq(check(st, BS_TREE_ROOT, "caf\xe9", false, 0), EINVAL);
  cr_expect_str_eq(err.key, "caf\\xe9");
  cr_expect_eq(check(st, enc, "\xff", true, 0), EINVAL, "directories too");
  cr_expect_eq(check(st, BS_TREE_ROOT, "__metadata__", false, 0), EINVAL);
  cr_expect_eq(check(gg, BS_TREE_ROOT, "__metadata__", false, 0), 0);
  char n[80];
  memset(n, 'n', 59), n[59] = '\0';
  cr_expect_eq(check(gg, enc, n, false, 0), 0, "enc. + 59 = 63 bytes");
  memset(n, 'n', 60), n[60] = '\0';
  cr_expect_eq(check(gg, enc, n, false, 0), EINVAL, "the key counts, not the name");
  cr_expect_str_eq(err.key, "enc.nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn");
  memcpy(n + 59, ".npy", 5);
  cr_expect_eq(check(gg, enc, n, false, 0), 0, "NAME.npy is checked as NAME");
}

Test(names, two_files_never_stand_for_one_key)
{
  uint64_t enc = bs_tree_lookup(&tree, BS_TREE_ROOT, "enc");
  uint64_t x = bs_tree_lookup(&tree, BS_TREE_ROOT, "x");
  uint64_t head = bs_tree_lookup(&tree, BS_TREE_ROOT, "head");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "enc.w", false, 0), EEXIST);
  cr_expect_str_eq(err.key, "enc.w");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "x.y.z", false, 0), EEXIST);
  cr_expect_eq(check(NULL, x, "y.z", false, 0), EEXIST);
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "enc.c", false, 0), 0);
  cr_expect_eq(check(NULL, enc, "c", false, 0), 0);
  /* x is both a tensor and a directory (x/%%): a file "x" elsewhere... */
  cr_expect_eq(check(NULL, x, BS_SELF_NAME, false, 0), 0, "%% itself passes");
  /* Renaming a file onto its own key, or over the file that has it. */
  uint64_t w = bs_tree_lookup(&tree, enc, "w");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "enc.w", false, w), 0, "its own key");
  cr_expect_eq(check(NULL, enc, "b", false, head), 0, "over enc/b, which it replaces");
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "enc.b", false, head), EEXIST, "beside enc/b");
  /* Directories are not keys: mkdir enc2 is fine, and flat mounts have no dots to split. */
  cr_expect_eq(check(NULL, BS_TREE_ROOT, "enc.w", true, 0), 0);
  bs_err_clear(&err);
  cr_expect_eq(bs_name_check(&tree, true, NULL, BS_TREE_ROOT, "enc.w", false, 0, &err), 0);
}

Test(names, fixed_tensors_are_neither_removed_nor_renamed)
{
  /* keys: enc.w enc.b head x.y.z x; fixed: enc.b and x.y.z */
  bool fixed[5] = {false, true, false, true, false};
  uint64_t enc = bs_tree_lookup(&tree, BS_TREE_ROOT, "enc");
  uint64_t x = bs_tree_lookup(&tree, BS_TREE_ROOT, "x");
  uint64_t y = bs_tree_lookup(&tree, x, "y");
  uint64_t head = bs_tree_lookup(&tree, BS_TREE_ROOT, "head");
  cr_assert(enc && x && y && head);
  bs_err_clear(&err);
  cr_expect_eq(bs_name_check_fixed(&tree, &cat, fixed, bs_tree_lookup(&tree, enc, "b"), &err), -1);
  cr_expect(err.code == EPERM && strcmp(err.key, "enc.b") == 0 && strstr(err.msg, "item of a list"),
            "%d %s: %s", err.code, err.key, err.msg);
  bs_err_clear(&err);
  cr_expect_eq(bs_name_check_fixed(&tree, &cat, fixed, bs_tree_lookup(&tree, enc, "w"), &err), 0);
  cr_expect_eq(bs_name_check_fixed(&tree, &cat, fixed, head, &err), 0);
  cr_expect_eq(bs_name_check_fixed(&tree, &cat, fixed, enc, &err), -1, "a directory above one");
  bs_err_clear(&err);
  cr_expect_eq(bs_name_check_fixed(&tree, &cat, fixed, x, &err), -1, "two levels above");
  cr_expect_str_eq(err.key, "x.y.z");
  bs_err_clear(&err);
  cr_expect_eq(bs_name_check_fixed(&tree, &cat, NULL, enc, &err), 0, "nothing fixed");
  cr_expect_eq(bs_name_check_fixed(&tree, &cat, fixed, 9999, &err), 0, "no such node");
}

/* Issue 34: a tensor of a large catalog costs at most 150 bytes with its
 * tree node (its key and shape, its entry, its node, its share of the hash
 * table and of its directory's children), counted by malloc itself: 250,000
 * tensors of the benchmark's million-tensor shape (b123.t456, 1000 a
 * directory), the catalog reserved as the readers reserve it. */
Test(tree, a_tensor_and_its_node_cost_at_most_150_bytes)
{
  const size_t n = 250000;
  struct mallinfo2 before = mallinfo2();
  cr_assert_eq(bs_catalog_reserve(&cat, n), 0);
  char key[32];
  for (size_t i = 0; i < n; i++) {
    snprintf(key, sizeof key, "b%zu.t%zu", i / 1000, i % 1000);
    add(key);
  }
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
  struct mallinfo2 after = mallinfo2();
  size_t used = (after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd);
  cr_assert_leq(used / n, 150, "%zu bytes a tensor (%zu in all)", used / n, used);
  expect_key("b249/t999", "b249.t999");
}
