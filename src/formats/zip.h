/* A read-only zip/zip64 reader over a bs_src: the central directory gives
 * each member's name, method, sizes and local header; a member's data offset
 * comes from its local header, so STORED members are read in place from the
 * source (PyTorch's storages, numpy's .npz arrays) and DEFLATED ones are
 * inflated with zlib's raw inflate into a caller's sink.
 *
 * Layout (APPNOTE.TXT 4.3):
 *   local header: u32 sig 0x04034b50, u16 name_len at 26, u16 extra_len at 28,
 *     name, extra (torch pads data to 64 bytes with an extra field that exists
 *     only here), then the data.
 *   central entry: u32 sig 0x02014b50, u16 flags at 8, u16 method at 10,
 *     u32 crc at 16, u32 csize at 20, u32 usize at 24, u16 name_len at 28,
 *     u16 extra_len at 30, u16 comment_len at 32, u32 local header at 42,
 *     name at 46; a zip64 extra (id 1) holds the 64-bit usize, csize, local
 *     header offset, in that order, for those that are 0xFFFFFFFF.
 *   zip64 end record (sig 0x06064b50: u64 entries at 32, u64 cd size at 40,
 *     u64 cd offset at 48), its locator (sig 0x07064b50, u64 offset at 8),
 *   end record (sig 0x06054b50: u16 entries at 10, u32 cd size at 12, u32 cd
 *     offset at 16, u16 comment length at 20). */
#ifndef BURNSTORE_ZIP_H
#define BURNSTORE_ZIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/source.h"
#include "core/strmap.h"

#define BS_ZIP_STORED 0
#define BS_ZIP_DEFLATED 8
#define BS_ZIP_MAX_CD (256u << 20) /* bytes of central directory we read */
/* Deflate cannot expand a stream by more than about 1032:1; a member that
 * claims more is lying and is refused before anything is inflated. */
#define BS_ZIP_MAX_RATIO 1032u

struct bs_zip_entry {
  char *name; /* owned, NUL-free */
  uint16_t method, flags;
  uint32_t crc;
  uint64_t csize, usize; /* compressed and uncompressed sizes, as claimed */
  uint64_t lho;          /* absolute offset of the local header */
};

struct bs_zip {
  struct bs_zip_entry *ents; /* in central directory order */
  size_t n;
  struct bs_strmap names;
};

/* Parse the central directory of src (zip or zip64). Names are unique;
 * encrypted members are refused. On failure *z is empty. */
BS_NODISCARD int bs_zip_open(struct bs_zip *z, const struct bs_src *src, bs_err *err);
void bs_zip_close(struct bs_zip *z); /* safe on a zeroed or failed bs_zip */

const struct bs_zip_entry *bs_zip_find(const struct bs_zip *z, const char *name);

/* Absolute offset of the member's data (from its local header), checked so
 * that [off, off + csize) lies in the source. */
BS_NODISCARD int bs_zip_data_off(const struct bs_src *src, const struct bs_zip_entry *e,
                                 uint64_t *off, bs_err *err);

/* Receives the member's bytes in order; returns 0 or -1 with err set. */
typedef int (*bs_zip_sink)(void *ctx, const uint8_t *buf, size_t n, bs_err *err);

/* Decompress (or copy, when STORED) the member into sink, exactly usize
 * bytes: more or fewer bytes than claimed, a bad CRC, a ratio over
 * BS_ZIP_MAX_RATIO or another method is an error naming the member. Works
 * in bounded memory (a few hundred KiB). */
BS_NODISCARD int bs_zip_extract(const struct bs_src *src, const struct bs_zip_entry *e,
                                bs_zip_sink sink, void *ctx, bs_err *err);

/* Extract a small member into a new bs_malloc'd buffer of usize (+1, NUL
 * terminated) bytes; usize over max is EFBIG. */
BS_NODISCARD int bs_zip_extract_mem(const struct bs_src *src, const struct bs_zip_entry *e,
                                    uint64_t max, uint8_t **out, bs_err *err);

#endif
