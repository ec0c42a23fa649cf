/* Sharded SafeTensors output: NAME-0000K-of-0000N.safetensors shards and
 * NAME.safetensors.index.json, written atomically as a set (safetensors_write.h).
 *
 * Index layout written (transformers: json.dumps(index, indent=2,
 * sort_keys=True) + "\n", ASCII only):
 *   {
 *     "metadata": {
 *       "total_size": 344
 *     },
 *     "weight_map": {
 *       "lm_head.weight": "model-00002-of-00002.safetensors",
 *       ...
 *     }
 *   }
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/safe_open.h"
#include "core/set_journal.h"
#include "core/strmap.h"
#include "formats/formats.h"
#include "formats/safetensors_sharded.h"
#include "formats/safetensors_write.h"

#define IDX_SUFFIX ".safetensors.index.json"
#define ST_SUFFIX ".safetensors"

/* ---- JSON as Python's json.dumps writes it (ensure_ascii) -------------------------------- */

static int puts_(struct bs_buf *b, const char *s)
{
  return bs_buf_put(b, s, strlen(s));
}

/* One UTF-8 sequence at p (valid: the catalog's keys are), its code point. */
static uint32_t utf8_next(const unsigned char **p)
{
  const unsigned char *s = *p;
  uint32_t c = s[0];
  int n = c < 0x80 ? 0 : c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
  c = n == 0 ? c : n == 1 ? c & 0x1f : n == 2 ? c & 0x0f : c & 0x07;
  int i = 1;
  for (; i <= n && s[i]; i++)
    c = (c << 6) | (s[i] & 0x3f);
  *p = s + i;
  return c;
}

static int py_string(struct bs_buf *b, const char *s)
{
  int bad = bs_buf_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p && !bad;) {
    unsigned char c = *p;
    char e[16];
    if (c == '"' || c == '\\') {
      e[0] = '\\', e[1] = (char)c;
      bad |= bs_buf_put(b, e, 2);
      p++;
      continue;
    }
    if (c >= 0x20 && c < 0x7f) {
      bad |= bs_buf_put(b, p, 1);
      p++;
      continue;
    }
    const char *short_ = c == '\n'   ? "\\n"
                         : c == '\r' ? "\\r"
                         : c == '\t' ? "\\t"
                         : c == '\b' ? "\\b"
                         : c == '\f' ? "\\f"
                                     : NULL;
    if (short_) {
      bad |= puts_(b, short_);
      p++;
      continue;
    }
    uint32_t cp = utf8_next(&p);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    } else {
      snprintf(e, sizeof e, "\\u%04x", cp);
    }
    bad |= puts_(b, e);
  }
  return bad | bs_buf_put(b, "\"", 1);
}

/* ---- The set ------------------------------------------------------------------------------- */

struct shard {
  char *name; /* file name, in dir */
  size_t *which;
  size_t n, cap;
  uint64_t bytes;
  bool write; /* its bytes change */
};

struct set {
  char *dir, *stem, *index;
  int dirfd;     /* the index's directory, held (-1 until load_old) */
  bool have_ist; /* the old index's fstat (mode kept for a new shard) */
  struct stat ist;
  struct shard *shards;
  size_t nshards;
  size_t *shard_of; /* per catalog tensor: its shard, or SIZE_MAX (not written) */
  struct bs_st_index old;
  bool have_old;
  /* The old index is writable by others than its owner (a group-writable
   * index in a team directory): its names may be anyone's choice, so only
   * its shards of this set's own naming that are the caller's or root's
   * regular files (or missing) are removed or reused; the others (foreign)
   * are left in place, and said. */
  bool untrusted;
  bool *foreign; /* per old shard (untrusted only) */
  size_t nforeign;
};

