#include <errno.h>
#include <string.h>

#include "burnstore/checked.h"
#include "burnstore/formats.h"

static const uint8_t legacy_magic[15] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                         0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};

int bs_sniff(const struct bs_src *src, enum bs_kind *kind, bs_err *err)
{
  uint8_t head[16] = {0};
  *kind = BS_KIND_UNKNOWN;
  size_t n = src->size < sizeof head ? (size_t)src->size : sizeof head;
  if (n && bs_src_read(src, 0, head, n, err) != 0)
    return -1;
  if (n >= 4 && memcmp(head, "NRUB", 4) == 0) {
    *kind = BS_KIND_BURNPACK;
    return 0;
  }
  if (n >= 4 && memcmp(head, "PK\x03\x04", 4) == 0) {
    *kind = BS_KIND_PT_ZIP;
    return 0;
  }
  if (n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5) {
    /* A pickle stream: the legacy torch format starts with a pickled magic
     * number. The exact 15 bytes are protocol 2; other protocols are checked
     * by the PyTorch reader itself. */
    if (n >= 15 && memcmp(head, legacy_magic, 15) != 0 && head[1] == 2)
      return bs_fail(err, EINVAL, 0, NULL,
                     "a pickle stream, but not a PyTorch checkpoint (no legacy magic number)");
    *kind = BS_KIND_PT_LEGACY;
    return 0;
  }
  if (src->size >= 262) {
    uint8_t ustar[5];
    if (bs_src_read(src, 257, ustar, 5, err) != 0)
      return -1;
    if (memcmp(ustar, "ustar", 5) == 0) {
      *kind = BS_KIND_PT_TAR;
      return 0;
    }
  }
  if (n >= 9) {
    /* SafeTensors: u64 LE header length, then a JSON object (whitespace may
     * come before the '{'). */
    uint64_t hlen = bs_le64(head);
    size_t i = 8;
    while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r'))
      i++;
    if (hlen >= 2 && i < n && head[i] == '{') {
      *kind = BS_KIND_SAFETENSORS;
      return 0;
    }
    if (hlen >= 2 && hlen < (1ull << 40) && i == n) {
      *kind = BS_KIND_SAFETENSORS;
      return 0;
    }
  }
  if (src->size < 4)
    return bs_fail(err, EINVAL, 0, NULL,
                   "not a checkpoint: the file is only %llu bytes (Burnpack, SafeTensors and "
                   "PyTorch files are longer)",
                   (unsigned long long)src->size);
  return bs_fail(err, EINVAL, 0, NULL,
                 "unknown format: first bytes %02x %02x %02x %02x match no Burnpack ('NRUB'), "
                 "SafeTensors, PyTorch zip ('PK') or legacy pickle header",
                 head[0], head[1], head[2], head[3]);
}

int bs_open_any(struct bs_catalog *cat, struct bs_src *src, const struct bs_open_opts *opts,
                bs_err *err)
{
  static const struct bs_open_opts defaults = {0};
  if (!opts)
    opts = &defaults;
  enum bs_kind kind;
  if (bs_sniff(src, &kind, err) != 0) {
    bs_src_destroy(src);
    return -1;
  }
  uint32_t idx;
  if (bs_catalog_add_src(cat, src, &idx, err) != 0)
    return -1;
  int rc;
  switch (kind) {
  case BS_KIND_BURNPACK:
    cat->format = BS_FMT_BURNPACK;
    rc = bs_bpk_read(cat, idx, err);
    break;
  case BS_KIND_SAFETENSORS:
    cat->format = BS_FMT_SAFETENSORS;
    rc = bs_st_read(cat, idx, err);
    break;
  default:
    cat->format = BS_FMT_PYTORCH;
    rc = bs_pth_read(cat, idx, kind, opts, err);
    break;
  }
  if (rc != 0) {
    bs_catalog_destroy(cat);
    bs_catalog_init(cat);
  }
  return rc;
}
