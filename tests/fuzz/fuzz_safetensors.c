/* SafeTensors reader: open from memory (bs_st_read directly, so every input
 * reaches the parser rather than the sniffer), read every tensor. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct bs_catalog cat;
  struct bs_src src;
  bs_err err = {0};
  uint32_t idx;
  bs_catalog_init(&cat);
  if (bs_src_init_mem(&src, data, size, "fuzz", &err) != 0 ||
      bs_catalog_add_src(&cat, &src, &idx, &err) != 0)
    __builtin_trap();
  cat.format = BS_FMT_SAFETENSORS;
  if (bs_st_read(&cat, idx, NULL, &err) == 0) {
    FUZZ_CHECK(err.code == 0);
    fuzz_check_catalog(&cat);
  } else {
    FUZZ_CHECK(err.code != 0 && err.msg[0] != '\0');
    FUZZ_CHECK(cat.count == 0 && cat.nmeta == 0);
  }
  bs_catalog_destroy(&cat);
  return 0;
}
