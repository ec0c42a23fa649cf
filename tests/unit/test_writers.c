/* The writers table: choosing a writer by extension, the rows' invariants,
 * the conversion check, and the atomic write through a row. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "formats/burnpack_write.h"
#include "formats/writers.h"

static struct bs_tensor *add(struct bs_catalog *cat, const char *key, enum bs_dtype dt,
                             uint64_t dim0, uint64_t off)
{
  bs_err err;
  bs_err_clear(&err);
  struct bs_tensor *t = bs_catalog_add(cat, key, dt, 1, &dim0, off, &err);
  cr_assert_not_null(t, "%s", err.msg);
  t->src = 0;
  t->off = off;
  return t;
}

Test(writers, chosen_by_the_extension_of_the_base_name)
{
  const struct bs_writer *bpk = bs_writer_for_format(BS_FMT_BURNPACK);
  cr_assert_not_null(bpk);
  cr_assert_str_eq(bpk->name, "burnpack");
  cr_assert_eq(bs_writer_for_path("m.bpk"), bpk);
  cr_assert_eq(bs_writer_for_path("/a/b.c/model.v2.bpk"), bpk);
  cr_assert_eq(bs_writer_for_path("MODEL.BPK"), bpk, "case does not matter");
  const struct bs_writer *pth = bs_writer_for_format(BS_FMT_PYTORCH);
  cr_assert_not_null(pth);
  cr_assert_str_eq(pth->name, "pytorch");
  cr_assert_eq(bs_writer_for_path("m.pth"), pth);
  cr_assert_eq(bs_writer_for_path("m.PT"), pth);
  cr_assert_eq(bs_writer_for_path("pytorch_model.bin"), pth);
  cr_assert_null(bs_writer_for_path("m.ckpt"));
  const struct bs_writer *st = bs_writer_for_format(BS_FMT_SAFETENSORS);
  cr_assert_not_null(st);
  cr_assert_eq(bs_writer_for_path("x.safetensors"), st);
  cr_assert_eq(bs_writer_for_path("/d/Model.SafeTensors"), st);
  cr_assert_eq(bs_writer_for_path("x.safetensors.index.json"),
               bs_writer_for_format(BS_FMT_ST_SHARDED));
  cr_assert_null(bs_writer_for_path("x.index.json"));
  cr_assert_null(bs_writer_for_path("model"), "no extension: no format");
  cr_assert_null(bs_writer_for_path("dir.bpk/model"));
  cr_assert_null(bs_writer_for_path(".bpk"), "a hidden name, not an extension");
  cr_assert_null(bs_writer_for_path("/x/.bpk"));
  cr_assert_null(bs_writer_for_path("m.bpk.gz"));
  cr_assert_null(bs_writer_for_path("m.bpkx"));
  cr_assert_null(bs_writer_for_path(""));
}

Test(writers, formats_without_a_writer_have_none)
{
  cr_assert_null(bs_writer_for_format(BS_FMT_NONE));
}

Test(writers, path_extension_is_from_the_last_dot_of_the_base_name)
{
  cr_assert_str_eq(bs_path_extension("m.pth"), ".pth");
  cr_assert_str_eq(bs_path_extension("/a/x.tar.gz"), ".gz");
  cr_assert_str_eq(bs_path_extension("/a.b/model"), "");
  cr_assert_str_eq(bs_path_extension(".hidden"), "");
  cr_assert_str_eq(bs_path_extension("model."), ".");
}

Test(writers, list_names_every_extension)
{
  char buf[256];
  cr_assert_str_eq(
      bs_writer_list(buf, sizeof buf),
      ".bpk (burnpack), .safetensors (safetensors), .safetensors.index.json (safetensors-sharded), "
      ".gguf (gguf), .pth (pytorch), .pt (pytorch), .bin (pytorch)");
  char tiny[6];
  bs_writer_list(tiny, sizeof tiny);
  cr_assert_lt(strlen(tiny), sizeof tiny);
}

/* What every row must be, so that a new row cannot be half filled in. */
Test(writers, every_row_is_complete_and_reachable)
{
  cr_assert_geq(bs_nwriters, 1);
  for (size_t i = 0; i < bs_nwriters; i++) {
    const struct bs_writer *w = &bs_writers[i];
    cr_assert_not_null(w->name);
    cr_assert_str_eq(bs_format_name(w->format), w->name, "row %zu", i);
    cr_assert_not_null(w->can_write);
    cr_assert_not_null(w->name_ok, "%s: every row says which names it holds", w->name);
    cr_assert_not_null(w->write);
    cr_assert_eq(bs_writer_for_format(w->format), w, "one row per format");
    cr_assert_not_null(w->extensions[0], "%s has no extension", w->name);
    for (const char *const *e = w->extensions; *e; e++) {
      cr_assert_eq((*e)[0], '.', "%s", *e);
      for (const char *c = *e; *c; c++)
        cr_assert(!isupper((unsigned char)*c), "%s: extensions are lower case", *e);
      char path[64];
      snprintf(path, sizeof path, "/d/name%s", *e);
      cr_assert_eq(bs_writer_for_path(path), w, "%s", path);
    }
  }
}

