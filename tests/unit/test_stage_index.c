/* The staging INDEX: round trips of an output catalog, refusal of cut or
 * hostile INDEX files, saving and reattaching the byte sources. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/decode.h"
#include "formats/burnpack_write.h"
#include "policy/stage_index.h"

static bs_err err;
static void reset(void)
{
  bs_err_clear(&err);
}
TestSuite(stage_index, .init = reset);

static const uint8_t ckbytes[64] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static const uint8_t stbytes[16] = {0xAA, 0xBB, 0xCC, 0xDD};

/* An output catalog like fs_writeback builds: srcs[0] is the checkpoint,
 * srcs[1] a staging file; contiguous, strided, QFloat and empty tensors. */
static void build(struct bs_catalog *c)
{
  bs_catalog_init(c);
  c->format = BS_FMT_BURNPACK;
  struct bs_src s;
  uint32_t i;
  cr_assert_eq(bs_src_init_mem(&s, ckbytes, sizeof ckbytes, "/ck.bpk", &err), 0);
  cr_assert_eq(bs_catalog_add_src(c, &s, &i, &err), 0);
  cr_assert_eq(bs_src_init_mem(&s, stbytes, sizeof stbytes, "/stage dir/7", &err), 0);
  cr_assert_eq(bs_catalog_add_src(c, &s, &i, &err), 0);
  uint64_t sh[2] = {2, 3};
  struct bs_tensor *t = bs_catalog_add(c, "enc.w\tx%\n\xc3\xa9", BS_DT_U8, 2, sh, 0, &err);
  cr_assert_not_null(t);
  t->src = 0;
  t->off = 8;
  t->has_param_id = true;
  cr_assert_not_null(bs_tensor_x(c, t));
  t->x->param_id = UINT64_MAX;
  t = bs_catalog_add(c, "view", BS_DT_U16, 2, sh, 0, &err);
  cr_assert_not_null(t);
  t->src = 0;
  t->off = 4;
  cr_assert_not_null(bs_tensor_x(c, t));
  t->x->strides = bs_malloc(2 * sizeof *t->x->strides);
  t->x->strides[0] = 1;
  t->x->strides[1] = 2;
  t->x->storage_off = 1;
  t->x->storage_bytes = 20;
  t = bs_catalog_add(c, "q", BS_DT_QFLOAT, 1, sh, 0, &err);
  cr_assert_not_null(t);
  t->src = 1;
  t->off = 0;
  t->nbytes = 16;
  cr_assert_not_null(bs_tensor_x(c, t));
  t->x->dtype_raw = bs_malloc(3);
  memcpy(t->x->dtype_raw, "\xa1\x01\x02", 3);
  t->x->dtype_raw_len = 3;
  t = bs_catalog_add(c, "", BS_DT_F32, 0, NULL, 0, &err); /* rank 0, empty key */
  cr_assert_not_null(t);
  t->src = 1;
  t->off = 12;
  uint64_t z = 0;
  t = bs_catalog_add(c, "empty", BS_DT_F32, 1, &z, 0, &err);
  cr_assert_not_null(t);
  t->src = UINT32_MAX;
  cr_assert_eq(bs_catalog_add_meta(c, "note", "a\tb %41\n", &err), 0);
  cr_assert_eq(bs_catalog_add_meta(c, "", "", &err), 0);
  /* a GGUF value left in the checkpoint: where it is, not its text */
  struct bs_meta_ref r = {.format = BS_FMT_GGUF,
                          .src = 0,
                          .types = {9, 8},
                          .off = 16,
                          .len = 20,
                          .text_len = 1234}; /* an array of strings */
  struct bs_kv kv = {"tokenizer.ggml.tokens", NULL, &r, false};
  cr_assert_eq(bs_catalog_add_meta_kv(c, &kv, &err), 0);
}

