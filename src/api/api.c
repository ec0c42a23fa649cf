/* The public API (include/burnstore.h), reading side: the library's
 * process-wide state, errors, dtypes, and a checkpoint opened through the
 * one internal open path (policy/open.h) with its tensors, metadata and
 * attributes (the mount's xattr table, policy/xattr.h). Each function checks
 * its arguments, calls the core and turns a bs_err into the thread's last
 * error; no format is named here. */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "api.h"
#include "core/alloc.h"
#include "core/checked.h"
#include "core/dtype.h"
#include "core/target.h"
#include "core/tree.h"
#include "formats/formats.h"
#include "policy/open.h"

/* ---- Errors --------------------------------------------------------------------------------- */

#define MSG_MAX 1024
static _Thread_local int last_code;
static _Thread_local char last_msg[MSG_MAX];

int bs_api_fail(const char *file, const bs_err *err)
{
  last_code = err->code ? err->code : EIO;
  bs_err_format(err, file, last_msg, sizeof last_msg);
  return last_code;
}

int bs_api_failf(int code, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  bs_text_clean(last_msg);
  last_code = code ? code : EIO;
  return last_code;
}

int burnstore_errcode(void)
{
  return last_code;
}

const char *burnstore_errmsg(void)
{
  return last_msg;
}

/* ---- The library ---------------------------------------------------------------------------- */

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count; /* (under init_lock; read atomically) */

int burnstore_init(unsigned flags)
{
  if (flags != 0)
    return bs_api_failf(EINVAL, "burnstore_init: flags 0x%x: none is defined (pass 0)", flags);
  pthread_mutex_lock(&init_lock);
  int rc = 0;
  if (init_count == 0) {
    /* libcurl counts its global inits: the HTTP source's own (at its first
     * URL) stays for the process; this one is undone at the last shutdown. */
    CURLcode c = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (c != CURLE_OK)
      rc = bs_api_failf(EIO, "burnstore_init: libcurl's global init failed: %s",
                        curl_easy_strerror(c));
    else
      bs_formats_init();
  }
  if (rc == 0)
    __atomic_store_n(&init_count, init_count + 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&init_lock);
  return rc;
}

void burnstore_shutdown(void)
{
  pthread_mutex_lock(&init_lock);
  if (init_count > 0) {
    __atomic_store_n(&init_count, init_count - 1, __ATOMIC_RELEASE);
    if (init_count == 0) {
      bs_log_set_sink(NULL, NULL);
      curl_global_cleanup();
    }
  }
  pthread_mutex_unlock(&init_lock);
}

int bs_api_begin(const char *fn, const char *what, const char *arg)
{
  if (__atomic_load_n(&init_count, __ATOMIC_ACQUIRE) <= 0)
    return bs_api_failf(EINVAL,
                        "%s: burnstore_init was not called (or was undone by "
                        "burnstore_shutdown)",
                        fn);
  return arg && *arg ? 0 : bs_api_failf(EINVAL, "%s: no %s", fn, what);
}

#define STR_(x) #x
#define STR(x) STR_(x)

const char *burnstore_version(void)
{
  return STR(BURNSTORE_VERSION_MAJOR) "." STR(BURNSTORE_VERSION_MINOR) "." STR(
      BURNSTORE_VERSION_PATCH);
}

unsigned burnstore_version_num(void)
{
  return BURNSTORE_VERSION_NUM;
}

void burnstore_set_log(burnstore_log_fn fn, void *ctx)
{
  bs_log_set_sink(fn, ctx);
}

/* ---- Dtypes --------------------------------------------------------------------------------- */

/* The API's values are fixed; the core's enum may change order: one row
 * each, and the count checked. */
