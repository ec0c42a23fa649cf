/* Key options: remap (Rust replacement syntax), filters, top_level_key,
 * contiguous indices, collisions, option string splitting, OOM. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/keys.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* LeakSanitizer's report at exit does not fail a Criterion test, so the OOM
 * test asks for a leak check itself. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define ASSERT_NO_LEAKS()                                                                          \
  cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "memory leaked (report on stderr)")
#else
#define ASSERT_NO_LEAKS() ((void)0)
#endif

static void mkcat(struct bs_catalog *cat, const char *const *keys, size_t n)
{
  bs_catalog_init(cat);
  bs_err err;
  bs_err_clear(&err);
  uint64_t shape[1] = {1};
  for (size_t i = 0; i < n; i++)
    cr_assert_not_null(bs_catalog_add(cat, keys[i], BS_DT_F32, 1, shape, 0, &err), "%s", err.msg);
}

/* Parse an option string into o; asserts success. */
static void mkopts(struct bs_keyopts *o, const char *optstr)
{
  bs_keyopts_init(o);
  bs_err err;
  bs_err_clear(&err);
  char **items;
  size_t n;
  cr_assert_eq(bs_opts_split(optstr, &items, &n, &err), 0);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(bs_keyopts_add_item(o, items[i], &err), 0, "%s: %s", items[i], err.msg);
  bs_opts_free(items, n);
}

/* Build a catalog of `keys`, apply `optstr`; returns apply's rc. */
static int run(struct bs_catalog *cat, const char *const *keys, size_t n, const char *optstr,
               bs_err *err)
{
  mkcat(cat, keys, n);
  struct bs_keyopts o;
  mkopts(&o, optstr);
  bs_err_clear(err);
  int rc = bs_keys_apply(cat, &o, err);
  bs_keyopts_destroy(&o);
  return rc;
}

static const struct bs_tensor *by_key(const struct bs_catalog *cat, const char *key)
{
  long i = bs_catalog_find(cat, key);
  cr_assert_geq(i, 0, "no key %s", key);
  return &cat->tensors[i];
}

#define EXPECT(cat, key, want)                                                                     \
  do {                                                                                             \
    const struct bs_tensor *t_ = by_key((cat), (key));                                             \
    cr_expect_str_eq(t_->name, (want), "%s -> %s, want %s", (key), t_->name, (want));              \
    cr_expect(!t_->hidden, "%s is hidden", (key));                                                 \
  } while (0)
#define EXPECT_HIDDEN(cat, key) cr_expect(by_key((cat), (key))->hidden, "%s is visible", (key))

/* Apply a single remap to one key and compare. */
static void remap1(const char *opt, const char *key, const char *want)
{
  struct bs_catalog cat;
  bs_err err;
  const char *keys[] = {key};
  cr_assert_eq(run(&cat, keys, 1, opt, &err), 0, "%s", err.msg);
  EXPECT(&cat, key, want);
  bs_catalog_destroy(&cat);
}

/* ---- remap ---- */

Test(keys, remap_chained_burn_example_renames_blocks)
{
  static const char *const keys[] = {
      "conv.weight",
      "bn.weight",
      "layer.0.block.0.weight",
      "layer.0.block.1.weight",
      "layer.1.block.0.weight",
      "layer.1.block.1.running_mean",
  };
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys),
                   "remap=(.+)\\.block\\.0\\.(.+)=>$1.conv.$2,"
                   "remap=(.+)\\.block\\.1\\.(.+)=>$1.bn.$2,"
                   "remap=layer\\.([0-9])\\.(.+)=>layer.blocks.$1.$2",
                   &err),
               0, "%s", err.msg);
  EXPECT(&cat, "conv.weight", "conv.weight");
  EXPECT(&cat, "bn.weight", "bn.weight");
  EXPECT(&cat, "layer.0.block.0.weight", "layer.blocks.0.conv.weight");
  EXPECT(&cat, "layer.0.block.1.weight", "layer.blocks.0.bn.weight");
  EXPECT(&cat, "layer.1.block.0.weight", "layer.blocks.1.conv.weight");
  EXPECT(&cat, "layer.1.block.1.running_mean", "layer.blocks.1.bn.running_mean");
  bs_catalog_destroy(&cat);
}

