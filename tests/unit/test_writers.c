/* The writers table: choosing a writer by extension, the rows' invariants,
 * the conversion check, and the atomic write through a row. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bs_test.h"
#include "burnstore/writers.h"
#include "core/alloc.h"
#include "formats/bpk_write.h"

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
  t->unsupported = bs_strdup("storage class FooStorage is not supported");
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
