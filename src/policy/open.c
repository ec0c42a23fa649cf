#include "policy/open.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/decode.h"
#include "core/size.h"
#include "formats/writers.h"
#include "policy/decode_as.h"

void bs_open_spec_init(struct bs_open_spec *s)
{
  memset(s, 0, sizeof *s);
  bs_keyopts_init(&s->keys);
  bs_adapter_init(&s->adapter);
}

void bs_open_spec_destroy(struct bs_open_spec *s)
{
  bs_keyopts_destroy(&s->keys);
  bs_adapter_destroy(&s->adapter);
}

/* item is "name=VALUE": VALUE, else NULL. */
static const char *value_of(const char *item, const char *name)
{
  size_t n = strlen(name);
  return strncmp(item, name, n) == 0 && item[n] == '=' ? item + n + 1 : NULL;
}

int bs_open_spec_add_item(struct bs_open_spec *s, const char *item, bs_err *err)
{
  const char *v;
  if (strcmp(item, "strict") == 0) {
    s->open.strict = true;
  } else if (strcmp(item, "unvalidated") == 0) {
    s->http.unvalidated = true;
  } else if ((v = value_of(item, "as"))) {
    enum bs_dtype dt;
    if (bs_dtype_from_name(v, &dt) != 0 || !bs_encode_ok(dt))
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "option '%s': as= takes F32, F16 or BF16",
                     item);
    s->has_as = true;
    s->as = dt;
  } else if ((v = value_of(item, "http_cache"))) {
    if (bs_http_parse_cache(v, &s->http.cache_bytes) != 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "option '%s': not a cache size (1M to 16G, e.g. 256M, 256MiB or 300MB)", item);
  } else if ((v = value_of(item, "http_timeout"))) {
    if (bs_http_parse_timeout(v, &s->http.timeout_s) != 0)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "option '%s': not whole seconds from 1 to 3600", item);
  } else {
    /* an adapter item, else (also "adapterX": not one) a key option */
    bs_err sub;
    bs_err_clear(&sub);
    int rc = strncmp(item, "adapter", 7) == 0 ? bs_adapter_add_item(&s->adapter, item, &sub) : 1;
    if (rc > 0)
      rc = bs_keyopts_add_item(&s->keys, item, &sub);
    if (rc < 0)
      return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "option '%s': %s", item, sub.msg);
    return rc;
  }
  return 0;
}

/* Each item of OPTSTR through ADD (0 taken, 1 not its option, -1 failed);
 * an item no ADD takes is refused naming the options KNOWN. */
static int parse_items(const char *optstr, int (*add)(void *ctx, const char *item, bs_err *err),
                       void *ctx, const char *known, bs_err *err)
{
  char **items = NULL;
  size_t n = 0;
  if (bs_opts_split(optstr, &items, &n, err) != 0)
    return -1;
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    int r = add(ctx, items[i], err);
    if (r > 0)
      rc = bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "unknown option '%s' (%s)", items[i], known);
    else if (r < 0)
      rc = -1;
  }
  bs_opts_free(items, n);
  return rc;
}

static int add_open_item(void *ctx, const char *item, bs_err *err)
{
  return bs_open_spec_add_item(ctx, item, err);
}

int bs_open_spec_parse(struct bs_open_spec *s, const char *optstr, bs_err *err)
{
  return parse_items(optstr, add_open_item, s,
                     "include=, exclude=, remap=, top_level_key=, contiguous_indices, adapter=, "
                     "as=, strict, http_cache=, http_timeout=, unvalidated",
                     err);
}

int bs_write_spec_add_item(uint64_t *max_shard_size, const char *item, bs_err *err)
{
  const char *v = value_of(item, "max_shard_size");
  if (!v)
    return 1;
  if (bs_parse_size(v, max_shard_size) != 0 || *max_shard_size == 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "option '%s': not a size (5GB, 500MB, 2GiB, 64M, bytes...)", item);
  return 0;
}

static int add_write_item(void *ctx, const char *item, bs_err *err)
{
  return bs_write_spec_add_item(ctx, item, err);
}

int bs_write_spec_parse(const char *optstr, uint64_t *max_shard_size, bs_err *err)
{
  *max_shard_size = 0;
  return parse_items(optstr, add_write_item, max_shard_size, "a write takes max_shard_size=SIZE",
                     err);
}

int bs_checkpoint_open(struct bs_catalog *cat, const char *source, const struct bs_open_spec *s,
                       char **name, bs_err *err)
{
  static const struct bs_open_spec none;
  if (!s)
    s = &none;
  bool url = bs_src_is_url(source);
  char *index = NULL;
  struct stat st;
  if (!url && stat(source, &st) == 0 && S_ISDIR(st.st_mode)) {
    /* A directory: the checkpoint it holds (a shard set's index). */
    int rc = bs_format_in_dir(source, &index, err);
    *name = bs_strdup(rc == 0 ? index : source);
    if (rc != 0)
      return -1;
  } else {
    *name = url ? bs_http_redact(source) : bs_strdup(source); /* no credentials in messages */
  }
  if (!*name) {
    bs_free(index);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  const char *path = index ? index : source;
  struct bs_src src;
  int rc = -1;
  if (!url && (s->http.cache_bytes || s->http.timeout_s || s->http.unvalidated)) {
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
            "http_cache=, http_timeout= and unvalidated apply to a URL");
  } else if (url ? bs_src_init_http(&src, source, &s->http, err) != 0
                 : bs_writer_recover(path, err) != 0 || bs_src_open(&src, path, err) != 0) {
    /* (A set whose write a kill interrupted completes or rolls back first,
     * also one with no index yet: its temp files and journal go.) */
  } else if (bs_open_any(cat, &src, &s->open, err) == 0 && bs_keys_apply(cat, &s->keys, err) == 0 &&
             bs_adapter_apply(cat, &s->adapter, NULL, NULL, err) == 0 &&
             (!s->has_as || bs_catalog_decode_as(cat, s->as, err) == 0)) {
    rc = 0;
  }
  bs_free(index);
  if (rc != 0) {
    bs_catalog_destroy(cat);
    bs_catalog_init(cat);
  }
  return rc;
}
