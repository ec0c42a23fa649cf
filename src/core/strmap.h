/* A small open-addressing map from borrowed NUL-terminated strings to
 * indexes (FNV-1a hashed). The keys must outlive the map. */
#ifndef BURNSTORE_STRMAP_H
#define BURNSTORE_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

struct bs_strmap {
  const char **keys; /* borrowed */
  size_t *vals;
  size_t cap, n;
};

void bs_strmap_destroy(struct bs_strmap *m); /* safe on a zeroed map */
bool bs_strmap_get(const struct bs_strmap *m, const char *k, size_t *val);
/* Insert k (borrowed). Returns 0, 1 if k was present (val untouched), -1 when out of memory. */
int bs_strmap_put(struct bs_strmap *m, const char *k, size_t val);

#endif
