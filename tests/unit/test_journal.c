/* The staging journal (core/journal.h) without a mount: a SafeTensors
 * checkpoint, its tree and editable catalog as a writable mount has them,
 * the journal started as the mount starts it, changes made through the
 * same core calls the FUSE ops make, then no INDEX (the daemon "was
 * killed") and bs_wb_finish rebuilding the output from the journal. Replay
 * of every record kind, a torn tail, damage before more records (refused,
 * or salvaged), a NUL in metadata, a failed fdatasync, rename chains,
 * unlink then recreate, a changed checkpoint. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"
#include "policy/journal_replay.h"
#include "policy/stage_index.h"
#include "policy/writeback.h"

/* The checkpoint a (F32 [4]) b (U8 [4]), its mount's tree and editable
 * catalog, a staging directory (bs_test.h). */
static struct bs_test_wb W;
static char out_path[128];
static struct bs_journal *jr;
static bs_err err;

static struct bs_wb job(void)
{
  struct bs_wb wb = {.target = out_path,
                     .source = W.src_path,
                     .edit = &W.ed,
                     .staging = W.stg,
                     .staging_fd = &W.stg_fd,
                     .staging_lock = &W.stg_lock};
  wb.writer = bs_wb_writer(out_path, out_path, 0, &err);
  cr_assert_not_null(wb.writer, "%s", err.msg);
  return wb;
}

static void setup(void)
{
  bs_err_clear(&err);
  bs_test_wb_setup(&W);
  snprintf(out_path, sizeof out_path, "%s/out.safetensors", W.dir);
  struct bs_wb wb = job();
  jr = bs_wb_journal_start(&wb, &err);
  cr_assert_not_null(jr, "%s", err.msg);
  bs_journal_begin(jr);
  W.ed.journal = jr;
}

static void teardown(void)
{
  W.ed.journal = NULL;
  bs_journal_close(jr);
  jr = NULL;
  bs_test_wb_teardown(&W);
}

TestSuite(journal, .init = setup, .fini = teardown);

/* ---- what the FUSE ops do, through the same core calls ---- */

static uint64_t lookup(const char *name)
{
  uint64_t ino = bs_tree_lookup(&W.tree, BS_TREE_ROOT, name);
  cr_assert_neq(ino, 0, "%s", name);
  return ino;
}

static struct bs_entry *entry(const char *name)
{
  return bs_edit_entry(&W.ed, lookup(name));
}

static uint64_t next_stage = 0;

/* fs_stage, then the bytes written. */
static void stage(struct bs_entry *e, const void *data, size_t n)
{
  char p[200];
  e->stage = ++next_stage + 100;
  snprintf(p, sizeof p, "%s/%llu", W.stg, (unsigned long long)e->stage);
  bs_test_put_file(p, data, n);
  e->size = n;
  bs_edit_log_stage(&W.ed, e);
}

static uint64_t create(const char *name)
{
  uint64_t ino;
  cr_assert_eq(bs_tree_add(&W.tree, BS_TREE_ROOT, name, false, -1, &ino, &err), 0, "%s", err.msg);
  struct bs_entry *e = bs_entry_new(-1, 0, false, 0644);
  e->ino = ino;
  cr_assert_eq(bs_tree_set_user(&W.tree, ino, e), 0);
  bs_edit_log_key(&W.ed, ino);
  return ino;
}

static void rename_to(const char *from, const char *to)
{
  uint64_t ino = lookup(from), target = bs_tree_lookup(&W.tree, BS_TREE_ROOT, to);
  if (target) {
    cr_assert_eq(bs_tree_remove(&W.tree, target, &err), 0);
    bs_edit_log_gone(&W.ed, target);
  }
  cr_assert_eq(bs_tree_move(&W.tree, ino, BS_TREE_ROOT, to, &err), 0, "%s", err.msg);
  bs_edit_log_key(&W.ed, ino);
}

static void unlink_file(const char *name)
{
  uint64_t ino = lookup(name);
  cr_assert_eq(bs_tree_remove(&W.tree, ino, &err), 0);
  bs_edit_log_gone(&W.ed, ino);
}

/* The daemon is killed: no INDEX, its lock released. */
static void kill_owner(void)
{
  bs_journal_close(jr);
  jr = NULL;
  W.ed.journal = NULL;
  close(W.stg_lock);
  close(W.stg_fd);
  W.stg_lock = W.stg_fd = -1;
}

