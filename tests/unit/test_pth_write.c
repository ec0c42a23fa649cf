/* The PyTorch writer on memory sinks: every dtype torch stores read back by
 * our reader in key order, the zip's structure byte by byte (64-byte aligned
 * member data through torch's "FB" extra, data descriptors, CRCs, the zip64
 * end records, the archive prefix), refusals naming the tensor, and
 * out-of-memory at every step. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "bs_test.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "formats/formats.h"
#include "formats/pth_write.h"
#include "formats/writers.h"

static struct bs_buf write_mem(const struct bs_catalog *cat, const char *name)
{
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, name);
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_pth_write(cat, &k, &err), 0, "%s", err.msg);
  return b;
}

static int read_mem(struct bs_catalog *cat, const void *d, size_t n, bs_err *err)
{
  bs_test_mem_catalog(cat, d, n);
  return bs_pth_read(cat, 0, NULL, err);
}

static const enum bs_dtype all[] = {
    BS_DT_F64,     BS_DT_F32,     BS_DT_F16,         BS_DT_BF16,        BS_DT_I64,
    BS_DT_I32,     BS_DT_I16,     BS_DT_I8,          BS_DT_U8,          BS_DT_BOOL,
    BS_DT_C64,     BS_DT_C128,    BS_DT_U16,         BS_DT_U32,         BS_DT_U64,
    BS_DT_F8_E4M3, BS_DT_F8_E5M2, BS_DT_F8_E4M3FNUZ, BS_DT_F8_E5M2FNUZ, BS_DT_F8_E8M0};
enum { N = sizeof all / sizeof all[0] };

Test(pth_write, every_torch_dtype_round_trips_in_key_order)
{
  uint8_t mem[N * 256];
  for (size_t i = 0; i < sizeof mem; i++)
    mem[i] = (uint8_t)(i * 13 + 5);
  for (size_t i = 0; i < N; i++)
    if (all[i] == BS_DT_BOOL)
      for (size_t j = 0; j < 256; j++)
        mem[i * 256 + j] &= 1;
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  for (size_t i = 0; i < N; i++) {
    char name[32]; /* names not in sorted order: the catalog's order is kept */
    snprintf(name, sizeof name, "%c.layer.%s", (char)('z' - i), bs_dtype_name(all[i]));
    bs_test_add(&cat, name, all[i], 3, (uint64_t[]){2, 1, 4}, i * 256);
  }
  bs_test_add(&cat, "scalar", BS_DT_I64, 0, NULL, 0);
  bs_test_add(&cat, "empty", BS_DT_F32, 2, (uint64_t[]){0, 3}, 0);
  bs_test_add(&cat, "rank5", BS_DT_U8, 5, (uint64_t[]){1, 2, 1, 2, 3}, 7);
  struct bs_buf b = write_mem(&cat, "/some/dir/model.v1.pth");
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog back;
  cr_assert_eq(read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, cat.count);
  cr_assert_null(back.values_json, "nothing but tensors");
  for (size_t i = 0; i < cat.count; i++) {
    const struct bs_tensor *t = &cat.tensors[i], *u = &back.tensors[i];
    cr_assert_str_eq(u->key, t->key, "key order kept");
    cr_assert_eq(u->dtype, t->dtype, "%s", t->key);
    cr_assert_eq(u->rank, t->rank, "%s", t->key);
    for (uint32_t d = 0; d < t->rank; d++)
      cr_assert_eq(u->shape[d], t->shape[d]);
    cr_assert_eq(u->nbytes, t->nbytes);
    cr_assert_null(u->x->strides, "%s: written contiguous", t->key);
    cr_assert_arr_eq(b.data + u->off, mem + t->off, t->nbytes, "%s", t->key);
  }
  struct bs_buf again = write_mem(&back, "/else/where/model.v1.pt");
  cr_assert_eq(again.len, b.len);
  cr_assert_arr_eq(again.data, b.data, b.len, "a file this writer made is canonical");
  bs_buf_destroy(&again);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

static bool has(const struct bs_buf *b, const char *s, size_t n)
{
  return memmem(b->data, b->len, s, n) != NULL;
}

