/* Sharded SafeTensors checkpoints (NAME.safetensors.index.json): the index
 * parser and the reader that mounts the union of the shards.
 *
 * Layout (what transformers' save_pretrained and huggingface_hub write):
 *   {"metadata": {"total_size": 16060522496},
 *    "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}
 * The index is JSON, parsed by jansson with duplicate keys refused; the
 * shards are SafeTensors files beside it, each read (header only) by the
 * SafeTensors reader into its own bs_src of the catalog, so a tensor's bytes
 * are read in place from its shard. Shard paths are relative to the index's
 * directory and may not leave it lexically (absolute paths and ".." segments
 * are refused); symbolic links inside it are followed, as the Hugging Face
 * cache links snapshot files to its blobs.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/set_journal.h"
#include "core/siblings.h"
#include "core/strmap.h"
#include "formats/safetensors_sharded.h"

#define INDEX_SUFFIX BS_ST_INDEX_SUFFIX
#define MAX_NOTES 100

void bs_st_index_destroy(struct bs_st_index *ix)
{
  if (!ix)
    return;
  for (size_t i = 0; i < ix->nshards; i++)
    bs_free(ix->shards[i]);
  bs_free(ix->shards);
  for (size_t i = 0; i < ix->nmap; i++)
    bs_free(ix->map[i].key);
  bs_free(ix->map);
  for (size_t i = 0; i < ix->nmeta; i++) {
    bs_free(ix->meta[i].key);
    bs_free(ix->meta[i].value);
  }
  bs_free(ix->meta);
  memset(ix, 0, sizeof *ix);
}

/* Relative, inside the directory: no leading '/', no ".." segment, not empty. */
static int check_shard_path(const char *key, const char *p, bs_err *err)
{
  size_t n = strlen(p);
  if (n == 0)
    return bs_fail(err, EINVAL, BS_OFF_NONE, key, "the weight_map names an empty shard path");
  if (n > BS_MAX_KEY_LEN)
    return bs_fail(err, EINVAL, BS_OFF_NONE, key, "shard path of %zu bytes is too long", n);
  if (p[0] == '/')
    return bs_fail(err, EACCES, BS_OFF_NONE, key,
                   "shard path '%.100s' is absolute; shards must be in the index's directory", p);
  for (const char *s = p; *s;) {
    const char *e = strchr(s, '/');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (len == 2 && s[0] == '.' && s[1] == '.')
      return bs_fail(err, EACCES, BS_OFF_NONE, key,
                     "shard path '%.100s' leaves the index's directory (..)", p);
    s += len + (e != NULL);
  }
  return 0;
}

