/* PLACEHOLDER until the key options module lands. */
#ifndef BURNSTORE_KEYS_H
#define BURNSTORE_KEYS_H
#include <stdbool.h>
#include <stddef.h>
#include "burnstore/catalog.h"
struct bs_keyopts { int unused; };
void bs_keyopts_init(struct bs_keyopts *o);
void bs_keyopts_destroy(struct bs_keyopts *o);
int bs_keyopts_add(struct bs_keyopts *o, const char *name, const char *value, bs_err *err);
bool bs_keyopts_any(const struct bs_keyopts *o);
int bs_keys_apply(struct bs_catalog *cat, const struct bs_keyopts *o, bs_err *err);
bool bs_keys_keep(const struct bs_keyopts *o, const char *name);
int bs_opts_split(const char *optstr, char ***items, size_t *n, bs_err *err);
#endif