Test(pth_write, torch_2_dtypes_are_untyped_storages_rebuilt_by_v3)
{
  uint8_t mem[64];
  for (size_t i = 0; i < sizeof mem; i++)
    mem[i] = (uint8_t)i;
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "f8", BS_DT_F8_E4M3, 2, (uint64_t[]){2, 3}, 0);
  bs_test_add(&cat, "u64", BS_DT_U64, 1, (uint64_t[]){3}, 8);
  bs_test_add(&cat, "e8m0", BS_DT_F8_E8M0, 1, (uint64_t[]){5}, 32);
  struct bs_buf b = write_mem(&cat, "m.pth");
  static const char v3[] = "ctorch._utils\n_rebuild_tensor_v3\n", v2[] = "_rebuild_tensor_v2";
  static const char un[] = "ctorch.storage\nUntypedStorage\n";
  cr_assert(has(&b, v3, sizeof v3 - 1) && has(&b, un, sizeof un - 1), "v3 and UntypedStorage");
  cr_assert(!has(&b, v2, sizeof v2 - 1), "no legacy storage class, no _rebuild_tensor_v2");
  static const char d1[] = "ctorch\nfloat8_e4m3fn\n", d2[] = "ctorch\nuint64\n",
                    d3[] = "ctorch\nfloat8_e8m0fnu\n";
  cr_assert(has(&b, d1, sizeof d1 - 1) && has(&b, d2, sizeof d2 - 1) && has(&b, d3, sizeof d3 - 1),
            "each tensor's torch dtype, as _rebuild_tensor_v3's 7th argument");
  /* the persistent id's numel is the storage's bytes: 'cpu' (memo), K 24, TUPLE */
  static const char n24[] = {'K', 24, 't', 'Q'};
  cr_assert(has(&b, n24, sizeof n24), "u64's UntypedStorage numel is 24 bytes, not 3 elements");
  struct bs_catalog back;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, 3);
  for (size_t i = 0; i < 3; i++) {
    cr_assert_str_eq(back.tensors[i].key, cat.tensors[i].key);
    cr_assert_eq(back.tensors[i].dtype, cat.tensors[i].dtype, "%s", cat.tensors[i].key);
    cr_assert_eq(back.tensors[i].nbytes, cat.tensors[i].nbytes);
    cr_assert_arr_eq(b.data + back.tensors[i].off, mem + cat.tensors[i].off, cat.tensors[i].nbytes);
  }
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

/* Walk the central directory; check every member against its local header. */
static size_t check_zip(const struct bs_buf *b, const char *prefix, char names[][64], size_t max)
{
  const uint8_t *d = b->data;
  size_t n = b->len;
  cr_assert_geq(n, 98);
  const uint8_t *eocd = d + n - 22, *loc = d + n - 42, *z64 = d + n - 98;
  cr_assert_eq(bs_le32(eocd), 0x06054b50u, "classic end record last");
  cr_assert_eq(bs_le32(loc), 0x07064b50u, "zip64 locator before it");
  cr_assert_eq(bs_le64(loc + 8), (uint64_t)(n - 98), "the locator points at the zip64 end");
  cr_assert_eq(bs_le32(z64), 0x06064b50u, "zip64 end record, always (as torch)");
  uint64_t count = bs_le64(z64 + 32), cd_size = bs_le64(z64 + 40), cd_off = bs_le64(z64 + 48);
  cr_assert_eq(bs_le16(eocd + 10), count);
  cr_assert_eq(cd_off + cd_size, (uint64_t)(n - 98));
  cr_assert_leq(count, max);
  uint64_t p = cd_off;
  for (uint64_t i = 0; i < count; i++) {
    const uint8_t *c = d + p;
    cr_assert_eq(bs_le32(c), 0x02014b50u);
    cr_assert_eq(bs_le16(c + 8), 0x0808, "data descriptor + UTF-8 flags");
    cr_assert_eq(bs_le16(c + 10), 0, "stored");
    uint32_t crc = bs_le32(c + 16), size = bs_le32(c + 24);
    cr_assert_eq(bs_le32(c + 20), size);
    uint16_t nlen = bs_le16(c + 28), xlen = bs_le16(c + 30);
    cr_assert_eq(xlen, 0, "no extra field in a small file's central entries");
    uint32_t lo = bs_le32(c + 42);
    cr_assert_lt(nlen, 64);
    memcpy(names[i], c + 46, nlen);
    names[i][nlen] = '\0';
    cr_assert_eq(strncmp(names[i], prefix, strlen(prefix)), 0, "%s", names[i]);
    cr_assert_eq(names[i][strlen(prefix)], '/');
    const uint8_t *l = d + lo;
    cr_assert_eq(bs_le32(l), 0x04034b50u);
    cr_assert_eq(bs_le16(l + 6), 0x0808);
    cr_assert_eq(bs_le32(l + 14), 0, "CRC in the descriptor");
    cr_assert_eq(bs_le32(l + 18), 0, "sizes in the descriptor");
    cr_assert_eq(bs_le16(l + 26), nlen);
    cr_assert_arr_eq(l + 30, c + 46, nlen);
    uint16_t lx = bs_le16(l + 28);
    const uint8_t *x = l + 30 + nlen;
    cr_assert_eq(bs_le16(x), 0x4246, "torch's FB padding extra");
    cr_assert_eq(bs_le16(x + 2) + 4u, lx, "the only extra of a small member");
    for (unsigned j = 0; j < bs_le16(x + 2); j++)
      cr_assert_eq(x[4 + j], 'Z');
    uint64_t data = lo + 30u + nlen + lx;
    cr_assert_eq(data % BS_PTH_ALIGN, 0, "%s: data at %llu", names[i], (unsigned long long)data);
    cr_assert_eq((uint32_t)crc32(0, d + data, size), crc, "%s: CRC", names[i]);
    const uint8_t *dd = d + data + size;
    cr_assert_eq(bs_le32(dd), 0x08074b50u);
    cr_assert_eq(bs_le32(dd + 4), crc);
    cr_assert_eq(bs_le32(dd + 8), size);
    cr_assert_eq(bs_le32(dd + 12), size);
    p += 46u + nlen + xlen;
  }
  cr_assert_eq(p, cd_off + cd_size);
  return (size_t)count;
}

