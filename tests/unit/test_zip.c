/* The zip reader on in-memory archives: stored and deflated members, zip64,
 * and hostile directories (every field a lie in turn). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/zip.h"

struct member {
  const char *name;
  const void *data;
  size_t len;
  bool deflate;
};

static uint8_t *raw_deflate(const void *data, size_t n, size_t *outlen)
{
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  cr_assert_eq(deflateInit2(&zs, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY), Z_OK);
  size_t cap = deflateBound(&zs, (uLong)n) + 16;
  uint8_t *out = malloc(cap);
  zs.next_in = (Bytef *)data;
  zs.avail_in = (uInt)n;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
  *outlen = cap - zs.avail_out;
  deflateEnd(&zs);
  return out;
}

/* An archive of the members; with zip64, sizes and offsets are 0xFFFFFFFF in
 * the central directory with a zip64 extra, and a zip64 end record. Returns a
 * malloc'd buffer; *cdoff gets the central directory's offset. */
static uint8_t *build(const struct member *m, size_t n, bool zip64, size_t *outlen, size_t *cdoff)
{
  size_t cap = 4096;
  for (size_t i = 0; i < n; i++)
    cap += 2 * (strlen(m[i].name) + 80) + m[i].len + 64;
  uint8_t *b = calloc(1, cap), *p = b;
  uint64_t *lho = calloc(n, sizeof *lho);
  size_t *clen = calloc(n, sizeof *clen);
  for (size_t i = 0; i < n; i++) {
    size_t nl = strlen(m[i].name), bl = m[i].len;
    uint8_t *body = m[i].deflate ? raw_deflate(m[i].data, m[i].len, &bl) : NULL;
    clen[i] = bl;
    lho[i] = (uint64_t)(p - b);
    bs_put_le32(p, 0x04034b50);
    bs_put_le16(p + 8, m[i].deflate ? 8 : 0);
    bs_put_le32(p + 14, (uint32_t)crc32(0, m[i].data, (uInt)m[i].len));
    bs_put_le32(p + 18, (uint32_t)bl);
    bs_put_le32(p + 22, (uint32_t)m[i].len);
    bs_put_le16(p + 26, (uint16_t)nl);
    bs_put_le16(p + 28, 7); /* an extra field only the local header has (torch pads so) */
    memcpy(p + 30, m[i].name, nl);
    memcpy(p + 30 + nl + 7, body ? body : m[i].data, bl);
    p += 30 + nl + 7 + bl;
    free(body);
  }
  uint8_t *cd = p;
  for (size_t i = 0; i < n; i++) {
    size_t nl = strlen(m[i].name);
    bs_put_le32(p, 0x02014b50);
    bs_put_le16(p + 10, m[i].deflate ? 8 : 0);
    bs_put_le32(p + 16, (uint32_t)crc32(0, m[i].data, (uInt)m[i].len));
    bs_put_le16(p + 28, (uint16_t)nl);
    memcpy(p + 46, m[i].name, nl);
    if (zip64) {
      bs_put_le32(p + 20, 0xFFFFFFFFu);
      bs_put_le32(p + 24, 0xFFFFFFFFu);
      bs_put_le32(p + 42, 0xFFFFFFFFu);
      bs_put_le16(p + 30, 28);
      uint8_t *x = p + 46 + nl;
      bs_put_le16(x, 1);
      bs_put_le16(x + 2, 24);
      bs_put_le64(x + 4, m[i].len);
      bs_put_le64(x + 12, clen[i]);
      bs_put_le64(x + 20, lho[i]);
      p += 46 + nl + 28;
    } else {
      bs_put_le32(p + 20, (uint32_t)clen[i]);
      bs_put_le32(p + 24, (uint32_t)m[i].len);
      bs_put_le32(p + 42, (uint32_t)lho[i]);
      p += 46 + nl;
    }
  }
  uint64_t cdsize = (uint64_t)(p - cd);
  *cdoff = (size_t)(cd - b);
  if (zip64) {
    uint64_t z = (uint64_t)(p - b);
    bs_put_le32(p, 0x06064b50);
    bs_put_le64(p + 4, 44);
    bs_put_le64(p + 24, n);
    bs_put_le64(p + 32, n);
    bs_put_le64(p + 40, cdsize);
    bs_put_le64(p + 48, *cdoff);
    p += 56;
    bs_put_le32(p, 0x07064b50);
    bs_put_le64(p + 8, z);
    bs_put_le32(p + 16, 1);
    p += 20;
  }
  bs_put_le32(p, 0x06054b50);
  bs_put_le16(p + 8, zip64 ? 0xFFFF : (uint16_t)n);
  bs_put_le16(p + 10, zip64 ? 0xFFFF : (uint16_t)n);
  bs_put_le32(p + 12, zip64 ? 0xFFFFFFFFu : (uint32_t)cdsize);
  bs_put_le32(p + 16, zip64 ? 0xFFFFFFFFu : (uint32_t)*cdoff);
  p += 22;
  free(lho);
  free(clen);
  *outlen = (size_t)(p - b);
  return b;
}