static void head(struct bs_stage_index *h)
{
  bs_stage_index_init(h);
  h->pid = 4242;
  h->target = "/out dir/m.bpk";
  h->format = BS_FMT_BURNPACK;
  h->ncksrcs = 1;
  h->ck.path = "/ck.bpk";
  h->ck.size = sizeof ckbytes;
  h->ck.dev = 1;
  h->ck.ino = 99;
  h->ck.mtime_sec = 1700000000;
  h->ck.mtime_nsec = 123456789;
  h->has_mode = true;
  h->mode = 0640;
}

static void format(struct bs_buf *b)
{
  struct bs_catalog c;
  struct bs_stage_index h;
  build(&c);
  head(&h);
  memset(b, 0, sizeof *b);
  cr_assert_eq(bs_stage_index_format(&h, &c, "/stage dir", b, &err), 0, "%s", err.msg);
  bs_catalog_destroy(&c);
}

Test(stage_index, round_trip)
{
  struct bs_buf b;
  format(&b);
  struct bs_stage_index idx;
  cr_assert_eq(bs_stage_index_parse(b.data, b.len, &idx, &err), 0, "%s", err.msg);
  cr_assert_eq(idx.pid, 4242);
  cr_assert_str_eq(idx.target, "/out dir/m.bpk");
  cr_assert_eq(idx.format, BS_FMT_BURNPACK);
  cr_assert_str_eq(idx.ck.path, "/ck.bpk");
  cr_assert_eq(idx.ck.ino, 99);
  cr_assert_eq(idx.ck.mtime_nsec, 123456789);
  cr_assert(idx.has_mode);
  cr_assert_eq(idx.mode, 0640);
  cr_assert_eq(idx.nsrcs, 2);
  cr_assert_eq(idx.ncksrcs, 1);
  cr_assert(idx.srcs[1].stage);
  cr_assert_str_eq(idx.srcs[1].file, "7");
  cr_assert_eq(idx.srcs[1].size, sizeof stbytes);
  struct bs_catalog c;
  build(&c);
  cr_assert_eq(idx.cat.count, c.count);
  for (size_t i = 0; i < c.count; i++) {
    const struct bs_tensor *x = &c.tensors[i], *y = &idx.cat.tensors[i];
    cr_assert_str_eq(y->name, x->name);
    cr_assert_eq(y->dtype, x->dtype);
    cr_assert_eq(y->rank, x->rank);
    if (x->rank)
      cr_assert_eq(memcmp(y->shape, x->shape, x->rank * sizeof *x->shape), 0);
    cr_assert_eq(y->nbytes, x->nbytes);
    cr_assert_eq(y->src, x->src);
    cr_assert_eq(y->off, x->off);
    cr_assert_eq(y->has_param_id, x->has_param_id);
    cr_assert_eq(y->x->param_id, x->x->param_id);
    cr_assert_eq(!!y->x->strides, !!x->x->strides);
    if (x->x->strides) {
      cr_assert_eq(memcmp(y->x->strides, x->x->strides, x->rank * sizeof *x->x->strides), 0);
      cr_assert_eq(y->x->storage_off, x->x->storage_off);
      cr_assert_eq(y->x->storage_bytes, x->x->storage_bytes);
    }
    cr_assert_eq(y->x->dtype_raw_len, x->x->dtype_raw_len);
    if (x->x->dtype_raw_len)
      cr_assert_eq(memcmp(y->x->dtype_raw, x->x->dtype_raw, x->x->dtype_raw_len), 0);
  }
  cr_assert_eq(idx.cat.nmeta, 3);
  cr_assert_str_eq(idx.cat.meta[0].value, "a\tb %41\n");
  cr_assert_str_eq(idx.cat.meta[1].key, "");
  const struct bs_kv *kv = &idx.cat.meta[2];
  cr_assert(kv->ref && !kv->value && strcmp(kv->key, "tokenizer.ggml.tokens") == 0);
  const struct bs_meta_ref *a = kv->ref, *w = c.meta[2].ref;
  cr_assert(a->format == w->format && a->src == w->src && a->off == w->off && a->len == w->len &&
                a->text_len == w->text_len && memcmp(a->types, w->types, sizeof a->types) == 0,
            "the ref read back");
  bs_catalog_destroy(&c);
  bs_stage_index_destroy(&idx);
  bs_buf_destroy(&b);
}

