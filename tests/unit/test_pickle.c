/* The restricted unpickler on hand-built opcode streams. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/pickle.h"
#include "formats/pickle_vm.h"
#include "pickle_fixture.h"

TestSuite(pickle, .fini = pickle_fixture_teardown);

Test(pickle, memo_holds_references_so_a_dict_filled_after_binput_is_seen_filled)
{
  /* L = []; memo0 = L; D = {}; memo1 = D; L.append(D); memo1['k'] = 7; return L */
  static const char s[] = "\x80\x02]q\x00}q\x01"
                          "ah\x01X\x01\x00\x00\x00kK\x07s0.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->kind, BS_PV_LIST);
  cr_assert_eq(v->u.seq.n, 1);
  struct bs_pv *d = v->u.seq.items[0];
  cr_assert_eq(d->kind, BS_PV_DICT);
  cr_assert_eq(d->u.dict.keys.n, 1);
  cr_assert_str_eq(d->u.dict.keys.items[0]->u.str.s, "k");
  cr_assert_eq(d->u.dict.vals.items[0]->u.i, 7);
}

Test(pickle, nested_marks_build_nested_tuples)
{
  static const char s[] = "\x80\x02((K\x01K\x02t(K\x03tt.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->kind, BS_PV_TUPLE);
  cr_assert_eq(v->u.seq.n, 2);
  cr_assert_eq(v->u.seq.items[0]->u.seq.n, 2);
  cr_assert_eq(v->u.seq.items[0]->u.seq.items[1]->u.i, 2);
  cr_assert_eq(v->u.seq.items[1]->u.seq.n, 1);
  cr_assert_eq(v->u.seq.items[1]->u.seq.items[0]->u.i, 3);
}

Test(pickle, long1_is_signed_twos_complement)
{
  struct bs_pv *v;
  static const char m1[] = "\x80\x02\x8a\x01\xff.";
  LOAD_OK(m1, &v);
  cr_assert_eq(v->kind, BS_PV_INT);
  cr_assert_eq(v->u.i, -1);
  static const char m2[] = "\x80\x02\x8a\x02\x00\x80.";
  LOAD_OK(m2, &v);
  cr_assert_eq(v->u.i, -32768);
  static const char z[] = "\x80\x02\x8a\x00.";
  LOAD_OK(z, &v);
  cr_assert_eq(v->u.i, 0);
  static const char big[] = "\x80\x02\x8a\x05\x00\xcb\x4c\x00\x01.";
  LOAD_OK(big, &v);
  cr_assert_eq(v->u.i, 4300000000LL);
  static const char pos9[] = "\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\x00.";
  LOAD_OK(pos9, &v);
  cr_assert_eq(v->u.i, INT64_MAX);
  static const char huge[] = "\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.";
  LOAD_OK(huge, &v);
  cr_assert_eq(v->kind, BS_PV_BIGINT);
  cr_assert_eq(v->u.str.len, 9);
}

Test(pickle, binint_family_signedness)
{
  static const char s[] = "\x80\x02(K\xffM\xff\xffJ\xff\xff\xff\xfft.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->u.seq.items[0]->u.i, 255);
  cr_assert_eq(v->u.seq.items[1]->u.i, 65535);
  cr_assert_eq(v->u.seq.items[2]->u.i, -1);
}

Test(pickle, binfloat_is_big_endian)
{
  static const char s[] = "\x80\x02(G\x3f\xf0\x00\x00\x00\x00\x00\x00"
                          "G\xc0\x09\x21\xfb\x54\x44\x2d\x18t.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->u.seq.items[0]->kind, BS_PV_FLOAT);
  cr_assert_eq(v->u.seq.items[0]->u.f, 1.0);
  cr_assert_eq(v->u.seq.items[1]->u.f, -3.141592653589793);
}

