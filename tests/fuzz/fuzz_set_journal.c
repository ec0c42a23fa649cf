/* The shard set's commit journal (what recovery reads beside an index): any
 * bytes are refused cleanly or give a plan that stays inside its directory:
 * plain names only, old files shard names, every rename from a burnstore temp
 * name to a new file, a commit only after "prepared", nothing after a failure. */
#include "fuzz_common.h"

#include "core/set_journal.h"

static bool plain(const char *n)
{
  return n && n[0] && !strchr(n, '/') && strcmp(n, ".") != 0 && strcmp(n, "..") != 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size > 65536)
    return 0;
  struct bs_set_plan p;
  bs_err err = {0};
  if (bs_set_plan_parse("fuzz", ".safetensors", data, size, &p, &err) != 0) {
    FUZZ_CHECK(err.code != 0 && err.msg[0]);
    FUZZ_CHECK(p.copy == NULL && p.nnew == 0 && p.nold == 0 && p.nren == 0);
    bs_set_plan_destroy(&p);
    return 0;
  }
  FUZZ_CHECK(!p.committed || p.prepared);
  FUZZ_CHECK(!p.prepared || plain(p.index));
  for (size_t i = 0; i < p.nnew; i++)
    FUZZ_CHECK(plain(p.newf[i]));
  for (size_t i = 0; i < p.nold; i++)
    FUZZ_CHECK(plain(p.oldf[i]) && bs_set_is_member(p.oldf[i], ".safetensors"));
  for (size_t i = 0; i < p.nren; i++) {
    FUZZ_CHECK(plain(p.ren[i].tmp) && p.ren[i].tmp[0] == '.' &&
               strstr(p.ren[i].tmp, ".burnstore-tmp-"));
    bool known = false;
    for (size_t k = 0; k < p.nnew && !known; k++)
      known = strcmp(p.newf[k], p.ren[i].final) == 0;
    FUZZ_CHECK(known);
  }
  bs_set_plan_destroy(&p);
  return 0;
}