Test(pth_write, zip_layout_is_torchs)
{
  uint8_t mem[100];
  for (size_t i = 0; i < sizeof mem; i++)
    mem[i] = (uint8_t)i;
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "a", BS_DT_F32, 1, (uint64_t[]){3}, 0);
  bs_test_add(&cat, "bb", BS_DT_U8, 1, (uint64_t[]){77}, 13);
  bs_test_add(&cat, "c", BS_DT_F16, 0, NULL, 2);
  struct bs_buf b = write_mem(&cat, "/tmp/x/pytorch_model.bin");
  char names[8][64];
  size_t n = check_zip(&b, "pytorch_model", names, 8);
  static const char *const want[] = {"pytorch_model/data.pkl", "pytorch_model/byteorder",
                                     "pytorch_model/data/0",   "pytorch_model/data/1",
                                     "pytorch_model/data/2",   "pytorch_model/version"};
  cr_assert_eq(n, 6);
  for (size_t i = 0; i < n; i++)
    cr_assert_str_eq(names[i], want[i]);
  const uint8_t *pkl = b.data + 64;
  cr_assert_eq(pkl[0], 0x80);
  cr_assert_eq(pkl[1], 2, "pickle protocol 2");
  cr_assert(memmem(b.data, b.len, "ccollections\nOrderedDict\n", 25));
  cr_assert(memmem(b.data, b.len, "ctorch._utils\n_rebuild_tensor_v2\n", 33));
  cr_assert(memmem(b.data, b.len, "little", 6));
  cr_assert(memmem(b.data, b.len, "3\n", 2));
  bs_buf_destroy(&b);
  /* A name that is not plain ASCII: the prefix torch uses for file objects. */
  b = write_mem(&cat, "/tmp/m\xc3\xa9.pth");
  cr_assert_eq(check_zip(&b, "archive", names, 8), 6);
  bs_buf_destroy(&b);
  b = write_mem(&cat, ".pth");
  cr_assert_eq(check_zip(&b, "archive", names, 8), 6);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

Test(pth_write, an_empty_state_dict_is_a_valid_file)
{
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, "", 0);
  struct bs_buf b = write_mem(&cat, "e.pth");
  char names[4][64];
  cr_assert_eq(check_zip(&b, "e", names, 4), 3);
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog back;
  cr_assert_eq(read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, 0);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