static int cmp_str(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* metadata values: strings as they are, everything else as compact JSON. */
static char *meta_value(const json_t *v)
{
  if (json_is_string(v))
    return bs_strdup(json_string_value(v));
  return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

int bs_st_index_parse(const uint8_t *buf, size_t n, struct bs_st_index *ix, bs_err *err)
{
  bs_formats_init();
  memset(ix, 0, sizeof *ix);
  if (n > BS_ST_INDEX_MAX)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "index of %zu bytes exceeds the limit of %u bytes", n, BS_ST_INDEX_MAX);
  json_error_t je;
  unsigned long failures = bs_json_alloc_failures();
  json_t *root = json_loadb((const char *)buf, n, JSON_REJECT_DUPLICATES, &je);
  struct bs_strmap shards = {0};
  int rc = -1;
  /* (jansson's lexer ignores a failed growth of its string buffer: a shard
   * name would lose bytes, silently) */
  if (root && bs_json_alloc_failures() != failures) {
    json_decref(root);
    root = NULL;
  }
  if (!root) {
    if (bs_json_alloc_failures() != failures)
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory parsing the index");
    else
      bs_fail(err, EINVAL, je.position, NULL, "index is not valid JSON: %s (line %d, column %d)",
              je.text, je.line, je.column);
    return -1;
  }
  if (!json_is_object(root)) {
    bs_fail(err, EINVAL, 0, NULL, "index is not a JSON object");
    goto out;
  }
  const json_t *wm = json_object_get(root, "weight_map");
  if (!json_is_object(wm)) {
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
            wm ? "\"weight_map\" is not an object of key: shard file"
               : "no \"weight_map\": not a sharded checkpoint's index");
    goto out;
  }
  const json_t *meta = json_object_get(root, "metadata");
  if (meta && !json_is_object(meta) && !json_is_null(meta)) {
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "\"metadata\" is not an object");
    goto out;
  }
  size_t nmap = json_object_size(wm);
  ix->map = bs_calloc(nmap ? nmap : 1, sizeof *ix->map);
  char **names = bs_calloc(nmap ? nmap : 1, sizeof *names); /* borrowed from root */
  if (!ix->map || !names) {
    bs_free(names);
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  const char *k;
  const json_t *v;
  size_t nn = 0;
  json_object_foreach((json_t *)wm, k, v)
  {
    if (!json_is_string(v)) {
      bs_free(names);
      bs_fail(err, EINVAL, BS_OFF_NONE, k, "the weight_map's value is not a shard file name");
      goto out;
    }
    const char *p = json_string_value(v);
    if (strlen(k) > BS_MAX_KEY_LEN || check_shard_path(k, p, err) != 0) {
      bs_free(names);
      bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "tensor name of %zu bytes is too long", strlen(k));
      goto out;
    }
    int r = bs_strmap_put(&shards, p, nn);
    if (r < 0) {
      bs_free(names);
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
    if (r == 0) {
      if (nn >= BS_ST_MAX_SHARDS) {
        bs_free(names);
        bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "the weight_map names more than %u shards",
                BS_ST_MAX_SHARDS);
        goto out;
      }
      names[nn++] = (char *)p;
    }
  }
  /* Distinct shards, sorted; then each map entry's shard by lookup. */
  qsort(names, nn, sizeof *names, cmp_str);
  ix->shards = bs_calloc(nn ? nn : 1, sizeof *ix->shards);
  bs_strmap_destroy(&shards);
  memset(&shards, 0, sizeof shards);
  bool oom = !ix->shards;
  for (size_t i = 0; i < nn && !oom; i++) {
    oom = !(ix->shards[i] = bs_strdup(names[i])) || bs_strmap_put(&shards, ix->shards[i], i) < 0;
    ix->nshards += ix->shards[i] != NULL;
  }
  bs_free(names);
  json_object_foreach((json_t *)wm, k, v)
  {
    if (oom)
      break;
    size_t s = 0;
    (void)bs_strmap_get(&shards, json_string_value(v), &s);
    if (!(ix->map[ix->nmap].key = bs_strdup(k)))
      oom = true;
    else
      ix->map[ix->nmap++].shard = (uint32_t)s;
  }
  if (!oom && meta && json_is_object(meta)) {
    ix->meta = bs_calloc(json_object_size(meta) ? json_object_size(meta) : 1, sizeof *ix->meta);
    oom = !ix->meta;
    json_object_foreach((json_t *)meta, k, v)
    {
      if (oom)
        break;
      struct bs_kv *kv = &ix->meta[ix->nmeta];
      kv->key = bs_strdup(k);
      kv->value = meta_value(v);
      ix->nmeta++;
      oom = !kv->key || !kv->value;
    }
  }
  if (oom) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  rc = 0;
out:
  bs_strmap_destroy(&shards);
  json_decref(root);
  if (rc != 0)
    bs_st_index_destroy(ix);
  return rc;
}