/* A cut INDEX (a crash before the atomic rename cannot leave one, but a
 * copied or damaged one can) is refused at every length. */
Test(stage_index, every_cut_is_refused)
{
  struct bs_buf b;
  format(&b);
  for (size_t n = 0; n < b.len; n++) {
    struct bs_stage_index idx;
    bs_err_clear(&err);
    cr_assert_eq(bs_stage_index_parse(b.data, n, &idx, &err), -1, "cut at %zu accepted", n);
    cr_assert_eq(err.code, EINVAL);
    bs_stage_index_destroy(&idx);
  }
  bs_buf_destroy(&b);
}

static void refused(const char *text, const char *what)
{
  struct bs_stage_index idx;
  bs_err_clear(&err);
  cr_assert_eq(bs_stage_index_parse(text, strlen(text), &idx, &err), -1, "accepted: %s", text);
  cr_assert_not_null(strstr(err.msg, what), "'%s' not in '%s'", what, err.msg);
  bs_stage_index_destroy(&idx);
}

#define HEAD                                                                                       \
  "burnstore-staging-index\t1\npid\t1\ntarget\t/t.bpk\nformat\tburnpack\n"                         \
  "checkpoint\t/c\t64\t0\t0\t0\t0\t-\nsrc\t0\tcheckpoint\t64\nsrc\t1\tstage\t5\t8\n"

Test(stage_index, hostile_records_are_refused)
{
  refused("burnstore-staging-index\t3\n", "version 1 or 2");
  refused("burnstore-staging-index\t2\npid\t1\ntarget\t/t.bpk\nformat\tburnpack\nend\t0\n",
          "no staging record");
  refused("burnstore-staging-index\t1\nstaging\ts\ntarget\t/t.bpk\nformat\tburnpack\nend\t0\n",
          "unknown record 'staging'");
  refused("burnstore-staging-index\t2\nstaging\ta/b\ntarget\t/t.bpk\nformat\tburnpack\nend\t0\n",
          "bad staging record");
  refused("burnstore-staging-index\t2\nstaging\t..\ntarget\t/t.bpk\nformat\tburnpack\nend\t0\n",
          "bad staging record");
  refused("burnstore-staging-index\t2\nstaging\ts\nstaging\ts\ntarget\t/t.bpk\nformat\t"
          "burnpack\nend\t0\n",
          "bad staging record");
  refused(HEAD "tensor\tk\tF32\t[2]\t-\t0\t60\t8\nend\t1\n", "outside their source");
  refused(HEAD "tensor\tk\tF32\t[2]\t-\t0\t18446744073709551615\t8\nend\t1\n", "outside");
  refused(HEAD "tensor\tk\tF32\t[2]\t-\t2\t0\t8\nend\t1\n", "bad param_id, source");
  refused(HEAD "tensor\tk\tF32\t[2]\t-\t1\t0\t4\nend\t1\n", "does not match the shape");
  refused(HEAD "tensor\tk\tF32\t[18446744073709551615,2]\t-\t1\t0\t8\nend\t1\n", "");
  refused(HEAD "tensor\tk\tF32\t[99999999999999999999]\t-\t1\t0\t8\nend\t1\n", "bad shape");
  refused(HEAD "tensor\tk\tF32\t[2\t-\t1\t0\t8\nend\t1\n", "bad shape");
  refused(HEAD "tensor\tk\tF32\t[2]\t-\t-\t0\t8\nend\t1\n", "without a source");
  refused(HEAD "tensor\tk\tU8\t[2,2]\t-\t0\t0\t4\tstrided\t[1,-1]\t0\t8\nend\t1\n",
          "negative stride");
  refused(HEAD "tensor\tk\tU8\t[2,2]\t-\t0\t0\t4\tstrided\t[9,9]\t0\t8\nend\t1\n",
          "storage too short");
  refused(HEAD "tensor\tk%zz\tU8\t[2]\t-\t0\t0\t2\nend\t1\n", "bad escape");
  refused(HEAD "tensor\tk%00\tU8\t[2]\t-\t0\t0\t2\nend\t1\n", "bad escape");
  refused(HEAD "tensor\tk\tU8\t[2]\t-\t0\t0\t2\nend\t2\n", "'end' counts");
  refused(HEAD "end\t0\ntensor\tk\tU8\t[2]\t-\t0\t0\t2\n", "after 'end'");
  refused(HEAD "bogus\t1\nend\t0\n", "unknown record");
  refused(HEAD "src\t5\tstage\tx\t1\nend\t0\n", "numbered from 0");
  refused(HEAD "src\t2\tstage\t../x\t1\nend\t0\n", "staging file name");
  /* a raw-file record names a file of the staging directory, never one out of it */
  refused(HEAD "file\t../../etc/passwd\tk\tU8\t-\nend\t0\n", "staging file name");
  refused(HEAD "file\t..\tk\tU8\t-\nend\t0\n", "staging file name");
  refused(HEAD "src\t2\tcheckpoint\t1\nend\t0\n", "come first");
  refused("burnstore-staging-index\t1\npid\t1\nformat\tburnpack\nend\t0\n", "no target");
  refused("burnstore-staging-index\t1\ntarget\trel.bpk\n", "bad target");
  refused(HEAD "end\t0", "no newline");
  refused(HEAD "mode\t0777\nend\t0\n", "bad mode");
  refused(HEAD "mode\t00644\nend\t0\n", "bad mode");
  refused(HEAD "mode\t0x1\nend\t0\n", "bad mode");
  refused(HEAD "mode\t\nend\t0\n", "bad mode");
  refused(HEAD "mode\t0600\nmode\t0600\nend\t0\n", "bad mode");
}

