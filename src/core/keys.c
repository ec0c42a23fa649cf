/* Key options, mirroring burn-store's load pipeline (see keys.h for the order).
 *
 * Regexes are PCRE2 compiled with UTF + UCP (Unicode \d \w \b, as Rust's regex
 * crate), DOLLAR_ENDONLY (Rust's `$` never matches before a final newline) and
 * MATCH_INVALID_UTF (a key that is not UTF-8 is matched, never an error).
 * PCRE2 is a superset of Rust's syntax (it also has backreferences and
 * lookaround); patterns valid in both mean the same.
 *
 * Replacement follows Rust's `Captures::expand`, and we substitute ourselves
 * rather than with pcre2_substitute, for two reasons: the reference syntax
 * differs (Rust reads `$` + the longest run of [0-9A-Za-z_] as ONE reference,
 * so `$1a` is the group named "1a" -- nonexistent, hence empty; write `${1}a`),
 * and so does global iteration (Rust's replace_all skips an empty match that
 * ends where the previous match ended; PCRE2 and Perl retry there non-empty).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "core/keys.h"

#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"

#define COMPILE_FLAGS                                                                              \
  (PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_BACKSLASH_C)
#define PCRE2_COMPILE_ENOMEM 121 /* ERR21 "failed to allocate heap memory" */
#define TOP_KEYS_LISTED 20

static void *pc_malloc(PCRE2_SIZE n, void *data)
{
  (void)data;
  return bs_malloc(n);
}

static void pc_free(void *p, void *data)
{
  (void)data;
  bs_free(p);
}

void bs_keyopts_init(struct bs_keyopts *o)
{
  memset(o, 0, sizeof *o);
}

static void regex_destroy(struct bs_key_regex *r)
{
  bs_free(r->pattern);
  pcre2_code_free(r->code);
}

static void remap_destroy(struct bs_key_remap *m)
{
  regex_destroy(&m->re);
  bs_free(m->to);
  bs_free(m->lit);
  bs_free(m->pieces);
}

void bs_keyopts_destroy(struct bs_keyopts *o)
{
  if (!o)
    return;
  for (size_t i = 0; i < o->ninclude; i++)
    regex_destroy(&o->include[i]);
  bs_free(o->include);
  for (size_t i = 0; i < o->nexclude; i++)
    regex_destroy(&o->exclude[i]);
  bs_free(o->exclude);
  for (size_t i = 0; i < o->nremap; i++)
    remap_destroy(&o->remap[i]);
  bs_free(o->remap);
  bs_free(o->top_level_key);
  pcre2_compile_context_free(o->cctx);
  pcre2_general_context_free(o->gctx);
  memset(o, 0, sizeof *o);
}

bool bs_keyopts_any(const struct bs_keyopts *o)
{
  return o->ninclude || o->nexclude || o->nremap || o->top_level_key || o->contiguous_indices;
}

static int oom(bs_err *err)
{
  return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
}

static pcre2_code *compile(struct bs_keyopts *o, const char *what, const char *pat, bs_err *err)
{
  if (!o->gctx) {
    o->gctx = pcre2_general_context_create(pc_malloc, pc_free, NULL);
    if (!o->gctx) {
      oom(err);
      return NULL;
    }
  }
  if (!o->cctx) {
    o->cctx = pcre2_compile_context_create(o->gctx);
    if (!o->cctx) {
      oom(err);
      return NULL;
    }
  }
  int ec;
  PCRE2_SIZE eoff;
  pcre2_code *code =
      pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, COMPILE_FLAGS, &ec, &eoff, o->cctx);
  if (code)
    return code;
  if (ec == PCRE2_COMPILE_ENOMEM) {
    oom(err);
    return NULL;
  }
  PCRE2_UCHAR msg[128];
  if (pcre2_get_error_message(ec, msg, sizeof msg) < 0)
    snprintf((char *)msg, sizeof msg, "PCRE2 error %d", ec);
  bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "%s regex '%s' is invalid: %s at offset %zu", what, pat,
          (const char *)msg, (size_t)eoff);
  return NULL;
}

/* Rust's `str::parse::<usize>()`: ASCII digits, one optional leading '+',
 * leading zeros allowed, no overflow. */