static void set_destroy(struct set *s)
{
  for (size_t i = 0; i < s->nshards; i++) {
    bs_free(s->shards[i].name);
    bs_free(s->shards[i].which);
  }
  bs_free(s->shards);
  bs_free(s->shard_of);
  bs_free(s->dir);
  bs_free(s->stem);
  bs_free(s->index);
  bs_free(s->foreign);
  bs_st_index_destroy(&s->old);
  if (s->dirfd >= 0)
    close(s->dirfd);
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = n >= 0 ? bs_malloc((size_t)n + 1) : NULL;
  if (p) {
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  return p;
}

/* s is NAME + suffix with a NAME of at least one byte. */
static bool ends_with(const char *s, const char *suffix)
{
  size_t n = strlen(s);
  return n > strlen(suffix) && bs_ends_with(s, n, suffix, true);
}

static int names(struct set *s, const char *path, bs_err *err)
{
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t cut = ends_with(base, IDX_SUFFIX)  ? strlen(IDX_SUFFIX)
               : ends_with(base, ST_SUFFIX) ? strlen(ST_SUFFIX)
                                            : 0;
  if (!cut)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "%s: a sharded SafeTensors output is named NAME" IDX_SUFFIX " or NAME" ST_SUFFIX,
                   path);
  s->dir =
      slash ? str_printf("%.*s", (int)(slash == path ? 1 : slash - path), path) : bs_strdup(".");
  s->stem = str_printf("%.*s", (int)(strlen(base) - cut), base);
  s->index = s->dir && s->stem ? str_printf("%s/%s" IDX_SUFFIX, s->dir, s->stem) : NULL;
  if (!s->index)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  return 0;
}

/* Refuse a set whose old index names a file the set does not own. */
static int not_owned(const struct set *s, size_t k, const char *why, bs_err *err)
{
  const char *key = NULL;
  for (size_t e = 0; e < s->old.nmap && !key; e++)
    if (s->old.map[e].shard == k)
      key = s->old.map[e].key;
  return bs_fail(err, EACCES, BS_OFF_NONE, key,
                 "%s names '%.100s' as its shard, which is %s; burnstore replaces and removes only "
                 "the set's own shard files beside the index, so it writes nothing",
                 s->index, s->old.shards[k], why);
}

int bs_st_set_recover(const char *path, bs_err *err)
{
  struct set s = {.dirfd = -1};
  int rc = names(&s, path, err) == 0 && bs_set_recover(s.index, ST_SUFFIX, NULL, err) == 0 ? 0 : -1;
  set_destroy(&s);
  return rc;
}

/* Whether `name` follows this set's own shard naming: STEM-NNNNN-of-NNNNN
 * .safetensors (five digits or more each), the names reshard gives. */
static bool own_shard_name(const struct set *s, const char *name)
{
  size_t sl = strlen(s->stem);
  if (strncmp(name, s->stem, sl) != 0 || name[sl] != '-')
    return false;
  const char *p = name + sl + 1;
  for (int part = 0; part < 2; part++) {
    size_t d = strspn(p, "0123456789");
    if (d < 5)
      return false;
    p += d;
    if (part == 0) {
      if (strncmp(p, "-of-", 4) != 0)
        return false;
      p += 4;
    }
  }
  return strcmp(p, ST_SUFFIX) == 0;
}

/* The existing index at s->index, if there is a readable one; it must be a
 * regular file of this user's or root's (another user who may write the
 * directory could plant one naming this user's files as its shards), and
 * every shard it names one this write may replace or remove: a plain
 * NAME.safetensors in the index's directory, a regular file of this user's
 * or root's (or missing), not the index. Anything else refuses the write
 * before it starts, in one line naming it (and its owner). An index that
 * others may write (group or other write bits) is not refused for its
 * names, which another user may have chosen: its shards not of this set's
 * own naming, or not regular files of this user's or root's, are foreign,
 * never removed, replaced or read (see struct set). */
