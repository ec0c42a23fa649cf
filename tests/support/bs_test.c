#include "bs_test.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "burnstore/formats.h"
#include "core/alloc.h"

uint8_t *bs_test_slurp(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = bs_malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

char *bs_test_tmpdir(const char *tag)
{
  const char *base = getenv("TMPDIR");
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/bs-%s-XXXXXX", base && *base ? base : "/tmp", tag);
  char *d = mkdtemp(tmpl);
  cr_assert_not_null(d, "mkdtemp failed");
  return strdup(d);
}

void bs_test_rmrf(const char *path)
{
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", path);
}

int bs_test_open_mem(struct bs_catalog *cat, const void *buf, size_t len, bs_err *err)
{
  struct bs_src src;
  bs_catalog_init(cat);
  if (bs_src_init_mem(&src, buf, len, "test.bin", err) != 0)
    return -1;
  return bs_open_any(cat, &src, NULL, err);
}
