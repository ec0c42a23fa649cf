/* The one allocator of burnstore. Every heap allocation in the core and the
 * FUSE layer goes through these, so a test can make the Nth one fail. */
#ifndef BURNSTORE_ALLOC_H
#define BURNSTORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

#pragma GCC visibility push(hidden) /* internal (err.h) */

void *bs_malloc(size_t n);
/* Memory the core hands over: what a call documents as bs_malloc'd
 * (bs_shape_json's string, bs_src_read_alloc's buffer) is the caller's, to
 * release with bs_free. bs_free(NULL) is a no-op. */
void bs_free(void *p);
void *bs_calloc(size_t n, size_t size);
void *bs_realloc(void *p, size_t n);
char *bs_strdup(const char *s);
char *bs_strndup(const char *s, size_t n);
/* "dir/name", allocated; NULL when out of memory. */
char *bs_path_join(const char *dir, const char *name);
/* Whether s (its first n bytes) ends with suffix; ASCII case ignored when
 * nocase (extensions: ".EXT" is ".ext"). */
bool bs_ends_with(const char *s, size_t n, const char *suffix, bool nocase);

/* Grow an array of `elem`-byte items so that it holds at least `need`
 * (checked arithmetic; doubles). Returns 0, or -1 with *arr untouched. */
int bs_grow(void **arr, size_t *cap, size_t need, size_t elem);

/* Test hook: the allocation `n` calls from now fails (n = 0: the very next
 * one). A negative n disables the hook. Not thread-safe; tests only. */
void bs_alloc_fail_after(long n);

#pragma GCC visibility pop

#endif