/* The INDEX line of a QI8 tensor of shape [2,3] (its 6 bytes at offset 0
 * of the checkpoint) whose dtype_raw is a per-channel quantizer of nch
 * channels along axis, inner elements a step. */
static void qline(char *text, size_t cap, uint32_t axis, uint64_t nch, uint64_t inner)
{
  uint8_t blob[sizeof(struct bs_torch_q) + 4 * 16] = {0};
  struct bs_torch_q h = {.scheme = BS_TQ_PER_CHANNEL, .axis = axis, .nch = nch, .inner = inner};
  memcpy(blob, &h, sizeof h);
  size_t len = sizeof h + nch * 16;
  cr_assert_leq(len, sizeof blob);
  int n = snprintf(text, cap, HEAD "tensor\tq\tQI8\t[2,3]\t-\t0\t0\t6\traw\t");
  for (size_t k = 0; k < len; k++)
    n += snprintf(text + n, cap - (size_t)n, "%02x", blob[k]);
  snprintf(text + n, cap - (size_t)n, "\nend\t1\n");
}

/* A torch quantizer read back for --finish must tile its tensor's elements
 * (nch * inner divides numel: its channels run over the flat index, so a
 * reshaped tensor keeps it); the blob's own lengths agree either way. */
Test(stage_index, quantizers_must_fit_their_tensor)
{
  char text[1024];
  struct bs_stage_index idx;
  const uint64_t ok[][3] = {{0, 2, 3}, {1, 3, 1}, {0, 3, 2}, {0, 1, 6}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    qline(text, sizeof text, (uint32_t)ok[i][0], ok[i][1], ok[i][2]);
    cr_assert_eq(bs_stage_index_parse(text, strlen(text), &idx, &err), 0, "%s", err.msg);
    bs_stage_index_destroy(&idx);
  }
  qline(text, sizeof text, 0, 2, 2); /* 4 does not divide 6 */
  refused(text, "does not fit the tensor's elements");
  qline(text, sizeof text, 0, 3, 3); /* 9 > 6 */
  refused(text, "does not fit the tensor's elements");
  /* a strided view (torch's t() of a per-tensor quantized tensor) keeps its
   * quantizer: its elements are gathered in row-major order (it was refused) */
  struct bs_torch_q pt = {.scheme = BS_TQ_PER_TENSOR, .scale = 0.5, .zp = 3};
  int n = snprintf(text, sizeof text,
                   HEAD "tensor\tq\tQU8\t[3,2]\t-\t0\t0\t6\tstrided\t[1,3]\t0\t6\traw\t");
  for (size_t k = 0; k < sizeof pt; k++)
    n += snprintf(text + n, sizeof text - (size_t)n, "%02x", ((const uint8_t *)&pt)[k]);
  snprintf(text + n, sizeof text - (size_t)n, "\nend\t1\n");
  cr_assert_eq(bs_stage_index_parse(text, strlen(text), &idx, &err), 0, "%s", err.msg);
  cr_assert(idx.cat.tensors[0].x->strides && idx.cat.tensors[0].x->dtype_raw_len == sizeof pt);
  bs_stage_index_destroy(&idx);
  /* two hex digits a byte, nothing else (sscanf's %2x read "-1" as 0xff) */
  refused(HEAD "tensor\tq\tQFLOAT\t[2]\t-\t0\t0\t6\traw\ta1-1\nend\t1\n", "bad raw dtype");
  refused(HEAD "tensor\tq\tQFLOAT\t[2]\t-\t0\t0\t6\traw\ta1 f\nend\t1\n", "bad raw dtype");
}