static bool is_space(uint8_t c)
{
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

enum bs_sniff bs_st_index_sniff(const uint8_t *head, size_t n, uint64_t size)
{
  (void)size;
  size_t i = 0;
  while (i < n && is_space(head[i]))
    i++;
  if (i >= n || head[i] != '{')
    return BS_SNIFF_NO;
  return memmem(head, n, "\"weight_map\"", 12) ? BS_SNIFF_YES : BS_SNIFF_NO;
}

/* ---- The reader ---------------------------------------------------------------------------- */

/* Re-raise a shard's error with the shard named, keeping the tensor key. */
static int shard_fail(bs_err *err, const bs_err *sub, const char *shard)
{
  if (sub->off != BS_OFF_NONE)
    return bs_fail(err, sub->code, BS_OFF_NONE, sub->key[0] ? sub->key : NULL,
                   "shard %.200s: offset 0x%" PRIx64 ": %s", shard, sub->off, sub->msg);
  return bs_fail(err, sub->code, BS_OFF_NONE, sub->key[0] ? sub->key : NULL, "shard %.200s: %s",
                 shard, sub->msg);
}

/* Where the shards go as they are opened (bs_src_open_siblings). */
struct shards {
  struct bs_catalog *cat;
  const struct bs_st_index *ix;
  const struct bs_open_opts *opts;
  uint32_t *srcof;
};

/* Shard i, open: into the catalog, its header read (with its opening
 * request's bytes, still in the cache of a remote index's shards). */
static int shard_ready(void *ud, size_t i, struct bs_src *s, bs_err *err)
{
  struct shards *sh = ud;
  struct bs_catalog *cat = sh->cat;
  if (bs_catalog_add_src(cat, s, &sh->srcof[i], err) != 0)
    return -1;
  bs_err sub;
  bs_err_clear(&sub);
  size_t nmeta = cat->nmeta;
  if (bs_st_read(cat, sh->srcof[i], sh->opts, &sub) != 0)
    return shard_fail(err, &sub, sh->ix->shards[i]);
  bs_catalog_truncate(cat, cat->count, nmeta); /* the shard's own __metadata__ */
  return 0;
}

/* Every shard beside the index: a remote index's all at once (their
 * opening requests in flight together, one timeout for all), local ones in
 * turn; the first that cannot be opened or read ends it, named. */
static int open_shards(struct bs_catalog *cat, uint32_t src, const struct bs_st_index *ix,
                       const struct bs_open_opts *opts, uint32_t *srcof, bs_err *err)
{
  struct shards sh = {.cat = cat, .ix = ix, .opts = opts, .srcof = srcof};
  size_t failed;
  bs_err sub;
  bs_err_clear(&sub);
  if (bs_src_open_siblings(&cat->srcs[src], (const char *const *)ix->shards, ix->nshards,
                           shard_ready, &sh, &failed, &sub) == 0)
    return 0;
  if (failed == SIZE_MAX) /* (shard_ready's own error, the shard named) */
    return bs_fail(err, sub.code, sub.off, sub.key[0] ? sub.key : NULL, "%s", sub.msg);
  return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "shard %.200s: %s", ix->shards[failed], sub.msg);
}

/* The shard a catalog source is, as the index names it (messages only). */
static const char *shard_name(const struct bs_st_index *ix, const uint32_t *srcof, uint32_t src)
{
  for (size_t i = 0; i < ix->nshards; i++)
    if (srcof[i] == src)
      return ix->shards[i];
  return "?";
}

