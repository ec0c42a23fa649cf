/* Shared libcbor helpers: see formats/cbor_item.h. */
#include "formats/cbor_item.h"

const cbor_item_t *bs_cbor_untag(const cbor_item_t *it)
{
  while (it && cbor_isa_tag(it)) {
    cbor_item_t *inner = cbor_tag_item(it); /* increfs; the tag still holds a reference */
    if (!inner)
      return NULL;
    cbor_item_t *ref = inner;
    cbor_decref(&ref); /* the count is at least 1 more: this never frees */
    it = inner;
  }
  return it;
}
