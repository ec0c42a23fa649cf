/* PLACEHOLDER until the key options module lands. */
#include <errno.h>
#include <string.h>
#include "burnstore/alloc.h"
#include "burnstore/keys.h"
void bs_keyopts_init(struct bs_keyopts *o) { memset(o, 0, sizeof *o); }
void bs_keyopts_destroy(struct bs_keyopts *o) { (void)o; }
int bs_keyopts_add(struct bs_keyopts *o, const char *name, const char *value, bs_err *err)
{ (void)o; (void)name; (void)value; (void)err; return 1; }
bool bs_keyopts_any(const struct bs_keyopts *o) { (void)o; return false; }
int bs_keys_apply(struct bs_catalog *cat, const struct bs_keyopts *o, bs_err *err)
{ (void)cat; (void)o; (void)err; return 0; }
bool bs_keys_keep(const struct bs_keyopts *o, const char *name) { (void)o; (void)name; return true; }
int bs_opts_split(const char *optstr, char ***items, size_t *n, bs_err *err)
{
  size_t cap = 0; *items = NULL; *n = 0;
  const char *p = optstr;
  while (1) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p);
    if (bs_grow((void **)items, &cap, *n + 1, sizeof **items) != 0) return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "oom");
    (*items)[(*n)++] = bs_strndup(p, len);
    if (!c) break;
    p = c + 1;
  }
  return 0;
}
