/* SafeTensors fixtures in memory: length prefix + header + data, and a
 * one-call read of such a buffer into a catalog. */
#ifndef BS_ST_FIXTURE_H
#define BS_ST_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "core/catalog.h"

/* prefix (u64 LE `n_prefix`) + `hlen` header bytes + `dlen` data bytes, the
 * data byte i being st_data_byte(i). Returns a bs_malloc'd buffer (never
 * NULL: aborts the test) and its length in *len. */
uint8_t *st_build_raw(uint64_t n_prefix, const void *header, size_t hlen, size_t dlen, size_t *len);
/* The common case: the prefix is strlen(header). */
uint8_t *st_build(const char *header, size_t dlen, size_t *len);
/* The data pattern, so tests can check bytes read back. */
static inline uint8_t st_data_byte(size_t i)
{
  return (uint8_t)(i * 7u + 1u);
}

/* bs_catalog_init(cat), wrap buf as memory source 0, bs_st_read it.
 * Returns the reader's rc; the caller destroys cat either way. */
int st_read_mem(struct bs_catalog *cat, const void *buf, size_t len, bs_err *err);

#endif
