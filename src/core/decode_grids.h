/* The lookup tables of ggml's IQ and MXFP4 block types (decode_grids.c says
 * where they come from and how an entry holds its values). */
#ifndef BURNSTORE_CORE_DECODE_GRIDS_H
#define BURNSTORE_CORE_DECODE_GRIDS_H

#include <stdint.h>

extern const uint64_t bs_iq2xxs_grid[256];
extern const uint64_t bs_iq2xs_grid[512];
extern const uint64_t bs_iq2s_grid[1024];
extern const uint32_t bs_iq3xxs_grid[256];
extern const uint32_t bs_iq3s_grid[512];
extern const uint64_t bs_iq1s_grid[2048];
extern const int8_t bs_kvalues_iq4nl[16];
extern const int8_t bs_kvalues_mxfp4[16];

#endif
