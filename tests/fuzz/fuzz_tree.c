/* Tree: each input line is a key. Escaping a segment and unescaping it gives
 * the segment back; unescaping arbitrary names never overruns; and in the
 * built tree (nested and flat) every file's key leads back to its tensor. */
#include "fuzz_common.h"

#include "core/tree.h"

#define MAX_KEYS 256

static void check_tree(const struct bs_catalog *cat, bool flat)
{
  struct bs_tree t;
  bs_err err = {0};
  FUZZ_CHECK(bs_tree_init(&t, &err) == 0);
  if (bs_tree_build(&t, cat, flat, &err) == 0) {
    size_t files = 0;
    for (uint64_t ino = BS_TREE_ROOT + 1; ino < t.n; ino++) {
      const struct bs_node *nd = bs_tree_node(&t, ino);
      if (!nd || nd->is_dir)
        continue;
      FUZZ_CHECK(nd->tensor >= 0 && (size_t)nd->tensor < cat->count);
      FUZZ_CHECK(bs_tree_lookup(&t, nd->parent, nd->name) == ino);
      char *key = bs_tree_key(&t, ino, flat);
      FUZZ_CHECK(key != NULL);
      FUZZ_CHECK(strcmp(key, cat->tensors[nd->tensor].name) == 0);
      bs_free(key);
      files++;
    }
    FUZZ_CHECK(files == cat->count);
  } else {
    FUZZ_CHECK(err.code == EEXIST);
  }
  bs_tree_destroy(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size > 8192)
    return 0;
  char *text = bs_malloc(size + 1);
  FUZZ_CHECK(text != NULL);
  memcpy(text, data, size);
  text[size] = '\0';

  /* The whole input as one component name. */
  char *u = bs_unescape_component(text);
  if (u) {
    char *e = bs_escape_component(u, strlen(u));
    FUZZ_CHECK(e != NULL);
    char *u2 = bs_unescape_component(e);
    FUZZ_CHECK(u2 && strcmp(u, u2) == 0);
    bs_free(u2);
    bs_free(e);
    bs_free(u);
  }

  struct bs_catalog cat;
  bs_catalog_init(&cat);
  char *line = text;
  while (line && cat.count < MAX_KEYS) {
    char *end = strchr(line, '\n');
    if (end)
      *end = '\0';
    size_t len = strlen(line);
    char *e = bs_escape_component(line, len);
    FUZZ_CHECK(e && strchr(e, '/') == NULL && strcmp(e, ".") != 0 && strcmp(e, "..") != 0 &&
               e[0] != '\0');
    char *back = bs_unescape_component(e);
    FUZZ_CHECK(back && strcmp(back, line) == 0);
    bs_free(back);
    bs_free(e);
    bs_err err = {0};
    FUZZ_CHECK(bs_catalog_add(&cat, line, BS_DT_U8, 0, NULL, 0, &err) != NULL);
    line = end ? end + 1 : NULL;
  }
  check_tree(&cat, false);
  check_tree(&cat, true);
  bs_catalog_destroy(&cat);
  bs_free(text);
  return 0;
}