Test(keys, remap_dollar_1a_is_group_named_1a_and_expands_empty)
{
  remap1("remap=^(enc)\\.=>$1a.", "enc.w", ".w");
  remap1("remap=^(enc)\\.=>${1}a.", "enc.w", "enca.w");
  remap1("remap=^(enc)\\.=>$1_x.", "enc.w", ".w");
  remap1("remap=^(enc)\\.=>${1}_x.", "enc.w", "enc_x.w");
}

Test(keys, remap_dollar_then_dot_is_group_then_literal)
{
  remap1("remap=^(enc)\\.(.*)=>$1.conv.$2", "enc.w", "enc.conv.w");
}

Test(keys, remap_double_dollar_is_literal_dollar)
{
  remap1("remap=^a=>$$1", "a.w", "$1.w");
  remap1("remap=^(a)=>$$$1", "a.w", "$a.w");
}

Test(keys, remap_lone_or_unclosed_dollar_is_literal)
{
  remap1("remap=^a=>$", "a.w", "$.w");
  remap1("remap=^a=>$.", "a.w", "$..w");
  remap1("remap=^(a)=>${1", "a.w", "${1.w");
  remap1("remap=^(a)=>${}", "a.w", ".w");
}

Test(keys, remap_named_groups_expand_both_forms)
{
  remap1("remap=^(?P<mod>[a-z]+)\\.(?<p>[a-z]+)$=>$p.$mod", "enc.weight", "weight.enc");
  remap1("remap=^(?P<mod>[a-z]+)\\.=>${mod}_x.", "enc.weight", "enc_x.weight");
  remap1("remap=^(?P<mod>[a-z]+)\\.=>$nope.", "enc.weight", ".weight");
}

Test(keys, remap_numbered_group_forms_follow_rust_usize)
{
  remap1("remap=^(a)(b)=>${2}${1}", "ab.w", "ba.w");
  remap1("remap=^(a)(b)=>$02", "ab.w", "b.w");
  remap1("remap=^(a)(b)=>${+1}", "ab.w", "a.w");
  remap1("remap=^(a)(b)=>$9", "ab.w", ".w");                   /* no group 9 */
  remap1("remap=^(a)|(z)=>[$2]", "ab.w", "[]b.w");             /* unset group */
  remap1("remap=^(a)=>$99999999999999999999999", "a.w", ".w"); /* too big: a name */
}

Test(keys, remap_replaces_every_match)
{
  remap1("remap=\\.=>_", "a.b.c.weight", "a_b_c_weight");
}

Test(keys, remap_non_matching_key_is_untouched)
{
  remap1("remap=^decoder\\.=>dec.", "encoder.w", "encoder.w");
}

Test(keys, remap_empty_matches_follow_rust_replace_all)
{
  /* Rust: "-a-b-d-" (PCRE2/Perl would give "-a-b--d-") */
  remap1("remap=x*=>-", "abxd", "-a-b-d-");
  remap1("remap=$=>.end", "a.w", "a.w.end");
}

Test(keys, remap_splits_at_first_arrow)
{
  remap1("remap=^a=>b=>c", "a.w", "b=>c.w");
}

Test(keys, remap_is_unicode_aware)
{
  /* \d matches the Arabic-Indic digit three (U+0663) under UCP, as in Rust. */
  remap1("remap=\\d=>N", "layer\xd9\xa3.w", "layerN.w");
  remap1("remap=^.=>X", "\xc3\xa9t\xc3\xa9.w", "Xt\xc3\xa9.w");
}

Test(keys, remap_matches_around_invalid_utf8_in_key)
{
  remap1("remap=\\.=>/", "a.\xff.w", "a/\xff/w");
}

Test(keys, remap_longer_than_key_limit_fails)
{
  struct bs_catalog cat;
  bs_err err;
  const char *keys[] = {"a.b.c.d.e.f.g.h.i.j"};
  char opt[4200];
  memset(opt, 0, sizeof opt);
  strcpy(opt, "remap=\\.=>");
  memset(opt + strlen(opt), 'x', 1000);
  cr_assert_eq(run(&cat, keys, 1, opt, &err), -1);
  cr_expect_eq(err.code, EINVAL);
  cr_expect_eq(err.off, BS_OFF_NONE);
  cr_expect_str_eq(err.key, "a.b.c.d.e.f.g.h.i.j");
  cr_expect(strstr(err.msg, "longer than the limit of 4096"), "%s", err.msg);
  EXPECT(&cat, "a.b.c.d.e.f.g.h.i.j", "a.b.c.d.e.f.g.h.i.j");
  bs_catalog_destroy(&cat);
}