Test(pickle, protocol4_frame_stack_global_memoize)
{
  /* OrderedDict([('a', 1)]) as protocol 4 writes it */
  static const char s[] = "\x80\x04\x95\x2a\x00\x00\x00\x00\x00\x00\x00"
                          "\x8c\x0b"
                          "collections\x94\x8c\x0b"
                          "OrderedDict\x94\x93\x94)R\x94"
                          "\x8c\x01"
                          "a\x94K\x01sh\x00h\x03s.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->kind, BS_PV_DICT);
  cr_assert(v->u.dict.ordered);
  cr_assert_eq(v->u.dict.keys.n, 2);
  cr_assert_str_eq(v->u.dict.keys.items[0]->u.str.s, "a");
  cr_assert_eq(v->u.dict.vals.items[0]->u.i, 1);
  /* memo 0 = 'collections', 3 = the OrderedDict itself (MEMOIZE numbering) */
  cr_assert_str_eq(v->u.dict.keys.items[1]->u.str.s, "collections");
  cr_assert_eq(v->u.dict.vals.items[1], v);
}

Test(pickle, python2_names_are_mapped_and_set_is_built)
{
  static const char s[] = "\x80\x02"
                          "c__builtin__\nset\n]K\x01"
                          "aK\x02"
                          "a\x85R.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->kind, BS_PV_SET);
  cr_assert_eq(v->u.seq.n, 2);
}

Test(pickle, text_opcodes_dict_list_int_long_dup_pop_mark)
{
  static const char s[] = "\x80\x02(I01\nL12L\nI-5\nl2(U\x01xF0.5\nd(N1(N000.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  /* stack: [list, list(dup), dict]; POP_MARK removed (None), POP removed the dict... */
  cr_assert_eq(v->kind, BS_PV_LIST);
  cr_assert_eq(v->u.seq.n, 3);
  cr_assert_eq(v->u.seq.items[0]->kind, BS_PV_BOOL);
  cr_assert(v->u.seq.items[0]->u.b);
  cr_assert_eq(v->u.seq.items[1]->u.i, 12);
  cr_assert_eq(v->u.seq.items[2]->u.i, -5);
}

Test(pickle, strings_and_bytes_and_codecs_encode)
{
  static const char s[] = "\x80\x03(U\x02hiT\x02\x00\x00\x00yoC\x02\x00\x01"
                          "B\x01\x00\x00\x00z"
                          "c_codecs\nencode\nX\x02\x00\x00\x00\xc3\xbf"
                          "X\x06\x00\x00\x00latin1\x86Rt.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->u.seq.n, 5);
  cr_assert_str_eq(v->u.seq.items[0]->u.str.s, "hi");
  cr_assert_str_eq(v->u.seq.items[1]->u.str.s, "yo");
  cr_assert_eq(v->u.seq.items[2]->kind, BS_PV_BYTES);
  cr_assert_eq(v->u.seq.items[2]->u.str.len, 2);
  cr_assert_eq(v->u.seq.items[4]->kind, BS_PV_BYTES);
  cr_assert_eq(v->u.seq.items[4]->u.str.len, 1);
  cr_assert_eq((uint8_t)v->u.seq.items[4]->u.str.s[0], 0xff);
}

/* {'w': _rebuild_tensor_v2(pid, 2, (2, 3), (3, 1), False, OrderedDict())} */
#define TENSOR_PICKLE(cls)                                                                         \
  "\x80\x02}X\x01\x00\x00\x00w"                                                                    \
  "ctorch._utils\n_rebuild_tensor_v2\n"                                                            \
  "((X\x07\x00\x00\x00storagectorch\n" cls "\nX\x01\x00\x00\x00"                                   \
  "0X\x03\x00\x00\x00"                                                                             \
  "cpuK\x08tQ"                                                                                     \
  "K\x02K\x02K\x03\x86K\x03K\x01\x86\x89"                                                          \
  "ccollections\nOrderedDict\n)RtRs."

Test(pickle, mark_dict_as_the_first_opcodes_gives_an_empty_dict)
{
  static const char s[] = "(d.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->kind, BS_PV_DICT);
  cr_assert_eq(v->u.dict.keys.n, 0);
}

Test(pickle, mark_bomb_is_a_clean_error)
{
  size_t n = 2 + BS_PICKLE_MAX_DEPTH + 10;
  char *s = malloc(n);
  s[0] = (char)0x80;
  s[1] = 2;
  memset(s + 2, '(', n - 2);
  struct bs_pv *v;
  bs_err e;
  int rc = pickle_load(s, n, &v, &e);
  free(s);
  cr_assert_eq(rc, -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 2 + BS_PICKLE_MAX_DEPTH);
  cr_assert(strstr(e.msg, "MARKs nested deeper than"), "%s", e.msg);
}

