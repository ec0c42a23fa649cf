/* PLACEHOLDER until the SafeTensors reader lands. */
#include <errno.h>
#include "burnstore/formats.h"
int bs_st_read(struct bs_catalog *cat, uint32_t src, bs_err *err)
{
  (void)cat; (void)src;
  return bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL, "SafeTensors reader not built yet");
}