static bool parse_usize(const char *s, size_t n, uint64_t *out)
{
  if (n > 0 && s[0] == '+') {
    s++;
    n--;
  }
  if (n == 0)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    if (!bs_mul_u64(v, 10, &v) || !bs_add_u64(v, (uint64_t)(s[i] - '0'), &v))
      return false;
  }
  if (v > SIZE_MAX)
    return false;
  *out = v;
  return true;
}

static bool is_cap_letter(char c)
{
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* Group number a reference names, or -1 when it names no group (expands to
 * nothing, as in Rust). */
static int32_t resolve_ref(const pcre2_code *code, const char *ref, size_t n, bs_err *err,
                           bool *failed)
{
  uint32_t ncap = 0;
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &ncap);
  uint64_t num;
  if (parse_usize(ref, n, &num))
    return num <= ncap ? (int32_t)num : -1;
  char *name = bs_strndup(ref, n);
  if (!name) {
    *failed = true;
    oom(err);
    return -1;
  }
  PCRE2_SPTR first, last;
  int size = pcre2_substring_nametable_scan(code, (PCRE2_SPTR)name, &first, &last);
  bs_free(name);
  if (size <= 0)
    return -1;
  /* Duplicate names need (?J); the first group of that name is taken. */
  return (int32_t)((first[0] << 8) | first[1]);
}

/* Parse TO into literal/group pieces, following Rust's regex interpolation. */
static int parse_replacement(struct bs_key_remap *m, bs_err *err)
{
  const char *r = m->to;
  size_t n = strlen(r), cap = 0;
  m->lit = bs_malloc(n + 1);
  if (!m->lit)
    return oom(err);
  size_t litlen = 0, i = 0;
  struct bs_repl_piece *cur = NULL; /* the literal piece being extended */
#define PUSH(piece)                                                                                \
  do {                                                                                             \
    if (bs_grow((void **)&m->pieces, &cap, m->npieces + 1, sizeof *m->pieces) != 0)                \
      return oom(err);                                                                             \
    m->pieces[m->npieces++] = (piece);                                                             \
  } while (0)
#define ADD_LIT(c)                                                                                 \
  do {                                                                                             \
    if (!cur) {                                                                                    \
      PUSH(((struct bs_repl_piece){-1, (uint32_t)litlen, 0}));                                     \
      cur = &m->pieces[m->npieces - 1];                                                            \
    }                                                                                              \
    m->lit[litlen++] = (c);                                                                        \
    cur->len++;                                                                                    \
  } while (0)
  while (i < n) {
    if (r[i] != '$') {
      ADD_LIT(r[i]);
      i++;
      continue;
    }
    if (i + 1 < n && r[i + 1] == '$') {
      ADD_LIT('$');
      i += 2;
      continue;
    }
    const char *ref = NULL;
    size_t reflen = 0, end = 0;
    if (i + 1 < n && r[i + 1] == '{') {
      const char *close = memchr(r + i + 2, '}', n - (i + 2));
      if (close) {
        ref = r + i + 2;
        reflen = (size_t)(close - ref);
        end = (size_t)(close - r) + 1;
      }
    } else {
      size_t j = i + 1;
      while (j < n && is_cap_letter(r[j]))
        j++;
      if (j > i + 1) {
        ref = r + i + 1;
        reflen = j - (i + 1);
        end = j;
      }
    }
    if (!ref) { /* not a reference: a literal '$' */
      ADD_LIT('$');
      i++;
      continue;
    }
    bool failed = false;
    int32_t g = resolve_ref(m->re.code, ref, reflen, err, &failed);
    if (failed)
      return -1;
    if (g >= 0) {
      PUSH(((struct bs_repl_piece){g, 0, 0}));
      cur = NULL;
    }
    i = end;
  }
#undef ADD_LIT
#undef PUSH
  m->lit[litlen] = '\0';
  return 0;
}

static int add_regex(struct bs_keyopts *o, struct bs_key_regex **arr, size_t *cnt, size_t *cap,
                     const char *what, const char *pat, bs_err *err)
{
  if (bs_grow((void **)arr, cap, *cnt + 1, sizeof **arr) != 0)
    return oom(err);
  struct bs_key_regex re = {0};
  re.pattern = bs_strdup(pat);
  if (!re.pattern)
    return oom(err);
  re.code = compile(o, what, pat, err);
  if (!re.code) {
    bs_free(re.pattern);
    return -1;
  }
  (*arr)[(*cnt)++] = re;
  return 0;
}

