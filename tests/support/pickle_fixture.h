/* The unpickler on in-memory opcode streams, for the pickle and torch_pickle
 * unit tests: one unpickler and one buffer per test, freed by the suite's
 * .fini = pickle_fixture_teardown. */
#ifndef BS_PICKLE_FIXTURE_H
#define BS_PICKLE_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "formats/pickle.h"

void pickle_fixture_teardown(void);
/* The unpickler of the last load (its notes, for instance). */
struct bs_pickle *pickle_fixture_unpickler(void);
/* Unpickle `len` bytes; the value stays valid until the teardown. */
int pickle_load_opts(const void *bytes, size_t len, bool strict, uint64_t base, struct bs_pv **out,
                     bs_err *err);
/* As if the stream came from a file of `input` bytes (an inflated zip member's). */
int pickle_load_input(const void *bytes, size_t len, uint64_t input, struct bs_pv **out,
                      bs_err *err);
static inline int pickle_load(const void *bytes, size_t len, struct bs_pv **out, bs_err *err)
{
  return pickle_load_opts(bytes, len, false, 0, out, err);
}

#define LOAD_OK(arr, out)                                                                          \
  do {                                                                                             \
    bs_err e_;                                                                                     \
    int rc_ = pickle_load(arr, sizeof(arr) - 1, out, &e_);                                         \
    cr_assert_eq(rc_, 0, "load failed: %s", e_.msg);                                               \
  } while (0)

#endif