Test(writers, check_refuses_a_dtype_the_format_cannot_store_naming_the_tensor)
{
  uint8_t mem[64] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  add(&cat, "ok", BS_DT_F32, 2, 0);
  add(&cat, "z", BS_DT_C64, 1, 8);
  const struct bs_writer *w = bs_writer_for_format(BS_FMT_BURNPACK);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_check(w, &cat, &err), -1);
  cr_assert_eq(err.code, ENOTSUP);
  cr_assert_str_eq(err.key, "z");
  cr_assert(strstr(err.msg, "cannot be written as burnpack"), "%s", err.msg);
  cr_assert(strstr(err.msg, "no dtype for C64"), "%s", err.msg);
  cr_assert(strstr(err.msg, "exclude="), "%s", err.msg);
  /* What the mount hides is not written, so it is not checked. */
  cat.tensors[1].hidden = true;
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_check(w, &cat, &err), 0, "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(writers, check_refuses_unreadable_tensors_and_qfloat_without_scheme)
{
  uint8_t mem[64] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  struct bs_tensor *t = add(&cat, "u", BS_DT_F32, 2, 0);
  cr_assert_not_null(bs_tensor_x(&cat, t));
  t->x->unsupported = bs_strdup("storage class FooStorage is not supported");
  const struct bs_writer *w = bs_writer_for_format(BS_FMT_BURNPACK);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_check(w, &cat, &err), -1);
  cr_assert_str_eq(err.key, "u");
  cr_assert(strstr(err.msg, "FooStorage"), "%s", err.msg);
  bs_catalog_destroy(&cat);

  bs_test_mem_catalog(&cat, mem, sizeof mem);
  uint64_t d = 4;
  bs_err_clear(&err);
  t = bs_catalog_add(&cat, "q", BS_DT_QFLOAT, 1, &d, 0, &err);
  cr_assert_not_null(t);
  t->nbytes = 4;
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_check(w, &cat, &err), -1);
  cr_assert_str_eq(err.key, "q");
  cr_assert(strstr(err.msg, "quantization scheme"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(writers, write_file_through_the_row_equals_the_memory_serialization)
{
  uint8_t mem[16];
  for (int i = 0; i < 16; i++)
    mem[i] = (uint8_t)i;
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  add(&cat, "a.w", BS_DT_F32, 2, 0);
  add(&cat, "b", BS_DT_U8, 8, 8);
  bs_err err;
  bs_err_clear(&err);
  const struct bs_writer *w = bs_writer_for_path("x.bpk");
  cr_assert_eq(w->default_meta(&cat, &err), 0);
  struct bs_buf want;
  cr_assert_eq(bs_bpk_write_mem(&cat, NULL, &want, &err), 0, "%s", err.msg);
  char *dir = bs_test_tmpdir("writers");
  char path[4200];
  snprintf(path, sizeof path, "%s/x.bpk", dir);
  cr_assert_eq(bs_writer_write_file(w, &cat, path, &err), 0, "%s", err.msg);
  size_t len;
  uint8_t *got = bs_test_slurp(path, &len);
  cr_assert_eq(len, want.len);
  cr_assert_arr_eq(got, want.data, len);
  bs_free(got);
  bs_buf_destroy(&want);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}

Test(writers, a_new_target_gets_the_mode_of_the_options)
{
  uint8_t mem[16] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  add(&cat, "a", BS_DT_F32, 2, 0);
  bs_err err;
  bs_err_clear(&err);
  char *dir = bs_test_tmpdir("writers");
  mode_t old = umask(022);
  for (size_t i = 0; i < bs_nwriters; i++) {
    const struct bs_writer *w = &bs_writers[i];
    char path[4200];
    snprintf(path, sizeof path, "%s/x%s", dir, w->extensions[0]);
    struct bs_write_opts o = {.has_mode = true, .mode = 0640};
    cr_assert_eq(bs_writer_write_file_opts(w, &cat, path, &o, &err), 0, "%s: %s", w->name, err.msg);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    cr_expect_eq(st.st_mode & 07777, 0640, "%s: %o", w->name, st.st_mode & 07777);
    /* Without a mode: 0644 & ~umask, as before. */
    snprintf(path, sizeof path, "%s/y%s", dir, w->extensions[0]);
    cr_assert_eq(bs_writer_write_file_opts(w, &cat, path, NULL, &err), 0, "%s: %s", w->name,
                 err.msg);
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    cr_expect_eq(st.st_mode & 07777, 0644, "%s: %o", w->name, st.st_mode & 07777);
  }
  umask(old);
  /* Every file of a new shard set too. */
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] != 'x' && e->d_name[0] != 'y')
      continue;
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    cr_assert_eq(stat(p, &st), 0, "%s", p);
    cr_expect_eq(st.st_mode & 07777, e->d_name[0] == 'x' ? 0640u : 0644u, "%s: %o", e->d_name,
                 st.st_mode & 07777);
    n++;
  }
  closedir(d);
  cr_expect_gt(n, (int)(2 * bs_nwriters), "a shard set wrote more than one file each: %d", n);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}