static int add_remap(struct bs_keyopts *o, const char *value, bs_err *err)
{
  const char *arrow = strstr(value, "=>");
  if (!arrow)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "remap '%s' has no '=>'; write remap=FROM=>TO",
                   value);
  if (strlen(arrow + 2) > BS_MAX_KEY_LEN)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "remap replacement is %zu bytes; a key may have at most %u", strlen(arrow + 2),
                   BS_MAX_KEY_LEN);
  if (bs_grow((void **)&o->remap, &o->remapcap, o->nremap + 1, sizeof *o->remap) != 0)
    return oom(err);
  struct bs_key_remap m = {0};
  m.re.pattern = bs_strndup(value, (size_t)(arrow - value));
  m.to = bs_strdup(arrow + 2);
  if (!m.re.pattern || !m.to) {
    remap_destroy(&m);
    return oom(err);
  }
  m.re.code = compile(o, "remap", m.re.pattern, err);
  if (!m.re.code || parse_replacement(&m, err) != 0) {
    remap_destroy(&m);
    return -1;
  }
  o->remap[o->nremap++] = m;
  return 0;
}

static int add_n(struct bs_keyopts *o, const char *name, size_t nlen, const char *value,
                 bs_err *err)
{
#define IS(s) (nlen == sizeof(s) - 1 && memcmp(name, s, nlen) == 0)
  bool inc = IS("include"), exc = IS("exclude"), rem = IS("remap"), top = IS("top_level_key");
  bool contig = IS("contiguous_indices");
#undef IS
  if (!inc && !exc && !rem && !top && !contig)
    return 1;
  if (contig) {
    if (value)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "contiguous_indices takes no value (got '%s')",
                     value);
    o->contiguous_indices = true;
    return 0;
  }
  if (!value)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "option '%.*s' needs a value: %.*s=%s",
                   (int)nlen, name, (int)nlen, name,
                   inc || exc ? "REGEX"
                   : rem      ? "FROM=>TO"
                              : "KEY");
  if (inc)
    return add_regex(o, &o->include, &o->ninclude, &o->includecap, "include", value, err);
  if (exc)
    return add_regex(o, &o->exclude, &o->nexclude, &o->excludecap, "exclude", value, err);
  if (rem)
    return add_remap(o, value, err);
  if (!*value)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "top_level_key needs a non-empty key");
  char *k = bs_strdup(value);
  if (!k)
    return oom(err);
  bs_free(o->top_level_key);
  o->top_level_key = k;
  return 0;
}

int bs_keyopts_add(struct bs_keyopts *o, const char *name, const char *value, bs_err *err)
{
  return add_n(o, name, strlen(name), value, err);
}

int bs_keyopts_add_item(struct bs_keyopts *o, const char *item, bs_err *err)
{
  const char *eq = strchr(item, '=');
  if (!eq)
    return add_n(o, item, strlen(item), NULL, err);
  return add_n(o, item, (size_t)(eq - item), eq + 1, err);
}

/* ---- matching ---- */

/* Search `pat` in s[0, len) from `start`: 1 match (ovector in md), 0 none,
 * -1 error. `key` is the source key, for messages. */
static int search(const struct bs_key_regex *re, const char *s, size_t len, size_t start,
                  pcre2_match_data *md, const char *key, bs_err *err)
{
  int rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, start, 0, md, NULL);
  if (rc >= 0)
    return 1;
  if (rc == PCRE2_ERROR_NOMATCH)
    return 0;
  if (rc == PCRE2_ERROR_NOMEMORY)
    return oom(err);
  PCRE2_UCHAR msg[128];
  if (pcre2_get_error_message(rc, msg, sizeof msg) < 0)
    snprintf((char *)msg, sizeof msg, "PCRE2 error %d", rc);
  const char *hint =
      rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT
          ? " (the pattern backtracks too much; make it more specific)"
          : "";
  return bs_fail(err, EINVAL, BS_OFF_NONE, key, "regex '%s' failed on '%s': %s%s", re->pattern, s,
                 (const char *)msg, hint);
}