/* A metadata ref names a GGUF value inside a checkpoint source, in full. */
Test(stage_index, metadata_refs_must_be_in_the_checkpoint)
{
  static const char ok[] = HEAD "metaref\tk\tgguf\t0\t16\t20\t99\t09080000000000000000\nend\t0\n";
  struct bs_stage_index idx;
  cr_assert_eq(bs_stage_index_parse(ok, sizeof ok - 1, &idx, &err), 0, "%s", err.msg);
  cr_assert(idx.cat.nmeta == 1 && idx.cat.meta[0].ref && idx.cat.meta[0].ref->text_len == 99);
  bs_stage_index_destroy(&idx);
  const char *bad[] = {
      HEAD "metaref\tk\tgguf\t1\t0\t4\t9\t09080000000000000000\nend\t0\n",    /* a staged file */
      HEAD "metaref\tk\tgguf\t2\t0\t4\t9\t09080000000000000000\nend\t0\n",    /* no source 2 */
      HEAD "metaref\tk\tgguf\t0\t60\t5\t9\t09080000000000000000\nend\t0\n",   /* past its end */
      HEAD "metaref\tk\tpytorch\t0\t0\t4\t9\t09080000000000000000\nend\t0\n", /* not GGUF */
      HEAD "metaref\tk\tgguf\t0\t0\t4\t9\t090800000000000000\nend\t0\n",      /* short types */
      HEAD "metaref\tk\tgguf\t0\t0\t4\t9\t0908000000000000000g\nend\t0\n",    /* not hex */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    refused(bad[i], "bad metaref record");
}

/* A remote checkpoint (a URL mounted with output=): its record and its
 * sources' validators parse; mixed or misplaced records are refused. */
#define RHEAD "burnstore-staging-index\t1\npid\t1\ntarget\t/t.st\nformat\tsafetensors\n"

Test(stage_index, remote_checkpoint)
{
  static const char ok[] = RHEAD "remote\ths://o/r@0123/m.st\t64\t-\n"
                                 "src\t0\tremote\tIf-Match:%20%22e1%22\t64\n"
                                 "src\t1\tremote\tIf-Unmodified-Since:%20x\t32\nend\t0\n";
  struct bs_stage_index idx;
  cr_assert_eq(bs_stage_index_parse(ok, strlen(ok) - 1, &idx, &err), -1); /* (cut) */
  bs_stage_index_destroy(&idx);
  bs_err_clear(&err);
  char text[sizeof ok];
  memcpy(text, ok, sizeof ok);
  memcpy(strstr(text, "hs://"), "hf://", 5);
  cr_assert_eq(bs_stage_index_parse(text, strlen(text), &idx, &err), 0, "%s", err.msg);
  cr_expect(idx.ck.remote);
  cr_expect_str_eq(idx.ck.path, "hf://o/r@0123/m.st");
  cr_expect_eq(idx.ck.size, 64);
  cr_assert_eq(idx.ncksrcs, 2);
  cr_expect_str_eq(idx.srcs[0].validator, "If-Match: \"e1\"");
  cr_expect_str_eq(idx.srcs[1].validator, "If-Unmodified-Since: x");
  bs_stage_index_destroy(&idx);
  refused(RHEAD "remote\t/local/path\t64\t-\nend\t0\n", "a URL");
  refused(RHEAD "remote\ts3://b/k\t64\t-\nremote\ts3://b/k\t64\t-\nend\t0\n", "once");
  refused(RHEAD "remote\ts3://b/k\t64\t-\nsrc\t0\tcheckpoint\t64\nend\t0\n",
          "a local source of a remote checkpoint");
  refused(RHEAD "checkpoint\t/c\t64\t0\t0\t0\t0\t-\nsrc\t0\tremote\tx\t64\nend\t0\n",
          "a remote source of a local checkpoint");
  refused(RHEAD "src\t0\tremote\tx\t64\nend\t0\n", "without a checkpoint record");
  refused(RHEAD "remote\ts3://b/k\t64\t-\nsrc\t0\tremote\tx%zz\t64\nend\t0\n", "bad validator");
  /* no validator: --finish would read whatever the URL holds by then */
  refused(RHEAD "remote\ts3://b/k\t64\t-\nsrc\t0\tremote\t%\t64\nend\t0\n", "without a validator");
  refused(RHEAD "remote\ts3://b/k\t64\t-\nsrc\t0\tremote\t\t64\nend\t0\n", "without a validator");
}

Test(stage_index, save_load_attach)
{
  char *dir = bs_test_tmpdir("stage");
  char ck[4200], st[4200];
  snprintf(ck, sizeof ck, "%s/ck.bpk", dir);
  snprintf(st, sizeof st, "%s/7", dir);
  /* A checkpoint file that is a valid (empty) Burnpack, and a staged file. */
  struct bs_catalog empty;
  bs_catalog_init(&empty);
  cr_assert_eq(bs_bpk_write_file(&empty, NULL, ck, &err), 0, "%s", err.msg);
  bs_catalog_destroy(&empty);
  FILE *f = fopen(st, "wb");
  fwrite(stbytes, 1, sizeof stbytes, f);
  fclose(f);
  struct stat sck;
  cr_assert_eq(stat(ck, &sck), 0);

  struct bs_catalog c;
  bs_catalog_init(&c);
  struct bs_src s;
  uint32_t i;
  cr_assert_eq(bs_src_open(&s, ck, &err), 0);
  cr_assert_eq(bs_catalog_add_src(&c, &s, &i, &err), 0);
  cr_assert_eq(bs_src_open(&s, st, &err), 0);
  bs_free(s.name);
  s.name = bs_strdup(st);
  cr_assert_eq(bs_catalog_add_src(&c, &s, &i, &err), 0);
  uint64_t two = 2;
  struct bs_tensor *t = bs_catalog_add(&c, "a.b", BS_DT_U16, 1, &two, 0, &err);
  t->src = 1;
  t->off = 0;
  struct bs_stage_index h;
  bs_stage_index_init(&h);
  h.target = ck;
  h.format = BS_FMT_BURNPACK;
  h.ncksrcs = 1;
  h.ck.path = ck;
  h.ck.size = (uint64_t)sck.st_size;
  h.ck.dev = sck.st_dev;
  h.ck.ino = sck.st_ino;
  h.ck.mtime_sec = sck.st_mtim.tv_sec;
  h.ck.mtime_nsec = sck.st_mtim.tv_nsec;
  struct bs_buf b = {0};
  cr_assert_eq(bs_stage_index_format(&h, &c, dir, &b, &err), 0, "%s", err.msg);
  struct bs_stage_dir stg = {open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), dir};
  cr_assert_eq(bs_stage_index_save(stg.fd, &b, &err), 0, "%s", err.msg);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&c);

  struct bs_stage_index idx;
  cr_assert_eq(bs_stage_index_load(&stg, &idx, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_stage_index_attach(&idx, &stg, &err), 0, "%s", err.msg);
  cr_assert_eq(idx.cat.nsrcs, 2);
  uint8_t got[4];
  cr_assert_eq(bs_tensor_read(&idx.cat, &idx.cat.tensors[0], 0, got, 4), 4);
  cr_assert_eq(memcmp(got, stbytes, 4), 0);
  bs_stage_index_destroy(&idx);

  /* A staged file of another size, then a checkpoint that changed: refused. */
  cr_assert_eq(truncate(st, 3), 0);
  cr_assert_eq(bs_stage_index_load(&stg, &idx, &err), 0);
  cr_assert_eq(bs_stage_index_attach(&idx, &stg, &err), -1);
  cr_assert_eq(err.code, ESTALE, "%s", err.msg);
  bs_stage_index_destroy(&idx);
  cr_assert_eq(truncate(st, sizeof stbytes), 0);
  f = fopen(ck, "ab");
  fputc('x', f);
  fclose(f);
  bs_err_clear(&err);
  cr_assert_eq(bs_stage_index_load(&stg, &idx, &err), 0);
  cr_assert_eq(bs_stage_index_attach(&idx, &stg, &err), -1);
  cr_assert_eq(err.code, ESTALE);
  cr_assert_not_null(strstr(err.msg, "changed since the write-back started"), "%s", err.msg);
  bs_stage_index_destroy(&idx);
  close(stg.fd);
  bs_test_rmrf(dir);
  free(dir);
}