Test(writers, failed_write_keeps_the_old_file_and_names_it)
{
  uint8_t mem[4] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  add(&cat, "short", BS_DT_F32, 4, 0); /* 16 bytes from a 4-byte source */
  char *dir = bs_test_tmpdir("writersfail");
  char path[4200];
  snprintf(path, sizeof path, "%s/x.bpk", dir);
  FILE *f = fopen(path, "w");
  fputs("old", f);
  fclose(f);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_write_file(bs_writer_for_path(path), &cat, path, &err), -1);
  cr_assert_str_eq(err.key, "short");
  cr_assert(strstr(err.msg, path), "%s", err.msg);
  size_t len;
  uint8_t *got = bs_test_slurp(path, &len);
  cr_assert_eq(len, 3);
  cr_assert_arr_eq(got, "old", 3);
  bs_free(got);
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -c burnstore-tmp", dir);
  FILE *p = popen(cmd, "r");
  int n = -1;
  cr_assert_eq(fscanf(p, "%d", &n), 1);
  pclose(p);
  cr_assert_eq(n, 0, "no temp file left");
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}

Test(writers, metadata_the_reader_would_refuse_is_never_written)
{
  /* A value that is not UTF-8 (Burnpack's CBOR text, SafeTensors' JSON
   * strings): refused by the row's check (the setxattr edge) and by the
   * write itself, which leaves the old file; a NUL is refused by every row. */
  static const char *const exts[] = {".bpk", ".safetensors", ".safetensors.index.json", ".gguf"};
  uint8_t mem[8] = {0};
  char *dir = bs_test_tmpdir("writersmeta");
  for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/x%s", dir, exts[i]);
    const struct bs_writer *w = bs_writer_for_path(path);
    cr_assert_not_null(w);
    bs_err err;
    bs_err_clear(&err);
    cr_expect_eq(bs_writer_check_meta(w, NULL, "k", "a\0b", 3, &err), -1, "%s", w->name);
    cr_expect_eq(err.code, EINVAL);
    cr_expect(strstr(err.msg, "NUL byte at 1") && strstr(err.msg, "'k'"), "%s", err.msg);
    bs_err_clear(&err);
    cr_expect_eq(bs_writer_check_meta(w, NULL, "k", "caf\xc3\xa9", 5, &err), 0, "%s", err.msg);
    if (w->format == BS_FMT_GGUF)
      continue; /* its values' rules need the source's types: test_gguf.c */
    cr_expect_eq(bs_writer_check_meta(w, NULL, "k", "caf\xe9", 4, &err), -1, "%s", w->name);
    cr_expect_eq(err.code, EINVAL);
    cr_expect_not_null(strstr(err.msg, "not UTF-8 (byte 3)"), "%s", err.msg);
    bs_err_clear(&err);
    cr_expect_eq(bs_writer_check_meta(w, NULL, "\xff", "v", 1, &err), -1, "%s", w->name);
    cr_expect_not_null(strstr(err.msg, "key"), "%s", err.msg);

    struct bs_catalog cat;
    bs_test_mem_catalog(&cat, mem, sizeof mem);
    add(&cat, "a", BS_DT_F32, 2, 0);
    cr_assert_eq(bs_catalog_add_meta(&cat, "note", "caf\xe9", &err), 0);
    bs_err_clear(&err);
    cr_expect_eq(bs_writer_write_file(w, &cat, path, &err), -1, "%s", w->name);
    cr_expect_eq(err.code, EINVAL);
    cr_expect(strstr(err.msg, path) && strstr(err.msg, "'note'"), "%s", err.msg);
    cr_expect_eq(access(path, F_OK), -1, "nothing written");
    bs_catalog_destroy(&cat);
  }
  bs_test_rmrf(dir);
  free(dir);
}