/* Fixed buffer for building one name: BS_MAX_KEY_LEN + 1 bytes. */
struct nbuf {
  char *p;
  size_t len;
  bool toolong;
};

static void nb_add(struct nbuf *b, const char *s, size_t n)
{
  if (b->toolong || n > BS_MAX_KEY_LEN - b->len) {
    b->toolong = true;
    return;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static size_t next_char(const char *s, size_t len, size_t pos)
{
  pos++;
  while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80)
    pos++;
  return pos;
}

/* Apply one remap to *name (replaced on a match). Rust's replace_all:
 * matches are found left to right from the end of the previous one; an empty
 * match ending where the previous match ended is skipped. */
static int remap_one(const struct bs_key_remap *m, char **name, struct nbuf *b,
                     pcre2_match_data *md, const char *key, bs_err *err)
{
  const char *s = *name;
  size_t len = strlen(s), start = 0, copied = 0, last_end = SIZE_MAX;
  bool any = false;
  b->len = 0;
  b->toolong = false;
  while (start <= len) {
    int rc = search(&m->re, s, len, start, md, key, err);
    if (rc < 0)
      return -1;
    if (rc == 0)
      break;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t ms = ov[0], me = ov[1];
    if (ms > me || me > len) /* \K tricks; Rust has no such thing */
      return bs_fail(err, EINVAL, BS_OFF_NONE, key,
                     "remap '%s' gave a match that ends before it starts (\\K is not supported)",
                     m->re.pattern);
    if (ms == me && me == last_end) {
      if (start >= len)
        break;
      start = next_char(s, len, start);
      continue;
    }
    any = true;
    nb_add(b, s + copied, ms - copied);
    uint32_t npairs = pcre2_get_ovector_count(md);
    for (size_t i = 0; i < m->npieces; i++) {
      const struct bs_repl_piece *pc = &m->pieces[i];
      if (pc->group < 0) {
        nb_add(b, m->lit + pc->off, pc->len);
      } else if ((uint32_t)pc->group < npairs && ov[2 * pc->group] != PCRE2_UNSET) {
        size_t gs = ov[2 * pc->group], ge = ov[2 * pc->group + 1];
        if (gs <= ge && ge <= len)
          nb_add(b, s + gs, ge - gs);
      }
    }
    copied = me;
    last_end = me;
    if (ms == me) {
      if (me >= len)
        break;
      start = next_char(s, len, me);
    } else {
      start = me;
    }
  }
  if (!any)
    return 0;
  nb_add(b, s + copied, len - copied);
  if (b->toolong)
    return bs_fail(err, EINVAL, BS_OFF_NONE, key,
                   "remap '%s' makes the name longer than the limit of %u bytes", m->re.pattern,
                   BS_MAX_KEY_LEN);
  char *out = bs_strndup(b->p, b->len);
  if (!out)
    return oom(err);
  bs_free(*name);
  *name = out;
  return 0;
}

/* 1 keep, 0 drop, -1 error. */
static int keep(const struct bs_keyopts *o, const char *name, pcre2_match_data *md, const char *key,
                bs_err *err)
{
  size_t len = strlen(name);
  int inc = o->ninclude == 0;
  for (size_t i = 0; i < o->ninclude && !inc; i++) {
    inc = search(&o->include[i], name, len, 0, md, key, err);
    if (inc < 0)
      return -1;
  }
  if (!inc)
    return 0;
  for (size_t i = 0; i < o->nexclude; i++) {
    int rc = search(&o->exclude[i], name, len, 0, md, key, err);
    if (rc != 0)
      return rc < 0 ? -1 : 0;
  }
  return 1;
}

bool bs_keys_keep(const struct bs_keyopts *o, const char *name)
{
  if (o->ninclude == 0 && o->nexclude == 0)
    return true;
  /* One match data per call: o is shared between FUSE threads. */
  pcre2_match_data *md = pcre2_match_data_create(1, o->gctx);
  if (!md)
    return true;
  bs_err err;
  bs_err_clear(&err);
  int rc = keep(o, name, md, name, &err);
  pcre2_match_data_free(md);
  return rc != 0;
}

/* ---- the pipeline ---- */

enum { ST_VISIBLE, ST_FILTERED, ST_OUTSIDE };

static int top_level_not_found(const struct bs_catalog *cat, const char *k, bs_err *err)
{
  const char *seen[TOP_KEYS_LISTED];
  size_t seenlen[TOP_KEYS_LISTED], nseen = 0;
  bool more = false;
  for (size_t i = 0; i < cat->count && !more; i++) {
    const char *key = cat->tensors[i].key;
    const char *dot = strchr(key, '.');
    size_t n = dot ? (size_t)(dot - key) : strlen(key);
    bool dup = false;
    for (size_t j = 0; j < nseen && !dup; j++)
      dup = seenlen[j] == n && memcmp(seen[j], key, n) == 0;
    if (dup)
      continue;
    if (nseen == TOP_KEYS_LISTED) {
      more = true;
      break;
    }
    seen[nseen] = key;
    seenlen[nseen++] = n;
  }
  if (nseen == 0)
    return bs_fail(err, ENOENT, BS_OFF_NONE, NULL,
                   "top_level_key '%s' not found; the checkpoint has no tensors", k);
  char list[sizeof err->msg];
  size_t used = 0;
  list[0] = '\0';
  for (size_t j = 0; j < nseen && used < sizeof list; j++) {
    int w = snprintf(list + used, sizeof list - used, "%s%.*s", j ? ", " : "", (int)seenlen[j],
                     seen[j]);
    if (w > 0)
      used += (size_t)w;
  }
  if (more && used < sizeof list)
    snprintf(list + used, sizeof list - used, ", ...");
  return bs_fail(err, ENOENT, BS_OFF_NONE, NULL,
                 "top_level_key '%s' not found; top-level keys are: %s", k, list);
}

/* One index segment of one name (step 3). */
struct idx {
  const char *name; /* the name before renumbering; scope = name[0, seg) */
  size_t tensor, seg, seglen;
  uint64_t value, rank;
};

static int idx_cmp_scope(const void *a, const void *b)
{
  const struct idx *x = *(const struct idx *const *)a, *y = *(const struct idx *const *)b;
  size_t n = x->seg < y->seg ? x->seg : y->seg;
  int c = memcmp(x->name, y->name, n);
  if (c)
    return c;
  if (x->seg != y->seg)
    return x->seg < y->seg ? -1 : 1;
  return (x->value > y->value) - (x->value < y->value);
}

/* burn's map_indices_contiguous over the names of tensors in scope. */
static int contiguous(const struct bs_catalog *cat, char **names, const uint8_t *state, bs_err *err)
{
  struct idx *ix = NULL, **ord = NULL;
  size_t n = 0, cap = 0;
  int rc = -1;
  for (size_t t = 0; t < cat->count; t++) {
    if (state[t] == ST_OUTSIDE)
      continue;
    const char *s = names[t];
    for (size_t p = 0;;) {
      const char *dot = strchr(s + p, '.');
      size_t e = dot ? (size_t)(dot - s) : strlen(s);
      uint64_t v;
      if (parse_usize(s + p, e - p, &v)) {
        if (bs_grow((void **)&ix, &cap, n + 1, sizeof *ix) != 0)
          goto oom;
        ix[n++] = (struct idx){s, t, p, e - p, v, 0};
      }
      if (!dot)
        break;
      p = e + 1;
    }
  }
  if (n == 0)
    return 0;
  ord = bs_calloc(n, sizeof *ord);
  if (!ord)
    goto oom;
  for (size_t i = 0; i < n; i++)
    ord[i] = &ix[i];
  qsort(ord, n, sizeof *ord, idx_cmp_scope);
  for (size_t i = 0; i < n; i++) {
    if (i == 0)
      continue;
    const struct idx *prev = ord[i - 1];
    bool same_scope = prev->seg == ord[i]->seg && memcmp(prev->name, ord[i]->name, prev->seg) == 0;
    if (!same_scope)
      ord[i]->rank = 0;
    else
      ord[i]->rank = prev->rank + (ord[i]->value != prev->value);
  }
  /* Rebuild: entries are in (tensor, segment) order. Ranks never have more
   * digits than the values they replace, so the new name is no longer. */
  for (size_t i = 0; i < n;) {
    size_t t = ix[i].tensor;
    const char *s = names[t];
    char *out = bs_malloc(strlen(s) + 1);
    if (!out)
      goto oom;
    size_t o = 0, from = 0;
    for (; i < n && ix[i].tensor == t; i++) {
      memcpy(out + o, s + from, ix[i].seg - from);
      o += ix[i].seg - from;
      o += (size_t)sprintf(out + o, "%llu", (unsigned long long)ix[i].rank);
      from = ix[i].seg + ix[i].seglen;
    }
    strcpy(out + o, s + from);
    /* ix[].name of later tensors still points at their own names: safe. */
    bs_free(names[t]);
    names[t] = out;
  }
  rc = 0;
  goto done;
oom:
  rc = oom(err);
done:
  bs_free(ord);
  bs_free(ix);
  return rc;
}

struct named {
  const char *name;
  size_t tensor;
};

static int named_cmp(const void *a, const void *b)
{
  const struct named *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c)
    return c;
  return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

static int check_collisions(const struct bs_catalog *cat, char **names, const uint8_t *state,
                            bs_err *err)
{
  size_t n = 0;
  for (size_t t = 0; t < cat->count; t++)
    n += state[t] == ST_VISIBLE;
  if (n < 2)
    return 0;
  struct named *v = bs_calloc(n, sizeof *v);
  if (!v)
    return oom(err);
  n = 0;
  for (size_t t = 0; t < cat->count; t++)
    if (state[t] == ST_VISIBLE)
      v[n++] = (struct named){names[t], t};
  qsort(v, n, sizeof *v, named_cmp);
  int rc = 0;
  for (size_t i = 1; i < n && rc == 0; i++)
    if (strcmp(v[i - 1].name, v[i].name) == 0)
      rc = bs_fail(err, EEXIST, BS_OFF_NONE, NULL,
                   "keys '%s' and '%s' both become '%s'; change remap/contiguous_indices or "
                   "exclude one",
                   cat->tensors[v[i - 1].tensor].key, cat->tensors[v[i].tensor].key, v[i].name);
  bs_free(v);
  return rc;
}

/* Any two visible tensors with the same name? One pass over a hash table
 * (the sort of check_collisions costs more than the whole mount's tree
 * build for a million keys); a hit goes to check_collisions for its
 * message. */
static int quick_collisions(const struct bs_catalog *cat, bs_err *err)
{
  size_t n = cat->count, cap = 16;
  if (n < 2)
    return 0;
  while (cap < 2 * n)
    cap *= 2;
  size_t *slot = bs_calloc(cap, sizeof *slot); /* tensor index + 1, 0 empty */
  if (!slot)
    return oom(err);
  bool dup = false;
  for (size_t t = 0; t < n && !dup; t++) {
    const struct bs_tensor *ten = &cat->tensors[t];
    if (ten->hidden)
      continue;
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *c = (const unsigned char *)ten->name; *c; c++)
      h = (h ^ *c) * 1099511628211ull;
    for (size_t i = (size_t)h & (cap - 1);; i = (i + 1) & (cap - 1)) {
      if (!slot[i]) {
        slot[i] = t + 1;
        break;
      }
      if (strcmp(cat->tensors[slot[i] - 1].name, ten->name) == 0) {
        dup = true;
        break;
      }
    }
  }
  bs_free(slot);
  if (!dup)
    return 0;
  char **names = bs_calloc(n, sizeof *names);
  uint8_t *state = bs_calloc(n, 1);
  int rc = -1;
  if (!names || !state) {
    oom(err);
  } else {
    for (size_t t = 0; t < n; t++) {
      names[t] = cat->tensors[t].name;
      state[t] = cat->tensors[t].hidden ? ST_FILTERED : ST_VISIBLE;
    }
    rc = check_collisions(cat, names, state, err);
  }
  bs_free(names);
  bs_free(state);
  return rc;
}

