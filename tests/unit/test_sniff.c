/* The format registry and detection (src/formats/registry.c, pth_sniff.c),
 * on in-memory buffers. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpk_fixture.h"
#include "bs_test.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"
#include "st_fixture.h"

static const char tensor_json[] = "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";

/* A valid SafeTensors file with one F32[2] tensor "w" and a header of
 * exactly hlen bytes (padded with spaces). With ustar, the header's
 * metadata holds "ustar" at file byte 257, where a tar header has it. */
static uint8_t *st_sized(size_t hlen, bool ustar, size_t *len)
{
  char *h = bs_malloc(hlen + 1);
  cr_assert_not_null(h);
  int n;
  if (ustar) {
    const size_t at = 257 - 8; /* header byte of file byte 257 */
    n = snprintf(h, hlen + 1, "{\"__metadata__\":{\"p\":\"");
    cr_assert_lt((size_t)n, at);
    memset(h + n, 'x', at - (size_t)n);
    n = (int)at;
    n += snprintf(h + n, hlen + 1 - (size_t)n, "ustar\"},%s}", tensor_json);
  } else {
    n = snprintf(h, hlen + 1, "{%s}", tensor_json);
  }
  cr_assert_leq((size_t)n, hlen, "header of %d bytes does not fit in %zu", n, hlen);
  memset(h + n, ' ', hlen - (size_t)n);
  h[hlen] = '\0';
  uint8_t *buf = st_build_raw(hlen, h, hlen, 8, len);
  bs_free(h);
  return buf;
}

static int sniff_mem(const void *buf, size_t len, const char *name, enum bs_format *fmt,
                     bs_err *err)
{
  struct bs_src src;
  bs_err_clear(err);
  cr_assert_eq(bs_src_init_mem(&src, buf, len, name, err), 0);
  int rc = bs_sniff(&src, fmt, err);
  bs_src_destroy(&src);
  return rc;
}

static enum bs_format must_sniff(const void *buf, size_t len)
{
  enum bs_format fmt;
  bs_err err;
  cr_assert_eq(sniff_mem(buf, len, "test", &fmt, &err), 0, "%s", err.msg);
  return fmt;
}

static int open_mem(struct bs_catalog *cat, const void *buf, size_t len, const char *name,
                    bs_err *err)
{
  struct bs_src src;
  bs_catalog_init(cat);
  bs_err_clear(err);
  cr_assert_eq(bs_src_init_mem(&src, buf, len, name, err), 0);
  return bs_open_any(cat, &src, NULL, err);
}

/* Open a st_sized() file through the registry and check its one tensor. */
static void expect_st_opens(const uint8_t *buf, size_t len)
{
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, buf, len, "test.safetensors", &err), 0, "%s", err.msg);
  cr_expect_eq(cat.format, BS_FMT_SAFETENSORS);
  cr_assert_eq(cat.count, 1);
  cr_expect_str_eq(cat.tensors[0].key, "w");
  uint8_t got[8];
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, got, 8), 8);
  for (size_t i = 0; i < 8; i++)
    cr_expect_eq(got[i], st_data_byte(i));
  bs_catalog_destroy(&cat);
}

static void expect_unknown(const void *buf, size_t len, const char *name, const char *sub)
{
  enum bs_format fmt;
  bs_err err;
  cr_assert_eq(sniff_mem(buf, len, name, &fmt, &err), -1, "sniffed as %s", bs_format_name(fmt));
  cr_expect_eq(err.code, EINVAL);
  cr_expect_eq(err.off, 0);
  cr_expect_not_null(strstr(err.msg, sub), "message '%s' lacks '%s'", err.msg, sub);
  cr_expect_lt(strlen(err.msg), sizeof err.msg - 1, "message truncated: '%s'", err.msg);
}

/* ---- SafeTensors files that look like something else (issue 9) ----------- */

Test(sniff, header_lengths_that_start_like_a_pickle_are_safetensors)
{
  static const size_t lens[] = {640, 896, 1152, 1408};
  for (size_t i = 0; i < 4; i++) {
    size_t len;
    uint8_t *buf = st_sized(lens[i], false, &len);
    cr_assert_eq(buf[0], 0x80);
    cr_assert_eq(buf[1], 2 + i, "header length %zu starts 80 %02x", lens[i], buf[1]);
    cr_expect_eq(must_sniff(buf, len), BS_FMT_SAFETENSORS, "header length %zu", lens[i]);
    expect_st_opens(buf, len);
    bs_free(buf);
  }
}