/* Names every reader of each format takes back, and those it refuses. */
Test(writers, name_ok_follows_each_formats_readers)
{
  static const char *const every[] = {
      "a.b", "caf\xc3\xa9", "\xf0\x9f\x98\x80", "tab\there", "new\nline", "\x01\x7f", "50%"};
  static const char *const none[] = {
      "caf\xe9",          /* Latin-1 */
      "\xc0\xaf",         /* overlong '/' */
      "\xed\xa0\x80",     /* a surrogate */
      "\xf4\x90\x80\x80", /* past U+10FFFF */
      "cut\xe2\x82",      /* a sequence cut short */
  };
  for (size_t i = 0; i < bs_nwriters; i++) {
    const struct bs_writer *w = &bs_writers[i];
    bs_err err;
    for (size_t k = 0; k < sizeof every / sizeof *every; k++) {
      bs_err_clear(&err);
      cr_expect_eq(w->name_ok(every[k], &err), 0, "%s: %s", w->name, err.msg);
    }
    for (size_t k = 0; k < sizeof none / sizeof *none; k++) {
      bs_err_clear(&err);
      cr_expect_eq(w->name_ok(none[k], &err), -1, "%s takes name %zu", w->name, k);
      cr_expect_eq(err.code, EINVAL);
      cr_expect(strstr(err.msg, "not valid UTF-8"), "%s", err.msg);
    }
  }
  bs_err err;
  bs_err_clear(&err);
  cr_expect_eq(bs_writer_for_format(BS_FMT_BURNPACK)->name_ok("caf\xe9", &err), -1);
  cr_expect_str_eq(err.key, "caf\\xe9", "the key is shown, its bad bytes escaped");
  cr_expect(strstr(err.msg, "byte 3 is 0xe9"), "%s", err.msg);
  cr_expect(strstr(err.msg, "CBOR text"), "%s", err.msg);

  const struct bs_writer *st = bs_writer_for_format(BS_FMT_SAFETENSORS);
  const struct bs_writer *gg = bs_writer_for_format(BS_FMT_GGUF);
  bs_err_clear(&err);
  cr_expect_eq(st->name_ok("__metadata__", &err), -1);
  cr_expect(strstr(err.msg, "reserves"), "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(bs_writer_for_format(BS_FMT_ST_SHARDED)->name_ok("__metadata__", &err), -1);
  bs_err_clear(&err);
  cr_expect_eq(st->name_ok("", &err), 0, "JSON holds an empty key");
  bs_err_clear(&err);
  cr_expect_eq(gg->name_ok("", &err), -1, "our GGUF reader refuses empty names");
  char n63[64], n64[65], big[5000];
  memset(n63, 'n', 63), n63[63] = '\0';
  memset(n64, 'n', 64), n64[64] = '\0';
  memset(big, 'b', 4097), big[4097] = '\0';
  bs_err_clear(&err);
  cr_expect_eq(gg->name_ok(n63, &err), 0, "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(gg->name_ok(n64, &err), -1, "ggml's GGML_MAX_NAME counts the NUL");
  cr_expect(strstr(err.msg, "64 bytes, over the limit of 63"), "%s", err.msg);
  bs_err_clear(&err);
  cr_expect_eq(st->name_ok(big, &err), -1, "over what our SafeTensors reader takes");
  big[4096] = '\0';
  bs_err_clear(&err);
  cr_expect_eq(st->name_ok(big, &err), 0, "%s", err.msg);
}

Test(writers, check_and_write_refuse_a_name_the_format_cannot_hold)
{
  uint8_t mem[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  add(&cat, "good", BS_DT_U8, 4, 0);
  add(&cat, "caf\xe9", BS_DT_U8, 4, 4);
  char *dir = bs_test_tmpdir("writersname");
  for (size_t i = 0; i < bs_nwriters; i++) {
    const struct bs_writer *w = &bs_writers[i];
    if (w->format == BS_FMT_GGUF) /* no U8 in ggml: its name rule has its own test */
      continue;
    bs_err err;
    bs_err_clear(&err);
    cr_expect_eq(bs_writer_check(w, &cat, &err), -1, "%s", w->name);
    cr_expect_str_eq(err.key, "caf\\xe9");
    cr_expect(strstr(err.msg, "not valid UTF-8"), "%s", err.msg);
    /* The last guard, for a caller that did not check: the old file stays. */
    char path[4200];
    snprintf(path, sizeof path, "%s/x%s", dir, w->extensions[0]);
    FILE *f = fopen(path, "w");
    fputs("old", f);
    fclose(f);
    bs_err_clear(&err);
    cr_expect_eq(bs_writer_write_file(w, &cat, path, &err), -1, "%s", w->name);
    cr_expect(strstr(err.msg, path), "%s", err.msg);
    cr_expect(strstr(err.msg, "not valid UTF-8"), "%s", err.msg);
    size_t len;
    uint8_t *got = bs_test_slurp(path, &len);
    cr_expect_eq(len, 3, "%s: the target is untouched", w->name);
    bs_free(got);
  }
  /* Hidden tensors are not written, so their names do not matter. */
  cat.tensors[1].hidden = true;
  bs_err err;
  bs_err_clear(&err);
  cr_expect_eq(bs_writer_check(bs_writer_for_format(BS_FMT_SAFETENSORS), &cat, &err), 0, "%s",
               err.msg);
  bs_test_rmrf(dir);
  free(dir);
  bs_catalog_destroy(&cat);
}

Test(writers, recovery_is_the_rows_column)
{
  for (size_t i = 0; i < bs_nwriters; i++) {
    const struct bs_writer *w = &bs_writers[i];
    bool st = w->format == BS_FMT_SAFETENSORS || w->format == BS_FMT_ST_SHARDED;
    cr_assert_eq(w->recover != NULL, st, "%s: only SafeTensors writes sets a kill can interrupt",
                 w->name);
  }
  cr_assert_eq(bs_writer_for_format(BS_FMT_SAFETENSORS)->recover,
               bs_writer_for_format(BS_FMT_ST_SHARDED)->recover, "the same journal");
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_recover("/nonexistent/d/m.bpk", &err), 0, "a row without: nothing to do");
  cr_assert_eq(bs_writer_recover("/nonexistent/d/m.ckpt", &err), 0, "no row: nothing to do");
}
