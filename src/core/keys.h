/* Key options: the filtering and renaming burn-store does on load (include,
 * exclude, remap, top_level_key, contiguous_indices), applied to a catalog's
 * presented names. Also the splitter for the mount option string. No FUSE. */
#ifndef BURNSTORE_KEYS_H
#define BURNSTORE_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"
#include "core/err.h"

#pragma GCC visibility push(hidden) /* internal (err.h) */

/* PCRE2 types, declared here so that users of this header need not include
 * pcre2.h (these are the tags pcre2.h uses for PCRE2_CODE_UNIT_WIDTH 8). */
struct pcre2_real_code_8;
struct pcre2_real_general_context_8;
struct pcre2_real_compile_context_8;

struct bs_key_regex {
  char *pattern;                  /* owned: as the user wrote it */
  struct pcre2_real_code_8 *code; /* owned */
};

/* One piece of a parsed replacement: a literal slice of bs_key_remap.lit,
 * or a capture group (group >= 0; an unset group expands to nothing). */
struct bs_repl_piece {
  int32_t group; /* -1: literal */
  uint32_t off, len;
};

struct bs_key_remap {
  struct bs_key_regex re;       /* FROM */
  char *to;                     /* owned: TO as the user wrote it */
  char *lit;                    /* owned: literal text of TO, `$$` already reduced */
  struct bs_repl_piece *pieces; /* owned */
  size_t npieces;
};

/* Caller storage: bs_keyopts_init, then bs_keyopts_add per option, then
 * bs_keyopts_destroy. Everything it points to is owned by it. */
struct bs_keyopts {
  struct bs_key_regex *include; /* any matches -> kept (none given: all kept) */
  size_t ninclude, includecap;
  struct bs_key_regex *exclude; /* any matches -> dropped */
  size_t nexclude, excludecap;
  struct bs_key_remap *remap; /* applied in this order */
  size_t nremap, remapcap;
  char *top_level_key; /* owned, NULL: none */
  bool contiguous_indices;
  /* PCRE2 allocates through bs_malloc via these (created on first use). */
  struct pcre2_real_general_context_8 *gctx;
  struct pcre2_real_compile_context_8 *cctx;
};

void bs_keyopts_init(struct bs_keyopts *o);
void bs_keyopts_destroy(struct bs_keyopts *o); /* safe on a half-built or zeroed struct */

/* Add one mount option. `name` is one of include, exclude, remap,
 * top_level_key, contiguous_indices; `value` is the text after '=' (NULL when
 * there was no '='). Regexes are compiled now; a bad one is an EINVAL error
 * naming the pattern, PCRE2's message and the offset. remap's value is
 * "FROM=>TO", split at the first "=>". A repeated top_level_key replaces the
 * earlier one. Returns 0 on success, 1 if `name` is not a key option (o is
 * untouched, err is not set), -1 on error. */
BS_NODISCARD int bs_keyopts_add(struct bs_keyopts *o, const char *name, const char *value,
                                bs_err *err);
/* The same for one "name" or "name=value" item of an option string. */
BS_NODISCARD int bs_keyopts_add_item(struct bs_keyopts *o, const char *item, bs_err *err);

/* Does o change anything at all? */
bool bs_keyopts_any(const struct bs_keyopts *o);

/* Compute every tensor's presented name from its source key (t->key) and set
 * t->name (the old one is freed) and t->hidden, in burn-store's load order:
 *   1. top_level_key=K: only keys starting with "K." take part; the prefix is
 *      stripped. The rest are hidden and ignored by steps 2-5 (burn never sees
 *      them). No key under K: ENOENT, listing the top-level keys there are.
 *   2. remap, each pattern in order on the current name; every
 *      non-overlapping match is replaced (Rust regex replace_all).
 *   3. contiguous_indices: burn's map_indices_contiguous (filtered-out keys
 *      take part, as in burn, whose filter runs later).
 *   4. include/exclude on the final name: visible iff (no include, or any
 *      include matches) and no exclude matches. Searches are unanchored.
 *   5. two visible tensors with the same final name: EEXIST naming both keys.
 * On error the catalog is unchanged. Match errors (PCRE2's backtracking
 * limit) are EINVAL naming the pattern and the key. */
BS_NODISCARD int bs_keys_apply(struct bs_catalog *cat, const struct bs_keyopts *o, bs_err *err);

/* Does a name pass include/exclude (step 4)? (Writable mounts do not filter
 * what users create: they write what the mount shows.) A match error (limit, memory) counts as
 * "keep": a tensor is never dropped silently. Thread-safe. */
bool bs_keys_keep(const struct bs_keyopts *o, const char *name);

/* Split a mount option string at commas. "\," is a literal comma and "\\" a
 * literal backslash; any other backslash is kept as is (so regex escapes like
 * "\." pass through). Empty items are skipped. On success *items is a
 * bs_malloc'd array of *n bs_malloc'd strings (free with bs_opts_free); on
 * failure (ENOMEM) *items is NULL and *n is 0. A NULL optstr gives 0 items. */
BS_NODISCARD int bs_opts_split(const char *optstr, char ***items, size_t *n, bs_err *err);
void bs_opts_free(char **items, size_t n);

#pragma GCC visibility pop

#endif