/* 100,000 lists nested: 12 MB of values from 200 KB of pickle, so the
 * stream sits in a 1 MB file (what follows STOP is not read): the memory
 * bound is 8 MiB + 24 x the file. */
Test(pickle, deeply_nested_lists_load_without_recursion)
{
  size_t depth = 100000, n = 2 + depth + (depth - 1) + 1, file = 1 << 20;
  char *s = calloc(1, file);
  s[0] = (char)0x80;
  s[1] = 2;
  memset(s + 2, ']', depth);
  memset(s + 2 + depth, 'a', depth - 1);
  s[n - 1] = '.';
  struct bs_pv *v;
  bs_err e;
  int rc = pickle_load(s, file, &v, &e);
  free(s);
  cr_assert_eq(rc, 0, "%s", e.msg);
  cr_assert_eq(v->kind, BS_PV_LIST);
}

Test(pickle, binget_of_an_unset_memo_index_fails)
{
  static const char s[] = "\x80\x02h\x05.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 2);
  cr_assert(strstr(e.msg, "memo index 5 was never stored"), "%s", e.msg);
}

Test(pickle, long_binput_beyond_the_stream_is_out_of_range)
{
  static const char s[] = "\x80\x02Nr\xff\xff\xff\xff.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 3);
  cr_assert(strstr(e.msg, "memo index 4294967295 out of range"), "%s", e.msg);
}

Test(pickle, string_longer_than_the_stream_is_truncated)
{
  static const char s[] = "\x80\x02X\x10\x00\x00\x00"
                          "abc";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load_opts(s, sizeof s - 1, false, 1000, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 1002);
  cr_assert(strstr(e.msg, "truncated pickle"), "%s", e.msg);
}

Test(pickle, stream_without_stop_is_truncated)
{
  static const char s[] = "\x80\x02N";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 3);
  cr_assert(strstr(e.msg, "ends without STOP"), "%s", e.msg);
}

Test(pickle, unknown_opcode_is_named_with_its_offset)
{
  static const char s[] = "\x80\x02N\xff.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 3);
  cr_assert(strstr(e.msg, "pickle offset 3: unknown pickle opcode 0xff"), "%s", e.msg);
}

Test(pickle, text_persid_is_unsupported)
{
  static const char s[] = "\x80\x02P0\n.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  cr_assert_eq(e.off, 2);
  cr_assert(strstr(e.msg, "PERSID"), "%s", e.msg);
}

Test(pickle, stack_underflow_is_an_error)
{
  static const char s[] = "\x80\x02(a.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 3);
  cr_assert(strstr(e.msg, "stack underflow"), "%s", e.msg);
}

Test(pickle, missing_mark_is_an_error)
{
  static const char s[] = "\x80\x02Nt.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 3);
  cr_assert(strstr(e.msg, "needs a MARK"), "%s", e.msg);
}

Test(pickle, build_on_a_plain_dict_is_an_error)
{
  static const char s[] = "\x80\x02}}b.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 4);
  cr_assert(strstr(e.msg, "BUILD on a plain dict"), "%s", e.msg);
}

Test(pickle, reduce_on_a_non_callable_is_an_error)
{
  static const char s[] = "\x80\x02K\x01)R.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, EINVAL);
  cr_assert_eq(e.off, 5);
  cr_assert(strstr(e.msg, "REDUCE on a int"), "%s", e.msg);
}

Test(pickle, protocol_6_is_refused)
{
  static const char s[] = "\x80\x06N.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  cr_assert_eq(e.off, 0);
  cr_assert(strstr(e.msg, "protocol 6"), "%s", e.msg);
}