Test(sniff, ustar_at_byte_257_inside_the_json_is_safetensors)
{
  size_t len;
  uint8_t *buf = st_sized(400, true, &len);
  cr_assert_eq(memcmp(buf + 257, "ustar", 5), 0);
  cr_expect_eq(must_sniff(buf, len), BS_FMT_SAFETENSORS);
  expect_st_opens(buf, len);
  bs_free(buf);
  /* Both at once: 80 02 at the start and ustar at 257. */
  buf = st_sized(640, true, &len);
  cr_assert(buf[0] == 0x80 && buf[1] == 2 && memcmp(buf + 257, "ustar", 5) == 0);
  cr_expect_eq(must_sniff(buf, len), BS_FMT_SAFETENSORS);
  expect_st_opens(buf, len);
  bs_free(buf);
}

Test(sniff, every_header_length_up_to_4k_is_safetensors)
{
  for (size_t hlen = sizeof tensor_json + 1; hlen <= 4096; hlen++) {
    size_t len;
    uint8_t *buf = st_sized(hlen, hlen >= 320, &len);
    enum bs_format fmt;
    bs_err err;
    cr_assert_eq(sniff_mem(buf, len, "t", &fmt, &err), 0, "header length %zu: %s", hlen, err.msg);
    cr_assert_eq(fmt, BS_FMT_SAFETENSORS, "header length %zu: %s", hlen, bs_format_name(fmt));
    bs_free(buf);
  }
}

Test(sniff, whitespace_before_the_brace_is_safetensors)
{
  const char *h = "  \n\t{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  size_t len;
  uint8_t *buf = st_build(h, 1, &len);
  cr_expect_eq(must_sniff(buf, len), BS_FMT_SAFETENSORS);
  bs_free(buf);
}

Test(sniff, truncated_safetensors_header_reaches_the_reader)
{
  size_t len;
  uint8_t *buf = st_sized(100, false, &len);
  len = 60; /* the header runs past the end */
  cr_expect_eq(must_sniff(buf, len), BS_FMT_SAFETENSORS);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, buf, len, "t.safetensors", &err), -1);
  cr_expect_not_null(strstr(err.msg, "runs past the end of the file"), "%s", err.msg);
  cr_expect_eq(cat.count, 0);
  bs_free(buf);
}

Test(sniff, detection_ignores_the_file_name)
{
  size_t len;
  uint8_t *buf = st_sized(200, false, &len);
  enum bs_format fmt;
  bs_err err;
  cr_assert_eq(sniff_mem(buf, len, "model.bpk", &fmt, &err), 0, "%s", err.msg);
  cr_expect_eq(fmt, BS_FMT_SAFETENSORS);
  cr_assert_eq(sniff_mem(buf, len, "model.pth", &fmt, &err), 0, "%s", err.msg);
  cr_expect_eq(fmt, BS_FMT_SAFETENSORS);
  bs_free(buf);
}

/* ---- The other formats ---------------------------------------------------- */

Test(sniff, burnpack_magic)
{
  uint8_t b[32] = "NRUB\x01\x00";
  cr_expect_eq(must_sniff(b, sizeof b), BS_FMT_BURNPACK);
  /* The magic byte-swapped goes to the Burnpack reader, which explains it. */
  memcpy(b, "BURN", 4);
  cr_expect_eq(must_sniff(b, sizeof b), BS_FMT_BURNPACK);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, b, sizeof b, "b.bpk", &err), -1);
  cr_expect_not_null(strstr(err.msg, "bad magic"), "%s", err.msg);
}

static void expect_pth(const void *buf, size_t len, enum bs_pth_container want)
{
  cr_expect_eq(must_sniff(buf, len), BS_FMT_PYTORCH);
  struct bs_src src;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_src_init_mem(&src, buf, len, "t", &err), 0);
  enum bs_pth_container c;
  cr_assert_eq(bs_pth_container(&src, &c, &err), 0, "%s", err.msg);
  cr_expect_eq(c, want);
  bs_src_destroy(&src);
}

Test(sniff, pytorch_zip_legacy_and_tar)
{
  uint8_t zip[64] = "PK\x03\x04\x14\x00";
  expect_pth(zip, sizeof zip, BS_PTH_ZIP);

  uint8_t p2[32] = {0x80, 0x02, 0x8a, 0x0a};
  memcpy(p2 + 4, bs_pth_legacy_magic, 10);
  p2[14] = '.';
  expect_pth(p2, sizeof p2, BS_PTH_LEGACY);
  uint8_t p4[40] = {0x80, 0x04, 0x95, 13, 0, 0, 0, 0, 0, 0, 0, 0x8a, 0x0a};
  memcpy(p4 + 13, bs_pth_legacy_magic, 10);
  p4[23] = '.';
  expect_pth(p4, sizeof p4, BS_PTH_LEGACY);

  uint8_t tar[1024] = "archive/pickle";
  memcpy(tar + 100, "0000644\0", 8);
  memcpy(tar + 257,
         "ustar\0"
         "00",
         8);
  unsigned sum = 0;
  for (size_t i = 0; i < 512; i++)
    sum += i >= 148 && i < 156 ? ' ' : tar[i];
  snprintf((char *)tar + 148, 8, "%06o", sum);
  tar[155] = ' ';
  expect_pth(tar, sizeof tar, BS_PTH_TAR);
  /* A wrong checksum is only a MAYBE, but still the PyTorch reader's to judge. */
  tar[150] ^= 1;
  expect_pth(tar, sizeof tar, BS_PTH_TAR);
}

