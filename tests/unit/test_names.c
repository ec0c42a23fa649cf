/* The names a writable mount lets users create (core/names.h): escapes
 * spelled one way, the output format's rule, no two files for one key. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "core/names.h"

static bs_err err;
static struct bs_catalog cat;
static struct bs_tree tree;

static void setup(void)
{
  bs_err_clear(&err);
  bs_catalog_init(&cat);
  cr_assert_eq(bs_tree_init(&tree, &err), 0);
  uint64_t shape[1] = {1};
  static const char *const keys[] = {"enc.w", "enc.b", "head", "x.y.z", "x"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    cr_assert_not_null(bs_catalog_add(&cat, keys[i], BS_DT_F32, 1, shape, 0, &err));
  cr_assert_eq(bs_tree_build(&tree, &cat, false, &err), 0, "%s", err.msg);
}
static void teardown(void)
{
  bs_tree_destroy(&tree);
  bs_catalog_destroy(&cat);
}
TestSuite(names, .init = setup, .fini = teardown);

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
