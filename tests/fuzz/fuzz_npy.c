/* The .npy header parser (what a writable mount reads from a file written as
 * NAME.npy): bs_npy_parse on the input. On success the header fits the
 * input, the shape gives nbytes, and a header built for the same dtype and
 * shape parses back to the same; a failure has a message. */
#include "fuzz_common.h"

#include "core/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  struct bs_npy_info info;
  bs_err err = {0};
  if (bs_npy_parse(data, size, &info, &err) != 0) {
    FUZZ_CHECK(err.code != 0 && err.msg[0] != '\0');
    return 0;
  }
  FUZZ_CHECK(info.header_len <= size && info.header_len <= BS_NPY_MAX_HEADER);
  FUZZ_CHECK(info.rank <= BS_MAX_RANK);
  uint64_t nb;
  bs_err e2 = {0};
  FUZZ_CHECK(bs_dtype_nbytes(info.dtype, info.rank, info.shape, &nb, NULL, 0, &e2) == 0);
  FUZZ_CHECK(nb == info.nbytes);
  static char hdr[BS_NPY_MAX_HEADER];
  size_t hl;
  bs_err e3 = {0};
  if (bs_npy_header(info.dtype, info.rank, info.shape, hdr, sizeof hdr, &hl, &e3) == 0) {
    struct bs_npy_info back;
    bs_err e4 = {0};
    FUZZ_CHECK(hl % 64 == 0 && hl == bs_npy_header_len(info.dtype, info.rank, info.shape));
    FUZZ_CHECK(bs_npy_parse((const uint8_t *)hdr, hl, &back, &e4) == 0);
    FUZZ_CHECK(back.dtype == info.dtype && back.rank == info.rank && !back.fortran_order &&
               back.header_len == hl);
    FUZZ_CHECK(info.rank == 0 || memcmp(back.shape, info.shape, info.rank * 8) == 0);
  }
  return 0;
}
