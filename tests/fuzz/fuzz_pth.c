/* PyTorch reader (zip, legacy and tar, by sniffing): open from memory, read
 * every tensor (strided views too), check that the non-tensor values are
 * valid JSON. The first byte picks strict mode and is not part of the file. */
#include "fuzz_common.h"

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  struct bs_catalog cat;
  if (fuzz_open(&cat, data + 1, size - 1, data[0] & 1) == 0) {
    fuzz_check_catalog(&cat);
    if (cat.values_json) {
      json_error_t je;
      json_t *j = json_loads(cat.values_json, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
      FUZZ_CHECK(j != NULL);
      json_decref(j);
    }
  }
  bs_catalog_destroy(&cat);
  return 0;
}