/* Every tensor once, where the map says; unmapped ones noted. */
static int check_map(struct bs_catalog *cat, size_t count0, const struct bs_st_index *ix,
                     const uint32_t *srcof, bs_err *err)
{
  struct bs_strmap keys = {0};
  bool *mapped = bs_calloc(cat->count - count0 + 1, sizeof *mapped);
  int rc = -1;
  if (!mapped) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (size_t i = count0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    int r = bs_strmap_put(&keys, t->key, i);
    if (r < 0) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
    if (r == 1) {
      size_t j = 0;
      (void)bs_strmap_get(&keys, t->key, &j);
      bs_fail(err, EINVAL, BS_OFF_NONE, t->key, "is in two shards, %.200s and %.200s",
              shard_name(ix, srcof, cat->tensors[j].src), shard_name(ix, srcof, t->src));
      goto out;
    }
  }
  for (size_t m = 0; m < ix->nmap; m++) {
    const struct bs_st_index_entry *e = &ix->map[m];
    size_t i;
    if (!bs_strmap_get(&keys, e->key, &i)) {
      bs_fail(err, EINVAL, BS_OFF_NONE, e->key,
              "the weight_map puts it in shard %.200s, which does not hold it",
              ix->shards[e->shard]);
      goto out;
    }
    if (cat->tensors[i].src != srcof[e->shard]) {
      bs_fail(err, EINVAL, BS_OFF_NONE, e->key,
              "the weight_map puts it in shard %.200s, but it is in %.200s", ix->shards[e->shard],
              shard_name(ix, srcof, cat->tensors[i].src));
      goto out;
    }
    mapped[i - count0] = true;
  }
  size_t unmapped = 0;
  for (size_t i = count0; i < cat->count; i++) {
    if (mapped[i - count0])
      continue;
    char line[600];
    if (++unmapped <= MAX_NOTES)
      snprintf(line, sizeof line,
               "tensor '%.200s' of shard %.200s is not in the weight_map (mounted from its shard)",
               cat->tensors[i].key, shard_name(ix, srcof, cat->tensors[i].src));
    else if (unmapped == MAX_NOTES + 1)
      snprintf(line, sizeof line, "... and more tensors the weight_map does not name");
    else
      continue;
    if (bs_catalog_note(cat, line, err) != 0)
      goto out;
  }
  rc = 0;
out:
  bs_free(mapped);
  bs_strmap_destroy(&keys);
  return rc;
}

/* A write of this set that a kill interrupted is completed or rolled back
 * before the set is read (so no half set is ever mounted or listed); when
 * that changed the directory, the index is opened again. */
static int recover_first(struct bs_catalog *cat, uint32_t src, bs_err *err)
{
  struct bs_src *s = &cat->srcs[src];
  struct bs_src_ident id;
  if (!bs_src_ident(s, &id))
    return 0; /* no file (memory): no directory */
  bool did = false;
  if (bs_set_recover(s->name, BS_ST_SHARD_SUFFIX, &did, err) != 0)
    return -1;
  struct bs_src fresh;
  if (!did)
    return 0;
  if (bs_src_open(&fresh, s->name, err) != 0)
    return -1;
  bs_src_destroy(s);
  *s = fresh;
  return 0;
}

int bs_st_index_read(struct bs_catalog *cat, uint32_t src, const struct bs_open_opts *opts,
                     bs_err *err)
{
  if (src >= cat->nsrcs)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "no source %u in the catalog", src);
  if (recover_first(cat, src, err) != 0)
    return -1;
  const struct bs_src *s = &cat->srcs[src];
  if (s->size > BS_ST_INDEX_MAX)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "index of %" PRIu64 " bytes exceeds the limit of %u bytes", s->size,
                   BS_ST_INDEX_MAX);
  const struct bs_catalog_mark mark = bs_catalog_mark(cat);
  const size_t count0 = cat->count;
  uint8_t *buf = NULL;
  uint32_t *srcof = NULL;
  struct bs_st_index ix = {0};
  int rc = -1;
  if (bs_src_read_alloc(s, 0, s->size, &buf, err) != 0 ||
      bs_st_index_parse(buf, (size_t)s->size, &ix, err) != 0)
    goto out;
  bs_free(buf);
  buf = NULL;
  if (!(srcof = bs_calloc(ix.nshards ? ix.nshards : 1, sizeof *srcof))) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  if (open_shards(cat, src, &ix, opts, srcof, err) != 0 ||
      check_map(cat, count0, &ix, srcof, err) != 0)
    goto out;
  for (size_t i = 0; i < ix.nmeta; i++)
    if (bs_catalog_add_meta(cat, ix.meta[i].key, ix.meta[i].value, err) != 0)
      goto out;
  rc = 0;
