/* Key options: the first line of the input is a mount option string, split
 * by bs_opts_split and added item by item; the other lines are tensor keys
 * of a small catalog that bs_keys_apply renames and filters. On error the
 * catalog must be unchanged; on success visible names are unique. */
#include "fuzz_common.h"

#include "core/keys.h"

#define MAX_KEYS 64

static int cmp_str(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size > 4096)
    return 0;
  char *text = bs_malloc(size + 1);
  FUZZ_CHECK(text != NULL);
  memcpy(text, data, size);
  text[size] = '\0';
  char *nl = strchr(text, '\n');
  char *rest = NULL;
  if (nl) {
    *nl = '\0';
    rest = nl + 1;
  }

  struct bs_keyopts o;
  bs_keyopts_init(&o);
  bs_err err = {0};
  char **items = NULL;
  size_t nitems = 0;
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  if (bs_opts_split(text, &items, &nitems, &err) != 0)
    goto out;
  for (size_t i = 0; i < nitems; i++) {
    FUZZ_CHECK(items[i] && items[i][0] != '\0');
    bs_err e = {0};
    int rc = bs_keyopts_add_item(&o, items[i], &e);
    FUZZ_CHECK(rc == 0 || rc == 1 || (rc == -1 && e.code != 0));
  }

  /* The keys: one per line (NULs end a key early). */
  size_t nkeys = 0;
  while (rest && nkeys < MAX_KEYS) {
    char *end = strchr(rest, '\n');
    if (end)
      *end = '\0';
    bs_err e = {0};
    FUZZ_CHECK(bs_catalog_add(&cat, rest, BS_DT_U8, 0, NULL, 0, &e) != NULL);
    nkeys++;
    rest = end ? end + 1 : NULL;
  }
  char *before[MAX_KEYS];
  for (size_t i = 0; i < cat.count; i++)
    before[i] = cat.tensors[i].name;

  if (bs_keys_apply(&cat, &o, &err) != 0) {
    FUZZ_CHECK(err.code != 0);
    for (size_t i = 0; i < cat.count; i++)
      FUZZ_CHECK(cat.tensors[i].name == before[i] && !cat.tensors[i].hidden);
    goto out;
  }
  const char *vis[MAX_KEYS];
  size_t nvis = 0;
  for (size_t i = 0; i < cat.count; i++) {
    const struct bs_tensor *t = &cat.tensors[i];
    FUZZ_CHECK(t->name != NULL);
    if (!t->hidden) {
      vis[nvis++] = t->name;
      (void)bs_keys_keep(&o, t->name);
    }
  }
  qsort(vis, nvis, sizeof *vis, cmp_str);
  for (size_t i = 1; i < nvis; i++)
    FUZZ_CHECK(strcmp(vis[i - 1], vis[i]) != 0);
out:
  bs_catalog_destroy(&cat);
  bs_opts_free(items, nitems);
  bs_keyopts_destroy(&o);
  bs_free(text);
  return 0;
}