static size_t read_journal(uint8_t **data)
{
  char p[200];
  snprintf(p, sizeof p, "%s/" BS_JOURNAL_NAME, W.stg);
  FILE *f = fopen(p, "rb");
  cr_assert_not_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = bs_malloc((size_t)n);
  cr_assert_eq(fread(*data, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return (size_t)n;
}

/* Key of the replayed file with ino, or NULL. */
static char *replayed_key(const struct bs_jreplay *r, uint64_t ino)
{
  for (size_t i = 0; i < r->nfiles; i++)
    if (r->inos[i] == ino)
      return bs_tree_key(&r->tree, BS_TREE_ROOT + 1 + i, true);
  return NULL;
}

static const struct bs_entry *replayed(const struct bs_jreplay *r, uint64_t ino)
{
  for (size_t i = 0; i < r->nfiles; i++)
    if (r->inos[i] == ino)
      return bs_tree_user(&r->tree, BS_TREE_ROOT + 1 + i);
  return NULL;
}

static void replay(struct bs_jreplay *r)
{
  uint8_t *data;
  size_t n = read_journal(&data);
  cr_assert_eq(bs_journal_replay(data, n, r, &err), 0, "%s", err.msg);
  bs_free(data);
}

/* ---- tests ---- */

Test(journal, every_record_kind_replays)
{
  uint64_t a = lookup("a"), b = lookup("b");
  struct bs_entry *ea = entry("a");
  const uint8_t bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  stage(ea, bytes, sizeof bytes);
  cr_assert_eq(bs_entry_set_dtype(&W.ed, ea, "F16\n", 4, &err), 0);
  cr_assert_eq(bs_entry_set_shape(&W.ed, ea, "[2, 2]", 6, &err), 0);
  cr_assert_eq(bs_entry_set_param_id(&W.ed, ea, "77", 2, &err), 0);
  cr_assert_eq(bs_entry_set_xattr(&W.ed, ea, "user.note", "hi", 2, 0, &err), 0);
  cr_assert_eq(bs_entry_set_xattr(&W.ed, ea, "user.gone", "x", 1, 0, &err), 0);
  cr_assert_eq(bs_entry_remove_xattr(&W.ed, ea, "user.gone", &err), 0);
  struct bs_entry *eb = entry("b");
  cr_assert_eq(bs_entry_set_shape(&W.ed, eb, "[4,1]", 5, &err), 0);
  bs_entry_clear_shape(&W.ed, eb);
  cr_assert_eq(bs_entry_set_dtype(&W.ed, eb, "I8", 2, &err), 0);
  bs_entry_clear_dtype(&W.ed, eb);
  cr_assert_eq(bs_entry_set_param_id(&W.ed, eb, "5", 1, &err), 0);
  bs_entry_clear_param_id(&W.ed, eb);
  cr_assert_eq(bs_edit_set_meta(&W.ed, "k", "v", 1, &err), 0);
  cr_assert_eq(bs_edit_set_meta(&W.ed, "drop", "v", 1, &err), 0);
  cr_assert_eq(bs_edit_remove_meta(&W.ed, "drop", &err), 0);
  uint64_t n = create("new");
  cr_assert_eq(bs_journal_pending(jr) > 0, true);

  struct bs_jreplay r;
  replay(&r);
  cr_assert_eq(r.torn, 0);
  cr_assert_eq(r.nfiles, 3);
  const struct bs_entry *ra = replayed(&r, a), *rb = replayed(&r, b), *rn = replayed(&r, n);
  cr_assert(ra && rb && rn);
  cr_assert_eq(ra->stage, ea->stage);
  cr_assert(ra->has_dtype && ra->dtype == BS_DT_F16);
  cr_assert(ra->has_shape && ra->rank == 2 && ra->shape[0] == 2 && ra->shape[1] == 2);
  cr_assert(ra->has_param_id && ra->param_id == 77);
  cr_assert_eq(ra->nxattrs, 1);
  cr_assert_str_eq(ra->xattrs[0].name, "user.note");
  cr_assert_str_eq(ra->xattrs[0].value, "hi");
  cr_assert(!rb->has_shape && !rb->has_dtype && !rb->has_param_id && rb->stage == 0);
  cr_assert_eq(rb->tensor, 1);
  cr_assert(rn->tensor == -1 && rn->stage == 0);
  char *k = replayed_key(&r, n);
  cr_assert_str_eq(k, "new");
  bs_free(k);
  cr_assert_str_eq(bs_edit_get_meta(&r.ed, "k"), "v");
  cr_assert_null(bs_edit_get_meta(&r.ed, "drop"));
  bs_jreplay_destroy(&r);
}

Test(journal, finish_after_a_kill_writes_what_the_mount_held)
{
  const uint8_t bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  struct bs_entry *ea = entry("a");
  stage(ea, bytes, sizeof bytes);
  cr_assert_eq(bs_entry_set_dtype(&W.ed, ea, "U16", 3, &err), 0);
  cr_assert_eq(bs_entry_set_shape(&W.ed, ea, "[2,2]", 5, &err), 0);
  rename_to("b", "renamed");
  uint64_t n = create("fresh");
  struct bs_entry *en = bs_edit_entry(&W.ed, n);
  stage(en, "abcd", 4);
  cr_assert_eq(bs_entry_set_dtype(&W.ed, en, "I32", 3, &err), 0);
  cr_assert_eq(bs_edit_set_meta(&W.ed, "author", "me", 2, &err), 0);
  kill_owner();

  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  cr_assert_str_eq(res.target, out_path);
  cr_assert_eq(res.tensors, 3);
  bs_free(res.target);
  struct stat st;
  cr_assert_neq(stat(W.stg, &st), 0, "the staging directory is removed");

  struct bs_catalog out;
  bs_test_open_file(out_path, &out);
  cr_assert_eq(out.count, 3);
  long ia = bs_catalog_find(&out, "a"), ir = bs_catalog_find(&out, "renamed"),
       inew = bs_catalog_find(&out, "fresh");
  cr_assert(ia >= 0 && ir >= 0 && inew >= 0);
  cr_assert_eq(bs_catalog_find(&out, "b"), -1);
  const struct bs_tensor *ta = &out.tensors[ia], *tn = &out.tensors[inew];
  cr_assert(ta->dtype == BS_DT_U16 && ta->rank == 2 && ta->shape[0] == 2);
  cr_assert(tn->dtype == BS_DT_I32 && tn->rank == 1 && tn->shape[0] == 1);
  uint8_t got[8];
  cr_assert_eq(bs_tensor_read(&out, ta, 0, got, 8), 8);
  cr_assert_arr_eq(got, bytes, 8);
  cr_assert_eq(bs_tensor_read(&out, &out.tensors[ir], 0, got, 4), 4);
  const uint8_t want_b[4] = {17, 18, 19, 20};
  cr_assert_arr_eq(got, want_b, 4);
  cr_assert_eq(bs_tensor_read(&out, tn, 0, got, 4), 4);
  cr_assert_arr_eq(got, "abcd", 4);
  bool meta = false;
  for (size_t i = 0; i < out.nmeta; i++)
    meta |= strcmp(out.meta[i].key, "author") == 0 && strcmp(out.meta[i].value, "me") == 0;
  cr_assert(meta, "the metadata set while mounted");
  bs_catalog_destroy(&out);
}

Test(journal, rename_chains_and_unlink_then_recreate)
{
  uint64_t a = lookup("a"), b = lookup("b");
  rename_to("a", "x");
  rename_to("x", "y");
  rename_to("y", "z");
  unlink_file("b");
  uint64_t b2 = create("b"); /* a new file under the old name */
  rename_to("z", "b");       /* and replaced by the renamed one */
  struct bs_jreplay r;
  replay(&r);
  cr_assert_eq(r.nfiles, 1);
  cr_assert_null(replayed(&r, b));
  cr_assert_null(replayed(&r, b2));
  char *k = replayed_key(&r, a);
  cr_assert_str_eq(k, "b");
  bs_free(k);
  cr_assert_eq(replayed(&r, a)->tensor, 0, "b is a's bytes");
  bs_jreplay_destroy(&r);
}

Test(journal, a_torn_tail_is_ignored)
{
  struct bs_entry *eb = entry("b");
  cr_assert_eq(bs_entry_set_dtype(&W.ed, eb, "I8", 2, &err), 0);
  uint8_t *data;
  size_t full = read_journal(&data);
  cr_assert_eq(bs_entry_set_shape(&W.ed, eb, "[2,2]", 5, &err), 0);
  bs_free(data);
  size_t n = read_journal(&data);
  cr_assert_gt(n, full);
  /* Every cut inside the last record leaves the state before it. */
  for (size_t cut = full; cut < n; cut++) {
    struct bs_jreplay r;
    cr_assert_eq(bs_journal_replay(data, cut, &r, &err), 0, "cut %zu: %s", cut, err.msg);
    cr_assert_eq(r.torn, cut - full);
    const struct bs_entry *e = replayed(&r, lookup("b"));
    cr_assert(e && e->has_dtype && e->dtype == BS_DT_I8 && !e->has_shape, "cut %zu", cut);
    bs_jreplay_destroy(&r);
  }
  bs_free(data);
}

static void put_rec2(uint8_t *p, size_t *off, unsigned kind, uint64_t ino, const void *a,
                     uint32_t alen, const void *b, uint32_t blen)
{
  uint8_t *q = p + *off + 12;
  q[0] = (uint8_t)kind;
  bs_put_le64(q + 1, ino);
  bs_put_le32(q + 9, alen);
  if (alen)
    memcpy(q + 13, a, alen);
  if (blen)
    memcpy(q + 13 + alen, b, blen);
  bs_put_le32(p + *off, 13 + alen + blen);
  bs_put_le64(p + *off + 4, bs_fnv1a(BS_FNV1A_INIT, q, 13 + alen + blen));
  *off += 12 + 13 + alen + blen;
}

static void put_rec(uint8_t *p, size_t *off, unsigned kind, uint64_t ino, const void *a,
                    uint32_t alen)
{
  put_rec2(p, off, kind, ino, a, alen, NULL, 0);
}

/* A record whose checksum fails with records after it is damage, not the
 * end of the last write: the state is what precedes it, and it says where. */
Test(journal, a_damaged_record_with_records_after_it_is_damage)
{
  struct bs_entry *eb = entry("b");
  uint8_t *data;
  size_t before = read_journal(&data);
  bs_free(data);
  cr_assert_eq(bs_entry_set_dtype(&W.ed, eb, "I8", 2, &err), 0);
  size_t second = read_journal(&data);
  bs_free(data);
  cr_assert_eq(bs_entry_set_param_id(&W.ed, eb, "3", 1, &err), 0);
  size_t n = read_journal(&data);
  data[before + 12 + 13] ^= 0x20; /* the dtype text: "i8" would be valid too */
  struct bs_jreplay r;
  cr_assert_eq(bs_journal_replay(data, n, &r, &err), 0, "%s", err.msg);
  cr_assert(r.damaged, "not a torn tail");
  cr_assert_eq(r.torn, 0);
  cr_assert_eq(r.damage_off, before);
  cr_assert_eq(r.damage_rec, 2, "BASE is record 1");
  cr_assert_eq(r.damage_next, second, "the next record is found");
  cr_assert(strstr(r.damage_why, "checksum"), "%s", r.damage_why);
  const struct bs_entry *e = replayed(&r, lookup("b"));
  cr_assert(!e->has_dtype && !e->has_param_id, "nothing from the bad record on");
  struct bs_buf dropped = {0};
  cr_assert_eq(bs_jreplay_dropped(data, n, &r, "DIR", &dropped), 0);
  cr_assert_eq(bs_buf_put(&dropped, "", 1), 0);
  const char *t = (const char *)dropped.data;
  cr_assert(strstr(t, "record 2 at offset") && strstr(t, "'b' (file 3): param_id set to '3'"), "%s",
            t);
  bs_buf_destroy(&dropped);
  bs_jreplay_destroy(&r);

  /* The same record the last one: still damage (whole, with a bad
   * checksum: a kill cuts, it never rewrites). */
  cr_assert_eq(bs_journal_replay(data, second, &r, &err), 0, "%s", err.msg);
  cr_assert(r.damaged && r.damage_next == BS_JREPLAY_NONE);
  bs_jreplay_destroy(&r);
  data[before + 12 + 13] ^= 0x20;

  /* A length flipped so that the record seems to run past the end: the
   * valid record after it shows it is no cut tail. */
  uint32_t len = bs_le32(data + before);
  bs_put_le32(data + before, len + 4096);
  cr_assert_eq(bs_journal_replay(data, n, &r, &err), 0, "%s", err.msg);
  cr_assert(r.damaged && r.damage_off == before && r.damage_next == second,
            "a cut record with records after it is damage");
  bs_jreplay_destroy(&r);
  bs_put_le32(data + before, len);

  /* Zeros after the last whole record (a crash's unwritten blocks): torn. */
  uint8_t *z = bs_calloc(1, n + 4096);
  memcpy(z, data, n);
  cr_assert_eq(bs_journal_replay(z, n + 4096, &r, &err), 0, "%s", err.msg);
  cr_assert(!r.damaged && r.torn == 4096);
  e = replayed(&r, lookup("b"));
  cr_assert(e->has_dtype && e->has_param_id, "every whole record applied");
  bs_jreplay_destroy(&r);
  bs_free(z);
  bs_free(data);
}

/* --finish refuses a damaged journal in one line and keeps the directory;
 * --finish --salvage writes what precedes the damage, lists what it
 * dropped, and keeps the directory too. */
Test(journal, finish_refuses_damage_and_salvage_lists_what_it_drops)
{
  struct bs_entry *ea = entry("a");
  uint8_t *data;
  size_t before = read_journal(&data);
  bs_free(data);
  rename_to("b", "renamed");
  const uint8_t bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  stage(ea, bytes, sizeof bytes);
  cr_assert_eq(bs_edit_set_meta(&W.ed, "author", "me", 2, &err), 0);
  size_t n = read_journal(&data);
  bs_free(data);
  kill_owner();
  /* Flip one bit in record 2 (the rename) on disk. */
  char p[200];
  snprintf(p, sizeof p, "%s/" BS_JOURNAL_NAME, W.stg);
  int fd = open(p, O_RDWR);
  uint8_t c;
  cr_assert_eq(pread(fd, &c, 1, (off_t)(before + 12 + 14)), 1);
  c ^= 1;
  cr_assert_eq(pwrite(fd, &c, 1, (off_t)(before + 12 + 14)), 1);
  close(fd);
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), -1);
  cr_assert_eq(err.code, EBADMSG, "%d %s", err.code, err.msg);
  char want[64];
  snprintf(want, sizeof want, "record 2 (offset %zu) is damaged", before);
  cr_assert(strstr(err.msg, want) && strstr(err.msg, "--salvage") && !strchr(err.msg, '\n'), "%s",
            err.msg);
  cr_assert_null(res.notes);
  bs_free(res.target);
  struct stat st;
  cr_assert_eq(stat(out_path, &st), -1, "nothing written");
  cr_assert_eq(stat(p, &st), 0, "the journal is kept");

  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, BS_WB_SALVAGE, &res, &err), 0, "%s", err.msg);
  cr_assert(res.salvaged);
  cr_assert_not_null(res.notes);
  cr_assert(strstr(res.notes, "records 1 to 1 applied") &&
                strstr(res.notes, "record 2 at offset") &&
                strstr(res.notes, "'a' (file 2): its bytes, staged file") &&
                strstr(res.notes, "metadata set 'author'"),
            "%s", res.notes);
  bs_free(res.target);
  bs_free(res.notes);
  cr_assert_eq(stat(p, &st), 0, "the staging directory and its journal are kept");
  snprintf(p, sizeof p, "%s/" BS_STAGE_INDEX_NAME, W.stg);
  cr_assert_eq(stat(p, &st), -1, "no INDEX of the salvage is left to be taken for the journal's");
  struct bs_catalog out;
  bs_test_open_file(out_path, &out);
  cr_assert(bs_catalog_find(&out, "b") >= 0 && bs_catalog_find(&out, "renamed") < 0,
            "the state before the damage");
  bs_catalog_destroy(&out);
  (void)n;
}