static int load_old(struct set *s, bs_err *err)
{
  bs_err sub;
  bs_err_clear(&sub);
  const char *ibase = strrchr(s->index, '/') + 1;
  if ((s->dirfd = bs_safe_open_dir(s->dir, BS_SAFE_ANY_OWNER, &sub)) < 0)
    return 0; /* no directory we can open: nothing there to replace */
  int fd = bs_safe_openat(s->dirfd, s->dir, ibase, O_RDONLY, 0, BS_SAFE_REG, &s->ist, &sub);
  if (fd < 0) {
    if (sub.code == ENOENT || sub.code == EACCES)
      return 0; /* none (or unreadable): no old set to replace */
    return bs_fail(err, sub.code, BS_OFF_NONE, NULL,
                   "%s; burnstore replaces only an index of its user's or root's, and the "
                   "shards it names",
                   sub.msg);
  }
  s->have_ist = true;
  struct bs_src src;
  if (bs_src_init_fd(&src, fd, BS_SRC_OWN_FD | BS_SRC_UNWATCHED, s->index, &sub) != 0)
    return 0; /* (fd closed) unreadable: as above */
  /* Read as the reader reads it: bounded first, then exactly its size (a
   * buffer of the whole limit was allocated for every write). */
  uint8_t *buf = NULL;
  if (src.size > BS_ST_INDEX_MAX) {
    bs_src_destroy(&src);
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "%s: an old index of %" PRIu64 " bytes exceeds the limit of %u bytes; it is "
                   "not replaced",
                   s->index, src.size, BS_ST_INDEX_MAX);
  }
  int rd = bs_src_read_alloc(&src, 0, src.size, &buf, &sub);
  uint64_t n = src.size;
  bs_src_destroy(&src);
  if (rd != 0)
    return sub.code == ENOMEM ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory") : 0;
  bs_err_clear(&sub);
  s->have_old = bs_st_index_parse(buf, (size_t)n, &s->old, &sub) == 0;
  bs_free(buf);
  if (!s->have_old && sub.code == ENOMEM)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (!s->have_old && sub.code == EACCES) /* a shard path outside the directory */
    return bs_fail(err, EACCES, BS_OFF_NONE, sub.key[0] ? sub.key : NULL,
                   "%s: %s; burnstore replaces and removes only the set's own shard files beside "
                   "the index, so it writes nothing",
                   s->index, sub.msg);
  s->untrusted = s->have_old && (s->ist.st_mode & (S_IWGRP | S_IWOTH));
  if (s->untrusted && !(s->foreign = bs_calloc(s->old.nshards + 1, sizeof *s->foreign)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t k = 0; s->have_old && k < s->old.nshards; k++) {
    const char *name = s->old.shards[k];
    if (s->untrusted) {
      bool ours = false;
      struct stat st;
      if (own_shard_name(s, name))
        ours = fstatat(s->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0
                   ? errno == ENOENT
                   : S_ISREG(st.st_mode) && (st.st_uid == geteuid() || st.st_uid == 0);
      s->foreign[k] = !ours;
      s->nforeign += !ours;
      continue;
    }
    if (strcmp(name, ibase) == 0)
      return not_owned(s, k, "the index itself", err);
    if (strchr(name, '/'))
      return not_owned(s, k, "not a file of the index's own directory", err);
    if (!bs_set_is_member(name, ST_SUFFIX))
      return not_owned(s, k, "not a shard file name (NAME.safetensors)", err);
    struct stat st;
    int r = fstatat(s->dirfd, name, &st, AT_SYMLINK_NOFOLLOW);
    if (r == 0 && S_ISLNK(st.st_mode))
      return not_owned(s, k, "a symbolic link", err);
    if (r == 0 && !S_ISREG(st.st_mode))
      return not_owned(s, k, "not a regular file", err);
    if (r == 0 && st.st_uid != geteuid() && st.st_uid != 0) {
      char who[160], why[200];
      bs_safe_owner(st.st_uid, who, sizeof who);
      snprintf(why, sizeof why, "owned by %s, not by you", who);
      return not_owned(s, k, why, err);
    }
  }
  return 0;
}

static int add_to(struct shard *sh, size_t ix, uint64_t bytes, bs_err *err)
{
  if (bs_grow((void **)&sh->which, &sh->cap, sh->n + 1, sizeof *sh->which) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  sh->which[sh->n++] = ix;
  sh->bytes += bytes;
  return 0;
}

static int new_shards(struct set *s, size_t n, bs_err *err)
{
  s->shards = bs_calloc(n ? n : 1, sizeof *s->shards);
  if (!s->shards)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  s->nshards = n;
  return 0;
}

/* Greedy, in catalog order, as transformers' shard_checkpoint does. */
static int reshard(struct set *s, const struct bs_catalog *cat, uint64_t max, bs_err *err)
{
  size_t n = 0;
  uint64_t cur = 0;
  bool open = false;
  for (size_t i = 0; i < cat->count; i++) {
    if (cat->tensors[i].hidden)
      continue;
    uint64_t b = cat->tensors[i].nbytes;
    if (!open || (cur > 0 && (b > max || cur > max - b))) {
      n++;
      cur = 0;
      open = true;
    }
    cur += b;
    s->shard_of[i] = n - 1;
  }
  if (n == 0)
    n = 1; /* no tensors: one empty shard */
  if (n > BS_ST_MAX_SHARDS)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL,
                   "max_shard_size makes %zu shards, more than the %u an index may name", n,
                   BS_ST_MAX_SHARDS);
  if (new_shards(s, n, err) != 0)
    return -1;
  for (size_t k = 0; k < n; k++)
    if (!(s->shards[k].name = str_printf("%s-%05zu-of-%05zu" ST_SUFFIX, s->stem, k + 1, n)))
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  return 0;
}

/* Each tensor back to the shard the existing index names; new ones to the
 * last shard. The foreign shards of an index others may write are left out
 * (their tensors go to the last shard of the set's own, as new ones do);
 * the caller reshards when none is left. */
static int keep_shards(struct set *s, const struct bs_catalog *cat, bs_err *err)
{
  size_t *to = bs_malloc((s->old.nshards + 1) * sizeof *to), n = 0;
  if (!to)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (new_shards(s, s->old.nshards - s->nforeign, err) != 0) {
    bs_free(to);
    return -1;
  }
  for (size_t k = 0; k < s->old.nshards; k++) {
    to[k] = SIZE_MAX;
    if (s->foreign && s->foreign[k])
      continue;
    if (!(s->shards[n].name = bs_strdup(s->old.shards[k]))) {
      bs_free(to);
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    }
    to[k] = n++;
  }
  struct bs_strmap m = {0};
  for (size_t e = 0; e < s->old.nmap; e++)
    if (bs_strmap_put(&m, s->old.map[e].key, s->old.map[e].shard) < 0) {
      bs_strmap_destroy(&m);
      bs_free(to);
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    }
  for (size_t i = 0; i < cat->count; i++) {
    if (cat->tensors[i].hidden)
      continue;
    size_t k;
    s->shard_of[i] =
        bs_strmap_get(&m, cat->tensors[i].name, &k) && to[k] != SIZE_MAX ? to[k] : n - 1;
  }
  bs_strmap_destroy(&m);
  bs_free(to);
  return 0;
}

/* A shard's metadata: the catalog's without total_size, with a format. */
static int shard_meta(const struct bs_catalog *cat, struct bs_kv **out, size_t *n, bs_err *err)
{
  *out = bs_calloc(cat->nmeta + 1, sizeof **out);
  if (!*out)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  bool fmt = false;
  *n = 0;
  for (size_t i = 0; i < cat->nmeta; i++) {
    if (strcmp(cat->meta[i].key, "total_size") == 0)
      continue;
    fmt |= strcmp(cat->meta[i].key, "format") == 0;
    (*out)[(*n)++] = cat->meta[i]; /* borrowed */
  }
  if (!fmt)
    (*out)[(*n)++] = (struct bs_kv){"format", "pt", NULL, false};
  return 0;
}

static int cmp_kv(const void *a, const void *b)
{
  return strcmp(((const struct bs_kv *)a)->key, ((const struct bs_kv *)b)->key);
}

struct wm {
  const char *key, *file;
};

static int cmp_wm(const void *a, const void *b)
{
  return strcmp(((const struct wm *)a)->key, ((const struct wm *)b)->key);
}

static int index_json(const struct set *s, const struct bs_catalog *cat, struct bs_buf *b,
                      bs_err *err)
{
  uint64_t total = 0;
  size_t nt = 0;
  for (size_t i = 0; i < cat->count; i++)
    if (s->shard_of[i] != SIZE_MAX) {
      if (!bs_add_u64(total, cat->tensors[i].nbytes, &total))
        return bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "total_size overflows 64 bits");
      nt++;
    }
  struct bs_kv *meta = bs_calloc(cat->nmeta + 1, sizeof *meta);
  struct wm *map = bs_calloc(nt ? nt : 1, sizeof *map);
  if (!meta || !map) {
    bs_free(meta);
    bs_free(map);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  char tot[24];
  snprintf(tot, sizeof tot, "%" PRIu64, total);
  size_t nm = 0;
  for (size_t i = 0; i < cat->nmeta; i++)
    if (strcmp(cat->meta[i].key, "total_size") != 0)
      meta[nm++] = cat->meta[i];
  meta[nm++] = (struct bs_kv){"total_size", tot, NULL, false};
  qsort(meta, nm, sizeof *meta, cmp_kv);
  for (size_t i = 0, j = 0; i < cat->count; i++)
    if (s->shard_of[i] != SIZE_MAX)
      map[j++] = (struct wm){cat->tensors[i].name, s->shards[s->shard_of[i]].name};
  qsort(map, nt, sizeof *map, cmp_wm);
  int bad = puts_(b, "{\n  \"metadata\": {");
  for (size_t i = 0; i < nm; i++) {
    bad |= puts_(b, i ? ",\n    " : "\n    ") | py_string(b, meta[i].key) | puts_(b, ": ");
    bad |= meta[i].value == tot ? puts_(b, tot) : py_string(b, meta[i].value);
  }
  bad |= puts_(b, "\n  },\n  \"weight_map\": {");
  for (size_t i = 0; i < nt; i++)
    bad |= puts_(b, i ? ",\n    " : "\n    ") | py_string(b, map[i].key) | puts_(b, ": ") |
           py_string(b, map[i].file);
  bad |= puts_(b, nt ? "\n  }\n}\n" : "}\n}\n");
  bs_free(meta);
  bs_free(map);
  if (bad)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (b->len > BS_ST_INDEX_MAX)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "an index of %zu bytes exceeds %u bytes", b->len,
                   BS_ST_INDEX_MAX);
  return 0;
}