Test(pth_write, many_tensors_use_long_memo_and_batched_setitems)
{
  enum { M = 2100 };
  static uint8_t mem[M * 4];
  for (size_t i = 0; i < sizeof mem; i++)
    mem[i] = (uint8_t)(i * 7);
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  for (size_t i = 0; i < M; i++) {
    char name[32];
    snprintf(name, sizeof name, "layers.%zu.w", i);
    bs_test_add(&cat, name, i % 2 ? BS_DT_F32 : BS_DT_I32, 1, (uint64_t[]){1}, i * 4);
  }
  struct bs_buf b = write_mem(&cat, "big.pth");
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog back;
  cr_assert_eq(read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  cr_assert_eq(back.count, M);
  for (size_t i = 0; i < M; i++) {
    cr_assert_str_eq(back.tensors[i].key, cat.tensors[i].key);
    cr_assert_eq(back.tensors[i].dtype, cat.tensors[i].dtype);
    cr_assert_arr_eq(b.data + back.tensors[i].off, mem + i * 4, 4);
  }
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

Test(pth_write, strided_views_are_written_contiguous)
{
  /* a (2,3) F32 storage, its transpose as (3,2) with strides (1,3) */
  float s[6] = {0, 1, 2, 3, 4, 5};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, s, sizeof s);
  struct bs_tensor *t = bs_test_add(&cat, "t", BS_DT_F32, 2, (uint64_t[]){3, 2}, 0);
  cr_assert_not_null(bs_tensor_x(&cat, t));
  t->x->strides = bs_malloc(2 * sizeof *t->x->strides);
  cr_assert_not_null(t->x->strides);
  t->x->strides[0] = 1, t->x->strides[1] = 3;
  t->x->storage_off = 0;
  t->x->storage_bytes = sizeof s;
  struct bs_buf b = write_mem(&cat, "v.pth");
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog back;
  cr_assert_eq(read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  float want[6] = {0, 3, 1, 4, 2, 5};
  cr_assert_null(back.tensors[0].x->strides);
  cr_assert_arr_eq(b.data + back.tensors[0].off, want, sizeof want);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

static void expect_refused(enum bs_dtype dt, const char *words)
{
  bs_test_writer_refuses("o.pth", dt, words);
}

Test(pth_write, dtypes_without_a_torch_storage_are_refused_naming_the_tensor)
{
  expect_refused(BS_DT_FLEX32, "user.burnstore.dtype to F32");
  expect_refused(BS_DT_BOOL_U8, "user.burnstore.dtype to BOOL");
  expect_refused(BS_DT_QI8, "convert --as F32 dequantizes");
  expect_refused(BS_DT_QFLOAT, "Burnpack");
}

/* F4 as torch's float4_e2m1fn_x2: the bytes as they are, the last
 * dimension halved in the pickle, read back as F4 of the same shape; an
 * odd last dimension is refused. */
Test(pth_write, f4_as_float4_e2m1fn_x2)
{
  uint8_t mem[8] = {0x21, 0x43, 0x65, 0x87, 0xa9, 0xcb, 0xed, 0x0f};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "w", BS_DT_F4, 2, (uint64_t[]){2, 8}, 0);
  struct bs_buf b = write_mem(&cat, "f4.pth");
  cr_assert(memmem(b.data, b.len, "float4_e2m1fn_x2", 16) != NULL);
  /* the size (2, 4) and strides (4, 1) as TUPLE2s of BININT1 */
  cr_assert(memmem(b.data, b.len, "K\x02K\x04\x86", 5) != NULL, "size (2, 4)");
  bs_err err;
  bs_err_clear(&err);
  struct bs_catalog back;
  cr_assert_eq(read_mem(&back, b.data, b.len, &err), 0, "%s", err.msg);
  const struct bs_tensor *t = &back.tensors[0];
  cr_assert(t->dtype == BS_DT_F4 && t->rank == 2 && t->shape[0] == 2 && t->shape[1] == 8 &&
            t->nbytes == 8 && !t->x->unsupported);
  cr_assert_arr_eq(b.data + t->off, mem, 8);
  bs_catalog_destroy(&back);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "odd", BS_DT_F4, 2, (uint64_t[]){2, 3}, 0);
  bs_err_clear(&err);
  cr_assert_eq(bs_writer_check(bs_writer_for_path("o.pth"), &cat, &err), -1);
  cr_assert(err.code == ENOTSUP && strcmp(err.key, "odd") == 0 && strstr(err.msg, "even"), "%s",
            err.msg);
  bs_catalog_destroy(&cat);
}

Test(pth_write, bad_names_and_sizes_are_refused)
{
  uint8_t mem[64] = {0};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "a\xff", BS_DT_F32, 1, (uint64_t[]){1}, 0);
  struct bs_buf b = {0};
  struct bs_sink k;
  bs_sink_init_mem(&k, &b, "mem");
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_pth_write(&cat, &k, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert(strstr(err.msg, "UTF-8"), "%s", err.msg);
  bs_catalog_destroy(&cat);
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "w", BS_DT_F32, 1, (uint64_t[]){1}, 0);
  bs_test_add(&cat, "w", BS_DT_F32, 1, (uint64_t[]){1}, 4);
  bs_err_clear(&err);
  cr_assert_eq(bs_pth_write(&cat, &k, &err), -1);
  cr_assert(strstr(err.msg, "unique"), "%s", err.msg);
  bs_catalog_destroy(&cat);
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "w", BS_DT_F32, 1, (uint64_t[]){2}, 0)->nbytes = 4;
  bs_err_clear(&err);
  cr_assert_eq(bs_pth_write(&cat, &k, &err), -1);
  cr_assert_str_eq(err.key, "w");
  cr_assert(strstr(err.msg, "need 8"), "%s", err.msg);
  bs_catalog_destroy(&cat);
  bs_buf_destroy(&b);
}

