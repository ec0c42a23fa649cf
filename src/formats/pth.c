/* PLACEHOLDER until the PyTorch reader lands. */
#include <errno.h>
#include "burnstore/formats.h"
int bs_pth_read(struct bs_catalog *cat, uint32_t src, enum bs_kind kind,
                const struct bs_open_opts *opts, bs_err *err)
{
  (void)cat; (void)src; (void)kind; (void)opts;
  return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "PyTorch reader not built yet");
}