static const burnstore_dtype api_of[BS_DT_COUNT] = {
    [BS_DT_F64] = BURNSTORE_DT_F64,
    [BS_DT_F32] = BURNSTORE_DT_F32,
    [BS_DT_F16] = BURNSTORE_DT_F16,
    [BS_DT_BF16] = BURNSTORE_DT_BF16,
    [BS_DT_I64] = BURNSTORE_DT_I64,
    [BS_DT_I32] = BURNSTORE_DT_I32,
    [BS_DT_I16] = BURNSTORE_DT_I16,
    [BS_DT_I8] = BURNSTORE_DT_I8,
    [BS_DT_U64] = BURNSTORE_DT_U64,
    [BS_DT_U32] = BURNSTORE_DT_U32,
    [BS_DT_U16] = BURNSTORE_DT_U16,
    [BS_DT_U8] = BURNSTORE_DT_U8,
    [BS_DT_BOOL] = BURNSTORE_DT_BOOL,
    [BS_DT_F8_E4M3] = BURNSTORE_DT_F8_E4M3,
    [BS_DT_F8_E5M2] = BURNSTORE_DT_F8_E5M2,
    [BS_DT_F8_E8M0] = BURNSTORE_DT_F8_E8M0,
    [BS_DT_F8_E4M3FNUZ] = BURNSTORE_DT_F8_E4M3FNUZ,
    [BS_DT_F8_E5M2FNUZ] = BURNSTORE_DT_F8_E5M2FNUZ,
    [BS_DT_F6_E2M3] = BURNSTORE_DT_F6_E2M3,
    [BS_DT_F6_E3M2] = BURNSTORE_DT_F6_E3M2,
    [BS_DT_F4] = BURNSTORE_DT_F4,
    [BS_DT_C64] = BURNSTORE_DT_C64,
    [BS_DT_C128] = BURNSTORE_DT_C128,
    [BS_DT_FLEX32] = BURNSTORE_DT_FLEX32,
    [BS_DT_BOOL_U8] = BURNSTORE_DT_BOOL_U8,
    [BS_DT_BOOL_U32] = BURNSTORE_DT_BOOL_U32,
    [BS_DT_QFLOAT] = BURNSTORE_DT_QFLOAT,
    [BS_DT_QI8] = BURNSTORE_DT_QI8,
    [BS_DT_QU8] = BURNSTORE_DT_QU8,
    [BS_DT_QI32] = BURNSTORE_DT_QI32,
    [BS_DT_Q4_0] = BURNSTORE_DT_Q4_0,
    [BS_DT_Q4_1] = BURNSTORE_DT_Q4_1,
    [BS_DT_Q5_0] = BURNSTORE_DT_Q5_0,
    [BS_DT_Q5_1] = BURNSTORE_DT_Q5_1,
    [BS_DT_Q8_0] = BURNSTORE_DT_Q8_0,
    [BS_DT_Q8_1] = BURNSTORE_DT_Q8_1,
    [BS_DT_Q2_K] = BURNSTORE_DT_Q2_K,
    [BS_DT_Q3_K] = BURNSTORE_DT_Q3_K,
    [BS_DT_Q4_K] = BURNSTORE_DT_Q4_K,
    [BS_DT_Q5_K] = BURNSTORE_DT_Q5_K,
    [BS_DT_Q6_K] = BURNSTORE_DT_Q6_K,
    [BS_DT_Q8_K] = BURNSTORE_DT_Q8_K,
    [BS_DT_IQ2_XXS] = BURNSTORE_DT_IQ2_XXS,
    [BS_DT_IQ2_XS] = BURNSTORE_DT_IQ2_XS,
    [BS_DT_IQ3_XXS] = BURNSTORE_DT_IQ3_XXS,
    [BS_DT_IQ1_S] = BURNSTORE_DT_IQ1_S,
    [BS_DT_IQ4_NL] = BURNSTORE_DT_IQ4_NL,
    [BS_DT_IQ3_S] = BURNSTORE_DT_IQ3_S,
    [BS_DT_IQ2_S] = BURNSTORE_DT_IQ2_S,
    [BS_DT_IQ4_XS] = BURNSTORE_DT_IQ4_XS,
    [BS_DT_IQ1_M] = BURNSTORE_DT_IQ1_M,
    [BS_DT_TQ1_0] = BURNSTORE_DT_TQ1_0,
    [BS_DT_TQ2_0] = BURNSTORE_DT_TQ2_0,
    [BS_DT_MXFP4] = BURNSTORE_DT_MXFP4,
};
_Static_assert((int)BS_DT_COUNT == (int)BURNSTORE_DTYPE_COUNT,
               "every core dtype has an API value (include/burnstore.h) and a row in api_of[]");

burnstore_dtype bs_api_dtype(enum bs_dtype dt)
{
  return (unsigned)dt < BS_DT_COUNT ? api_of[dt] : BURNSTORE_DTYPE_COUNT;
}

