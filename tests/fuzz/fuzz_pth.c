/* PyTorch reader (zip, legacy and tar, by sniffing): open from memory, read
 * every tensor (strided views too), check that the non-tensor values are
 * valid JSON. Then the writer's rewrite in place: a file it keeps is
 * re-pickled around its own tensors and must read back with the same keys.
 * The first byte picks strict mode and is not part of the file. */
#include "fuzz_common.h"

#include <jansson.h>
#include <string.h>

#include "core/sink.h"
#include "formats/pth_write.h"

static void rewrite(const struct bs_catalog *cat)
{
  struct bs_pth_keep keep;
  bs_err err;
  bs_err_clear(&err);
  if (bs_pth_keep_check(&cat->srcs[0], &keep, &err) == 0) {
    struct bs_buf b = {0};
    struct bs_sink k;
    bs_sink_init_mem(&k, &b, "fuzz.pth");
    if (bs_pth_write_kept(cat, &keep, &k, &err) == 0) {
      struct bs_catalog back;
      FUZZ_CHECK(fuzz_open(&back, b.data, b.len, false) == 0);
      FUZZ_CHECK(back.count == cat->count);
      for (size_t i = 0; i < cat->count && i < back.count; i++)
        FUZZ_CHECK(bs_catalog_find(&back, cat->tensors[i].key) >= 0);
      bs_catalog_destroy(&back);
    }
    bs_buf_destroy(&b);
  }
  bs_pth_keep_destroy(&keep);
}

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
    if (cat.format == BS_FMT_PYTORCH && cat.nsrcs)
      rewrite(&cat);
  }
  bs_catalog_destroy(&cat);
  return 0;
}