static int open_buf(struct bs_zip *z, struct bs_src *s, const uint8_t *b, size_t len, bs_err *e)
{
  bs_err_clear(e);
  cr_assert_eq(bs_src_init_mem(s, b, len, "mem.zip", e), 0);
  return bs_zip_open(z, s, e);
}

static const char TEXT[] = "hello, hello, hello, hello, zip";

static void check_members(bool zip64)
{
  uint8_t big[100000];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (uint8_t)(i * 7 / 1000);
  struct member m[] = {{"a/data.pkl", TEXT, sizeof TEXT - 1, false},
                       {"a/data/0", big, sizeof big, true},
                       {"a/empty", "", 0, false}};
  size_t len, cdoff;
  uint8_t *b = build(m, 3, zip64, &len, &cdoff);
  struct bs_zip z;
  struct bs_src s;
  bs_err e;
  cr_assert_eq(open_buf(&z, &s, b, len, &e), 0, "%s", e.msg);
  cr_assert_eq(z.n, 3);
  const struct bs_zip_entry *t = bs_zip_find(&z, "a/data.pkl");
  cr_assert_not_null(t);
  cr_assert_eq(t->method, BS_ZIP_STORED);
  cr_assert_eq(t->usize, sizeof TEXT - 1);
  uint64_t off;
  cr_assert_eq(bs_zip_data_off(&s, t, &off, &e), 0, "%s", e.msg);
  cr_assert_eq(memcmp(b + off, TEXT, sizeof TEXT - 1), 0, "stored data is read in place");
  const struct bs_zip_entry *d = bs_zip_find(&z, "a/data/0");
  cr_assert_eq(d->method, BS_ZIP_DEFLATED);
  cr_assert_eq(d->usize, sizeof big);
  cr_assert_lt(d->csize, sizeof big);
  uint8_t *out;
  cr_assert_eq(bs_zip_extract_mem(&s, d, sizeof big, &out, &e), 0, "%s", e.msg);
  cr_assert_eq(memcmp(out, big, sizeof big), 0);
  bs_free(out);
  cr_assert_eq(bs_zip_extract_mem(&s, t, 64, &out, &e), 0, "%s", e.msg);
  cr_assert_str_eq((char *)out, TEXT);
  bs_free(out);
  cr_assert_eq(bs_zip_extract_mem(&s, bs_zip_find(&z, "a/empty"), 0, &out, &e), 0, "%s", e.msg);
  bs_free(out);
  cr_assert_null(bs_zip_find(&z, "a/data"));
  cr_assert_eq(bs_zip_extract_mem(&s, d, 100, &out, &e), -1);
  cr_assert_eq(e.code, EFBIG);
  cr_assert(strstr(e.msg, "'a/data/0' is 100000 bytes, over the limit of 100"), "%s", e.msg);
  bs_zip_close(&z);
  bs_src_destroy(&s);
  free(b);
}