bool bs_api_core_dtype(burnstore_dtype dt, enum bs_dtype *out)
{
  for (int i = 0; i < BS_DT_COUNT; i++)
    if (api_of[i] == dt) {
      *out = (enum bs_dtype)i;
      return true;
    }
  return false;
}

const char *burnstore_dtype_name(burnstore_dtype dt)
{
  enum bs_dtype c;
  return bs_api_core_dtype(dt, &c) ? bs_dtype_name(c) : NULL;
}

int burnstore_dtype_from_name(const char *name, burnstore_dtype *out)
{
  enum bs_dtype c;
  if (!name || !out || bs_dtype_from_name(name, &c) != 0)
    return bs_api_failf(EINVAL, "'%.100s' is no dtype (F32, BF16, Q4_0...)", name ? name : "");
  *out = bs_api_dtype(c);
  return 0;
}

unsigned burnstore_dtype_bits(burnstore_dtype dt)
{
  enum bs_dtype c;
  return bs_api_core_dtype(dt, &c) ? bs_dtype_bits(c) : 0;
}

bool burnstore_dtype_block(burnstore_dtype dt, uint32_t *elems, uint32_t *bytes)
{
  enum bs_dtype c;
  uint32_t e, b;
  if (!bs_api_core_dtype(dt, &c) || !bs_dtype_block(c, &e, &b))
    return false;
  if (elems)
    *elems = e;
  if (bytes)
    *bytes = b;
  return true;
}

/* ---- Buffers -------------------------------------------------------------------------------- */

int bs_api_copy_out(const void *value, size_t n, char *buf, size_t size, size_t *len)
{
  if (len)
    *len = n;
  if (size == 0)
    return 0;
  if (!buf)
    return bs_api_failf(EINVAL, "a buffer of %zu bytes at NULL", size);
  if (n >= size)
    return bs_api_failf(ERANGE, "the value is %zu bytes: the buffer of %zu holds less", n, size);
  memcpy(buf, value, n);
  buf[n] = '\0';
  return 0;
}

/* ---- Opening -------------------------------------------------------------------------------- */

/* The absolute path of each source that is a local regular file, as it
 * was opened (same device and inode): what burnstore_tensor_file_range
 * gives for a zero-copy map. */
