#include "core/strmap.h"

#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"

static uint64_t hash_str(const char *s)
{
  return bs_fnv1a_str(BS_FNV1A_INIT, s);
}

void bs_strmap_destroy(struct bs_strmap *m)
{
  bs_free(m->keys);
  bs_free(m->vals);
  memset(m, 0, sizeof *m);
}

bool bs_strmap_get(const struct bs_strmap *m, const char *k, size_t *val)
{
  if (!m->cap)
    return false;
  for (size_t i = hash_str(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->keys[i])
      return false;
    if (strcmp(m->keys[i], k) == 0) {
      *val = m->vals[i];
      return true;
    }
  }
}

int bs_strmap_put(struct bs_strmap *m, const char *k, size_t val)
{
  if ((m->n + 1) * 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    const char **nk = bs_calloc(cap, sizeof *nk);
    size_t *nv = bs_calloc(cap, sizeof *nv);
    if (!nk || !nv) {
      bs_free(nk);
      bs_free(nv);
      return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i])
        continue;
      size_t j = hash_str(m->keys[i]) & (cap - 1);
      while (nk[j])
        j = (j + 1) & (cap - 1);
      nk[j] = m->keys[i];
      nv[j] = m->vals[i];
    }
    bs_free(m->keys);
    bs_free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = cap;
  }
  size_t i = hash_str(k) & (m->cap - 1);
  for (; m->keys[i]; i = (i + 1) & (m->cap - 1))
    if (strcmp(m->keys[i], k) == 0)
      return 1;
  m->keys[i] = k;
  m->vals[i] = val;
  m->n++;
  return 0;
}
