/* qfloat.h: recognising the QFloat schemes burnstore decodes. The scheme
 * map's spelling: /work/shared/docs/burnpack-format.md section 4.2 (cubecl's
 * QuantScheme serialized by serde); the byte layout: burn-std's
 * QuantizedBytes and quantized_data_len. */
#include "core/qfloat.h"

#include <cbor.h>
#include <stdbool.h>
#include <string.h>

static const cbor_item_t *untag(const cbor_item_t *it)
{
  for (int depth = 0; it && cbor_isa_tag(it) && depth < 8; depth++)
    it = cbor_tag_item(it) ? cbor_move(cbor_tag_item(it)) : NULL;
  return it;
}

static bool text_is(const cbor_item_t *it, const char *s)
{
  it = untag(it);
  return it && cbor_isa_string(it) && cbor_string_is_definite(it) &&
         cbor_string_length(it) == strlen(s) && memcmp(cbor_string_handle(it), s, strlen(s)) == 0;
}

/* The value of text key `k` in map m, or NULL. */
static const cbor_item_t *get(const cbor_item_t *m, const char *k)
{
  struct cbor_pair *p = cbor_map_handle(m);
  for (size_t i = 0; i < cbor_map_size(m); i++)
    if (text_is(p[i].key, k))
      return untag(p[i].value);
  return NULL;
}

static enum bs_dtype scale_dtype(const cbor_item_t *it)
{
  if (text_is(it, "F32"))
    return BS_DT_F32;
  if (text_is(it, "F16"))
    return BS_DT_F16;
  if (text_is(it, "BF16"))
    return BS_DT_BF16;
  return BS_DT_COUNT;
}

enum bs_dtype bs_qfloat_q8s_scale(const uint8_t *raw, size_t len)
{
  if (!raw || len == 0)
    return BS_DT_COUNT;
  struct cbor_load_result res;
  cbor_item_t *root = cbor_load(raw, len, &res);
  enum bs_dtype dt = BS_DT_COUNT;
  if (!root || res.error.code != CBOR_ERR_NONE || res.read != len)
    goto out;
  const cbor_item_t *v = untag(root);
  if (!cbor_isa_map(v) || !cbor_map_is_definite(v) || cbor_map_size(v) != 1 ||
      !text_is(cbor_map_handle(v)[0].key, "QFloat"))
    goto out;
  const cbor_item_t *s = untag(cbor_map_handle(v)[0].value);
  if (!s || !cbor_isa_map(s) || !cbor_map_is_definite(s))
    goto out;
  if (!text_is(get(s, "value"), "Q8S") || !text_is(get(s, "store"), "Native") ||
      !text_is(get(s, "mode"), "Symmetric"))
    goto out;
  const cbor_item_t *block = get(s, "block"), *level = get(s, "level");
  if (cbor_map_size(s) == 5 && block && cbor_is_null(block) && !level)
    dt = scale_dtype(get(s, "tensor")); /* current: tensor = the scale dtype, no blocks */
  else if (cbor_map_size(s) == 5 && level && text_is(level, "Tensor") && !block)
    dt = scale_dtype(get(s, "param")); /* v0.20-0.21: level Tensor, param the scale dtype */
out:
  if (root)
    cbor_decref(&root);
  return dt;
}
