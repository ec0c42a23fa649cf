/* Which PyTorch container a file is, from its first bytes:
 *
 *  ZIP (torch >= 1.6): "PK\3\4" at 0.
 *  LEGACY (torch < 1.6): a pickle of torch's magic number, which Python
 *    writes as 80 PP (PROTO 2..5), for protocols 4 and 5 a FRAME (95 + u64
 *    LE length), then LONG1 8a 0a + the 10 little-endian bytes of
 *    0x1950a86a20f9469cfc6c.
 *  TAR (torch 0.1-era): a ustar header block: "ustar" at 257 and the header
 *    checksum (octal at 148: the sum of the 512 bytes with the checksum field
 *    read as spaces; signed or unsigned bytes) right.
 * A pickle without the magic, or "ustar" with a wrong checksum, is only a
 * MAYBE: the registry tries SafeTensors first (a SafeTensors header length
 * of 640 starts with 80 02), and the reader then says what is wrong. */
#include <errno.h>
#include <string.h>

#include "core/source.h"
#include "formats/formats.h"

const uint8_t bs_pth_legacy_magic[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9,
                                         0x20, 0x6a, 0xa8, 0x50, 0x19};

#define TAR_BLOCK 512u

static bool is_pickle(const uint8_t *h, size_t n)
{
  return n >= 2 && h[0] == 0x80 && h[1] >= 2 && h[1] <= 5;
}

static bool legacy_magic(const uint8_t *h, size_t n)
{
  if (!is_pickle(h, n))
    return false;
  size_t i = 2;
  if (h[1] >= 4 && n > i && h[i] == 0x95) /* FRAME */
    i += 9;
  return n >= i + 12 && h[i] == 0x8a && h[i + 1] == 10 &&
         memcmp(h + i + 2, bs_pth_legacy_magic, sizeof bs_pth_legacy_magic) == 0;
}

static bool is_ustar(const uint8_t *h, size_t n)
{
  return n >= 262 && memcmp(h + 257, "ustar", 5) == 0;
}

static bool tar_checksum_ok(const uint8_t *h, size_t n)
{
  if (n < TAR_BLOCK)
    return false;
  const uint8_t *f = h + 148; /* 8 bytes: spaces, octal digits, NUL or space */
  size_t i = 0;
  while (i < 8 && f[i] == ' ')
    i++;
  uint64_t want = 0;
  size_t digits = 0;
  for (; i < 8 && f[i] >= '0' && f[i] <= '7'; i++, digits++)
    want = want * 8 + (uint64_t)(f[i] - '0');
  if (digits == 0 || (i < 8 && f[i] != '\0' && f[i] != ' '))
    return false;
  uint64_t usum = 0;
  int64_t ssum = 0;
  for (size_t k = 0; k < TAR_BLOCK; k++) {
    uint8_t b = k >= 148 && k < 156 ? ' ' : h[k];
    usum += b;
    ssum += (int8_t)b;
  }
  return want == usum || (int64_t)want == ssum;
}

static enum bs_sniff classify(const uint8_t *h, size_t n, enum bs_pth_container *c)
{
  if (n >= 4 && memcmp(h, "PK\x03\x04", 4) == 0) {
    *c = BS_PTH_ZIP;
    return BS_SNIFF_YES;
  }
  if (legacy_magic(h, n)) {
    *c = BS_PTH_LEGACY;
    return BS_SNIFF_YES;
  }
  if (is_ustar(h, n) && tar_checksum_ok(h, n)) {
    *c = BS_PTH_TAR;
    return BS_SNIFF_YES;
  }
  if (is_pickle(h, n)) {
    *c = BS_PTH_LEGACY;
    return BS_SNIFF_MAYBE;
  }
  if (is_ustar(h, n)) {
    *c = BS_PTH_TAR;
    return BS_SNIFF_MAYBE;
  }
  return BS_SNIFF_NO;
}

enum bs_sniff bs_pth_sniff(const uint8_t *head, size_t n, uint64_t size)
{
  (void)size;
  enum bs_pth_container c;
  return classify(head, n, &c);
}

void bs_pth_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx)
{
  enum bs_pth_container c;
  bs_err err;
  bs_err_clear(&err);
  if (bs_pth_container(&cat->srcs[0], &c, &err) != 0)
    return;
  switch (c) {
  case BS_PTH_ZIP: detail(ctx, "version", "zip (torch >= 1.6)"); break;
  case BS_PTH_LEGACY: detail(ctx, "version", "legacy pickle (torch < 1.6)"); break;
  case BS_PTH_TAR: detail(ctx, "version", "tar (torch < 0.4)"); break;
  }
}

int bs_pth_container(const struct bs_src *s, enum bs_pth_container *out, bs_err *err)
{
  uint8_t head[BS_SNIFF_HEAD];
  size_t n = s->size < sizeof head ? (size_t)s->size : sizeof head;
  if (n && bs_src_read(s, 0, head, n, err) != 0)
    return -1;
  if (classify(head, n, out) == BS_SNIFF_NO)
    return bs_fail(err, EINVAL, 0, NULL,
                   "not a PyTorch checkpoint: no zip, pickle or tar header at the start");
  return 0;
}
