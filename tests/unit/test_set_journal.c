/* The commit journal of multi-file outputs: a write through it, and the
 * recovery of journals as a kill leaves them (and as a hostile hand edits them). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/set_journal.h"
#include "core/sink.h"

#define SFX ".safetensors" /* the members of the sets these tests write */

#define JOURNAL ".m.safetensors.index.json.burnstore-journal"
#define TMP1 ".m-00001-of-00001.safetensors.burnstore-tmp-AbC123"
#define TMPI ".m.safetensors.index.json.burnstore-tmp-XyZ789"

static char *dir;

static void setup(void)
{
  dir = bs_test_tmpdir("setj");
}

static void teardown(void)
{
  bs_test_rmrf(dir);
  free(dir);
}

static char *at(const char *name)
{
  return bs_test_at(dir, name);
}

static void put(const char *name, const char *text)
{
  int fd = open(at(name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0, "%s: %s", name, strerror(errno));
  cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

static void expect(const char *name, const char *text)
{
  size_t len = 0;
  uint8_t *got = bs_test_slurp(at(name), &len);
  cr_assert(got, "%s is missing", name);
  cr_assert_eq(len, strlen(text), "%s: %zu bytes, expected %zu", name, len, strlen(text));
  cr_assert_arr_eq(got, text, len, "%s: other bytes", name);
  bs_free(got);
}

static void expect_gone(const char *name)
{
  struct stat st;
  cr_assert_neq(lstat(at(name), &st), 0, "%s should not exist", name);
}

/* A journal as a writer leaves it: the prepared part, then (commit != 0)
 * renames and a commit record, whose hash is right unless commit == 2. */
static void journal(const char *renames, const char *olds, int commit)
{
  char text[2048];
  int n = snprintf(text, sizeof text,
                   "burnstore-set-journal 1\nindex\tm.safetensors.index.json\n"
                   "new\tm-00001-of-00001.safetensors\nnew\tm.safetensors.index.json\n%s"
                   "prepared\n%s",
                   olds, commit ? renames : "");
  if (commit)
    snprintf(text + n, sizeof text - (size_t)n, "commit\t%016" PRIx64 "\n",
             bs_fnv1a(BS_FNV1A_INIT, text, (size_t)n) + (commit == 2));
  put(JOURNAL, text);
}

static int recover(bs_err *err)
{
  bs_err_clear(err);
  return bs_set_recover(at("m.safetensors.index.json"), SFX, NULL, err);
}

static void old_set(void)
{
  put("m.safetensors.index.json", "old index");
  put("m-00001-of-00002.safetensors", "old 1");
  put("m-00002-of-00002.safetensors", "old 2");
  put(TMP1, "new 1");
  put(TMPI, "new index");
}

#define OLDS "old\tm-00001-of-00002.safetensors\nold\tm-00002-of-00002.safetensors\n"
#define RENAMES                                                                                    \
  "rename\t" TMP1 "\tm-00001-of-00001.safetensors\nrename\t" TMPI "\tm.safetensors.index.json\n"

static void expect_old(void)
{
  expect("m.safetensors.index.json", "old index");
  expect("m-00001-of-00002.safetensors", "old 1");
  expect("m-00002-of-00002.safetensors", "old 2");
  expect_gone("m-00001-of-00001.safetensors");
  expect_gone(TMP1);
  expect_gone(TMPI);
  expect_gone(JOURNAL);
}

static void expect_new(void)
{
  expect("m.safetensors.index.json", "new index");
  expect("m-00001-of-00001.safetensors", "new 1");
  expect_gone("m-00001-of-00002.safetensors");
  expect_gone("m-00002-of-00002.safetensors");
  expect_gone(TMP1);
  expect_gone(TMPI);
  expect_gone(JOURNAL);
}

TestSuite(set_journal, .init = setup, .fini = teardown);

Test(set_journal, uncommitted_rolls_back)
{
  old_set();
  journal(RENAMES, OLDS, 0);
  bs_err err;
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect_old();
}

Test(set_journal, committed_rolls_forward_also_half_done)
{
  old_set();
  journal(RENAMES, OLDS, 1);
  /* killed after the first rename */
  cr_assert_eq(rename(at(TMP1), at("m-00001-of-00001.safetensors")), 0);
  bs_err err;
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect_new();
}

Test(set_journal, commit_record_cut_or_wrong_rolls_back)
{
  old_set();
  journal(RENAMES, OLDS, 2);
  bs_err err;
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect_old();
  old_set();
  put(JOURNAL, "burnstore-set-journal 1\nindex\tm.safetensors.index.json\nnew\tm.safetensors."
               "index.json\nprepared\nrename\t" TMPI "\tm.safetensors.index.json\ncommit\t0123");
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect("m.safetensors.index.json", "old index");
  expect_gone(TMPI);
  expect_gone(JOURNAL);
}

Test(set_journal, cut_before_prepared_removes_only_the_journal)
{
  old_set();
  put(JOURNAL, "burnstore-set-journal 1\nindex\tm.safetensors.index.json\nold\t../outside");
  bs_err err;
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect_gone(JOURNAL);
  expect(TMP1, "new 1"); /* not named by the journal: the next writer of its target cleans it */
  expect("m-00001-of-00002.safetensors", "old 1");
}

Test(set_journal, an_empty_journal_of_a_dead_writer_goes)
{
  old_set();
  put(JOURNAL, ""); /* killed between bs_set_begin and bs_set_prepare */
  bs_err err;
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect_gone(JOURNAL);
  expect("m.safetensors.index.json", "old index");
}

Test(set_journal, hostile_records_are_refused_and_the_journal_kept)
{
  const char *bad[] = {
      "rename\t" TMP1 "\t../m-00001-of-00001.safetensors\n", /* a final outside the set */
      "rename\t../" TMP1 "\tm-00001-of-00001.safetensors\n", /* a temp outside */
      "rename\tm-00001-of-00002.safetensors\tm-00001-of-00001.safetensors\n", /* not a temp */
      /* a temp, but of another final (the index's temp renamed over a shard) */
      "rename\t" TMPI "\tm-00001-of-00001.safetensors\n",
      "old\tprecious.txt\n", /* a record out of place */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    old_set();
    journal(bad[i], OLDS, 1);
    bs_err err;
    cr_assert_neq(recover(&err), 0, "case %zu accepted", i);
    cr_assert_eq(err.code, EINVAL);
    cr_assert(strstr(err.msg, JOURNAL) && strstr(err.msg, "line 8"), "case %zu: %s", i, err.msg);
    expect("m-00001-of-00002.safetensors", "old 1");
    expect(TMP1, "new 1");
    expect("m.safetensors.index.json", "old index");
    struct stat st;
    cr_assert_eq(lstat(at(JOURNAL), &st), 0, "case %zu: the journal is kept", i);
    unlink(at(JOURNAL));
  }
}

/* Two long index names may share one (cut) journal name: a journal that
 * records another index is not this set's, and is kept, not applied. */
Test(set_journal, a_journal_of_another_index_is_not_applied)
{
  old_set();
  char text[512];
  int n = snprintf(text, sizeof text,
                   "burnstore-set-journal 1\nindex\tother.safetensors.index.json\n"
                   "new\tm-00001-of-00001.safetensors\nnew\tother.safetensors.index.json\n%s"
                   "prepared\n",
                   OLDS);
  cr_assert(n > 0 && (size_t)n < sizeof text);
  put(JOURNAL, text);
  bs_err err;
  cr_assert_neq(recover(&err), 0);
  cr_assert(strstr(err.msg, "not of m.safetensors.index.json"), "%s", err.msg);
  expect("m-00001-of-00002.safetensors", "old 1");
  expect(TMP1, "new 1");
  struct stat st;
  cr_assert_eq(lstat(at(JOURNAL), &st), 0, "the journal is kept");
}

Test(set_journal, old_names_must_be_shards)
{
  cr_assert(bs_set_is_member("model-00001-of-00002.safetensors", SFX));
  cr_assert(bs_set_is_member("W.SafeTensors", SFX));
  cr_assert_not(bs_set_is_member("model.safetensors.index.json", SFX));
  cr_assert_not(bs_set_is_member("precious.txt", SFX));
  cr_assert_not(bs_set_is_member("up/x.safetensors", SFX));
  cr_assert_not(bs_set_is_member("../x.safetensors", SFX));
  cr_assert_not(bs_set_is_member(".x.safetensors", SFX));
  cr_assert_not(bs_set_is_member("a\nb.safetensors", SFX));
  cr_assert_not(bs_set_is_member(".safetensors", SFX));
}

Test(set_journal, a_live_uncommitted_writer_is_left_alone)
{
  old_set();
  journal(RENAMES, OLDS, 0);
  int fd = open(at(JOURNAL), O_RDONLY);
  cr_assert_eq(flock(fd, LOCK_EX | LOCK_NB), 0);
  bs_err err;
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect(TMP1, "new 1");
  expect("m.safetensors.index.json", "old index");
  close(fd);
  cr_assert_eq(recover(&err), 0, "%s", err.msg);
  expect_old();
}

Test(set_journal, write_through_the_journal)
{
  put("m.safetensors.index.json", "old index");
  put("m-00001-of-00002.safetensors", "old 1");
  put("m-00002-of-00002.safetensors", "old 2");
  const char *newf[] = {"m-00001-of-00001.safetensors", "m.safetensors.index.json"};
  const char *oldf[] = {"m-00001-of-00002.safetensors", "m-00002-of-00002.safetensors"};
  struct bs_set s;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_set_begin(&s, at("m.safetensors.index.json"), SFX, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_set_prepare(&s, newf, 2, oldf, 2, &err), 0, "%s", err.msg);
  struct stat st;
  cr_assert_eq(lstat(at(JOURNAL), &st), 0, "the journal exists before any temp file");
  /* A second writer of the same set is refused while the first holds it. */
  struct bs_set s2;
  cr_assert_neq(bs_set_begin(&s2, at("m.safetensors.index.json"), SFX, &err), 0);
  cr_assert_eq(err.code, EBUSY, "%s", err.msg);
  bs_err_clear(&err);
  struct bs_atomic a[2];
  const char *text[] = {"new 1", "new index"};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(bs_atomic_open(&a[i], at(newf[i]), &err), 0, "%s", err.msg);
    cr_assert_eq(bs_sink_put(&a[i].sink, text[i], strlen(text[i]), &err), 0);
    cr_assert_eq(bs_atomic_sync(&a[i], &err), 0, "%s", err.msg);
  }
  cr_assert_eq(bs_set_commit(&s, a, 2, &err), 0, "%s", err.msg);
  bs_set_abort(&s); /* a no-op after the commit */
  bs_atomic_abort(&a[0]);
  expect("m.safetensors.index.json", "new index");
  expect("m-00001-of-00001.safetensors", "new 1");
  expect_gone("m-00001-of-00002.safetensors");
  expect_gone("m-00002-of-00002.safetensors");
  expect_gone(JOURNAL);
}

Test(set_journal, abort_before_the_commit_leaves_the_old_set)
{
  put("m.safetensors.index.json", "old index");
  const char *newf[] = {"m.safetensors.index.json"};
  struct bs_set s;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_set_begin(&s, at("m.safetensors.index.json"), SFX, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_set_prepare(&s, newf, 1, NULL, 0, &err), 0, "%s", err.msg);
  bs_set_abort(&s);
  bs_set_abort(&s);
  expect("m.safetensors.index.json", "old index");
  expect_gone(JOURNAL);
}
