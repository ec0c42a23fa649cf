/* The class layer of the unpickler (torch_pickle.c): tensor rebuilds, storage classes, names
 * that are never called, strict mode, whole modules refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "formats/pickle.h"
#include "formats/torch_pickle.h"
#include "pickle_fixture.h"

TestSuite(torch_pickle, .fini = pickle_fixture_teardown);

#define TENSOR_PICKLE(cls)                                                                         \
  "\x80\x02}X\x01\x00\x00\x00w"                                                                    \
  "ctorch._utils\n_rebuild_tensor_v2\n"                                                            \
  "((X\x07\x00\x00\x00storagectorch\n" cls "\nX\x01\x00\x00\x00"                                   \
  "0X\x03\x00\x00\x00"                                                                             \
  "cpuK\x08tQ"                                                                                     \
  "K\x02K\x02K\x03\x86K\x03K\x01\x86\x89"                                                          \
  "ccollections\nOrderedDict\n)RtRs."

Test(torch_pickle, rebuild_tensor_v2_gives_a_tensor_with_its_storage)
{
  static const char s[] = TENSOR_PICKLE("FloatStorage");
  struct bs_pv *v;
  LOAD_OK(s, &v);
  struct bs_pv *t = v->u.dict.vals.items[0];
  cr_assert_eq(t->kind, BS_PV_TENSOR);
  cr_assert_null(t->u.tensor.unsupported);
  cr_assert_eq(t->u.tensor.dtype, BS_DT_F32);
  cr_assert_eq(t->u.tensor.rank, 2);
  cr_assert_eq(t->u.tensor.shape[1], 3);
  cr_assert_eq(t->u.tensor.stride[0], 3);
  cr_assert_eq(t->u.tensor.offset, 2);
  cr_assert_str_eq(t->u.tensor.storage->u.storage.key, "0");
  cr_assert_eq(t->u.tensor.storage->u.storage.numel, 8);
  cr_assert_eq(t->u.tensor.storage->u.storage.esize, 4);
}

Test(torch_pickle, byte_storage_is_uint8)
{
  static const char s[] = TENSOR_PICKLE("ByteStorage");
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->u.dict.vals.items[0]->u.tensor.dtype, BS_DT_U8);
}

Test(torch_pickle, unknown_storage_class_gives_an_unsupported_tensor_not_a_guess)
{
  static const char s[] = TENSOR_PICKLE("QUInt4x2Storage");
  struct bs_pv *v;
  LOAD_OK(s, &v);
  struct bs_pv *t = v->u.dict.vals.items[0];
  cr_assert_eq(t->kind, BS_PV_TENSOR);
  cr_assert_not_null(t->u.tensor.unsupported);
  cr_assert(strstr(t->u.tensor.unsupported, "QUInt4x2Storage"));
}

Test(torch_pickle, os_system_is_never_called_and_is_reported)
{
  static const char s[] = "\x80\x02"
                          "cos\nsystem\nX\x0b\x00\x00\x00touch /tmp/\x85R.";
  struct bs_pv *v;
  LOAD_OK(s, &v);
  cr_assert_eq(v->kind, BS_PV_OBJECT);
  cr_assert_str_eq(v->u.obj.cls->u.glob.module, "os");
  cr_assert_str_eq(v->u.obj.args->u.seq.items[0]->u.str.s, "touch /tmp/");
  cr_assert_eq(bs_pickle_nnotes(pickle_fixture_unpickler()), 1);
  cr_assert_str_eq(bs_pickle_note(pickle_fixture_unpickler(), 0),
                   "skipped object of class os.system at pickle offset 30");
}

Test(torch_pickle, strict_mode_refuses_an_unknown_global_naming_it)
{
  static const char s[] = "\x80\x02"
                          "cposix\nsystem\nX\x01\x00\x00\x00x\x85R.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load_opts(s, sizeof s - 1, true, 100, &v, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  cr_assert_eq(e.off, 102);
  cr_assert(strstr(e.msg, "strict mode"), "%s", e.msg);
  cr_assert(strstr(e.msg, "posix.system"), "%s", e.msg);
}

Test(torch_pickle, strict_mode_accepts_torch_globals)
{
  static const char s[] = TENSOR_PICKLE("HalfStorage");
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load_opts(s, sizeof s - 1, true, 0, &v, &e), 0, "%s", e.msg);
  cr_assert_eq(v->u.dict.vals.items[0]->u.tensor.dtype, BS_DT_F16);
}

Test(torch_pickle, whole_nn_module_is_refused_with_the_state_dict_hint)
{
  static const char s[] = "\x80\x02"
                          "ctorch.nn.modules.linear\nLinear\n)\x81}b.";
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, sizeof s - 1, &v, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  cr_assert_eq(e.off, 35);
  cr_assert(strstr(e.msg, "this file pickles a whole nn.Module (torch.nn.modules.linear.Linear); "
                          "save model.state_dict() instead"),
            "%s", e.msg);
}

/* The pickle s[0..n) is refused as not supported, the message holding want. */
static void expect_refused(const char *s, size_t n, const char *want)
{
  struct bs_pv *v;
  bs_err e;
  cr_assert_eq(pickle_load(s, n, &v, &e), -1);
  cr_assert_eq(e.code, ENOTSUP);
  cr_assert(strstr(e.msg, want), "%s", e.msg);
}

/* torch.save(model) of a class of the user's: its submodules, of classes
 * burnstore knows, are met before its own state is built; the refusal
 * names the outer class (issue 34). */
Test(torch_pickle, a_module_inside_a_user_class_names_the_user_class)
{
  static const char s[] = "\x80\x02"
                          "c__main__\nNet\n)\x81}X\x08\x00\x00\x00_modules"
                          "ctorch.nn.modules.conv\nConv2d\n)\x81}bsb.";
  expect_refused(s, sizeof s - 1,
                 "this file pickles a whole nn.Module (__main__.Net, holding "
                 "torch.nn.modules.conv.Conv2d); save model.state_dict() instead");
}

Test(torch_pickle, user_module_class_with_parameters_state_is_refused)
{
  static const char s[] = "\x80\x02"
                          "c__main__\nNet\n)\x81}(X\x0b\x00\x00\x00_parametersN"
                          "X\x08\x00\x00\x00_modulesNub.";
  expect_refused(s, sizeof s - 1, "(__main__.Net); save model.state_dict() instead");
}

/* Found by fuzzing: MARK DICT on a stack never pushed to did pointer
 * arithmetic on NULL (UBSan). */
