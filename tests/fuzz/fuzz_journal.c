/* The staging journal's replay (--finish of a staging directory whose
 * daemon was killed while mounted reads it): any bytes are refused with a
 * message or give a state whose claims hold: every live file has a key
 * that is its tree name's, a file's origin is a tensor of the BASE, the
 * torn tail lies inside the input, damage is named inside it with the
 * records dropped after it listed, and destroy frees everything. */
#include "fuzz_common.h"

#include "policy/journal_replay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size > 65536)
    return 0;
  struct bs_jreplay r;
  bs_err err = {0};
  if (bs_journal_replay(data, size, &r, &err) != 0) {
    FUZZ_CHECK(err.code != 0 && err.msg[0]);
    bs_jreplay_destroy(&r);
    return 0;
  }
  FUZZ_CHECK(r.torn <= size);
  FUZZ_CHECK(!r.damaged || (r.torn == 0 && r.damage_off < size && r.damage_rec >= 2 &&
                            (r.damage_next == BS_JREPLAY_NONE || r.damage_next > r.damage_off)));
  struct bs_buf dropped = {0};
  FUZZ_CHECK(bs_jreplay_dropped(data, size, &r, "DIR", &dropped) == 0);
  FUZZ_CHECK(r.damaged == (dropped.len > 0));
  bs_buf_destroy(&dropped);
  FUZZ_CHECK(r.base.target && r.base.target[0] == '/');
  FUZZ_CHECK(r.nfiles + BS_TREE_ROOT + 1 == r.tree.n);
  for (size_t i = 0; i < r.nfiles; i++) {
    uint64_t ino = BS_TREE_ROOT + 1 + i;
    const struct bs_entry *e = bs_tree_user(&r.tree, ino);
    FUZZ_CHECK(e && !e->is_dir);
    FUZZ_CHECK(e->tensor < 0 || (size_t)e->tensor < r.base.cat.count);
    FUZZ_CHECK(e->tensor < 0 || !r.base.cat.tensors[e->tensor].hidden);
    char *key = bs_tree_key(&r.tree, ino, true);
    FUZZ_CHECK(key && key[0]);
    bs_free(key);
    struct bs_eff eff;
    bs_entry_effective(&r.ed, e, &eff);
    FUZZ_CHECK(eff.rank <= BS_MAX_RANK);
  }
  bs_jreplay_destroy(&r);
  return 0;
}