Test(pickle, failing_allocations_give_enomem_and_no_leak)
{
  static const char s[] = TENSOR_PICKLE("FloatStorage");
  for (long n = 0; n < 40; n++) {
    struct bs_pv *v;
    bs_err e;
    bs_err_clear(&e);
    struct bs_pickle *p = bs_pickle_new();
    struct bs_src src;
    cr_assert_not_null(p);
    cr_assert_eq(bs_src_init_mem(&src, s, sizeof s - 1, "t", &e), 0);
    bs_alloc_fail_after(n);
    int rc = bs_pickle_load(p, &src, 0, sizeof s - 1, NULL, &v, NULL, &e);
    bs_alloc_fail_after(-1);
    bs_pickle_free(p);
    bs_src_destroy(&src);
    if (rc == 0)
      return;
    cr_assert_eq(e.code, ENOMEM, "n=%ld: %s", n, e.msg);
  }
  cr_assert_fail("never succeeded");
}

/* ---- bounded by the file's bytes ------------------------------------------------------------ */

/* "\x80\x02" head, n copies of pat, tail, STOP: what a deflated data.pkl of
 * a 78 KB file can inflate to (deflate's 1032:1). */
static char *flood(const char *head, size_t hl, const char *pat, size_t pl, size_t n,
                   const char *tail, size_t tl, size_t *len)
{
  *len = 2 + hl + n * pl + tl + 1;
  char *s = malloc(*len), *p = s;
  cr_assert_not_null(s);
  *p++ = (char)0x80;
  *p++ = 2;
  memcpy(p, head, hl);
  p += hl;
  for (size_t i = 0; i < n; i++, p += pl)
    memcpy(p, pat, pl);
  memcpy(p, tail, tl);
  p[tl] = '.';
  return s;
}

#define FILE_BYTES 78000u

/* The memory bound for a file of `bytes`: the larger of 48 MiB and 24 x. */
static uint64_t mem_bound(uint64_t bytes)
{
  uint64_t per = BS_PICKLE_MEM_PER_BYTE * bytes;
  return per > BS_PICKLE_MEM_FLOOR ? per : BS_PICKLE_MEM_FLOOR;
}

/* Refused by one of the bounds (`why`), EFBIG, with the arena it kept
 * within the memory bound: the larger of 48 MiB and 24 x the file. */
static void refused(const char *what, char *s, size_t len, const char *why)
{
  struct bs_pv *v;
  bs_err e;
  int rc = pickle_load_input(s, len, FILE_BYTES, &v, &e);
  free(s);
  cr_assert_eq(rc, -1, "%s: loaded", what);
  cr_assert_eq(e.code, EFBIG, "%s: %d %s", what, e.code, e.msg);
  cr_assert(strstr(e.msg, why), "%s: %s", what, e.msg);
  cr_assert(strstr(e.msg, "x the file's 78000 bytes"), "%s: %s", what, e.msg);
  const struct bs_pickle *p = pickle_fixture_unpickler();
  cr_assert_leq(p->total, mem_bound(FILE_BYTES), "%s", what);
  pickle_fixture_teardown(); /* the next stream gets an unpickler of its own */
}

#define MEM "bytes of memory to load (the bound is the larger of 48 MiB and 24"
#define WORK "opcodes (the bound is 1048576 + 32"

/* Opcodes that build nothing, or a shared value (None, (), a small int)
 * they drop: the work bound (a 78 KB .pth of 40M EMPTY_TUPLE, POP filled
 * the fixed 4 GiB arena: 4.3 GB, 9 s). */
Test(pickle, floods_that_build_nothing_stop_at_the_work_bound)
{
  size_t n;
  char *s;
  s = flood("", 0, ")0", 2, 4000000, "N", 1, &n);
  refused("EMPTY_TUPLE POP", s, n, WORK);
  s = flood("", 0, "(1", 2, 4000000, "N", 1, &n);
  refused("MARK POP_MARK", s, n, WORK);
  s = flood("", 0, "N0", 2, 4000000, "N", 1, &n);
  refused("NONE POP", s, n, WORK);
  s = flood("", 0,
            "K\x05"
            "0",
            3, 4000000, "N", 1, &n);
  refused("BININT1 POP", s, n, WORK);
  s = flood("]", 1, "q\x00", 2, 4000000, "", 0, &n);
  refused("BINPUT to one index", s, n, WORK);
  s = flood("", 0, "\x95\x01\x00\x00\x00\x00\x00\x00\x00", 9, 4000000, "N", 1, &n);
  refused("FRAME", s, n, WORK);
  /* 8 bytes an opcode (a stack or memo slot): 3.5M of them stay under the
   * 48 MiB floor, so the opcodes are what stops them */
  s = flood("]", 1, "2", 1, 4000000, "", 0, &n);
  refused("DUP", s, n, WORK);
  s = flood("]\x94", 2, "h\x00", 2, 4000000, "", 0, &n);
  refused("MEMOIZE BINGET", s, n, WORK);
  s = flood("]", 1, "\x94", 1, 4000000, "", 0, &n);
  refused("MEMOIZE", s, n, WORK);
}