int bs_keys_apply(struct bs_catalog *cat, const struct bs_keyopts *o, bs_err *err)
{
  /* No key option: the names are the keys (bs_catalog_add shares one
   * string between them); only the collision rule is left. */
  if (!o->top_level_key && !o->nremap && !o->contiguous_indices && !o->ninclude && !o->nexclude)
    return quick_collisions(cat, err);
  size_t n = cat->count, maxpairs = 1;
  char **names = bs_calloc(n, sizeof *names);
  uint8_t *state = bs_calloc(n, 1);
  char *scratch = bs_malloc(BS_MAX_KEY_LEN + 1);
  pcre2_match_data *md = NULL;
  int rc = -1;
  if (!names || !state || !scratch)
    goto oom;
  for (size_t i = 0; i < o->nremap; i++) {
    uint32_t c = 0;
    pcre2_pattern_info(o->remap[i].re.code, PCRE2_INFO_CAPTURECOUNT, &c);
    if ((size_t)c + 1 > maxpairs)
      maxpairs = (size_t)c + 1;
  }
  if (o->ninclude || o->nexclude || o->nremap) {
    md = pcre2_match_data_create((uint32_t)maxpairs, o->gctx);
    if (!md)
      goto oom;
  }

  /* 1. top_level_key */
  const char *k = o->top_level_key;
  size_t klen = k ? strlen(k) : 0, inside = 0;
  for (size_t t = 0; t < n; t++) {
    const char *key = cat->tensors[t].key;
    if (k && !(strncmp(key, k, klen) == 0 && key[klen] == '.')) {
      state[t] = ST_OUTSIDE;
      names[t] = bs_strdup(key);
    } else {
      names[t] = bs_strdup(k ? key + klen + 1 : key);
      inside++;
    }
    if (!names[t])
      goto oom;
  }
  if (k && inside == 0) {
    top_level_not_found(cat, k, err);
    goto done;
  }

  /* 2. remap */
  struct nbuf b = {scratch, 0, false};
  for (size_t t = 0; t < n; t++) {
    if (state[t] == ST_OUTSIDE)
      continue;
    for (size_t i = 0; i < o->nremap; i++)
      if (remap_one(&o->remap[i], &names[t], &b, md, cat->tensors[t].key, err) != 0)
        goto done;
  }

  /* 3. contiguous indices */
  if (o->contiguous_indices && contiguous(cat, names, state, err) != 0)
    goto done;

  /* 4. include / exclude */
  if (o->ninclude || o->nexclude) {
    for (size_t t = 0; t < n; t++) {
      if (state[t] == ST_OUTSIDE)
        continue;
      int r = keep(o, names[t], md, cat->tensors[t].key, err);
      if (r < 0)
        goto done;
      if (r == 0)
        state[t] = ST_FILTERED;
    }
  }

  /* 5. collisions */
  if (check_collisions(cat, names, state, err) != 0)
    goto done;

  for (size_t t = 0; t < n; t++) {
    struct bs_tensor *ten = &cat->tensors[t];
    if (ten->name != ten->key)
      bs_free(ten->name);
    ten->name = names[t];
    names[t] = NULL;
    ten->hidden = state[t] != ST_VISIBLE;
  }
  rc = 0;
  goto done;
oom:
  oom(err);
done:
  if (names)
    for (size_t t = 0; t < n; t++)
      bs_free(names[t]);
  bs_free(names);
  bs_free(state);
  bs_free(scratch);
  pcre2_match_data_free(md);
  return rc;
}