/* ---- contiguous_indices ---- */

Test(keys, contiguous_renumbers_sequential_gaps)
{
  static const char *const keys[] = {"fc.0.weight", "fc.0.bias",   "fc.2.weight",
                                     "fc.2.bias",   "fc.4.weight", "output.weight"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "contiguous_indices", &err), 0, "%s", err.msg);
  EXPECT(&cat, "fc.0.weight", "fc.0.weight");
  EXPECT(&cat, "fc.0.bias", "fc.0.bias");
  EXPECT(&cat, "fc.2.weight", "fc.1.weight");
  EXPECT(&cat, "fc.2.bias", "fc.1.bias");
  EXPECT(&cat, "fc.4.weight", "fc.2.weight");
  EXPECT(&cat, "output.weight", "output.weight");
  bs_catalog_destroy(&cat);
}

Test(keys, contiguous_scopes_use_original_prefixes)
{
  static const char *const keys[] = {"feature.layers.0.conv_block.0.weight",
                                     "feature.layers.0.conv_block.2.weight",
                                     "feature.layers.2.conv_block.2.weight",
                                     "a.0.b.2.c.0.w",
                                     "a.2.b.0.c.0.w",
                                     "a.0.b.0.c.0.w",
                                     "a.0.b.0.c.2.w"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "contiguous_indices", &err), 0, "%s", err.msg);
  EXPECT(&cat, "feature.layers.0.conv_block.0.weight", "feature.layers.0.conv_block.0.weight");
  EXPECT(&cat, "feature.layers.0.conv_block.2.weight", "feature.layers.0.conv_block.1.weight");
  /* under feature.layers.2.conv_block. only index 2 exists: it becomes 0 */
  EXPECT(&cat, "feature.layers.2.conv_block.2.weight", "feature.layers.1.conv_block.0.weight");
  EXPECT(&cat, "a.0.b.0.c.0.w", "a.0.b.0.c.0.w");
  EXPECT(&cat, "a.0.b.0.c.2.w", "a.0.b.0.c.1.w");
  EXPECT(&cat, "a.0.b.2.c.0.w", "a.0.b.1.c.0.w");
  EXPECT(&cat, "a.2.b.0.c.0.w", "a.1.b.0.c.0.w");
  bs_catalog_destroy(&cat);
}

Test(keys, contiguous_renumbers_lone_and_last_and_first_segments)
{
  static const char *const keys[] = {"blocks.7.x", "params.3", "params.9", "5.x", "8.x"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "contiguous_indices", &err), 0, "%s", err.msg);
  EXPECT(&cat, "blocks.7.x", "blocks.0.x");
  EXPECT(&cat, "params.3", "params.0");
  EXPECT(&cat, "params.9", "params.1");
  EXPECT(&cat, "5.x", "0.x");
  EXPECT(&cat, "8.x", "1.x");
  bs_catalog_destroy(&cat);
}

Test(keys, contiguous_index_is_rust_usize_parse)
{
  static const char *const keys[] = {"a.+3.w",
                                     "a.007.w",
                                     "a.5.w",
                                     "b.-1.w",
                                     "b.1a.w",
                                     "b.4.w",
                                     "b.+.w",
                                     "b..w",
                                     "c.99999999999999999999.w",
                                     "c.18446744073709551615.w"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "contiguous_indices", &err), 0, "%s", err.msg);
  EXPECT(&cat, "a.+3.w", "a.0.w");
  EXPECT(&cat, "a.5.w", "a.1.w");
  EXPECT(&cat, "a.007.w", "a.2.w");
  EXPECT(&cat, "b.-1.w", "b.-1.w");
  EXPECT(&cat, "b.1a.w", "b.1a.w");
  EXPECT(&cat, "b.+.w", "b.+.w");
  EXPECT(&cat, "b..w", "b..w");
  EXPECT(&cat, "b.4.w", "b.0.w");
  EXPECT(&cat, "c.99999999999999999999.w", "c.99999999999999999999.w"); /* > u64 */
  EXPECT(&cat, "c.18446744073709551615.w", "c.0.w");
  bs_catalog_destroy(&cat);
}

