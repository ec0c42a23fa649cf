/* Recognise files that look like something burnstore does not read; see lookalike.h. */
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "burnstore/lookalike.h"

static bool ends_with(const char *path, const char *ext)
{
  if (!path)
    return false;
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t b = strlen(base), e = strlen(ext);
  return b > e && strcasecmp(base + b - e, ext) == 0;
}

static bool starts(const uint8_t *head, size_t n, const char *magic, size_t m)
{
  return n >= m && memcmp(head, magic, m) == 0;
}

#define RESAVE "load it in Burn and save it with BurnpackStore (.bpk)"

const char *bs_sniff_lookalike(const uint8_t *head, size_t n, const char *path)
{
  if (!head)
    n = 0;
  if (starts(head, n, "\x1f\x8b", 2)) {
    if (ends_with(path, ".mpk.gz") || ends_with(path, ".mpk"))
      return "unknown format: gzip-compressed (starts 1f 8b) like Burn's older recorder files "
             "(NamedMpkGzFileRecorder, .mpk.gz), which burnstore does not read: " RESAVE;
    return "unknown format: a gzip-compressed file (starts 1f 8b): decompress it first "
           "(gunzip -k) if it holds a checkpoint";
  }
  /* Burn's NamedMpkFileRecorder writes a MessagePack map (rmp-serde, named
   * fields). 0x80 0x02..0x05 is a pickle's start, which is not ours to claim. */
  bool msgpack_map =
      n >= 1 && ((head[0] >= 0x80 && head[0] <= 0x8f) || head[0] == 0xde || head[0] == 0xdf);
  if (msgpack_map && n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5)
    msgpack_map = false;
  if (msgpack_map && (ends_with(path, ".mpk") || ends_with(path, ".mpk.gz")))
    return "unknown format: MessagePack like Burn's older recorder files (NamedMpkFileRecorder, "
           ".mpk), which burnstore does not read: " RESAVE;
  if (starts(head, n, "\x28\xb5\x2f\xfd", 4))
    return "unknown format: a zstd-compressed file (starts 28 b5 2f fd): decompress it first "
           "(zstd -d) if it holds a checkpoint";
  if (starts(head, n,
             "\xfd"
             "7zXZ\0",
             6))
    return "unknown format: an xz-compressed file (starts fd 37 7a 58 5a 00): decompress it "
           "first (xz -dk) if it holds a checkpoint";
  if (starts(head, n, "BZh", 3))
    return "unknown format: a bzip2-compressed file (starts 'BZh'): decompress it first "
           "(bunzip2 -k) if it holds a checkpoint";
  if (starts(head, n, "GGUF", 4))
    return "unknown format: a GGUF file (llama.cpp, starts 'GGUF'), which burnstore does not "
           "read";
  if (starts(head, n, "\x89HDF\r\n\x1a\n", 8))
    return "unknown format: an HDF5 file (Keras .h5, starts 89 'HDF'), which burnstore does not "
           "read";
  if (starts(head, n, "\x93NUMPY", 6))
    return "unknown format: a NumPy .npy array (starts 93 'NUMPY'), which burnstore does not "
           "read";
  return NULL;
}