Test(pth_write, out_of_memory_at_every_step)
{
  uint8_t mem[64] = {1, 2, 3};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "a", BS_DT_F32, 2, (uint64_t[]){2, 2}, 0);
  bs_test_add(&cat, "b", BS_DT_BF16, 1, (uint64_t[]){3}, 16);
  bs_test_write_survives_oom(bs_pth_write, &cat);
  bs_catalog_destroy(&cat);
}

Test(pth_write, a_flat_state_dict_can_be_rewritten_in_place)
{
  uint8_t mem[16] = {1, 2, 3, 4};
  struct bs_catalog cat;
  bs_test_mem_catalog(&cat, mem, sizeof mem);
  bs_test_add(&cat, "w", BS_DT_F32, 1, (uint64_t[]){2}, 0);
  struct bs_buf b = write_mem(&cat, "flat.pth");
  struct bs_src s;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_src_init_mem(&s, b.data, b.len, "flat.pth", &err), 0);
  struct bs_pth_keep keep;
  cr_assert_eq(bs_pth_keep_check(&s, &keep, &err), 0, "%s", err.msg);
  cr_assert_not_null(keep.root);
  bs_pth_keep_destroy(&keep);
  /* In place (the sink names the source file): the same bytes. */
  char path[] = "/tmp/bs-pthw-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, b.data, b.len), (ssize_t)b.len);
  close(fd);
  struct bs_catalog back;
  struct bs_src fs;
  bs_catalog_init(&back);
  uint32_t idx;
  cr_assert_eq(bs_src_open(&fs, path, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_catalog_add_src(&back, &fs, &idx, &err), 0);
  cr_assert_eq(bs_pth_read(&back, 0, NULL, &err), 0, "%s", err.msg);
  cr_assert_str_eq(back.srcs[0].name, path);
  struct bs_buf again = write_mem(&back, path);
  unlink(path);
  struct bs_catalog third;
  cr_assert_eq(read_mem(&third, again.data, again.len, &err), 0, "%s", err.msg);
  cr_assert_eq(third.count, 1);
  cr_assert_str_eq(third.tensors[0].key, "w");
  bs_catalog_destroy(&third);
  bs_buf_destroy(&again);
  bs_catalog_destroy(&back);
  bs_src_destroy(&s);
  bs_buf_destroy(&b);
  bs_catalog_destroy(&cat);
}

Test(pth_write, only_torch_zip_files_are_checked_for_in_place)
{
  static const uint8_t legacy[] = {0x80, 0x02, 0x8A, 0x0A, 0x6C, 0xFC, 0x9C, 0x46, 0xF9, 0x20, 0x6A,
                                   0xA8, 0x50, 0x19, 0x2E, 0x80, 0x02, 0x4D, 0xE9, 0x03, 0x2E};
  struct bs_src s;
  bs_err err;
  bs_err_clear(&err);
  cr_assert_eq(bs_src_init_mem(&s, legacy, sizeof legacy, "l.pth", &err), 0);
  struct bs_pth_keep keep;
  cr_assert_eq(bs_pth_keep_check(&s, &keep, &err), -1);
  cr_assert(strstr(err.msg, "legacy"), "%s", err.msg);
  bs_pth_keep_destroy(&keep);
  bs_src_destroy(&s);
}