/* A metadata value holding a NUL is refused at replay, naming its offset
 * (a NUL cut it short before). */
Test(journal, a_nul_in_a_metadata_value_is_refused)
{
  uint8_t *data;
  size_t n = read_journal(&data);
  uint8_t *bad = bs_malloc(n + 64);
  memcpy(bad, data, n);
  size_t off = n;
  put_rec2(bad, &off, BS_J_MSET, 0, "k", 1, "v\0tail", 6);
  struct bs_jreplay r;
  cr_assert_eq(bs_journal_replay(bad, off, &r, &err), -1);
  char want[80];
  snprintf(want, sizeof want, "offset %zu: a NUL inside a metadata value", n);
  cr_assert(err.code == EINVAL && strstr(err.msg, want), "%s", err.msg);
  bs_jreplay_destroy(&r);
  bs_free(bad);
  bs_free(data);
}

/* An UNSYNCED record (a failed fdatasync) is read, and --finish says it. */
Test(journal, an_unsynced_record_is_reported)
{
  rename_to("a", "x");
  uint8_t e[4];
  bs_put_le32(e, EIO);
  bs_journal_append(jr, BS_J_UNSYNCED, 0, e, 4, NULL, 0);
  rename_to("b", "y");
  kill_owner();
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  cr_assert(res.notes && strstr(res.notes, "stopped being durable at record 3") &&
                strstr(res.notes, strerror(EIO)),
            "%s", res.notes ? res.notes : "(none)");
  bs_free(res.target);
  bs_free(res.notes);
  struct bs_catalog out;
  bs_test_open_file(out_path, &out);
  cr_assert(bs_catalog_find(&out, "x") >= 0 && bs_catalog_find(&out, "y") >= 0);
  bs_catalog_destroy(&out);
}