Test(sniff, pickle_without_torch_magic_is_refused_by_the_pytorch_reader)
{
  const uint8_t p[] = {0x80, 0x03, 0x4b, 0x01, 0x2e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  cr_expect_eq(must_sniff(p, sizeof p), BS_FMT_PYTORCH);
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, p, sizeof p, "x.pt", &err), -1);
  cr_expect_not_null(strstr(err.msg, "not a PyTorch checkpoint"), "%s", err.msg);
}

/* ---- Unknown formats say what they look like ------------------------------ */

Test(sniff, unknown_formats_are_named)
{
  const uint8_t gz[] = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0xff, 1, 2, 3, 4, 5, 6};
  expect_unknown(gz, sizeof gz, "model.mpk.gz", "gzip");
  expect_unknown(gz, sizeof gz, "model.mpk.gz", "NamedMpkGzFileRecorder");
  const uint8_t mpk[] = "\x83\xa8metadata\x85\xa5"
                        "float\xa3"
                        "f32";
  expect_unknown(mpk, sizeof mpk - 1, "anything", "MessagePack");
  expect_unknown(mpk, sizeof mpk - 1, "anything", "NamedMpkFileRecorder");
  /* Only the name says .mpk: a hint in the message, nothing more. */
  const uint8_t junk[] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x11, 0x22};
  expect_unknown(junk, sizeof junk, "/tmp/model.mpk", "NamedMpkFileRecorder");
  expect_unknown(junk, sizeof junk, "/tmp/model.mpk", "12 34 56 78");
  expect_unknown(junk, sizeof junk, "/tmp/w.dat", "unknown format: first bytes 12 34");
  expect_unknown("PK\x05\x06\0\0\0\0\0\0", 10, "m.zip", "empty zip");
  expect_unknown("hello world, not a checkpoint\n", 30, "t.txt", "unknown format");
  const char *json = "{\n  \"metadata\": {\n    \"float\": \"f32\"";
  expect_unknown(json, strlen(json), "m.json", "PrettyJsonFileRecorder");
  expect_unknown("  {\"a\": 1}", 10, "m", "JSON text (a SafeTensors file starts with");
  expect_unknown("", 0, "e.bin", "only 0 bytes");
  const uint8_t zero8[8] = {0};
  expect_unknown(zero8, 8, "dup.safetensors", "header");
  expect_unknown(zero8, 8, "dup.safetensors", "the name says safetensors");
}

/* ---- The table ------------------------------------------------------------ */

Test(sniff, every_format_has_a_complete_row)
{
  cr_expect_null(bs_format_desc(BS_FMT_NONE));
  cr_expect_null(bs_format_desc(BS_FMT_COUNT));
  cr_expect_str_eq(bs_format_name(BS_FMT_NONE), "none");
  cr_expect_str_eq(bs_format_name(BS_FMT_COUNT), "?");
  for (int f = BS_FMT_NONE + 1; f < BS_FMT_COUNT; f++) {
    const struct bs_format_desc *d = bs_format_desc((enum bs_format)f);
    cr_assert_not_null(d, "format %d has no row", f);
    cr_expect_not_null(d->name);
    cr_expect_not_null(d->sniff, "%s", d->name);
    cr_expect_not_null(d->read, "%s", d->name);
    cr_expect_not_null(d->exts[0], "%s has no file name ending", d->name);
    cr_expect_str_eq(bs_format_name((enum bs_format)f), d->name);
    for (int g = BS_FMT_NONE + 1; g < f; g++)
      cr_expect_str_neq(bs_format_name((enum bs_format)g), d->name);
    for (int i = 0; i < BS_FORMAT_MAX_EXTS && d->exts[i]; i++) {
      char path[64];
      snprintf(path, sizeof path, "dir.x/model%s", d->exts[i]);
      cr_expect_eq(bs_format_by_ext(path), f, "%s", path);
    }
  }
  cr_expect_str_eq(bs_format_name(BS_FMT_BURNPACK), "burnpack");
  cr_expect_str_eq(bs_format_name(BS_FMT_SAFETENSORS), "safetensors");
  cr_expect_str_eq(bs_format_name(BS_FMT_PYTORCH), "pytorch");
  cr_expect_eq(bs_format_by_ext("/a/Model.PTH"), BS_FMT_PYTORCH);
  cr_expect_eq(bs_format_by_ext("m.gguf"), BS_FMT_GGUF);
  cr_expect_str_eq(bs_format_name(BS_FMT_GGUF), "gguf");
  cr_expect_eq(bs_format_by_ext("m.npy"), BS_FMT_NONE);
  cr_expect_eq(bs_format_by_ext("bpk"), BS_FMT_NONE);
}