Test(keys, contiguous_equal_values_collide_with_error)
{
  static const char *const keys[] = {"a.01", "a.1"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "contiguous_indices", &err), -1);
  cr_expect_eq(err.code, EEXIST);
  cr_expect_eq(err.off, BS_OFF_NONE);
  cr_expect(strstr(err.msg, "keys 'a.01' and 'a.1' both become 'a.0'"), "%s", err.msg);
  EXPECT(&cat, "a.01", "a.01"); /* unchanged on error */
  EXPECT(&cat, "a.1", "a.1");
  bs_catalog_destroy(&cat);
}

Test(keys, no_options_share_the_key_string_and_copy_nothing)
{
  static const char *const keys[] = {"b.x", "a", "c.d.e"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "", &err), 0, "%s", err.msg);
  for (size_t i = 0; i < cat.count; i++) {
    cr_expect_eq(cat.tensors[i].name, cat.tensors[i].key, "%s: name is the key's string",
                 cat.tensors[i].key);
    cr_expect(!cat.tensors[i].hidden);
  }
  bs_catalog_destroy(&cat);
}

Test(keys, no_options_still_refuse_two_tensors_of_one_name)
{
  /* Formats reject duplicate keys themselves; a catalog built otherwise
   * (several sources) still gets the collision rule, and its message. */
  static const char *const keys[] = {"q", "a.b", "z", "a.b", "c", "c"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "", &err), -1);
  cr_expect_eq(err.code, EEXIST);
  cr_expect(strstr(err.msg, "keys 'a.b' and 'a.b' both become 'a.b'"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(keys, contiguous_runs_after_remap)
{
  static const char *const keys[] = {"fc_2.w", "fc_6.w"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "contiguous_indices,remap=_=>.", &err), 0, "%s", err.msg);
  EXPECT(&cat, "fc_2.w", "fc.0.w");
  EXPECT(&cat, "fc_6.w", "fc.1.w");
  bs_catalog_destroy(&cat);
}

/* ---- top_level_key ---- */

Test(keys, top_level_key_keeps_and_strips_prefix)
{
  static const char *const keys[] = {"model.fc.weight", "model.fc.bias",
                                     "optimizer.state.0.exp_avg", "modelx.w", "model"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "top_level_key=model", &err), 0, "%s", err.msg);
  EXPECT(&cat, "model.fc.weight", "fc.weight");
  EXPECT(&cat, "model.fc.bias", "fc.bias");
  EXPECT_HIDDEN(&cat, "optimizer.state.0.exp_avg");
  EXPECT_HIDDEN(&cat, "modelx.w");
  EXPECT_HIDDEN(&cat, "model");
  bs_catalog_destroy(&cat);
}

Test(keys, top_level_key_missing_lists_top_level_keys)
{
  static const char *const keys[] = {"model.fc.weight", "model.fc.bias", "optimizer.state.0",
                                     "epoch"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "top_level_key=state_dict", &err), -1);
  cr_expect_eq(err.code, ENOENT);
  cr_expect_eq(err.off, BS_OFF_NONE);
  cr_expect_str_eq(err.msg,
                   "top_level_key 'state_dict' not found; top-level keys are: model, optimizer, "
                   "epoch");
  bs_catalog_destroy(&cat);
}

