/* The unpickler alone, on the whole input: every opcode sequence must end in
 * a value or an error, never a crash, a hang or a huge allocation. The
 * result is walked (bounded: memo GETs can make cycles). */
#include "fuzz_common.h"

#include "formats/pickle.h"

static size_t budget;

static void walk_seq(const struct bs_pv_seq *q, unsigned depth);

static void walk(const struct bs_pv *x, unsigned depth)
{
  if (!x || depth > 64 || budget == 0)
    return;
  budget--;
  FUZZ_CHECK(x->kind < BS_PV_COUNT);
  FUZZ_CHECK(bs_pv_kind_name(x->kind) != NULL);
  switch (x->kind) {
  case BS_PV_STR:
  case BS_PV_BYTES:
  case BS_PV_BIGINT: FUZZ_CHECK(x->u.str.s && x->u.str.s[x->u.str.len] == '\0'); break;
  case BS_PV_TUPLE:
  case BS_PV_LIST:
  case BS_PV_SET: walk_seq(&x->u.seq, depth + 1); break;
  case BS_PV_DICT:
    FUZZ_CHECK(x->u.dict.keys.n == x->u.dict.vals.n);
    walk_seq(&x->u.dict.keys, depth + 1);
    walk_seq(&x->u.dict.vals, depth + 1);
    break;
  case BS_PV_OBJECT:
    walk(x->u.obj.cls, depth + 1);
    walk(x->u.obj.args, depth + 1);
    walk(x->u.obj.state, depth + 1);
    if (x->u.obj.x) {
      walk_seq(&x->u.obj.x->items, depth + 1);
      walk_seq(&x->u.obj.x->dkeys, depth + 1);
      walk_seq(&x->u.obj.x->dvals, depth + 1);
    }
    break;
  case BS_PV_TENSOR:
    FUZZ_CHECK(x->u.tensor.rank <= BS_MAX_RANK);
    walk(x->u.tensor.storage, depth + 1);
    break;
  default: break;
  }
}

static void walk_seq(const struct bs_pv_seq *q, unsigned depth)
{
  FUZZ_CHECK(q->n <= q->cap);
  for (size_t i = 0; i < q->n; i++)
    walk(q->items[i], depth);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  struct bs_src src;
  bs_err err = {0};
  if (bs_src_init_mem(&src, data + 1, size - 1, "fuzz", &err) != 0)
    __builtin_trap();
  struct bs_pickle *p = bs_pickle_new();
  FUZZ_CHECK(p != NULL);
  struct bs_pickle_opts opts = {.strict = data[0] & 1, .base_off = 0};
  struct bs_pv *out = NULL;
  uint64_t stop_end = 0;
  if (bs_pickle_load(p, &src, 0, src.size, &opts, &out, &stop_end, &err) == 0) {
    FUZZ_CHECK(err.code == 0);
    FUZZ_CHECK(stop_end >= 1 && stop_end <= src.size);
    budget = 100000;
    walk(out, 0);
    /* A second stream into the same unpickler, as the legacy format does. */
    if (stop_end < src.size &&
        bs_pickle_load(p, &src, stop_end, src.size, &opts, &out, NULL, &err) == 0) {
      budget = 100000;
      walk(out, 0);
    }
  } else {
    FUZZ_CHECK(err.code != 0 && err.msg[0] != '\0');
  }
  for (size_t i = 0; i < bs_pickle_nnotes(p); i++)
    FUZZ_CHECK(bs_pickle_note(p, i) != NULL);
  bs_pickle_free(p);
  bs_src_destroy(&src);
  return 0;
}
