/* The staging INDEX parser (--finish and --list-staging read it): any bytes
 * are refused cleanly or give an index whose claims hold: every tensor's
 * bytes lie inside its declared source, nbytes is shape x dtype, a strided
 * view fits its storage, and a failure leaves nothing behind. */
#include "fuzz_common.h"

#include "policy/stage_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size > 65536)
    return 0;
  struct bs_stage_index idx;
  bs_err err = {0};
  if (bs_stage_index_parse(data, size, &idx, &err) != 0) {
    FUZZ_CHECK(err.code != 0 && err.msg[0]);
    FUZZ_CHECK(idx.cat.count == 0 && idx.nsrcs == 0 && idx.target == NULL && idx.staging == NULL);
    bs_stage_index_destroy(&idx);
    return 0;
  }
  FUZZ_CHECK(idx.target && idx.target[0] == '/');
  FUZZ_CHECK(!idx.staging || (idx.staging[0] && !strchr(idx.staging, '/')));
  FUZZ_CHECK(idx.ncksrcs <= idx.nsrcs);
  for (size_t i = 0; i < idx.nsrcs; i++)
    FUZZ_CHECK(i < idx.ncksrcs
                   ? !idx.srcs[i].stage
                   : idx.srcs[i].stage && idx.srcs[i].file && !strchr(idx.srcs[i].file, '/'));
  for (size_t i = 0; i < idx.cat.count; i++) {
    const struct bs_tensor *t = &idx.cat.tensors[i];
    if (t->dtype != BS_DT_QFLOAT) {
      uint64_t n;
      FUZZ_CHECK(bs_dtype_nbytes(t->dtype, t->rank, t->shape, &n, NULL, 0, &err) == 0);
      FUZZ_CHECK(n == t->nbytes);
    }
    if (t->src == UINT32_MAX) {
      FUZZ_CHECK(t->nbytes == 0);
      continue;
    }
    FUZZ_CHECK(t->src < idx.nsrcs);
    uint64_t len = t->x->strides ? t->x->storage_bytes : t->nbytes;
    FUZZ_CHECK(bs_range_ok(t->off, len, idx.srcs[t->src].size));
    if (t->x->strides)
      FUZZ_CHECK(bs_tensor_check_view(t, 0, &err) == 0);
  }
  bs_stage_index_destroy(&idx);
  return 0;
}