/* Opcodes that keep what they make: the memory bound, whatever holds it
 * (the stack, the memo, a list's items, values, the input window). */
Test(pickle, floods_that_keep_what_they_make_stop_at_the_memory_bound)
{
  size_t n;
  char *s;
  s = flood("]r\x18\x93\x98\x00", 6, "0", 1, 10000000, "N", 1, &n); /* LONG_BINPUT 9,999,000 */
  refused("a far LONG_BINPUT", s, n, MEM);
  char appends[1002];
  appends[0] = '(';
  memset(appends + 1, 'N', 1000);
  appends[1001] = 'e';
  s = flood("]", 1, appends, sizeof appends, 4000, "", 0, &n);
  refused("EMPTY_LIST APPENDS", s, n, MEM);
  s = flood("(", 1, "]", 1, 4000000, "l", 1, &n);
  refused("MARK EMPTY_LIST... LIST", s, n, MEM);
  s = flood("(", 1, "\x8c\x01x", 3, 2000000, "l", 1, &n);
  refused("short strings", s, n, MEM);
  s = flood("(", 1, "J\x00\x01\x00\x00", 5, 2000000, "l", 1, &n);
  refused("ints", s, n, MEM);
  s = flood("B\x00\x00\x40\x03", 5, "", 0, 0, "", 0, &n); /* BINBYTES of 52 MiB */
  s = realloc(s, n + (52u << 20));
  memset(s + n - 1, 0, (52u << 20) + 1);
  refused("BINBYTES", s, n + (52u << 20), MEM);
  s = flood("\x8b\x00\x00\x40\x03", 5, "", 0, 0, "", 0, &n); /* LONG4 of 52 MiB */
  s = realloc(s, n + (52u << 20));
  memset(s + n - 1, 0, (52u << 20) + 1);
  refused("LONG4", s, n + (52u << 20), MEM);
}

/* The same streams from a file their size (uncompressed): read, each
 * opcode at least a byte of the file. */
Test(pickle, the_same_streams_from_a_file_their_size_load)
{
  size_t n;
  char *s = flood("", 0, ")0", 2, 4000000, "N", 1, &n);
  struct bs_pv *v;
  bs_err e;
  int rc = pickle_load(s, n, &v, &e);
  free(s);
  cr_assert_eq(rc, 0, "%s", e.msg);
  cr_assert_eq(v->kind, BS_PV_NONE);
  s = flood("(", 1, "]", 1, 200000, "l", 1, &n);
  rc = pickle_load(s, n, &v, &e);
  free(s);
  cr_assert_eq(rc, 0, "%s", e.msg);
  cr_assert(v->kind == BS_PV_LIST && v->u.seq.n == 200000);
}

/* A file under 2 MiB may build up to 48 MiB whatever its size: a re-zipped
 * torch.save of 30,000 views (625 KB, a 2.5 MB pickle) needs about 40 MiB
 * of values. Before, the bound was 8 MiB + 24 x the file (23.4 MB here). */
Test(pickle, a_small_file_may_build_up_to_the_floor)
{
  size_t n;
  char *s = flood("(", 1, "\x8c\x01x", 3, 280000, "l", 1, &n); /* 280,000 strings: ~29 MB */
  struct bs_pv *v;
  bs_err e;
  int rc = pickle_load_input(s, n, 625000, &v, &e);
  free(s);
  cr_assert_eq(rc, 0, "%s", e.msg);
  cr_assert(v->kind == BS_PV_LIST && v->u.seq.n == 280000);
  const struct bs_pickle *p = pickle_fixture_unpickler();
  cr_assert_gt(p->total, 8u * 1048576 + 24u * 625000, "%" PRIu64, p->total);
  cr_assert_leq(p->total, mem_bound(625000));
}