Test(journal, bad_journals_are_refused_with_one_line)
{
  uint8_t *data;
  size_t n = read_journal(&data);
  struct bs_jreplay r;
  cr_assert_eq(bs_journal_replay("BSJRNL9\n", 8, &r, &err), -1);
  cr_assert(strstr(err.msg, "bad magic"), "%s", err.msg);
  bs_jreplay_destroy(&r);
  bs_err_clear(&err);
  cr_assert_eq(bs_journal_replay(data, 8, &r, &err), -1, "magic only: no BASE");
  cr_assert(strstr(err.msg, "no BASE"), "%s", err.msg);
  bs_jreplay_destroy(&r);
  /* A change of a file the journal never named; an ORIGIN past the BASE;
   * a field longer than its record; an unknown kind. */
  uint8_t *bad = bs_malloc(n + 64);
  cr_assert_not_null(bad);
  const uint8_t big[8] = {9, 0, 0, 0, 0, 0, 0, 0};
  struct {
    unsigned kind;
    uint64_t ino;
    const void *a;
    uint32_t alen;
    const char *msg;
  } cases[] = {{BS_J_DTYPE, 999, "F32", 3, "never created"},
               {BS_J_ORIGIN, 999, big, 8, "does not have"},
               {BS_J_KIND_END, 1, "", 0, "unknown record kind"},
               {BS_J_BASE, 0, "", 0, "second BASE"},
               {BS_J_KEY, 999, "a\0b", 3, "NUL"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    memcpy(bad, data, n);
    size_t off = n;
    put_rec(bad, &off, cases[i].kind, cases[i].ino, cases[i].a, cases[i].alen);
    bs_err_clear(&err);
    cr_assert_eq(bs_journal_replay(bad, off, &r, &err), -1, "case %zu", i);
    cr_assert(err.code == EINVAL && strstr(err.msg, cases[i].msg), "case %zu: %s", i, err.msg);
    bs_jreplay_destroy(&r);
  }
  /* alen past the record: its checksum holds, its field does not. */
  memcpy(bad, data, n);
  size_t off = n;
  put_rec(bad, &off, BS_J_KEY, 1, "ab", 2);
  bs_put_le32(bad + n + 12 + 9, 1000);
  bs_put_le64(bad + n + 4, bs_fnv1a(BS_FNV1A_INIT, bad + n + 12, 15));
  bs_err_clear(&err);
  cr_assert_eq(bs_journal_replay(bad, off, &r, &err), -1);
  cr_assert(strstr(err.msg, "longer than its record"), "%s", err.msg);
  bs_jreplay_destroy(&r);
  /* BASE's origins must be (inode, tensor) pairs. */
  uint32_t blen = bs_le32(data + 8 + 12 + 9);
  memcpy(bad, data, 8);
  off = 8;
  put_rec2(bad, &off, BS_J_BASE, 0, data + 8 + 12 + 13, blen, "0123456789abcde", 15);
  bs_err_clear(&err);
  cr_assert_eq(bs_journal_replay(bad, off, &r, &err), -1);
  cr_assert(strstr(err.msg, "pairs"), "%s", err.msg);
  bs_jreplay_destroy(&r);
  bs_free(bad);
  bs_free(data);
}

Test(journal, a_changed_checkpoint_is_refused)
{
  rename_to("a", "x");
  kill_owner();
  sleep(0); /* the rewrite below changes size and inode at least */
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.new", W.src_path);
  bs_test_write_ab_checkpoint(tmp);
  int fd = open(tmp, O_WRONLY | O_APPEND);
  cr_assert_eq(write(fd, "x", 1), 1);
  close(fd);
  cr_assert_eq(rename(tmp, W.src_path), 0);
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), -1);
  cr_assert_eq(err.code, ESTALE, "%d %s", err.code, err.msg);
  bs_free(res.target);
  struct stat st;
  cr_assert_eq(stat(out_path, &st), -1, "nothing written");
}