out:
  if (rc != 0)
    bs_catalog_rollback(cat, &mark); /* with the shards opened and the notes added */
  bs_free(buf);
  bs_free(srcof);
  bs_st_index_destroy(&ix);
  return rc;
}

int bs_st_index_find(const char *dir, char **path, bs_err *err)
{
  *path = NULL;
  DIR *d = opendir(dir);
  if (!d)
    return bs_fail(err, errno, BS_OFF_NONE, NULL, "cannot list the directory: %s", strerror(errno));
  char *found = NULL;
  int rc = 0;
  struct dirent *de;
  const size_t sl = strlen(INDEX_SUFFIX);
  while (rc == 0 && (de = readdir(d)) != NULL) {
    size_t n = strlen(de->d_name);
    if (n <= sl || strcmp(de->d_name + n - sl, INDEX_SUFFIX) != 0)
      continue;
    if (found) {
      rc = bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "the directory holds more than one *" INDEX_SUFFIX " (%.100s and %.100s): "
                   "mount the one you mean",
                   found, de->d_name);
      break;
    }
    if (!(found = bs_strdup(de->d_name)))
      rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  closedir(d);
  if (rc == 0 && !found)
    rc = bs_fail(err, ENOENT, BS_OFF_NONE, NULL,
                 "a directory without a *" INDEX_SUFFIX
                 "; burnstore mounts a directory only when it holds one sharded checkpoint");
  if (rc == 0 && !(*path = bs_path_join(dir, found)))
    rc = bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  bs_free(found);
  return rc;
}

/* The length of NAME when base is NAME-<digits>-of-<digits>.safetensors, else 0. */
static size_t shard_stem(const char *base, size_t n)
{
  static const char st[] = BS_ST_SHARD_SUFFIX;
  if (!bs_ends_with(base, n, st, true))
    return 0;
  size_t i = n - (sizeof st - 1), d = i;
  while (d > 0 && base[d - 1] >= '0' && base[d - 1] <= '9')
    d--;
  if (d == i || d < 4 || strncmp(base + d - 4, "-of-", 4) != 0)
    return 0;
  i = d - 4;
  d = i;
  while (d > 0 && base[d - 1] >= '0' && base[d - 1] <= '9')
    d--;
  if (d == i || d < 2 || base[d - 1] != '-')
    return 0;
  return d - 1;
}

bool bs_st_set_name(const char *base, char *out, size_t n)
{
  size_t len = strlen(base), stem = 0;
  if (bs_ends_with(base, len, BS_ST_INDEX_SUFFIX, true))
    stem = len - strlen(BS_ST_INDEX_SUFFIX);
  else
    stem = shard_stem(base, len);
  int w = stem > 0 ? snprintf(out, n, "%.*s" BS_ST_SHARD_SUFFIX, (int)stem, base) : -1;
  return w > 0 && (size_t)w < n;
}

void bs_st_index_describe(const struct bs_catalog *cat, bs_detail_fn detail, void *ctx)
{
  char v[24];
  snprintf(v, sizeof v, "%zu", cat->nsrcs - 1); /* srcs[0] is the index */
  detail(ctx, "shards", v);
}

const char *bs_st_index_shard_of(const struct bs_catalog *cat, const struct bs_tensor *t)
{
  if (cat->format != BS_FMT_ST_SHARDED || cat->nsrcs == 0 || t->src >= cat->nsrcs || t->src == 0)
    return NULL;
  const char *idx = cat->srcs[0].name, *name = cat->srcs[t->src].name;
  const char *slash = strrchr(idx, '/');
  size_t dl = slash ? (size_t)(slash - idx) + 1 : 0;
  if (dl && strncmp(name, idx, dl) == 0)
    return name + dl;
  if (!dl && strncmp(name, "./", 2) == 0)
    return name + 2;
  return name;
}
