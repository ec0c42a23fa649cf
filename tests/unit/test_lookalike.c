/* Naming what an unreadable file looks like (gzip, Burn's .mpk, ...). */
#include <criterion/criterion.h>
#include <string.h>

#include "bs_test.h"
#include "burnstore/lookalike.h"

#define LIKE(bytes, path) bs_sniff_lookalike((const uint8_t *)(bytes), sizeof(bytes) - 1, path)

Test(lookalike, gzip_named_mpk_gz_is_burns_old_recorder)
{
  const char *s = LIKE("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", "/m/model.mpk.gz");
  cr_assert_not_null(s);
  cr_assert(strstr(s, "1f 8b") && strstr(s, ".mpk.gz") && strstr(s, "BurnpackStore"), "%s", s);
  cr_assert_null(strchr(s, '\n'), "one line");
}

Test(lookalike, gzip_by_magic_whatever_the_name)
{
  const char *s = LIKE("\x1f\x8b\x08\x00", "weights.bin");
  cr_assert_not_null(s);
  cr_assert(strstr(s, "gzip") && strstr(s, "1f 8b"), "%s", s);
  cr_assert_null(strstr(s, "mpk"), "%s", s);
  cr_assert_not_null(LIKE("\x1f\x8b", NULL));
}

Test(lookalike, messagepack_named_mpk_is_burns_old_recorder)
{
  const char *s = LIKE("\x82\xa8metadata\x84\xa6", "model.MPK");
  cr_assert_not_null(s);
  cr_assert(strstr(s, "NamedMpkFileRecorder"), "%s", s);
  cr_assert_not_null(LIKE("\xde\x00\x02", "m.mpk"));
  /* Not by name alone, and never a head a reader claims. */
  cr_assert_null(LIKE("\x82\xa8metadata", "model.bin"));
  cr_assert_null(LIKE("\x80\x02\x8a\x0a", "model.mpk"), "a pickle's start");
  cr_assert_null(LIKE("NRUB\x01\x00", "model.mpk"));
}

Test(lookalike, other_known_formats)
{
  cr_assert(strstr(LIKE("\x28\xb5\x2f\xfd\x00", "m"), "zstd"));
  cr_assert(strstr(LIKE("\xfd"
                        "7zXZ\0\0",
                        "m"),
                   "xz"));
  cr_assert(strstr(LIKE("BZh91AY", "m"), "bzip2"));
  cr_assert(strstr(LIKE("GGUF\x03\x00\x00\x00", "m.gguf"), "GGUF"));
  cr_assert(strstr(LIKE("\x89HDF\r\n\x1a\n\x00", "m.h5"), "HDF5"));
  cr_assert(strstr(LIKE("\x93NUMPY\x01\x00", "a.npy"), "NumPy"));
}

Test(lookalike, unknown_or_readable_heads_are_not_named)
{
  cr_assert_null(bs_sniff_lookalike(NULL, 0, "x.mpk"));
  cr_assert_null(LIKE("", "x.mpk.gz"));
  cr_assert_null(LIKE("hello world", "notes.txt"));
  cr_assert_null(LIKE("PK\x03\x04", "m.pth"));
  cr_assert_null(LIKE("\x1f", "m.gz"), "one byte is not a gzip magic");
}

/* The contract: only heads that no reader accepts are named, so the
 * explanation never replaces a reader's own error. */
Test(lookalike, every_recognised_head_is_refused_by_the_readers)
{
  static const struct {
    const char *head;
    size_t n;
    const char *path;
  } cases[] = {
      {"\x1f\x8b\x08\x00", 4, "a.mpk.gz"},
      {"\x82\xa8metadata", 10, "a.mpk"},
      {"\xde\x00\x02\xa8", 4, "a.mpk"},
      {"\x28\xb5\x2f\xfd", 4, "a"},
      {"\xfd"
       "7zXZ\0",
       6, "a"},
      {"BZh9", 4, "a"},
      {"GGUF\x03\0\0\0", 8, "a"},
      {"\x89HDF\r\n\x1a\n", 8, "a"},
      {"\x93NUMPY\x01\x00", 8, "a"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t buf[512] = {0};
    memcpy(buf, cases[i].head, cases[i].n);
    cr_assert_not_null(bs_sniff_lookalike(buf, sizeof buf, cases[i].path), "case %zu", i);
    struct bs_catalog cat;
    bs_err err;
    bs_err_clear(&err);
    cr_assert_neq(bs_test_open_mem(&cat, buf, sizeof buf, &err), 0, "case %zu was read", i);
    bs_catalog_destroy(&cat);
  }
}