/* An INDEX names its staging directory: one copied into another (or the
 * directory renamed) is refused in one line naming both; version 1 (burnstore
 * 0.1.0's, naming none) is read anywhere. */
Test(stage_index, an_index_names_its_staging_directory)
{
  char *a = bs_test_tmpdir("stage"), *b = bs_test_tmpdir("stage");
  struct bs_stage_index h;
  head(&h);
  h.ncksrcs = 0;
  h.ck.path = NULL;
  struct bs_buf buf = {0};
  cr_assert_eq(bs_stage_index_format(&h, NULL, a, &buf, &err), 0, "%s", err.msg);
  const char *an = strrchr(a, '/') + 1, *bn = strrchr(b, '/') + 1;
  char rec[300];
  snprintf(rec, sizeof rec,
           "burnstore-staging-index\t2\npid\t4242\ntarget\t/out%%20dir/m.bpk\n"
           "staging\t%s\n",
           an);
  char *text = (char *)buf.data;
  cr_assert_not_null(strstr(text, rec), "%s", text);
  struct bs_stage_dir sa = {open(a, O_RDONLY | O_DIRECTORY | O_CLOEXEC), a},
                      sb = {open(b, O_RDONLY | O_DIRECTORY | O_CLOEXEC), b};
  cr_assert_eq(bs_stage_index_save(sa.fd, &buf, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_stage_index_save(sb.fd, &buf, &err), 0, "%s", err.msg);
  struct bs_stage_index idx;
  cr_assert_eq(bs_stage_index_load(&sa, &idx, &err), 0, "%s", err.msg);
  cr_assert_str_eq(idx.staging, an);
  bs_stage_index_destroy(&idx);
  /* its directory reached as "." (--list-staging .): its name from the fd */
  struct bs_stage_dir dot = {sa.fd, "."};
  cr_assert_eq(bs_stage_index_load(&dot, &idx, &err), 0, "%s", err.msg);
  bs_stage_index_destroy(&idx);
  cr_assert_eq(bs_stage_index_load(&sb, &idx, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  char want[600];
  snprintf(want, sizeof want,
           "%s/INDEX was written in %s, not in this staging directory (%s): copied from "
           "another? not used (its target: /out dir/m.bpk)",
           b, an, bn);
  cr_assert_str_eq(err.msg, want);
  cr_assert_null(idx.staging);
  bs_stage_index_destroy(&idx);
  /* version 1 names no directory: read as it is (burnstore 0.1.0's) */
  char *v1 = strstr(text, "\t2\n");
  v1[1] = '1';
  char *st = strstr(text, "staging\t");
  char *nl = strchr(st, '\n');
  memmove(st, nl + 1, strlen(nl + 1) + 1);
  buf.len = strlen(text);
  cr_assert_eq(bs_stage_index_save(sb.fd, &buf, &err), 0, "%s", err.msg);
  bs_err_clear(&err);
  cr_assert_eq(bs_stage_index_load(&sb, &idx, &err), 0, "%s", err.msg);
  cr_assert_null(idx.staging);
  bs_stage_index_destroy(&idx);
  bs_buf_destroy(&buf);
  close(sa.fd);
  close(sb.fd);
  bs_test_rmrf(a);
  bs_test_rmrf(b);
  free(a);
  free(b);
}

Test(stage_index, no_index_is_a_clear_error)
{
  char *dir = bs_test_tmpdir("stage");
  struct bs_stage_dir stg = {open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), dir};
  struct bs_stage_index idx;
  cr_assert_eq(bs_stage_index_load(&stg, &idx, &err), -1);
  cr_assert_eq(err.code, ENOENT);
  cr_assert_not_null(strstr(err.msg, "no INDEX"));
  bs_stage_index_destroy(&idx);
  close(stg.fd);
  bs_test_rmrf(dir);
  free(dir);
}

Test(stage_index, output_as_round_trips_and_bad_ones_are_refused)
{
  static const char head[] = "burnstore-staging-index\t1\ntarget\t/t/x.safetensors\nformat\t"
                             "safetensors\n";
  char text[256];
  struct bs_stage_index idx;
  const char *bad[] = {"F64", "I32", "nonsense", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(text, sizeof text, "%soutput_as\t%s\nend\t0\n", head, bad[i]);
    bs_stage_index_init(&idx);
    bs_err e;
    bs_err_clear(&e);
    cr_assert_eq(bs_stage_index_parse(text, strlen(text), &idx, &e), -1, "%s", bad[i]);
    cr_assert(strstr(e.msg, "bad output_as"), "%s", e.msg);
    bs_stage_index_destroy(&idx);
  }
  snprintf(text, sizeof text, "%soutput_as\tF16\noutput_as\tF16\nend\t0\n", head);
  bs_stage_index_init(&idx);
  bs_err e;
  bs_err_clear(&e);
  cr_assert_eq(bs_stage_index_parse(text, strlen(text), &idx, &e), -1, "only once");
  bs_stage_index_destroy(&idx);
  snprintf(text, sizeof text, "%soutput_as\tBF16\nend\t0\n", head);
  bs_stage_index_init(&idx);
  bs_err_clear(&e);
  cr_assert_eq(bs_stage_index_parse(text, strlen(text), &idx, &e), 0, "%s", e.msg);
  cr_assert(idx.has_output_as && idx.output_as == BS_DT_BF16);
  struct bs_buf buf = {0};
  idx.pid = 1;
  cr_assert_eq(bs_stage_index_format(&idx, &idx.cat, "/t/stg", &buf, &e), 0, "%s", e.msg);
  cr_assert_not_null(memmem(buf.data, buf.len, "\noutput_as\tBF16\n", 16));
  bs_buf_destroy(&buf);
  bs_stage_index_destroy(&idx);
}
