#include "pickle_fixture.h"

#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/source.h"

static struct bs_pickle *P;
static struct bs_src SRC;
static uint8_t *BUF;

void pickle_fixture_teardown(void)
{
  bs_pickle_free(P);
  bs_src_destroy(&SRC);
  bs_free(BUF);
  P = NULL;
  BUF = NULL;
}

struct bs_pickle *pickle_fixture_unpickler(void)
{
  return P;
}

static int load(const void *bytes, size_t len, const struct bs_pickle_opts *o, struct bs_pv **out,
                bs_err *err)
{
  bs_err_clear(err);
  if (!P)
    P = bs_pickle_new();
  cr_assert_not_null(P);
  bs_src_destroy(&SRC);
  bs_free(BUF);
  BUF = bs_malloc(len ? len : 1);
  cr_assert_not_null(BUF);
  memcpy(BUF, bytes, len);
  cr_assert_eq(bs_src_init_mem(&SRC, BUF, len, "t.pkl", err), 0);
  return bs_pickle_load(P, &SRC, 0, len, o, out, NULL, err);
}

int pickle_load_opts(const void *bytes, size_t len, bool strict, uint64_t base, struct bs_pv **out,
                     bs_err *err)
{
  struct bs_pickle_opts o = {.strict = strict, .base_off = base};
  return load(bytes, len, &o, out, err);
}

int pickle_load_input(const void *bytes, size_t len, uint64_t input, struct bs_pv **out,
                      bs_err *err)
{
  struct bs_pickle_opts o = {.input = input};
  return load(bytes, len, &o, out, err);
}