/* The names the journal records: every file of the new set (the index
 * last), and the old files the set replaces (shards of the old index, and
 * `path` when a set replaces the single file NAME.safetensors). Borrowed. */
static int journal_names(const struct set *s, const char *path, const char ***newf, size_t *nnew,
                         const char ***oldf, size_t *nold, bs_err *err)
{
  *newf = bs_calloc(s->nshards + 1, sizeof **newf);
  *oldf = bs_calloc(s->old.nshards + 1, sizeof **oldf);
  if (!*newf || !*oldf)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  *nnew = *nold = 0;
  for (size_t k = 0; k < s->nshards; k++)
    (*newf)[(*nnew)++] = s->shards[k].name;
  (*newf)[(*nnew)++] = strrchr(s->index, '/') + 1;
  for (size_t k = 0; s->have_old && k < s->old.nshards; k++)
    if (!s->foreign || !s->foreign[k])
      (*oldf)[(*nold)++] = s->old.shards[k];
  struct stat st;
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (ends_with(path, ST_SUFFIX) && s->dirfd >= 0 &&
      fstatat(s->dirfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    char who[160];
    bs_safe_owner(st.st_uid, who, sizeof who);
    if (!S_ISREG(st.st_mode) || !bs_set_is_member(base, ST_SUFFIX) ||
        (st.st_uid != geteuid() && st.st_uid != 0))
      return bs_fail(err, EACCES, BS_OFF_NONE, NULL,
                     "%s (owned by %s) is not a regular NAME.safetensors file of yours; burnstore "
                     "does not replace it with a shard set",
                     path, who);
    (*oldf)[(*nold)++] = base;
  }
  return 0;
}

/* After a write over an index others may write: the files it named as
 * shards that were left in place, in one line (the mount's log, convert's
 * stderr). */
static void note_foreign(const struct set *s)
{
  char line[BS_LOG_LINE];
  size_t n = (size_t)snprintf(line, sizeof line,
                              "note: %s was writable by others (mode %04o), so the %zu files it "
                              "named as shards that are not this set's own (%s-NNNNN-of-NNNNN"
                              ".safetensors of yours) were left in place:",
                              s->index, (unsigned)(s->ist.st_mode & 07777), s->nforeign, s->stem);
  for (size_t k = 0; k < s->old.nshards && n < sizeof line; k++)
    if (s->foreign[k])
      n += (size_t)snprintf(line + n, sizeof line - n, " %s", s->old.shards[k]);
  bs_log(BS_LOG_WARNING, "%s", line);
}

/* Foreign old shards the new set writes over (a name of this set's own
 * that another user's file held) are not left in place: not foreign. */
static void unmark_written(struct set *s)
{
  for (size_t k = 0; s->foreign && k < s->old.nshards; k++)
    for (size_t j = 0; s->foreign[k] && j < s->nshards; j++)
      if (strcmp(s->old.shards[k], s->shards[j].name) == 0) {
        s->foreign[k] = false;
        s->nforeign--;
      }
}

int bs_st_write_set(const struct bs_catalog *cat, const char *path, const struct bs_write_opts *o,
                    bs_err *err)
{
  struct set s = {.dirfd = -1};
  struct bs_set js = {0};
  struct bs_atomic *at = NULL;
  struct bs_kv *smeta = NULL;
  struct bs_buf ib = {0};
  const char **newf = NULL, **oldf = NULL;
  size_t nat = 0, nnew = 0, nold = 0;
  int rc = -1;
  if (names(&s, path, err) != 0)
    goto out;
  if (!(s.shard_of = bs_malloc((cat->count ? cat->count : 1) * sizeof *s.shard_of))) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < cat->count; i++)
    s.shard_of[i] = SIZE_MAX;
  /* An interrupted write of this set first completes or rolls back, so the
   * old index read next is a whole set's; the journal's lock keeps other
   * writers of the set out from here. */
  if (bs_set_begin(&js, s.index, ST_SUFFIX, err) != 0 || load_old(&s, err) != 0)
    goto out;
  if (o->max_shard_size == 0 && s.have_old && s.old.nshards > s.nforeign) {
    if (keep_shards(&s, cat, err) != 0)
      goto out;
  } else if (reshard(&s, cat, o->max_shard_size ? o->max_shard_size : UINT64_MAX, err) != 0) {
    goto out;
  }
  for (size_t i = 0; i < cat->count; i++)
    if (s.shard_of[i] != SIZE_MAX &&
        add_to(&s.shards[s.shard_of[i]], i, cat->tensors[i].nbytes, err) != 0)
      goto out;
  if (journal_names(&s, path, &newf, &nnew, &oldf, &nold, err) != 0 ||
      bs_set_prepare(&js, newf, nnew, oldf, nold, err) != 0)
    goto out;

  /* The shards' catalog: the same tensors and sources, their metadata. */
  struct bs_catalog sc = *cat;
  if (shard_meta(cat, &smeta, &sc.nmeta, err) != 0)
    goto out;
  sc.meta = smeta;
  /* Every file of a new set gets the new target's mode; a new shard of an
   * existing set its index's, so the set stays as private as it was. */
  unsigned mode = bs_write_new_mode(o);
  if (s.have_ist) /* (an index of this user's or root's: load_old refused another's) */
    mode = s.ist.st_mode & 0666;
  if (!(at = bs_calloc(s.nshards + 1, sizeof *at))) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  for (size_t k = 0; k < s.nshards; k++) {
    struct shard *sh = &s.shards[k];
    char *p = str_printf("%s/%s", s.dir, sh->name);
    bool same = false;
    if (!p) {
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
      goto out;
    }
    static const size_t none[1];
    const size_t *which = sh->which ? sh->which : none; /* NULL would mean "every tensor" */
    int r = bs_st_file_unchanged(&sc, which, sh->n, p, &same, err);
    if (r == 0 && !same && (r = bs_atomic_open_mode(&at[nat], p, mode, err)) == 0) {
      nat++;
      /* Synced and closed as soon as written: a set of any size holds O(1)
       * fds (its journal's lock keeps other writers off the temp files). */
      if ((r = bs_st_write_some(&sc, which, sh->n, &at[nat - 1].sink, err)) != 0 ||
          (r = bs_atomic_sync(&at[nat - 1], err)) != 0)
        bs_atomic_fail(&at[nat - 1], err);
      else
        bs_atomic_unlock(&at[nat - 1]);
    }
    bs_free(p);
    if (r != 0)
      goto out;
  }
  if (index_json(&s, cat, &ib, err) != 0 || bs_atomic_open_mode(&at[nat], s.index, mode, err) != 0)
    goto out;
  nat++;
  if (bs_sink_put(&at[nat - 1].sink, ib.data, ib.len, err) != 0 ||
      bs_atomic_sync(&at[nat - 1], err) != 0) {
    bs_atomic_fail(&at[nat - 1], err);
    goto out;
  }
  /* The commit record, then the shards, the index, the old shards' removal. */
  rc = bs_set_commit(&js, at, nat, err);
  unmark_written(&s);
  if (rc == 0 && s.nforeign)
    note_foreign(&s);
out:
  for (size_t k = 0; at && k <= s.nshards; k++)
    bs_atomic_abort(&at[k]);
  bs_set_abort(&js);
  bs_free(at);
  bs_free(newf);
  bs_free(oldf);
  bs_free(smeta);
  bs_buf_destroy(&ib);
  set_destroy(&s);
  return rc;
}