Test(zip, stored_and_deflated_members)
{
  check_members(false);
}

Test(zip, zip64_directory_and_extra_fields)
{
  check_members(true);
}

/* Build a one-member archive, let `mutate` lie in it, and expect an error. */
static void expect_refused(void (*mutate)(uint8_t *b, size_t len, size_t cdoff), int code,
                           const char *msg, bool at_open)
{
  static const uint8_t data[4000] = {0};
  struct member m[] = {{"x/y", data, sizeof data, true}};
  size_t len, cdoff;
  uint8_t *b = build(m, 1, false, &len, &cdoff);
  mutate(b, len, cdoff);
  struct bs_zip z;
  struct bs_src s;
  bs_err e;
  int rc = open_buf(&z, &s, b, len, &e);
  if (!at_open) {
    cr_assert_eq(rc, 0, "%s", e.msg);
    uint8_t *out = NULL;
    rc = bs_zip_extract_mem(&s, &z.ents[0], UINT64_MAX, &out, &e);
    bs_free(out);
  }
  cr_assert_eq(rc, -1);
  cr_assert_eq(e.code, code, "%d %s", e.code, e.msg);
  cr_assert(strstr(e.msg, msg), "'%s' not in '%s'", msg, e.msg);
  bs_zip_close(&z);
  bs_src_destroy(&s);
  free(b);
}

static void many_entries(uint8_t *b, size_t len, size_t cdoff)
{
  (void)cdoff;
  bs_put_le16(b + len - 22 + 10, 60000);
}
static void cd_past_end(uint8_t *b, size_t len, size_t cdoff)
{
  (void)cdoff;
  bs_put_le32(b + len - 22 + 16, 0xFFFFFF00u);
}
static void nul_in_name(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  b[cdoff + 46 + 1] = 0;
}
static void lho_outside(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  bs_put_le32(b + cdoff + 42, 0x7FFFFFF0u);
}
static void encrypted(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  bs_put_le16(b + cdoff + 8, 1);
}
static void extra_past_entry(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  bs_put_le16(b + cdoff + 30, 60000);
}
static void bomb_claim(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  bs_put_le32(b + cdoff + 24, 0xFFFFFF00u); /* 4 GiB from a few dozen bytes */
}
static void bigger_than_declared(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  bs_put_le32(b + cdoff + 24, 1000);
}
static void smaller_than_declared(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  bs_put_le32(b + cdoff + 24, 4001);
}
static void bad_crc(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  b[cdoff + 16] ^= 1;
}
static void bad_method(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  bs_put_le16(b + cdoff + 10, 12); /* bzip2 */
}
static void bad_local_sig(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  (void)cdoff;
  b[0] = 'Q';
}
static void corrupt_deflate(uint8_t *b, size_t len, size_t cdoff)
{
  (void)len;
  (void)cdoff;
  b[30 + 3 + 7] = 0xff; /* first byte of the deflate stream: a reserved block type */
}

Test(zip, hostile_directories_are_refused_with_a_message)
{
  expect_refused(many_entries, EINVAL, "60000 entries cannot fit", true);
  expect_refused(cd_past_end, EINVAL, "does not end before the end record", true);
  expect_refused(nul_in_name, EINVAL, "NUL byte", true);
  expect_refused(lho_outside, EINVAL, "is not before the central directory", true);
  expect_refused(encrypted, ENOTSUP, "is encrypted", true);
  expect_refused(extra_past_entry, EINVAL, "runs past the directory", true);
}

Test(zip, lying_members_are_refused_when_extracted)
{
  expect_refused(bomb_claim, EINVAL, "a ratio over deflate's limit of 1032:1", false);
  expect_refused(bigger_than_declared, EINVAL, "inflates to more than the 1000 bytes", false);
  expect_refused(smaller_than_declared, EINVAL, "ends early, after 4000 of 4001 bytes", false);
  expect_refused(bad_crc, EINVAL, "CRC mismatch", false);
  expect_refused(bad_method, ENOTSUP, "compression method 12", false);
  expect_refused(bad_local_sig, EINVAL, "bad local header signature for 'x/y'", false);
  expect_refused(corrupt_deflate, EINVAL, "corrupt deflate data", false);
}