/* ---- jansson's allocator: set at first use, not by a constructor ---------- */

Test(sniff, jansson_allocator_is_untouched_until_a_reader_runs)
{
  json_malloc_t m;
  json_free_t f;
  json_get_alloc_funcs(&m, &f);
  cr_expect(m == malloc && f == free, "jansson's allocator changed before any reader ran");
  bs_formats_init();
  json_get_alloc_funcs(&m, &f);
  cr_expect(m != malloc, "bs_formats_init did not route jansson through bs_malloc");
}

Test(sniff, out_of_memory_loop_through_bs_open_any)
{
  const char *h = "{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[4,20]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1}}";
  /* (The unknown field "x" sends the header to jansson: its allocations
   * are the ones counted below.) */
  size_t len;
  uint8_t *buf = st_build(h, 20, &len);
  long n = 0;
  for (;; n++) {
    struct bs_catalog cat;
    bs_err err;
    bs_catalog_init(&cat);
    bs_err_clear(&err);
    struct bs_src src;
    cr_assert_eq(bs_src_init_mem(&src, buf, len, "oom.safetensors", &err), 0);
    bs_alloc_fail_after(n);
    int rc = bs_open_any(&cat, &src, NULL, &err);
    bs_alloc_fail_after(-1);
    if (rc == 0) {
      cr_expect_eq(cat.count, 2);
      bs_catalog_destroy(&cat);
      break;
    }
    cr_expect_eq(err.code, ENOMEM, "allocation %ld: code %d: %s", n, err.code, err.msg);
    cr_expect_eq(cat.count, 0);
    cr_expect_eq(cat.nsrcs, 0);
    bs_catalog_destroy(&cat);
    cr_assert_lt(n, 10000, "never succeeds");
  }
  cr_expect_gt(n, 30, "only %ld allocations: is jansson routed through bs_malloc?", n);
  cr_expect_gt(bs_json_alloc_failures(), 0, "no jansson allocation ever failed");
  bs_free(buf);
}

/* bs_format_describe's details, collected as "key=value;" into a 256-byte
 * buffer. */
static void collect(void *ctx, const char *key, const char *value)
{
  char *out = ctx;
  size_t n = strlen(out);
  snprintf(out + n, 256 - n, "%s=%s;", key, value);
}

static void expect_details(const void *buf, size_t len, const char *name, const char *want)
{
  struct bs_catalog cat;
  bs_err err;
  cr_assert_eq(open_mem(&cat, buf, len, name, &err), 0, "%s: %s", name, err.msg);
  char got[256] = "";
  bs_format_describe(&cat, collect, got);
  cr_expect_str_eq(got, want, "%s", name);
  bs_catalog_destroy(&cat);
}

static void expect_file_details(const char *rel, const char *want)
{
  char path[512];
  snprintf(path, sizeof path, "%s/%s", BS_FIXTURES_DIR, rel);
  size_t len;
  uint8_t *buf = bs_test_slurp(path, &len);
  cr_assert_not_null(buf, "%s", path);
  expect_details(buf, len, rel, want);
  bs_free(buf);
}

Test(sniff, describe_gives_each_formats_own_details)
{
  struct bpk_fixture f;
  bpk_fixture_build(BPK_FIX_NONE, &f);
  expect_details(f.data, f.len, "t.bpk", "version=1;");
  f.data[4] = 0; /* version 0: Burn reads it too */
  expect_details(f.data, f.len, "t.bpk", "version=0;");
  bpk_fixture_free(&f);

  expect_file_details("complex_nested.pt", "version=zip (torch >= 1.6);");
  expect_file_details("burn/burn-store/src/pytorch/tests/reader/test_data/simple_legacy.pt",
                      "version=legacy pickle (torch < 1.6);");
  expect_file_details("burn/burn-store/src/pytorch/tests/reader/test_data/tar_float32.tar",
                      "version=tar (torch < 0.4);");

  size_t len;
  uint8_t *st = st_sized(64, false, &len);
  expect_details(st, len, "t.safetensors", ""); /* nothing beyond the common fields */
  bs_free(st);

  struct bs_catalog none; /* not read from a file */
  bs_catalog_init(&none);
  char got[256] = "";
  bs_format_describe(&none, collect, got);
  cr_expect_str_eq(got, "");
  bs_catalog_destroy(&none);
}