/* ---- option string ---- */

void bs_opts_free(char **items, size_t n)
{
  if (!items)
    return;
  for (size_t i = 0; i < n; i++)
    bs_free(items[i]);
  bs_free(items);
}

int bs_opts_split(const char *optstr, char ***items, size_t *n, bs_err *err)
{
  *items = NULL;
  *n = 0;
  if (!optstr)
    return 0;
  char *buf = bs_malloc(strlen(optstr) + 1);
  if (!buf)
    return oom(err);
  char **arr = NULL;
  size_t cnt = 0, cap = 0, bl = 0;
  for (size_t i = 0;; i++) {
    char c = optstr[i];
    if (c == '\\' && (optstr[i + 1] == ',' || optstr[i + 1] == '\\')) {
      buf[bl++] = optstr[++i];
      continue;
    }
    if (c != ',' && c != '\0') {
      buf[bl++] = c;
      continue;
    }
    if (bl) {
      if (bs_grow((void **)&arr, &cap, cnt + 1, sizeof *arr) != 0 ||
          !(arr[cnt] = bs_strndup(buf, bl))) {
        bs_opts_free(arr, cnt);
        bs_free(buf);
        return oom(err);
      }
      cnt++;
      bl = 0;
    }
    if (c == '\0')
      break;
  }
  bs_free(buf);
  *items = arr;
  *n = cnt;
  return 0;
}