Test(keys, top_level_key_missing_lists_at_most_twenty)
{
  const char *keys[30];
  char buf[30][8];
  for (int i = 0; i < 30; i++) {
    snprintf(buf[i], sizeof buf[i], "k%d.w", i);
    keys[i] = buf[i];
  }
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, 30, "top_level_key=zz", &err), -1);
  cr_expect_eq(err.code, ENOENT);
  cr_expect_eq(err.off, BS_OFF_NONE);
  cr_expect(strstr(err.msg, "k0, k1, "), "%s", err.msg);
  cr_expect(strstr(err.msg, "k19, ..."), "%s", err.msg);
  cr_expect(!strstr(err.msg, "k20"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(keys, top_level_key_outside_keys_do_not_take_part)
{
  /* Outside keys neither take part in index scopes nor collide. */
  static const char *const keys[] = {"m.fc.2.w", "m.fc.4.w", "fc.0.w", "fc.1.w"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "top_level_key=m,contiguous_indices", &err), 0, "%s",
               err.msg);
  EXPECT(&cat, "m.fc.2.w", "fc.0.w");
  EXPECT(&cat, "m.fc.4.w", "fc.1.w");
  EXPECT_HIDDEN(&cat, "fc.0.w");
  EXPECT_HIDDEN(&cat, "fc.1.w");
  bs_catalog_destroy(&cat);
}

/* ---- include / exclude ---- */

static const char *const net[] = {"encoder.0.weight", "encoder.0.bias", "decoder.0.weight",
                                  "decoder.0.bias", "head.weight"};

Test(keys, include_is_or_of_patterns)
{
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, net, N(net), "include=^encoder\\.,include=^head", &err), 0, "%s", err.msg);
  EXPECT(&cat, "encoder.0.weight", "encoder.0.weight");
  EXPECT(&cat, "encoder.0.bias", "encoder.0.bias");
  EXPECT(&cat, "head.weight", "head.weight");
  EXPECT_HIDDEN(&cat, "decoder.0.weight");
  EXPECT_HIDDEN(&cat, "decoder.0.bias");
  bs_catalog_destroy(&cat);
}

Test(keys, include_search_is_unanchored)
{
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, net, N(net), "include=0\\.w", &err), 0, "%s", err.msg);
  EXPECT(&cat, "encoder.0.weight", "encoder.0.weight");
  EXPECT(&cat, "decoder.0.weight", "decoder.0.weight");
  EXPECT_HIDDEN(&cat, "head.weight");
  bs_catalog_destroy(&cat);
}

Test(keys, exclude_drops_if_any_matches)
{
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, net, N(net), "exclude=bias$,exclude=^head", &err), 0, "%s", err.msg);
  EXPECT(&cat, "encoder.0.weight", "encoder.0.weight");
  EXPECT(&cat, "decoder.0.weight", "decoder.0.weight");
  EXPECT_HIDDEN(&cat, "encoder.0.bias");
  EXPECT_HIDDEN(&cat, "decoder.0.bias");
  EXPECT_HIDDEN(&cat, "head.weight");
  bs_catalog_destroy(&cat);
}

Test(keys, include_and_exclude_combine)
{
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, net, N(net), "include=coder,exclude=weight", &err), 0, "%s", err.msg);
  EXPECT(&cat, "encoder.0.bias", "encoder.0.bias");
  EXPECT(&cat, "decoder.0.bias", "decoder.0.bias");
  EXPECT_HIDDEN(&cat, "encoder.0.weight");
  EXPECT_HIDDEN(&cat, "decoder.0.weight");
  EXPECT_HIDDEN(&cat, "head.weight");
  bs_catalog_destroy(&cat);
}

Test(keys, filters_match_the_name_after_remap)
{
  struct bs_catalog cat;
  bs_err err;
  /* written before the remap, still applied after it */
  cr_assert_eq(run(&cat, net, N(net), "include=^enc\\.,remap=^encoder\\.=>enc.", &err), 0, "%s",
               err.msg);
  EXPECT(&cat, "encoder.0.weight", "enc.0.weight");
  EXPECT(&cat, "encoder.0.bias", "enc.0.bias");
  EXPECT_HIDDEN(&cat, "decoder.0.weight");
  EXPECT_HIDDEN(&cat, "head.weight");
  bs_catalog_destroy(&cat);
}

Test(keys, filtered_keys_still_count_for_contiguous_indices)
{
  static const char *const keys[] = {"fc.0.w", "fc.2.w", "fc.4.w"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "contiguous_indices,exclude=^fc\\.0\\.", &err), 0, "%s",
               err.msg);
  EXPECT_HIDDEN(&cat, "fc.0.w");
  EXPECT(&cat, "fc.2.w", "fc.1.w");
  EXPECT(&cat, "fc.4.w", "fc.2.w");
  bs_catalog_destroy(&cat);
}

/* ---- collisions ---- */

Test(keys, collision_after_remap_names_both_keys)
{
  static const char *const keys[] = {"x.0", "a.w", "b.w"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "remap=^(a|b)\\.=>x.", &err), -1);
  cr_expect_eq(err.code, EEXIST);
  cr_expect_eq(err.off, BS_OFF_NONE);
  cr_expect(strstr(err.msg, "keys 'a.w' and 'b.w' both become 'x.w'"), "%s", err.msg);
  EXPECT(&cat, "a.w", "a.w");
  bs_catalog_destroy(&cat);
}