Test(zip, duplicate_names_and_empty_archives_are_refused)
{
  struct member m[] = {{"a/b", "1", 1, false}, {"a/b", "2", 1, false}};
  size_t len, cdoff;
  uint8_t *b = build(m, 2, false, &len, &cdoff);
  struct bs_zip z;
  struct bs_src s;
  bs_err e;
  cr_assert_eq(open_buf(&z, &s, b, len, &e), -1);
  cr_assert(strstr(e.msg, "two entries are named 'a/b'"), "%s", e.msg);
  bs_src_destroy(&s);
  free(b);
  uint8_t empty[22] = {0x50, 0x4b, 0x05, 0x06};
  cr_assert_eq(open_buf(&z, &s, empty, sizeof empty, &e), -1);
  cr_assert(strstr(e.msg, "no entries"), "%s", e.msg);
  bs_src_destroy(&s);
  cr_assert_eq(open_buf(&z, &s, empty, 10, &e), -1);
  cr_assert(strstr(e.msg, "too short"), "%s", e.msg);
  bs_src_destroy(&s);
}

Test(zip, zip64_locator_outside_the_file_is_refused)
{
  struct member m[] = {{"a/b", "1", 1, false}};
  size_t len, cdoff;
  uint8_t *b = build(m, 1, true, &len, &cdoff);
  bs_put_le64(b + len - 22 - 20 + 8, 1ull << 40);
  struct bs_zip z;
  struct bs_src s;
  bs_err e;
  cr_assert_eq(open_buf(&z, &s, b, len, &e), -1);
  cr_assert(strstr(e.msg, "zip64 locator points outside the file"), "%s", e.msg);
  bs_src_destroy(&s);
  free(b);
}

/* Every truncation and many bit flips: an error or a success, never a crash
 * (ASan) or a read outside the buffer. */
Test(zip, truncations_and_bit_flips_never_crash)
{
  uint8_t big[3000];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (uint8_t)(i % 13);
  struct member m[] = {{"a/data.pkl", TEXT, sizeof TEXT - 1, false},
                       {"a/data/0", big, sizeof big, true}};
  for (int zip64 = 0; zip64 < 2; zip64++) {
    size_t len, cdoff;
    uint8_t *b = build(m, 2, zip64, &len, &cdoff);
    for (size_t cut = 0; cut <= len; cut++) {
      uint8_t *t = malloc(cut ? cut : 1);
      memcpy(t, b, cut);
      struct bs_zip z;
      struct bs_src s;
      bs_err e;
      if (open_buf(&z, &s, t, cut, &e) == 0) {
        for (size_t i = 0; i < z.n; i++) {
          uint8_t *out = NULL;
          if (bs_zip_extract_mem(&s, &z.ents[i], 1u << 20, &out, &e) == 0)
            cr_assert_eq(memcmp(out, i ? (const void *)big : (const void *)TEXT, z.ents[i].usize),
                         0);
          bs_free(out);
        }
        bs_zip_close(&z);
      }
      bs_src_destroy(&s);
      free(t);
    }
    srand(7);
    for (int round = 0; round < 3000; round++) {
      uint8_t *t = malloc(len);
      memcpy(t, b, len);
      for (int k = 0; k < 3; k++)
        t[(size_t)rand() % len] ^= (uint8_t)(1u << (rand() % 8));
      struct bs_zip z;
      struct bs_src s;
      bs_err e;
      if (open_buf(&z, &s, t, len, &e) == 0) {
        for (size_t i = 0; i < z.n; i++) {
          uint8_t *out = NULL;
          if (bs_zip_extract_mem(&s, &z.ents[i], 1u << 20, &out, &e) == 0)
            bs_free(out);
        }
        bs_zip_close(&z);
      }
      bs_src_destroy(&s);
      free(t);
    }
    free(b);
  }
}
