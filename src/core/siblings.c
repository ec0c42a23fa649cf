/* An index's shards opened beside it (siblings.h). */
#include <stdint.h>

#include "core/siblings.h"
#include "core/source_http.h"

int bs_src_open_siblings(const struct bs_src *index, const char *const *rel, size_t n,
                         bs_sibling_ready_fn ready, void *ud, size_t *failed, bs_err *err)
{
  if (index->ops == &bs_http_ops)
    return bs_http_open_siblings(index, rel, n, ready, ud, failed, err);
  *failed = SIZE_MAX;
  /* (a copy: ready may move the index, adding to the catalog that holds it;
   * what it points at stays) */
  const struct bs_src ix = *index;
  for (size_t i = 0; i < n; i++) {
    struct bs_src s;
    if (bs_src_open_sibling(&ix, rel[i], &s, err) != 0) {
      *failed = i;
      return -1;
    }
    if (ready(ud, i, &s, err) != 0)
      return -1;
  }
  return 0;
}
