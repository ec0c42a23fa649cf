/* The zip reader: see include/formats/zip.h for the layout. Every field is
 * a claim: offsets and sizes are checked against the source before anything
 * is read or allocated, and inflated output against the claimed size. */
#include "formats/zip.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/crc32.h"

#define EOCD_LEN 22u
#define CDH_LEN 46u
#define LFH_LEN 30u
#define CHUNK (128u << 10)

static int corrupt(bs_err *err, uint64_t off, const char *what)
{
  return bs_fail(err, EINVAL, off, NULL, "corrupt zip: %s", what);
}

void bs_zip_close(struct bs_zip *z)
{
  for (size_t i = 0; i < z->n; i++)
    bs_free(z->ents[i].name);
  bs_free(z->ents);
  bs_strmap_destroy(&z->names);
  memset(z, 0, sizeof *z);
}

/* Find the end record in the last 64 KiB + 22 bytes; then the zip64 one. */
static int find_directory(const struct bs_src *s, uint64_t *entries, uint64_t *cdoff,
                          uint64_t *cdsize, uint64_t *end, bs_err *err)
{
  uint64_t size = s->size;
  if (size < EOCD_LEN)
    return corrupt(err, 0, "the file is too short for an end-of-central-directory record");
  uint64_t tlen = size < EOCD_LEN + 65535 ? size : EOCD_LEN + 65535, tstart = size - tlen;
  uint8_t *tail;
  if (bs_src_read_alloc(s, tstart, tlen, &tail, err) != 0)
    return -1;
  uint64_t eocd = UINT64_MAX;
  for (uint64_t i = tlen - EOCD_LEN + 1; i-- > 0;) {
    if (bs_le32(tail + i) == 0x06054b50 && i + EOCD_LEN + bs_le16(tail + i + 20) <= tlen) {
      eocd = i;
      break;
    }
  }
  if (eocd == UINT64_MAX) {
    bs_free(tail);
    return corrupt(err, size, "no end-of-central-directory record (truncated file?)");
  }
  const uint8_t *e = tail + eocd;
  *entries = bs_le16(e + 10);
  *cdsize = bs_le32(e + 12);
  *cdoff = bs_le32(e + 16);
  *end = tstart + eocd;
  bs_free(tail);
  if (*end >= 20) {
    uint8_t loc[20];
    if (bs_src_read(s, *end - 20, loc, 20, err) != 0)
      return -1;
    if (bs_le32(loc) == 0x07064b50) {
      uint64_t zo = bs_le64(loc + 8);
      uint8_t z64[56];
      if (!bs_range_ok(zo, 56, *end - 20))
        return corrupt(err, *end - 20, "zip64 locator points outside the file");
      if (bs_src_read(s, zo, z64, 56, err) != 0)
        return -1;
      if (bs_le32(z64) != 0x06064b50)
        return corrupt(err, zo, "bad zip64 end-of-central-directory signature");
      *entries = bs_le64(z64 + 32);
      *cdsize = bs_le64(z64 + 40);
      *cdoff = bs_le64(z64 + 48);
      *end = zo;
    }
  }
  if (!bs_range_ok(*cdoff, *cdsize, *end))
    return bs_fail(err, EINVAL, *end, NULL,
                   "corrupt zip: central directory [%" PRIu64 ", +%" PRIu64
                   ") does not end before the end record at %" PRIu64,
                   *cdoff, *cdsize, *end);
  if (*cdsize > BS_ZIP_MAX_CD)
    return bs_fail(err, EFBIG, *cdoff, NULL,
                   "zip central directory of %" PRIu64 " bytes exceeds the limit of %u", *cdsize,
                   (unsigned)BS_ZIP_MAX_CD);
  if (*entries == 0)
    return corrupt(err, *end, "the archive has no entries");
  if (*entries > *cdsize / CDH_LEN)
    return bs_fail(err, EINVAL, *end, NULL,
                   "corrupt zip: %" PRIu64 " entries cannot fit in a %" PRIu64
                   "-byte central directory",
                   *entries, *cdsize);
  return 0;
}

