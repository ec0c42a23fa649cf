#include "st_fixture.h"

#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"

uint8_t *st_build_raw(uint64_t n_prefix, const void *header, size_t hlen, size_t dlen, size_t *len)
{
  size_t n = 8 + hlen + dlen;
  uint8_t *buf = bs_malloc(n);
  cr_assert_not_null(buf);
  bs_put_le64(buf, n_prefix);
  if (hlen)
    memcpy(buf + 8, header, hlen);
  for (size_t i = 0; i < dlen; i++)
    buf[8 + hlen + i] = st_data_byte(i);
  *len = n;
  return buf;
}

uint8_t *st_build(const char *header, size_t dlen, size_t *len)
{
  return st_build_raw(strlen(header), header, strlen(header), dlen, len);
}

int st_read_mem(struct bs_catalog *cat, const void *buf, size_t len, bs_err *err)
{
  struct bs_src src;
  uint32_t idx;
  bs_catalog_init(cat);
  if (bs_src_init_mem(&src, buf, len, "test.safetensors", err) != 0)
    return -1;
  if (bs_catalog_add_src(cat, &src, &idx, err) != 0)
    return -1;
  return bs_st_read(cat, idx, NULL, err);
}