static int find_paths(burnstore_checkpoint *ck, bs_err *err)
{
  size_t n = ck->cat.nsrcs;
  if (!(ck->paths = bs_calloc(n ? n : 1, sizeof *ck->paths)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const struct bs_src *s = &ck->cat.srcs[i];
    struct bs_src_ident id;
    struct stat st;
    if (!s->name || s->name[0] != '/' || !bs_src_ident(s, &id) || stat(s->name, &st) != 0 ||
        !S_ISREG(st.st_mode) || (uint64_t)st.st_dev != id.dev || (uint64_t)st.st_ino != id.ino)
      continue;
    if (!(ck->paths[i] = bs_strdup(s->name)))
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  return 0;
}

/* The visible tensors, their keys, the read-only view the xattr table reads. */
static int index_checkpoint(burnstore_checkpoint *ck, bs_err *err)
{
  const struct bs_catalog *cat = &ck->cat;
  if (!(ck->visible = bs_calloc(cat->count ? cat->count : 1, sizeof *ck->visible)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < cat->count; i++) {
    if (cat->tensors[i].hidden)
      continue;
    /* (bs_keys_apply refused two visible tensors of one key) */
    if (bs_strmap_put(&ck->by_key, cat->tensors[i].name, ck->nvisible) < 0)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    ck->visible[ck->nvisible++] = (struct burnstore_tensor){.ck = ck, .i = i};
  }
  if (find_paths(ck, err) != 0 || bs_edit_init(&ck->edit, cat, NULL, false, err) != 0)
    return -1;
  return bs_xa_mount_init(&ck->xa, cat, &ck->edit, NULL, err);
}

burnstore_checkpoint *burnstore_open(const char *source, const char *options)
{
  if (bs_api_begin("burnstore_open", "source", source) != 0)
    return NULL;
  bs_err err;
  bs_err_clear(&err);
  struct bs_open_spec spec;
  bs_open_spec_init(&spec);
  if (bs_open_spec_parse(&spec, options, &err) != 0) {
    bs_open_spec_destroy(&spec);
    bs_api_fail(NULL, &err);
    return NULL;
  }
  burnstore_checkpoint *ck = bs_calloc(1, sizeof *ck);
  /* A local file by its absolute path: messages and file ranges name it so. */
  char *abs = !ck ? NULL : bs_src_is_url(source) ? bs_strdup(source) : bs_abs_path(source);
  if (!abs) {
    int e = ck && errno ? errno : ENOMEM;
    bs_api_failf(e, "%s: %s", source, strerror(e));
    bs_free(ck);
    bs_open_spec_destroy(&spec);
    return NULL;
  }
  bs_catalog_init(&ck->cat);
  /* A source's failure is told in this call's message, not logged apart. */
  bs_log_hold(true);
  int rc = bs_checkpoint_open(&ck->cat, abs, &spec, &ck->name, &err);
  if (rc == 0)
    rc = index_checkpoint(ck, &err);
  if (rc != 0)
    bs_api_fail(ck->name ? ck->name : source, &err);
  bs_log_hold(false);
  bs_free(abs);
  bs_open_spec_destroy(&spec);
  if (rc != 0) {
    burnstore_close(ck);
    return NULL;
  }
  return ck;
}

void burnstore_close(burnstore_checkpoint *ck)
{
  if (!ck)
    return;
  bs_xa_mount_destroy(&ck->xa);
  bs_edit_destroy(&ck->edit);
  if (ck->paths)
    for (size_t i = 0; i < ck->cat.nsrcs; i++)
      bs_free(ck->paths[i]);
  bs_free(ck->paths);
  bs_strmap_destroy(&ck->by_key);
  bs_free(ck->visible);
  bs_catalog_destroy(&ck->cat);
  bs_free(ck->name);
  bs_free(ck);
}

const char *burnstore_source(const burnstore_checkpoint *ck)
{
  return ck ? ck->name : NULL;
}

const char *burnstore_format(const burnstore_checkpoint *ck)
{
  return ck ? bs_format_name(ck->cat.format) : NULL;
}

size_t burnstore_count(const burnstore_checkpoint *ck)
{
  return ck ? ck->nvisible : 0;
}

const burnstore_tensor *burnstore_tensor_at(const burnstore_checkpoint *ck, size_t i)
{
  return ck && i < ck->nvisible ? &ck->visible[i] : NULL;
}

const burnstore_tensor *burnstore_find(const burnstore_checkpoint *ck, const char *key)
{
  size_t i;
  if (!ck || !key) {
    bs_api_failf(EINVAL, "burnstore_find: no %s", ck ? "key" : "checkpoint");
    return NULL;
  }
  if (!bs_strmap_get(&ck->by_key, key, &i)) {
    bs_api_failf(ENOENT, "%s: no tensor '%.200s'", ck->name, key);
    return NULL;
  }
  return &ck->visible[i];
}

/* ---- Metadata and attributes ---------------------------------------------------------------- */

size_t burnstore_meta_count(const burnstore_checkpoint *ck)
{
  return ck ? ck->cat.nmeta : 0;
}

const char *burnstore_meta_key(const burnstore_checkpoint *ck, size_t i)
{
  return ck && i < ck->cat.nmeta ? ck->cat.meta[i].key : NULL;
}

int burnstore_meta_value(const burnstore_checkpoint *ck, size_t i, char *buf, size_t size,
                         size_t *len)
{
  if (!ck || i >= ck->cat.nmeta)
    return bs_api_failf(EINVAL, "burnstore_meta_value: %s", ck ? "no such entry" : "no checkpoint");
  const struct bs_kv *kv = &ck->cat.meta[i];
  uint64_t n = bs_kv_text_len(kv);
  if (n >= SIZE_MAX)
    return bs_api_failf(EFBIG, "%s: metadata '%s' is too long", ck->name, kv->key);
  if (size == 0 || n >= size) /* (the length without making the text) */
    return bs_api_copy_out(NULL, (size_t)n, buf, size, len);
  struct bs_buf b = {0};
  bool cut;
  bs_err err;
  bs_err_clear(&err);
  int rc = bs_meta_text(&ck->cat, kv, n, &b, &cut, &err);
  if (rc != 0) {
    rc = bs_api_fail(ck->name, &err);
  } else {
    rc = bs_api_copy_out(b.data ? (const char *)b.data : "", b.len, buf, size, len);
  }
  bs_buf_destroy(&b);
  return rc;
}

/* An attribute name as the xattr table knows it: with the prefix. */
static const char *full_name(const char *name, char *buf, size_t n)
{
  if (strncmp(name, "user.", 5) == 0)
    return name;
  snprintf(buf, n, "%s%s", BS_XA_PREFIX, name);
  return buf;
}

static int attr_get(const burnstore_checkpoint *ck, const struct bs_xa_node *node, const char *what,
                    const char *name, char *buf, size_t size, size_t *len)
{
  if (!name)
    return bs_api_failf(EINVAL, "%s: no attribute name", ck->name);
  char fb[512];
  const char *full = full_name(name, fb, sizeof fb);
  if (strlen(full) >= sizeof fb - 1)
    return bs_api_failf(ENODATA, "%s: %s: no attribute '%.100s...'", ck->name, what, name);
  struct bs_buf b = {0};
  bs_err err;
  bs_err_clear(&err);
  int rc;
  if (bs_xa_get(&ck->xa, node, full, &b, &err) != 0)
    rc = bs_api_failf(err.code, "%s: %s: attribute '%s': %s", ck->name, what, name, err.msg);
  else
    rc = bs_api_copy_out(b.data ? (const char *)b.data : "", b.len, buf, size, len);
  bs_buf_destroy(&b);
  return rc;
}

/* The names, each NUL-terminated, without the prefix. */
static int attr_names(const burnstore_checkpoint *ck, const struct bs_xa_node *node,
                      const char *what, char *buf, size_t size, size_t *len)
{
  struct bs_buf b = {0}, out = {0};
  bs_err err;
  bs_err_clear(&err);
  int rc = 0;
  if (bs_xa_list(&ck->xa, node, &b, &err) != 0) {
    rc = bs_api_failf(err.code, "%s: %s: %s", ck->name, what, err.msg);
  } else {
    const size_t pl = strlen(BS_XA_PREFIX);
    for (size_t i = 0; i < b.len && rc == 0;) {
      const char *s = (const char *)b.data + i;
      size_t n = strlen(s);
      const char *shown = strncmp(s, BS_XA_PREFIX, pl) == 0 ? s + pl : s;
      if (bs_buf_put(&out, shown, strlen(shown) + 1) != 0)
        rc = bs_api_failf(ENOMEM, "out of memory");
      i += n + 1;
    }
    /* (the value holds NULs: its length is out.len; a NUL still follows) */
    if (rc == 0)
      rc = bs_api_copy_out(out.data ? (const char *)out.data : "", out.len, buf, size, len);
  }
  bs_buf_destroy(&b);
  bs_buf_destroy(&out);
  return rc;
}

static const struct bs_xa_node root_node = {
    .ino = BS_TREE_ROOT, .is_dir = true, .is_root = true, .tensor = -1, .e = NULL};

int burnstore_checkpoint_attr(const burnstore_checkpoint *ck, const char *name, char *buf,
                              size_t size, size_t *len)
{
  if (!ck)
    return bs_api_failf(EINVAL, "burnstore_checkpoint_attr: no checkpoint");
  return attr_get(ck, &root_node, "the checkpoint", name, buf, size, len);
}

int burnstore_checkpoint_attr_names(const burnstore_checkpoint *ck, char *buf, size_t size,
                                    size_t *len)
{
  if (!ck)
    return bs_api_failf(EINVAL, "burnstore_checkpoint_attr_names: no checkpoint");
  return attr_names(ck, &root_node, "the checkpoint", buf, size, len);
}

/* ---- A tensor ------------------------------------------------------------------------------- */

static const struct bs_tensor *core(const burnstore_tensor *t)
{
  return &t->ck->cat.tensors[t->i];
}

const char *burnstore_tensor_key(const burnstore_tensor *t)
{
  return t ? core(t)->name : NULL;
}

burnstore_dtype burnstore_tensor_dtype(const burnstore_tensor *t)
{
  return t ? bs_api_dtype(core(t)->dtype) : BURNSTORE_DTYPE_COUNT;
}

burnstore_dtype burnstore_tensor_stored_dtype(const burnstore_tensor *t)
{
  if (!t)
    return BURNSTORE_DTYPE_COUNT;
  const struct bs_tensor *c = core(t);
  return bs_api_dtype(c->decoded ? (enum bs_dtype)c->stored_dtype : c->dtype);
}

unsigned burnstore_tensor_rank(const burnstore_tensor *t)
{
  return t ? core(t)->rank : 0;
}

const uint64_t *burnstore_tensor_shape(const burnstore_tensor *t)
{
  return t && core(t)->rank ? core(t)->shape : NULL;
}

uint64_t burnstore_tensor_nbytes(const burnstore_tensor *t)
{
  return t ? core(t)->nbytes : 0;
}

const char *burnstore_tensor_unreadable(const burnstore_tensor *t)
{
  return t ? core(t)->x->unsupported : NULL;
}

static struct bs_xa_node tensor_node(const burnstore_tensor *t)
{
  return (struct bs_xa_node){.is_dir = false, .is_root = false, .tensor = (long)t->i, .e = NULL};
}

int burnstore_tensor_attr(const burnstore_tensor *t, const char *name, char *buf, size_t size,
                          size_t *len)
{
  if (!t)
    return bs_api_failf(EINVAL, "burnstore_tensor_attr: no tensor");
  struct bs_xa_node n = tensor_node(t);
  char what[300];
  snprintf(what, sizeof what, "tensor '%.200s'", core(t)->name);
  return attr_get(t->ck, &n, what, name, buf, size, len);
}

int burnstore_tensor_attr_names(const burnstore_tensor *t, char *buf, size_t size, size_t *len)
{
  if (!t)
    return bs_api_failf(EINVAL, "burnstore_tensor_attr_names: no tensor");
  struct bs_xa_node n = tensor_node(t);
  char what[300];
  snprintf(what, sizeof what, "tensor '%.200s'", core(t)->name);
  return attr_names(t->ck, &n, what, buf, size, len);
}

/* ---- Reading -------------------------------------------------------------------------------- */

int burnstore_tensor_read(const burnstore_tensor *t, uint64_t off, void *buf, size_t n,
                          size_t *nread)
{
  if (nread)
    *nread = 0;
  if (!t || (!buf && n))
    return bs_api_failf(EINVAL, "burnstore_tensor_read: no %s", t ? "buffer" : "tensor");
  const burnstore_checkpoint *ck = t->ck;
  const struct bs_tensor *c = core(t);
  if (c->x->unsupported)
    return bs_api_failf(ENOTSUP, "%s: tensor '%s' cannot be read: %s", ck->name, c->name,
                        c->x->unsupported);
  if (off >= c->nbytes)
    return 0;
  size_t want = c->nbytes - off < n ? (size_t)(c->nbytes - off) : n, got = 0;
  int rc = 0;
  bs_log_hold(true); /* a source's failure is told in this call's message */
  while (got < want) {
    size_t step = want - got < (1u << 30) ? want - got : (1u << 30);
    long r = bs_tensor_read(&ck->cat, c, off + got, (char *)buf + got, step);
    if (r <= 0) {
      char why[BS_LOG_LINE];
      int code = r < 0 ? (int)-r : EIO;
      rc = bs_api_failf(code, "%s: tensor '%s': read failed at byte %llu: %s", ck->name, c->name,
                        (unsigned long long)(off + got),
                        bs_tensor_why(&ck->cat, c, code, why, sizeof why));
      break;
    }
    got += (size_t)r;
  }
  bs_log_hold(false);
  if (nread)
    *nread = got;
  return rc;
}

int burnstore_tensor_file_range(const burnstore_tensor *t, const char **path, uint64_t *offset)
{
  if (!t || !path || !offset)
    return bs_api_failf(EINVAL, "burnstore_tensor_file_range: NULL argument");
  const burnstore_checkpoint *ck = t->ck;
  const struct bs_tensor *c = core(t);
  const char *why = c->x->unsupported ? "it cannot be read"
                    : c->decoded      ? "it is decoded (as=)"
                    : c->x->strides   ? "it is a strided view"
                    : c->src >= ck->cat.nsrcs || !ck->paths[c->src]
                        ? "its source is no local regular file (a URL, memory, a deflated zip "
                          "member)"
                        : NULL;
  if (why)
    return bs_api_failf(ENOTSUP, "%s: tensor '%s': not one range of a file: %s", ck->name, c->name,
                        why);
  char changed[256];
  if (bs_src_changed(&ck->cat.srcs[c->src], changed, sizeof changed))
    return bs_api_failf(EIO, "%s: changed since it was opened: %s", ck->paths[c->src], changed);
  *path = ck->paths[c->src];
  *offset = c->off;
  return 0;
}
