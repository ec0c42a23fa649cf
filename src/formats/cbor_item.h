/* What the Burnpack reader and its dtype descriptions share about libcbor's items. */
#ifndef BURNSTORE_CBOR_ITEM_H
#define BURNSTORE_CBOR_ITEM_H

#include <cbor.h>

/* The item under any number of tags (the item itself when untagged):
 * borrowed, as long as `it` lives. libcbor's cbor_tag_item takes a
 * reference the caller must release; this gives it back at once (the tag
 * still holds its own), so looking through a tag costs no reference. */
const cbor_item_t *bs_cbor_untag(const cbor_item_t *it);

#endif