/* The zip64 extra (id 1): 64-bit fields, present only for those that are 0xFFFFFFFF. */
static int zip64_extra(struct bs_zip_entry *z, const uint8_t *x, const uint8_t *xe, uint64_t at,
                       bs_err *err)
{
  while (xe - x >= 4) {
    uint16_t id = bs_le16(x), len = bs_le16(x + 2);
    if (len > xe - x - 4)
      return corrupt(err, at, "an extra field runs past its entry");
    if (id == 1) {
      const uint8_t *f = x + 4, *fe = f + len;
      uint64_t *fields[3] = {&z->usize, &z->csize, &z->lho};
      for (int k = 0; k < 3; k++) {
        if (*fields[k] != 0xFFFFFFFFu)
          continue;
        if (fe - f < 8)
          return corrupt(err, at, "zip64 extra field too short");
        *fields[k] = bs_le64(f);
        f += 8;
      }
    }
    x += 4 + len;
  }
  return 0;
}

int bs_zip_open(struct bs_zip *z, const struct bs_src *s, bs_err *err)
{
  memset(z, 0, sizeof *z);
  uint64_t entries = 0, cdoff = 0, cdsize = 0, end = 0;
  if (find_directory(s, &entries, &cdoff, &cdsize, &end, err) != 0)
    return -1;
  uint8_t *cd;
  if (bs_src_read_alloc(s, cdoff, cdsize, &cd, err) != 0)
    return -1;
  z->ents = bs_calloc((size_t)entries, sizeof *z->ents);
  if (!z->ents) {
    bs_free(cd);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  uint64_t p = 0;
  int rc = 0;
  for (uint64_t i = 0; i < entries && rc == 0; i++) {
    uint64_t at = cdoff + p;
    if (cdsize - p < CDH_LEN || bs_le32(cd + p) != 0x02014b50) {
      rc = corrupt(err, at, "bad central directory entry");
      break;
    }
    const uint8_t *h = cd + p;
    struct bs_zip_entry *e = &z->ents[i];
    e->flags = bs_le16(h + 8);
    e->method = bs_le16(h + 10);
    e->crc = bs_le32(h + 16);
    e->csize = bs_le32(h + 20);
    e->usize = bs_le32(h + 24);
    e->lho = bs_le32(h + 42);
    uint64_t nl = bs_le16(h + 28), xl = bs_le16(h + 30), cl = bs_le16(h + 32);
    if (cdsize - p - CDH_LEN < nl + xl + cl) {
      rc = corrupt(err, at, "central directory entry runs past the directory");
      break;
    }
    if (memchr(h + CDH_LEN, '\0', nl)) {
      rc = corrupt(err, at, "entry name contains a NUL byte");
      break;
    }
    if (!(e->name = bs_strndup((const char *)h + CDH_LEN, nl))) {
      rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      break;
    }
    z->n++;
    rc = zip64_extra(e, h + CDH_LEN + nl, h + CDH_LEN + nl + xl, at, err);
    if (rc == 0 && (e->flags & 1))
      rc = bs_fail(err, ENOTSUP, at, NULL, "zip entry '%.100s' is encrypted", e->name);
    if (rc == 0 && !bs_range_ok(e->lho, LFH_LEN, cdoff))
      rc = bs_fail(err, EINVAL, at, NULL,
                   "corrupt zip: local header of '%.100s' at %" PRIu64
                   " is not before the central directory",
                   e->name, e->lho);
    if (rc == 0) {
      int r = bs_strmap_put(&z->names, e->name, (size_t)i);
      if (r < 0)
        rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      else if (r > 0)
        rc = bs_fail(err, EINVAL, at, NULL, "corrupt zip: two entries are named '%.100s'", e->name);
    }
    p += CDH_LEN + nl + xl + cl;
  }
  bs_free(cd);
  if (rc != 0) {
    bs_zip_close(z);
    return -1;
  }
  return 0;
}

const struct bs_zip_entry *bs_zip_find(const struct bs_zip *z, const char *name)
{
  size_t idx;
  return bs_strmap_get(&z->names, name, &idx) ? &z->ents[idx] : NULL;
}

int bs_zip_data_off(const struct bs_src *s, const struct bs_zip_entry *e, uint64_t *out,
                    bs_err *err)
{
  uint8_t h[LFH_LEN];
  if (!bs_range_ok(e->lho, LFH_LEN, s->size))
    return bs_fail(err, EINVAL, e->lho, NULL,
                   "corrupt zip: local header of '%.100s' at %" PRIu64 " is outside the file",
                   e->name, e->lho);
  if (bs_src_read(s, e->lho, h, LFH_LEN, err) != 0)
    return -1;
  if (bs_le32(h) != 0x04034b50)
    return bs_fail(err, EINVAL, e->lho, NULL,
                   "corrupt zip: bad local header signature for '%.100s'", e->name);
  uint64_t d = e->lho + LFH_LEN + bs_le16(h + 26) + bs_le16(h + 28);
  if (!bs_range_ok(d, e->csize, s->size))
    return bs_fail(err, EINVAL, d, NULL,
                   "truncated zip: '%.100s' needs %" PRIu64 " bytes at %" PRIu64
                   " but the file has %" PRIu64,
                   e->name, e->csize, d, s->size);
  *out = d;
  return 0;
}

static int extract_stored(const struct bs_src *s, const struct bs_zip_entry *e, uint64_t d,
                          bs_zip_sink sink, void *ctx, uint8_t *in, bs_err *err)
{
  uint32_t crc = 0;
  for (uint64_t done = 0; done < e->usize;) {
    size_t n = e->usize - done < CHUNK ? (size_t)(e->usize - done) : CHUNK;
    if (bs_src_read(s, d + done, in, n, err) != 0 || sink(ctx, in, n, err) != 0)
      return -1;
    crc = bs_crc32(crc, in, n);
    done += n;
  }
  if ((uint32_t)crc != e->crc)
    return bs_fail(err, EINVAL, d, NULL, "zip member '%.100s': CRC mismatch (corrupt data)",
                   e->name);
  return 0;
}

static int extract_deflated(const struct bs_src *s, const struct bs_zip_entry *e, uint64_t d,
                            bs_zip_sink sink, void *ctx, uint8_t *in, uint8_t *out, bs_err *err)
{
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory (zlib)");
  uint32_t crc = 0;
  uint64_t consumed = 0, produced = 0;
  int rc = 0, zr = Z_OK;
  while (rc == 0 && zr != Z_STREAM_END) {
    if (zs.avail_in == 0) {
      if (consumed == e->csize) {
        rc = bs_fail(err, EINVAL, d, NULL,
                     "zip member '%.100s': the deflate stream ends early, after %" PRIu64
                     " of %" PRIu64 " bytes",
                     e->name, produced, e->usize);
        break;
      }
      size_t n = e->csize - consumed < CHUNK ? (size_t)(e->csize - consumed) : CHUNK;
      if (bs_src_read(s, d + consumed, in, n, err) != 0) {
        rc = -1;
        break;
      }
      zs.next_in = in;
      zs.avail_in = (uInt)n;
      consumed += n;
    }
    zs.next_out = out;
    zs.avail_out = CHUNK;
    zr = inflate(&zs, Z_NO_FLUSH);
    if (zr != Z_OK && zr != Z_STREAM_END) {
      rc = bs_fail(err, EINVAL, d, NULL,
                   "zip member '%.100s': corrupt deflate data after %" PRIu64 " bytes (%s)",
                   e->name, produced, zs.msg ? zs.msg : "zlib error");
      break;
    }
    size_t got = CHUNK - zs.avail_out;
    if (got > e->usize - produced) {
      rc = bs_fail(err, EINVAL, d, NULL,
                   "zip member '%.100s' inflates to more than the %" PRIu64
                   " bytes its directory entry declares",
                   e->name, e->usize);
      break;
    }
    if (got && sink(ctx, out, got, err) != 0) {
      rc = -1;
      break;
    }
    crc = bs_crc32(crc, out, got);
    produced += got;
  }
  inflateEnd(&zs);
  if (rc != 0)
    return -1;
  if (produced != e->usize)
    return bs_fail(err, EINVAL, d, NULL,
                   "zip member '%.100s': the deflate stream ends early, after %" PRIu64
                   " of %" PRIu64 " bytes",
                   e->name, produced, e->usize);
  if ((uint32_t)crc != e->crc)
    return bs_fail(err, EINVAL, d, NULL, "zip member '%.100s': CRC mismatch (corrupt data)",
                   e->name);
  return 0;
}

/* The method is one we read, and the sizes are possible for it. */
static int check_claims(const struct bs_zip_entry *e, bs_err *err)
{
  if (e->method != BS_ZIP_STORED && e->method != BS_ZIP_DEFLATED)
    return bs_fail(err, ENOTSUP, e->lho, NULL,
                   "zip member '%.100s' uses compression method %u (only stored and deflated "
                   "are supported)",
                   e->name, e->method);
  if (e->method == BS_ZIP_STORED && e->csize != e->usize)
    return bs_fail(err, EINVAL, e->lho, NULL,
                   "corrupt zip: stored member '%.100s' has compressed size %" PRIu64
                   " != size %" PRIu64,
                   e->name, e->csize, e->usize);
  uint64_t most;
  if (e->method == BS_ZIP_DEFLATED && (!bs_mul_u64(e->csize, BS_ZIP_MAX_RATIO, &most) ||
                                       !bs_add_u64(most, 64, &most) || e->usize > most))
    return bs_fail(err, EINVAL, e->lho, NULL,
                   "zip member '%.100s' claims %" PRIu64 " bytes from %" PRIu64
                   " compressed, a ratio over deflate's limit of %u:1",
                   e->name, e->usize, e->csize, (unsigned)BS_ZIP_MAX_RATIO);
  return 0;
}

int bs_zip_extract(const struct bs_src *s, const struct bs_zip_entry *e, bs_zip_sink sink,
                   void *ctx, bs_err *err)
{
  if (check_claims(e, err) != 0)
    return -1;
  uint64_t d;
  if (bs_zip_data_off(s, e, &d, err) != 0)
    return -1;
  uint8_t *buf = bs_malloc(2 * CHUNK);
  if (!buf)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  int rc = e->method == BS_ZIP_STORED ? extract_stored(s, e, d, sink, ctx, buf, err)
                                      : extract_deflated(s, e, d, sink, ctx, buf, buf + CHUNK, err);
  bs_free(buf);
  return rc;
}

struct membuf {
  uint8_t *p;
  size_t len;
};

static int mem_sink(void *ctx, const uint8_t *buf, size_t n, bs_err *err)
{
  (void)err;
  struct membuf *m = ctx;
  memcpy(m->p + m->len, buf, n); /* extract never passes more than usize in total */
  m->len += n;
  return 0;
}

int bs_zip_extract_mem(const struct bs_src *s, const struct bs_zip_entry *e, uint64_t max,
                       uint8_t **out, bs_err *err)
{
  *out = NULL;
  if (check_claims(e, err) != 0)
    return -1;
  if (e->usize > max)
    return bs_fail(err, EFBIG, e->lho, NULL,
                   "zip member '%.100s' is %" PRIu64 " bytes, over the limit of %" PRIu64, e->name,
                   e->usize, max);
  struct membuf m = {bs_malloc((size_t)e->usize + 1), 0};
  if (!m.p)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (bs_zip_extract(s, e, mem_sink, &m, err) != 0) {
    bs_free(m.p);
    return -1;
  }
  m.p[m.len] = 0;
  *out = m.p;
  return 0;
}
