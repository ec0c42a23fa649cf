/* npy.c: the .npy header built for the views (byte-exact against what
 * numpy.save writes) and the parser for .npy files written into a mount,
 * on hostile headers; adapter.c on an in-memory catalog. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/npy.h"
#include "policy/adapter.h"

static bs_err err;
static void reset(void)
{
  bs_err_clear(&err);
}
TestSuite(npy, .init = reset);
TestSuite(adapter, .init = reset);

/* numpy.save(f, np.zeros((2, 3), np.float32)): the first 128 bytes. */
static const char numpy_f32_2x3[] =
    "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

Test(npy, header_matches_numpy_save)
{
  char buf[BS_NPY_MAX_HEADER];
  size_t len;
  uint64_t shape[] = {2, 3};
  cr_assert_eq(bs_npy_header(BS_DT_F32, 2, shape, buf, sizeof buf, &len, &err), 0, "%s", err.msg);
  cr_assert_eq(len, 128);
  size_t n = sizeof numpy_f32_2x3 - 1;
  cr_assert_eq(memcmp(buf, numpy_f32_2x3, n), 0);
  for (size_t i = n; i < 127; i++)
    cr_assert_eq(buf[i], ' ');
  cr_assert_eq(buf[127], '\n');
  cr_assert_eq(bs_npy_header_len(BS_DT_F32, 2, shape), 128);
}

Test(npy, header_one_d_scalar_and_descrs)
{
  char buf[BS_NPY_MAX_HEADER];
  size_t len;
  uint64_t five = 5;
  cr_assert_eq(bs_npy_header(BS_DT_I64, 1, &five, buf, sizeof buf, &len, &err), 0);
  cr_assert(memmem(buf, len, "'shape': (5,), }", sizeof "'shape': (5,), }" - 1) != NULL,
            "1-D is a one-tuple");
  cr_assert(memmem(buf, len, "'<i8'", sizeof "'<i8'" - 1) != NULL);
  cr_assert_eq(bs_npy_header(BS_DT_BOOL, 0, NULL, buf, sizeof buf, &len, &err), 0);
  cr_assert(memmem(buf, len, "'shape': (), }", sizeof "'shape': (), }" - 1) != NULL &&
            memmem(buf, len, "'|b1'", sizeof "'|b1'" - 1) != NULL);
  bool exact;
  cr_assert_str_eq(bs_npy_descr(BS_DT_BF16, &exact), "<u2");
  cr_assert(!exact);
  cr_assert_str_eq(bs_npy_descr(BS_DT_F8_E5M2, &exact), "|u1");
  cr_assert(!exact);
  cr_assert_str_eq(bs_npy_descr(BS_DT_C128, &exact), "<c16");
  cr_assert(exact);
  cr_assert_null(bs_npy_descr(BS_DT_F4, NULL));
  cr_assert_null(bs_npy_descr(BS_DT_QFLOAT, NULL));
  cr_assert_eq(bs_npy_header(BS_DT_F4, 1, &five, buf, sizeof buf, &len, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  reset();
  cr_assert_eq(bs_npy_header(BS_DT_F32, 1, &five, buf, 64, &len, &err), -1, "cap too small");
  cr_assert_eq(err.code, ENAMETOOLONG);
}

Test(npy, header_round_trips_every_dtype_and_rank_64)
{
  static char buf[BS_NPY_MAX_HEADER];
  uint64_t shape[BS_MAX_RANK];
  for (int r = 0; r < BS_MAX_RANK; r++)
    shape[r] = 1;
  shape[0] = 3;
  for (int d = 0; d < BS_DT_COUNT; d++) {
    if (!bs_npy_descr((enum bs_dtype)d, NULL))
      continue;
    size_t len;
    reset();
    cr_assert_eq(bs_npy_header((enum bs_dtype)d, BS_MAX_RANK, shape, buf, sizeof buf, &len, &err),
                 0);
    cr_assert_eq(len % 64, 0);
    struct bs_npy_info info;
    cr_assert_eq(bs_npy_parse((uint8_t *)buf, len, &info, &err), 0, "%s: %s",
                 bs_dtype_name((enum bs_dtype)d), err.msg);
    cr_assert_eq(info.header_len, len);
    cr_assert_eq(info.rank, BS_MAX_RANK);
    cr_assert_eq(bs_dtype_bits(info.dtype), bs_dtype_bits((enum bs_dtype)d));
    cr_assert_eq(info.nbytes, 3 * bs_dtype_bits((enum bs_dtype)d) / 8);
  }
}

static int parse_text(const char *dict, uint8_t version, struct bs_npy_info *info)
{
  static uint8_t buf[4096];
  size_t dl = strlen(dict), pre = version == 1 ? 10 : 12;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = version;
  buf[7] = 0;
  if (version == 1)
    bs_put_le16(buf + 8, (uint16_t)dl);
  else
    bs_put_le32(buf + 8, (uint32_t)dl);
  memcpy(buf + pre, dict, dl);
  reset();
  return bs_npy_parse(buf, pre + dl, info, &err);
}

Test(npy, parses_what_numpy_writes)
{
  struct bs_npy_info i;
  cr_assert_eq(parse_text("{'descr': '<f8', 'fortran_order': True, 'shape': (4, 5), }   \n", 1, &i),
               0, "%s", err.msg);
  cr_assert_eq(i.dtype, BS_DT_F64);
  cr_assert(i.fortran_order);
  cr_assert_eq(i.rank, 2);
  cr_assert_eq(i.nbytes, 160);
  cr_assert_eq(parse_text("{\"shape\": (7,), \"descr\": \"|u1\", \"fortran_order\": False}", 3, &i),
               0, "any key order, double quotes, version 3: %s", err.msg);
  cr_assert_eq(i.dtype, BS_DT_U8);
  cr_assert_eq(i.header_len, 12 + strlen("{\"shape\": (7,), \"descr\": \"|u1\", \"fortran_order\": "
                                         "False}"));
  cr_assert_eq(parse_text("{'descr': '<u2', 'fortran_order': False, 'shape': (), }", 2, &i), 0);
  cr_assert_eq(i.dtype, BS_DT_U16, "<u2 is U16 (never BF16)");
  cr_assert_eq(i.rank, 0);
  cr_assert_eq(i.nbytes, 2);
  cr_assert_eq(parse_text("{'descr': '<c16', 'fortran_order': False, 'shape': (0, 3), }", 1, &i),
               0);
  cr_assert_eq(i.nbytes, 0);
}

Test(npy, refuses_hostile_headers)
{
  static const char *const bad[] = {
      "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",               /* big-endian */
      "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",      /* structured */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }",                /* not a tuple */
      "{'descr': '<f4', 'fortran_order': False}",                                /* no shape */
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", /* twice */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",         /* unknown key */
      "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",                     /* not a bool */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",                /* negative */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",  /* u64 */
      "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", /* product */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} junk", /* after the dict */
      "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}",  /* escapes */
      "{'descr': 'O', 'fortran_order': False, 'shape': (1,)}",        /* objects */
      "{'descr': '<U8', 'fortran_order': False, 'shape': (1,)}",      /* strings */
      "{'descr': '|f4', 'fortran_order': False, 'shape': (1,)}",      /* | on 4 bytes */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)",       /* unclosed */
      "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}\x01",  /* control byte */
      "['descr', '<f4']",                                             /* not a dict */
      "",
  };
  struct bs_npy_info i;
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    cr_assert_eq(parse_text(bad[k], 1, &i), -1, "accepted: %s", bad[k]);
    cr_assert_eq(err.code, EINVAL, "%s: code %d", bad[k], err.code);
    cr_assert(err.msg[0], "a message");
  }
  /* 65 dimensions */
  char dict[1024] = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (int r = 0; r < 65; r++)
    strcat(dict, "1, ");
  strcat(dict, ")}");
  cr_assert_eq(parse_text(dict, 1, &i), -1);
  cr_assert(strstr(err.msg, "dimensions") != NULL, "%s", err.msg);
}