Test(keys, collision_with_a_filtered_key_is_fine)
{
  static const char *const keys[] = {"a.w", "b.w"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "remap=^(a|b)\\.=>x.,exclude=^x", &err), 0, "%s", err.msg);
  EXPECT_HIDDEN(&cat, "a.w");
  EXPECT_HIDDEN(&cat, "b.w");
  bs_catalog_destroy(&cat);
}

/* ---- option parsing ---- */

static void expect_add_fails(const char *name, const char *value, int code, const char *sub)
{
  struct bs_keyopts o;
  bs_keyopts_init(&o);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_keyopts_add(&o, name, value, &err), -1, "%s=%s", name, value);
  cr_expect_eq(err.code, code);
  cr_expect_eq(err.off, BS_OFF_NONE);
  cr_expect(strstr(err.msg, sub), "'%s' lacks '%s'", err.msg, sub);
  bs_keyopts_destroy(&o);
}

Test(keys, bad_regex_names_pattern_message_and_offset)
{
  expect_add_fails("include", "foo(", EINVAL,
                   "include regex 'foo(' is invalid: missing closing parenthesis at offset 4");
  expect_add_fails("exclude", "[a-", EINVAL, "exclude regex '[a-' is invalid");
  expect_add_fails("remap", "a)=>b", EINVAL, "remap regex 'a)' is invalid");
  expect_add_fails("include", "\xff", EINVAL, "include regex '\xff' is invalid");
}

Test(keys, remap_without_arrow_fails)
{
  expect_add_fails("remap", "a=b", EINVAL, "remap 'a=b' has no '=>'; write remap=FROM=>TO");
}

Test(keys, options_without_required_value_fail)
{
  expect_add_fails("include", NULL, EINVAL, "option 'include' needs a value: include=REGEX");
  expect_add_fails("remap", NULL, EINVAL, "remap=FROM=>TO");
  expect_add_fails("top_level_key", NULL, EINVAL, "top_level_key=KEY");
  expect_add_fails("top_level_key", "", EINVAL, "non-empty");
  expect_add_fails("contiguous_indices", "1", EINVAL, "takes no value");
}

Test(keys, unknown_option_returns_one_and_leaves_opts_alone)
{
  struct bs_keyopts o;
  bs_keyopts_init(&o);
  bs_err err;
  bs_err_clear(&err);
  cr_expect_eq(bs_keyopts_add(&o, "ro", NULL, &err), 1);
  cr_expect_eq(bs_keyopts_add_item(&o, "output=/x.bpk", &err), 1);
  cr_expect_eq(bs_keyopts_add_item(&o, "includes=a", &err), 1);
  cr_expect_eq(err.code, 0);
  cr_expect(!bs_keyopts_any(&o));
  cr_expect_eq(bs_keyopts_add_item(&o, "contiguous_indices", &err), 0);
  cr_expect(bs_keyopts_any(&o));
  cr_expect_eq(bs_keyopts_add_item(&o, "top_level_key=a", &err), 0);
  cr_expect_eq(bs_keyopts_add_item(&o, "top_level_key=b", &err), 0); /* last wins */
  cr_expect_str_eq(o.top_level_key, "b");
  bs_keyopts_destroy(&o);
}

Test(keys, split_honours_escaped_comma_and_backslash)
{
  char **items;
  size_t n;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(
      bs_opts_split("ro,remap=x\\,y=>z,,include=a\\\\b,remap=(.+)\\.b=>$1,flat,", &items, &n, &err),
      0);
  cr_assert_eq(n, 5);
  cr_expect_str_eq(items[0], "ro");
  cr_expect_str_eq(items[1], "remap=x,y=>z");
  cr_expect_str_eq(items[2], "include=a\\b");
  cr_expect_str_eq(items[3], "remap=(.+)\\.b=>$1");
  cr_expect_str_eq(items[4], "flat");
  bs_opts_free(items, n);
  cr_assert_eq(bs_opts_split(NULL, &items, &n, &err), 0);
  cr_expect_eq(n, 0);
  cr_expect_null(items);
  cr_assert_eq(bs_opts_split(",,", &items, &n, &err), 0);
  cr_expect_eq(n, 0);
  bs_opts_free(items, n);
  cr_assert_eq(bs_opts_split("a\\", &items, &n, &err), 0); /* trailing backslash is literal */
  cr_assert_eq(n, 1);
  cr_expect_str_eq(items[0], "a\\");
  bs_opts_free(items, n);
}