Test(journal, without_journal_finish_still_says_no_index)
{
  stage(entry("a"), "abcd", 4);
  kill_owner();
  char p[200];
  snprintf(p, sizeof p, "%s/" BS_JOURNAL_NAME, W.stg);
  cr_assert_eq(unlink(p), 0);
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), -1);
  cr_assert(strstr(err.msg, "no INDEX"), "%s", err.msg);
  bs_free(res.target);
  /* Without the staged file either, only its lock is left: removed. */
  snprintf(p, sizeof p, "%s/%llu", W.stg, (unsigned long long)entry("a")->stage);
  cr_assert_eq(unlink(p), 0);
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  cr_assert(res.empty && !res.completed);
  struct stat st;
  cr_assert_neq(stat(W.stg, &st), 0, "removed");
}

/* Nothing tied a JOURNAL to its directory: one copied into another killed
 * mount's staging directory was replayed there (its BASE names its target,
 * its records that directory's staged files): --finish wrote one target
 * with the other's bytes, exit 0. Its BASE names its staging directory. */
Test(journal, a_journal_copied_into_another_staging_directory_is_refused)
{
  stage(entry("a"), "abcdefghijklmnop", 16);
  kill_owner();
  uint8_t *data;
  size_t n = read_journal(&data);
  /* the other directory: a killed mount's, its staged file of that name
   * holding other bytes */
  char other[200], p[220];
  snprintf(other, sizeof other, "%s/.other.safetensors.staging-AbC123", W.dir);
  cr_assert_eq(mkdir(other, 0700), 0);
  snprintf(p, sizeof p, "%s/%llu", other, (unsigned long long)entry("a")->stage);
  FILE *f = fopen(p, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite("ZZZZZZZZZZZZZZZZ", 1, 16, f), 16);
  fclose(f);
  snprintf(p, sizeof p, "%s/" BS_JOURNAL_NAME, other);
  f = fopen(p, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(data, 1, n, f), n);
  fclose(f);
  bs_free(data);
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(other, 0, &res, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  const char *name = strrchr(W.stg, '/') + 1;
  char want[1024];
  snprintf(want, sizeof want,
           "%s/JOURNAL was written in %s, not in this staging directory "
           "(.other.safetensors.staging-AbC123): copied from another? not used (its target: %s)",
           other, name, out_path);
  cr_assert_str_eq(err.msg, want);
  bs_free(res.target);
  struct stat st;
  cr_assert_eq(stat(out_path, &st), -1, "nothing written");
  cr_assert_eq(stat(p, &st), 0, "the directory is kept");
  /* in its own directory it finishes */
  bs_err_clear(&err);
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  bs_free(res.target);
  cr_assert_eq(stat(out_path, &st), 0);
  bs_test_rmrf(other);
}

/* A journal of burnstore 0.1.0 (its BASE an INDEX of version 1, naming no
 * staging directory) still finishes: taken without the check. */
Test(journal, a_journal_of_version_1_still_finishes)
{
  stage(entry("a"), "abcdefghijklmnop", 16);
  kill_owner();
  uint8_t *data;
  size_t n = read_journal(&data);
  /* BASE: u32 len | u64 sum | kind | u64 ino | u32 alen | INDEX | origins */
  const uint8_t *rec = data + BS_JOURNAL_MAGIC_LEN;
  uint32_t len = bs_le32(rec), alen = bs_le32(rec + 12 + 9);
  char *text = bs_malloc(alen + 1);
  memcpy(text, rec + 12 + 13, alen);
  text[alen] = '\0';
  char *v = strstr(text, "burnstore-staging-index\t2\n"), *st = strstr(text, "\nstaging\t");
  cr_assert(v && st, "%s", text);
  v[strlen("burnstore-staging-index\t")] = '1';
  char *nl = strchr(st + 1, '\n');
  memmove(st, nl, strlen(nl) + 1);
  uint8_t *out = bs_malloc(n);
  size_t off = BS_JOURNAL_MAGIC_LEN;
  memcpy(out, data, off);
  put_rec2(out, &off, BS_J_BASE, 0, text, (uint32_t)strlen(text), rec + 12 + 13 + alen,
           len - 13 - alen);
  memcpy(out + off, rec + 12 + len, n - BS_JOURNAL_MAGIC_LEN - 12 - len);
  off += n - BS_JOURNAL_MAGIC_LEN - 12 - len;
  char p[200];
  snprintf(p, sizeof p, "%s/" BS_JOURNAL_NAME, W.stg);
  FILE *f = fopen(p, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(out, 1, off, f), off);
  fclose(f);
  bs_free(text);
  bs_free(out);
  bs_free(data);
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  bs_free(res.target);
  struct bs_catalog cat;
  bs_test_open_file(out_path, &cat);
  long ia = bs_catalog_find(&cat, "a");
  uint8_t got[16];
  cr_assert(ia >= 0 && bs_tensor_read(&cat, &cat.tensors[ia], 0, got, 16) == 16);
  cr_assert_arr_eq(got, "abcdefghijklmnop", 16);
  bs_catalog_destroy(&cat);
}

/* A kill during the removal after the commit leaves DONE: --finish removes
 * the rest, saying the write-back had completed; a mount's sweep too. */
Test(journal, a_completed_write_back_is_removed)
{
  stage(entry("a"), "abcd", 4);
  kill_owner();
  char p[200];
  snprintf(p, sizeof p, "%s/" BS_STAGE_DONE_NAME, W.stg);
  bs_test_put_file(p, out_path, strlen(out_path));
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  cr_assert(res.completed && res.target && strcmp(res.target, out_path) == 0);
  bs_free(res.target);
  struct stat st;
  cr_assert_neq(stat(W.stg, &st), 0, "removed");
  cr_assert_neq(stat(out_path, &st), 0, "nothing written: it had been");
}

Test(journal, the_flusher_syncs_within_its_window)
{
  struct bs_entry *eb = entry("b");
  cr_assert_eq(bs_entry_set_dtype(&W.ed, eb, "I8", 2, &err), 0);
  cr_assert_gt(bs_journal_pending(jr), 0);
  for (int i = 0; i < 40 && bs_journal_pending(jr); i++)
    usleep(100000);
  cr_assert_eq(bs_journal_pending(jr), 0, "synced within %d ms", BS_JOURNAL_SYNC_MS);
}

Test(journal, a_key_longer_than_a_file_name_survives)
{
  /* a/b nested: each component fits NAME_MAX, the key does not; the replay's
   * flat tree shows it under a shortened name that keeps the whole key. */
  char key[420];
  memset(key, 'a', 200);
  key[200] = '.';
  memset(key + 201, 'b', 200);
  key[401] = '\0';
  bs_journal_append(jr, BS_J_KEY, 9999, key, strlen(key), NULL, 0);
  kill_owner();
  struct bs_wb_finished res;
  cr_assert_eq(bs_wb_finish(W.stg, 0, &res, &err), 0, "%s", err.msg);
  bs_free(res.target);
  struct bs_catalog out;
  bs_test_open_file(out_path, &out);
  cr_assert_eq(out.count, 3);
  long k = bs_catalog_find(&out, key);
  cr_assert(k >= 0 && out.tensors[k].nbytes == 0, "the empty new file under its whole key");
  bs_catalog_destroy(&out);
}

Test(journal, unchanged_until_the_first_change)
{
  cr_assert(bs_journal_unchanged(W.stg_fd), "BASE alone: nothing to finish");
  rename_to("a", "x");
  cr_assert(!bs_journal_unchanged(W.stg_fd), "a rename is something to finish");
}