Test(npy, refuses_bad_framing)
{
  struct bs_npy_info i;
  uint8_t b[16] = "\x93NUMPX\x01\x00\x00\x00";
  cr_assert_eq(bs_npy_parse(b, 10, &i, &err), -1);
  cr_assert_eq(err.code, EINVAL, "bad magic");
  reset();
  memcpy(b, "\x93NUMPY\x04\x00\x00\x00", 10);
  cr_assert_eq(bs_npy_parse(b, 10, &i, &err), -1);
  cr_assert_eq(err.code, EINVAL, "version 4");
  reset();
  memcpy(b, "\x93NUMPY\x01\x00\xff\x00{", 11);
  cr_assert_eq(bs_npy_parse(b, 11, &i, &err), -1);
  cr_assert_eq(err.code, EAGAIN, "a length past the bytes given: more needed");
  reset();
  memcpy(b, "\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
  cr_assert_eq(bs_npy_parse(b, 12, &i, &err), -1);
  cr_assert_eq(err.code, EINVAL, "a 2 GiB header is over the cap, not a wait for more");
  reset();
  cr_assert_eq(bs_npy_parse(b, 3, &i, &err), -1);
  cr_assert_eq(err.code, EAGAIN);
  cr_assert(!bs_npy_is_npy(b, 5));
}

/* ---- adapter ---------------------------------------------------------------------------- */

static void add(struct bs_catalog *cat, const char *key, enum bs_dtype dt, uint32_t rank,
                uint64_t d0, uint64_t d1)
{
  uint64_t shape[2] = {d0, d1};
  cr_assert_not_null(bs_catalog_add(cat, key, dt, rank, shape, 0, &err), "%s", err.msg);
}

static struct bs_tensor *get(struct bs_catalog *cat, const char *name)
{
  for (size_t i = 0; i < cat->count; i++)
    if (strcmp(cat->tensors[i].name, name) == 0)
      return &cat->tensors[i];
  return NULL;
}

Test(adapter, the_rule_on_names_and_shapes)
{
  static float data[64];
  for (int i = 0; i < 64; i++)
    data[i] = (float)i;
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  struct bs_src s;
  uint32_t idx;
  cr_assert_eq(bs_src_init_mem(&s, data, sizeof data, "mem", &err), 0);
  cr_assert_eq(bs_catalog_add_src(&cat, &s, &idx, &err), 0);
  add(&cat, "fc.weight", BS_DT_F32, 2, 2, 3); /* Linear: bias of 2 */
  add(&cat, "fc.bias", BS_DT_F32, 1, 2, 0);
  add(&cat, "emb.weight", BS_DT_F32, 2, 4, 3); /* no bias: unchanged */
  add(&cat, "ln.weight", BS_DT_F32, 1, 3, 0);  /* norm */
  add(&cat, "ln.bias", BS_DT_F32, 1, 3, 0);
  add(&cat, "conv.weight", BS_DT_F32, 1, 2, 0); /* 1-D weight: a norm by the rule */
  struct bs_adapter a;
  bs_adapter_init(&a);
  cr_assert_eq(bs_adapter_add_item(&a, "include=x", &err), 1, "not an adapter option");
  cr_assert_eq(bs_adapter_add_item(&a, "adapter=jax", &err), -1);
  reset();
  cr_assert_eq(bs_adapter_add_item(&a, "adapter=pytorch", &err), 0);
  size_t nt, nr;
  cr_assert_eq(bs_adapter_apply(&cat, &a, &nt, &nr, &err), 0, "%s", err.msg);
  cr_assert_eq(nt, 1);
  cr_assert_eq(nr, 3);
  struct bs_tensor *w = get(&cat, "fc.weight");
  cr_assert_not_null(w);
  cr_assert_eq(w->shape[0], 3);
  cr_assert_eq(w->shape[1], 2);
  float out[6];
  cr_assert_eq(bs_tensor_read(&cat, w, 0, out, sizeof out), 24);
  const float want[6] = {0, 3, 1, 4, 2, 5}; /* [[0,1,2],[3,4,5]] transposed */
  cr_assert_eq(memcmp(out, want, sizeof want), 0);
  cr_assert_null(get(&cat, "emb.weight")->x->strides);
  cr_assert_not_null(get(&cat, "ln.gamma"));
  cr_assert_not_null(get(&cat, "ln.beta"));
  cr_assert_not_null(get(&cat, "conv.gamma"));
  cr_assert_str_eq(get(&cat, "ln.gamma")->key, "ln.weight", "the source key stays");
  bs_adapter_destroy(&a);
  bs_catalog_destroy(&cat);
}

Test(adapter, explicit_lists_and_collisions)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  add(&cat, "head.weight", BS_DT_F32, 2, 2, 3);
  add(&cat, "n.weight", BS_DT_F32, 1, 3, 0);
  add(&cat, "n.gamma", BS_DT_F32, 1, 3, 0);
  struct bs_adapter a;
  bs_adapter_init(&a);
  cr_assert_eq(bs_adapter_add_item(&a, "adapter_linear=^head", &err), 0);
  cr_assert_eq(bs_adapter_apply(&cat, &a, NULL, NULL, &err), -1, "needs adapter=pytorch");
  reset();
  cr_assert_eq(bs_adapter_add_item(&a, "adapter=pytorch", &err), 0);
  cr_assert_eq(bs_adapter_add_item(&a, "adapter_norm=^nothing", &err), 0);
  cr_assert_eq(bs_adapter_apply(&cat, &a, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(get(&cat, "head.weight")->shape[0], 3, "listed: transposed without a bias");
  cr_assert_not_null(get(&cat, "n.weight"), "adapter_norm= given: n not renamed");
  bs_adapter_destroy(&a);
  bs_adapter_init(&a);
  cr_assert_eq(bs_adapter_add_item(&a, "adapter=pytorch", &err), 0);
  cr_assert_eq(bs_adapter_apply(&cat, &a, NULL, NULL, &err), -1);
  cr_assert_eq(err.code, EEXIST);
  cr_assert(strstr(err.msg, "n.gamma") != NULL, "%s", err.msg);
  bs_adapter_destroy(&a);
  bs_catalog_destroy(&cat);
}

/* The one NAME.npy rule of the mount's names, edits and xattrs. */
Test(npy, name_rule)
{
  cr_assert(bs_npy_name("w.npy", 5));
  cr_assert(bs_npy_name("enc.w.npy", 9));
  cr_assert_not(bs_npy_name(".npy", 4)); /* no NAME */
  cr_assert_not(bs_npy_name("w.NPY", 5));
  cr_assert_not(bs_npy_name("w.npz", 5));
  cr_assert_not(bs_npy_name("npy", 3));
  cr_assert(bs_npy_name("w.npy.txt", 5)); /* only its first n bytes count */
}