Test(keys, remap_with_escaped_comma_in_option_string)
{
  remap1("remap=^(a)\\.=>$1\\,", "a.w", "a,w");
  remap1("remap=^a{1\\,2}=>b", "aa.w", "b.w");
}

Test(keys, keep_applies_include_and_exclude)
{
  struct bs_keyopts o;
  mkopts(&o, "");
  cr_expect(bs_keys_keep(&o, "anything"));
  bs_keyopts_destroy(&o);
  mkopts(&o, "include=^enc,include=head,exclude=bias$");
  cr_expect(bs_keys_keep(&o, "enc.w"));
  cr_expect(bs_keys_keep(&o, "x.head.w"));
  cr_expect(!bs_keys_keep(&o, "enc.bias"));
  cr_expect(!bs_keys_keep(&o, "dec.w"));
  bs_keyopts_destroy(&o);
  mkopts(&o, "exclude=^tmp\\.");
  cr_expect(bs_keys_keep(&o, "a.w"));
  cr_expect(!bs_keys_keep(&o, "tmp.w"));
  bs_keyopts_destroy(&o);
}

Test(keys, no_options_presents_keys_unchanged)
{
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, net, N(net), "", &err), 0, "%s", err.msg);
  for (size_t i = 0; i < N(net); i++)
    EXPECT(&cat, net[i], net[i]);
  bs_catalog_destroy(&cat);
}

/* ---- out of memory ---- */

Test(keys, oom_at_every_allocation_fails_cleanly)
{
  static const char *const keys[] = {"model.layer.0.block.0.weight", "model.layer.2.block.1.bias",
                                     "model.head.weight", "other.x"};
  const char *optstr = "top_level_key=model,remap=(.+)\\.block\\.0\\.(.+)=>$1.conv.$2,"
                       "remap=(?P<l>layer)\\.=>${l}s.,contiguous_indices,include=layer,"
                       "exclude=^zzz";
  struct bs_catalog cat;
  mkcat(&cat, keys, N(keys));
  bool done = false;
  for (long fail = 0; fail < 10000 && !done; fail++) {
    struct bs_keyopts o;
    bs_keyopts_init(&o);
    bs_err err;
    bs_err_clear(&err);
    char **items = NULL;
    size_t n = 0;
    bs_alloc_fail_after(fail);
    int rc = bs_opts_split(optstr, &items, &n, &err);
    for (size_t i = 0; i < n && rc == 0; i++)
      rc = bs_keyopts_add_item(&o, items[i], &err);
    if (rc == 0)
      rc = bs_keys_apply(&cat, &o, &err);
    bs_alloc_fail_after(-1);
    bs_opts_free(items, n);
    bs_keyopts_destroy(&o);
    if (rc == 0) {
      done = true;
      break;
    }
    cr_assert_eq(err.code, ENOMEM, "fail=%ld: %s", fail, err.msg);
    cr_assert_eq(err.off, BS_OFF_NONE);
    cr_assert(strstr(err.msg, "out of memory"));
    for (size_t i = 0; i < N(keys); i++)
      cr_assert_str_eq(cat.tensors[i].name, keys[i], "fail=%ld: catalog changed", fail);
  }
  cr_assert(done);
  EXPECT(&cat, "model.layer.0.block.0.weight", "layers.0.conv.weight");
  EXPECT(&cat, "model.layer.2.block.1.bias", "layers.1.block.0.bias");
  EXPECT_HIDDEN(&cat, "model.head.weight");
  EXPECT_HIDDEN(&cat, "other.x");
  bs_catalog_destroy(&cat);
  ASSERT_NO_LEAKS();
}

Test(keys, catastrophic_backtracking_is_an_error_not_a_hang)
{
  static const char *const keys[] = {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.c"};
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(run(&cat, keys, N(keys), "include=^(a|aa)+(?=b)", &err), -1);
  cr_expect_eq(err.code, EINVAL);
  cr_expect_eq(err.off, BS_OFF_NONE);
  cr_expect_str_eq(err.key, keys[0]);
  cr_expect(strstr(err.msg, "backtracks too much"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}
