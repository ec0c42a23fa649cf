/* Flattening the unpickled object of a PyTorch checkpoint: tensors become
 * catalog keys (dict keys and list indexes joined by dots), other values go
 * to one JSON object (user.burnstore.values).
 *
 * A pickle can share one object through memo references any number of times,
 * so the object graph may be exponentially larger than the file. The walk is
 * bounded by bytes and work, not counts:
 *  - values: at most PTH_VALUES_BUDGET bytes of JSON text (plus a fixed cost
 *    per value) and PTH_VALUES_WORK visited nodes; past either, values stop,
 *    a note says where, and the walk goes on for tensors only;
 *  - a container whose subtree held no tensor is marked, and a later visit
 *    that collects no values skips it in O(1), so the tensor search is
 *    linear in the pickle unless tensors themselves are shared;
 *  - a file is refused when tensors have more than PTH_TENSOR_SHARING keys
 *    each on average (tied weights have 2 or 3), or when nodes are reached
 *    again more than PTH_WALK_BUDGET times: the work beyond one visit per
 *    node, which is linear in the pickle.
 * The walk is iterative (an explicit stack of small frames, one path buffer),
 * so deep nesting cannot exhaust the C stack; nesting deeper than
 * BS_PICKLE_MAX_DEPTH is an error. A reference back to a container on the
 * current path (a cycle, `d['self'] = d`) is skipped with a note. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/utf8.h"
#include "pth_private.h"

#define VALUE_COST 64u /* bytes charged per value beyond its text (key map, bookkeeping) */

struct pth_frame {
  struct bs_pv *x;
  size_t plen; /* path length of this container */
  size_t i;    /* next item of the current phase */
  unsigned phase;
  bool values; /* collect values below */
  bool known;  /* OBJECT: a harmless known class (argparse.Namespace) */
  bool again;  /* the container was reached before */
  size_t nfound0;
};

/* ---- text ----------------------------------------------------------------------------------- */

static int vput(struct pth_ctx *c, const char *s, size_t n)
{
  if (c->vlen + n + 2 > c->vcap) {
    size_t need = c->vlen + n + 2;
    size_t cap = c->vcap ? c->vcap : 256;
    while (cap < need)
      cap *= 2;
    char *p = bs_realloc(c->values, cap);
    if (!p)
      return pth_nomem(c);
    c->values = p;
    c->vcap = cap;
  }
  if (s)
    memcpy(c->values + c->vlen, s, n);
  c->vlen += n;
  return 0;
}

/* JSON text of a string: its length (quotes included), or 0 when it is not
 * valid UTF-8; `bad` replaces invalid bytes by U+FFFD instead (keys). When
 * out is not NULL the text is appended. */
static int str_json(struct pth_ctx *c, const char *str, size_t n, bool bad_ok, bool out,
                    uint64_t *len)
{
  const uint8_t *s = (const uint8_t *)str;
  uint64_t total = 2;
  if (out && vput(c, "\"", 1) != 0)
    return -1;
  for (size_t i = 0; i < n;) {
    char esc[8];
    size_t el = 0, adv = 1;
    const char *piece = esc;
    uint8_t b = s[i];
    if (b == '"' || b == '\\') {
      esc[0] = '\\';
      esc[1] = (char)b;
      el = 2;
    } else if (b < 0x20) {
      el = (size_t)snprintf(esc, sizeof esc, "\\u%04x", b);
    } else {
      size_t u = bs_utf8_len(s + i, n - i);
      if (u == 0) {
        if (!bad_ok) {
          *len = 0;
          return 0;
        }
        piece = "\\ufffd";
        el = 6;
      } else {
        piece = str + i;
        el = u;
        adv = u;
      }
    }
    if (out && vput(c, piece, el) != 0)
      return -1;
    total += el;
    i += adv;
  }
  if (out && vput(c, "\"", 1) != 0)
    return -1;
  *len = total;
  return 0;
}

/* The shortest of %.15g, %.16g, %.17g that reads back as the same double. */
static void shortest_double(double f, char *out, size_t n)
{
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(out, n, "%.*g", prec, f);
    if (strtod(out, NULL) == f)
      return;
  }
}

static size_t bigint_text(const struct bs_pv *x, char *out, size_t outn);

/* Decimal text of v into out (at least 21 bytes); faster than snprintf. */
static void int_text(int64_t v, char *out)
{
  char tmp[24];
  size_t n = 0;
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0)
    *out++ = '-';
  while (n)
    *out++ = tmp[--n];
  *out = '\0';
}

/* JSON text of a scalar into buf (numbers, literals) or, for a string, only
 * its length (*is_str set; written by str_json). */
static int scalar_text(struct pth_ctx *c, const struct bs_pv *x, char *buf, size_t bn,
                       uint64_t *len, bool *is_str)
{
  *is_str = false;
  switch (x->kind) {
  case BS_PV_NONE: snprintf(buf, bn, "null"); break;
  case BS_PV_BOOL: snprintf(buf, bn, "%s", x->u.b ? "true" : "false"); break;
  case BS_PV_INT: int_text(x->u.i, buf); break;
  case BS_PV_BIGINT:
    if (!bigint_text(x, buf + 1, bn - 2))
      snprintf(buf, bn, "null");
    else { /* a JSON string: the digits, quoted */
      buf[0] = '"';
      size_t l = strlen(buf);
      buf[l] = '"';
      buf[l + 1] = '\0';
    }
    break;
  case BS_PV_FLOAT:
    if (!isfinite(x->u.f)) {
      snprintf(buf, bn, "null");
    } else {
      shortest_double(x->u.f, buf, bn - 2);
      if (!strpbrk(buf, ".eE")) /* keep it a float, as Python's json does */
        strcat(buf, ".0");
    }
    break;
  case BS_PV_STR: /* not valid UTF-8: null, as before */
    if (str_json(c, x->u.str.s, x->u.str.len, false, false, len) != 0)
      return -1;
    if (*len > 0) {
      *is_str = true;
      return 0;
    }
    snprintf(buf, bn, "null");
    break;
  case BS_PV_GLOBAL: {
    char tmp[2100];
    int n = snprintf(tmp, sizeof tmp, "%s.%s", x->u.glob.module, x->u.glob.name);
    if (n > 0 && (size_t)n < sizeof tmp && str_json(c, tmp, (size_t)n, false, false, len) == 0 &&
        *len > 0) {
      *is_str = true;
      return 0;
    }
    snprintf(buf, bn, "null");
    break;
  }
  default: snprintf(buf, bn, "null"); break;
  }
  *len = strlen(buf);
  return 0;
}

static int scalar_put(struct pth_ctx *c, const struct bs_pv *x)
{
  char buf[2100];
  uint64_t len;
  bool is_str;
  if (scalar_text(c, x, buf, sizeof buf, &len, &is_str) != 0)
    return -1;
  if (!is_str)
    return vput(c, buf, strlen(buf));
  if (x->kind == BS_PV_STR)
    return str_json(c, x->u.str.s, x->u.str.len, false, true, &len);
  int n = snprintf(buf, sizeof buf, "%s.%s", x->u.glob.module, x->u.glob.name);
  return str_json(c, buf, (size_t)n, false, true, &len);
}

/* Two's-complement LE bytes -> decimal text; returns its length, 0 if too long. */
static size_t bigint_text(const struct bs_pv *x, char *out, size_t outn)
{
  size_t n = x->u.str.len;
  if (n == 0 || n > 256 || outn < 800)
    return 0;
  uint8_t mag[256];
  memcpy(mag, x->u.str.s, n);
  bool neg = mag[n - 1] & 0x80;
  if (neg) { /* negate */
    unsigned carry = 1;
    for (size_t i = 0; i < n; i++) {
      unsigned v = (uint8_t)~mag[i] + carry;
      mag[i] = (uint8_t)v;
      carry = v >> 8;
    }
  }
  char digits[800];
  size_t nd = 0;
  for (;;) {
    bool zero = true;
    unsigned rem = 0;
    for (size_t i = n; i-- > 0;) {
      unsigned cur = (rem << 8) | mag[i];
      mag[i] = (uint8_t)(cur / 10);
      rem = cur % 10;
      if (mag[i])
        zero = false;
    }
    digits[nd++] = (char)('0' + rem);
    if (zero || nd >= sizeof digits - 2)
      break;
  }
  size_t o = 0;
  if (neg)
    out[o++] = '-';
  while (nd && o < outn - 1)
    out[o++] = digits[--nd];
  out[o] = '\0';
  return o;
}

/* ---- keys ----------------------------------------------------------------------------------- */

/* Set the path to path[0..plen) + "." + seg; *nl gets the new length. */
static int path_seg(struct pth_ctx *c, size_t plen, const char *seg, size_t sl, size_t *nl)
{
  size_t need = plen + (plen ? 1 : 0) + sl;
  if (need > BS_MAX_KEY_LEN)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL, "flattened key longer than %u bytes",
                   BS_MAX_KEY_LEN);
  if (plen)
    c->path[plen++] = '.';
  memcpy(c->path + plen, seg, sl);
  c->path[plen + sl] = '\0';
  *nl = plen + sl;
  return 0;
}

/* Python str() of a dict key, as far as it matters for names, as the next path segment. */
static int key_seg(struct pth_ctx *c, const struct bs_pv *k, size_t plen, size_t *nl)
{
  char b[2100];
  switch (k->kind) {
  case BS_PV_STR:
    if (strlen(k->u.str.s) != k->u.str.len)
      return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL, "a dict key contains a NUL byte");
    return path_seg(c, plen, k->u.str.s, k->u.str.len, nl);
  case BS_PV_INT: snprintf(b, sizeof b, "%" PRId64, k->u.i); break;
  case BS_PV_BOOL: snprintf(b, sizeof b, "%s", k->u.b ? "True" : "False"); break;
  case BS_PV_NONE: snprintf(b, sizeof b, "None"); break;
  case BS_PV_FLOAT:
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(b, sizeof b, "%.*g", prec, k->u.f);
      if (strtod(b, NULL) == k->u.f)
        break;
    }
    break;
  case BS_PV_GLOBAL: snprintf(b, sizeof b, "%s.%s", k->u.glob.module, k->u.glob.name); break;
  default: snprintf(b, sizeof b, "<%s>", bs_pv_kind_name(k->kind)); break;
  }
  return path_seg(c, plen, b, strlen(b), nl);
}

static int claim_key(struct pth_ctx *c, const char *key, char **kept)
{
  char *k = bs_strdup(key);
  if (!k ||
      bs_grow((void **)&c->owned_keys, &c->ownedcap, c->nowned + 1, sizeof *c->owned_keys) != 0) {
    bs_free(k);
    return pth_nomem(c);
  }
  c->owned_keys[c->nowned++] = k;
  int r = bs_strmap_put(&c->keys, k, 0);
  if (r < 0)
    return pth_nomem(c);
  if (r > 0)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, key,
                   "two entries of the pickle flatten to the same key '%.100s'", key);
  if (kept)
    *kept = k;
  return 0;
}

/* A note from the walk; past PTH_WALK_NOTES of them, one last line says
 * that more were left out (a shared cycle could otherwise note forever). */
static int walk_note(struct pth_ctx *c, const char *line)
{
  if (c->walk_notes >= PTH_WALK_NOTES)
    return 0;
  if (++c->walk_notes == PTH_WALK_NOTES)
    line = "further notes about skipped cycles and storages are left out";
  return bs_catalog_note(c->cat, line, c->err);
}

/* ---- values --------------------------------------------------------------------------------- */

static bool is_scalar(const struct bs_pv *x)
{
  switch (x->kind) {
  case BS_PV_NONE:
  case BS_PV_BOOL:
  case BS_PV_INT:
  case BS_PV_BIGINT:
  case BS_PV_FLOAT:
  case BS_PV_STR: return true;
  case BS_PV_GLOBAL: return x->u.glob.kind == BS_PG_DTYPE;
  default: return false;
  }
}

/* Stop collecting values (a budget is spent) and say where. */
static int values_stop(struct pth_ctx *c, const char *key, const char *why)
{
  c->values_off = true;
  char line[400];
  snprintf(line, sizeof line,
           "non-tensor values stop at '%.200s': %s (shared references multiply them); every "
           "tensor is still listed",
           key, why);
  return bs_catalog_note(c->cat, line, c->err);
}

/* Charge `text` bytes of JSON for one value at the current path; false (and
 * values stop) when that would pass the budget. */
static int charge(struct pth_ctx *c, const char *key, uint64_t text, bool *ok)
{
  uint64_t cost = text + strlen(key) + VALUE_COST;
  *ok = false;
  if (c->vbytes + cost > PTH_VALUES_BUDGET) {
    char why[80];
    snprintf(why, sizeof why, "over the budget of %u MiB of values text",
             (unsigned)(PTH_VALUES_BUDGET >> 20));
    return values_stop(c, key, why);
  }
  c->vbytes += cost;
  *ok = true;
  return 0;
}

/* Start the entry "key": for a value of `text` bytes; *ok false if over budget. */
static int value_head(struct pth_ctx *c, size_t plen, uint64_t text, bool *ok)
{
  const char *key = plen ? c->path : "value";
  if (charge(c, key, text, ok) != 0)
    return -1;
  if (!*ok)
    return 0;
  if (claim_key(c, key, NULL) != 0)
    return -1;
  uint64_t kl;
  if (vput(c, c->nvalues++ ? "," : "{", 1) != 0 ||
      str_json(c, key, strlen(key), true, true, &kl) != 0 || vput(c, ":", 1) != 0)
    return -1;
  return 0;
}

static int emit_scalar(struct pth_ctx *c, size_t plen, const struct bs_pv *x)
{
  char buf[2100];
  uint64_t len;
  bool is_str, ok;
  if (scalar_text(c, x, buf, sizeof buf, &len, &is_str) != 0 || value_head(c, plen, len, &ok) != 0)
    return -1;
  return ok ? scalar_put(c, x) : 0;
}

/* An all-scalar list at the current path. Its text is written once; a later
 * reference to the same list copies that text (bytes, not work). */
static int emit_array(struct pth_ctx *c, size_t plen, struct bs_pv *x)
{
  uint64_t estimate = 2;
  if (x->text_len) {
    estimate = x->text_len;
  } else {
    for (size_t i = 0; i < x->u.seq.n && estimate <= PTH_VALUES_BUDGET; i++) {
      const struct bs_pv *it = x->u.seq.items[i];
      uint64_t len = 24; /* numbers, literals: at most */
      if (it->kind == BS_PV_STR || it->kind == BS_PV_BIGINT || it->kind == BS_PV_GLOBAL) {
        char buf[2100];
        bool is_str;
        if (scalar_text(c, it, buf, sizeof buf, &len, &is_str) != 0)
          return -1;
      }
      estimate += len + 1;
    }
  }
  bool ok;
  if (value_head(c, plen, estimate, &ok) != 0)
    return -1;
  if (!ok)
    return 0;
  if (x->text_len) {
    if (vput(c, NULL, x->text_len) != 0) /* reserve, then copy from the first emission */
      return -1;
    memcpy(c->values + c->vlen - x->text_len, c->values + x->text_off, x->text_len);
    return 0;
  }
  size_t start = c->vlen;
  if (vput(c, "[", 1) != 0)
    return -1;
  for (size_t i = 0; i < x->u.seq.n; i++)
    if ((i && vput(c, ",", 1) != 0) || scalar_put(c, x->u.seq.items[i]) != 0)
      return -1;
  if (vput(c, "]", 1) != 0)
    return -1;
  size_t len = c->vlen - start;
  if (start <= UINT32_MAX && len <= UINT32_MAX) { /* (the budget keeps both far below) */
    x->text_off = (uint32_t)start;
    x->text_len = (uint32_t)len;
  }
  if (len < estimate) /* charge the text, not the estimate */
    c->vbytes -= estimate - len;
  return 0;
}

static int emit_empty_dict(struct pth_ctx *c, size_t plen)
{
  bool ok;
  if (value_head(c, plen, 2, &ok) != 0)
    return -1;
  return ok ? vput(c, "{}", 2) : 0;
}

int pth_values_json(struct pth_ctx *c, char **out)
{
  *out = NULL;
  if (c->nvalues == 0)
    return 0;
  if (vput(c, "}", 1) != 0)
    return -1;
  c->values[c->vlen] = '\0';
  *out = c->values; /* the catalog takes the buffer */
  c->values = NULL;
  c->vlen = c->vcap = 0;
  return 0;
}

/* ---- the walk ------------------------------------------------------------------------------- */

static int push(struct pth_ctx *c, struct bs_pv *x, size_t plen, bool values, bool known,
                bool again)
{
  if (x->walking) { /* a reference cycle: the container is already on the path */
    char line[300];
    snprintf(line, sizeof line, "skipped a reference cycle at key '%.200s'", plen ? c->path : "");
    return walk_note(c, line);
  }
  if (c->depth >= BS_PICKLE_MAX_DEPTH)
    return bs_fail(c->err, EINVAL, BS_OFF_NONE, NULL,
                   "pickled values nested deeper than %u (or a reference cycle) at '%.80s'",
                   BS_PICKLE_MAX_DEPTH, plen ? c->path : "");
  if (bs_grow((void **)&c->stack, &c->stackcap, c->depth + 1, sizeof *c->stack) != 0)
    return pth_nomem(c);
  struct pth_frame *f = &c->stack[c->depth++];
  memset(f, 0, sizeof *f);
  f->x = x;
  f->plen = plen;
  f->values = values;
  f->known = known;
  f->again = again;
  f->nfound0 = c->nfound;
  x->walking = true;
  return 0;
}

/* One node at path[0..plen): a leaf is handled here, a container is pushed.
 * parent_again: its container was reached before (a shared value, one
 * None or small int for the whole pickle, is reached again when that is). */
static int visit(struct pth_ctx *c, struct bs_pv *x, size_t plen, bool values, bool parent_again)
{
  c->visits++;
  const bool again = x->shared ? parent_again : x->visited;
  if (again && ++c->revisits > PTH_WALK_BUDGET)
    return bs_fail(c->err, EFBIG, BS_OFF_NONE, NULL,
                   "the pickled object graph has more than %u nodes when flattened (shared "
                   "references multiply it)",
                   PTH_WALK_BUDGET);
  c->path[plen] = '\0';
  if (values && !c->values_off && c->visits > PTH_VALUES_WORK) {
    char why[80];
    snprintf(why, sizeof why, "over %u visited nodes", PTH_VALUES_WORK);
    if (values_stop(c, plen ? c->path : "", why) != 0)
      return -1;
  }
  values = values && !c->values_off;
  if (x->walked && (!values || x->kind == BS_PV_STORAGE))
    return 0; /* nothing to find in it again */
  if (x->kind != BS_PV_TENSOR && !x->shared)
    x->visited = true;
  switch (x->kind) {
  case BS_PV_TENSOR: {
    const char *key = plen ? c->path : "tensor";
    if (!x->visited)
      c->tensors++;
    x->visited = true;
    if (c->nfound >= c->tensors * PTH_TENSOR_SHARING + PTH_TENSOR_SLACK)
      return bs_fail(c->err, EFBIG, BS_OFF_NONE, key,
                     "%" PRIu64 " distinct tensor(s) appear under %zu keys: shared references "
                     "multiply them (limit: %u keys per tensor + %u)",
                     c->tensors, c->nfound, PTH_TENSOR_SHARING, PTH_TENSOR_SLACK);
    /* what this key will hold (its copies, its catalog entry): a few bytes
     * of the pickle can name a shared tensor under thousands of long keys */
    uint64_t klen = strlen(key) + 1, cost = PTH_KEY_COST + (uint64_t)x->u.tensor.rank * 16;
    char *kept;
    if (bs_pickle_charge(c->p, cost + PTH_KEY_COPIES * klen, key, c->err) != 0 ||
        claim_key(c, key, &kept) != 0)
      return -1;
    if (bs_grow((void **)&c->found, &c->foundcap, c->nfound + 1, sizeof *c->found) != 0)
      return pth_nomem(c);
    c->found[c->nfound].key = kept; /* owned by owned_keys */
    c->found[c->nfound++].t = x;
    return 0;
  }
  case BS_PV_DICT:
    if (x->u.dict.keys.n == 0) {
      x->walked = true;
      return values && plen ? emit_empty_dict(c, plen) : 0;
    }
    return push(c, x, plen, values, false, again);
  case BS_PV_LIST:
  case BS_PV_TUPLE:
  case BS_PV_SET: {
    bool all = true;
    for (size_t i = 0; i < x->u.seq.n && all; i++)
      all = is_scalar(x->u.seq.items[i]);
    if (!all)
      return push(c, x, plen, values, false, again);
    x->walked = true;
    return values ? emit_array(c, plen, x) : 0;
  }
  case BS_PV_OBJECT: {
    /* Only known, harmless classes (argparse.Namespace) contribute values;
     * opaque objects are searched for tensors only. */
    const struct bs_pv *cls = x->u.obj.cls;
    bool known = cls->kind == BS_PV_GLOBAL && cls->u.glob.kind == BS_PG_NAMESPACE;
    return push(c, x, plen, values && known, known, again);
  }
  case BS_PV_STORAGE: {
    x->walked = true;
    char line[300];
    snprintf(line, sizeof line, "skipped a bare storage (not a tensor) at key '%.200s'",
             plen ? c->path : "");
    return walk_note(c, line);
  }
  case BS_PV_BYTES: return 0;
  default:
    if (!values || (x->kind == BS_PV_GLOBAL && !is_scalar(x)))
      return 0;
    return emit_scalar(c, plen, x);
  }
}

/* The next child of frame f: 1 with *child, the path set to its key and
 * *nl its length and *values whether to collect values in it; 0 when done. */
static int next_child(struct pth_ctx *c, struct pth_frame *f, struct bs_pv **child, size_t *nl,
                      bool *values)
{
  struct bs_pv *x = f->x;
  char seg[32];
  *values = f->values;
  if (x->kind == BS_PV_DICT) {
    if (f->i >= x->u.dict.keys.n)
      return 0;
    *child = x->u.dict.vals.items[f->i];
    return key_seg(c, x->u.dict.keys.items[f->i++], f->plen, nl) != 0 ? -1 : 1;
  }
  if (x->kind != BS_PV_OBJECT) { /* LIST, TUPLE, SET */
    if (f->i >= x->u.seq.n)
      return 0;
    *child = x->u.seq.items[f->i];
    snprintf(seg, sizeof seg, "%zu", f->i++);
    return path_seg(c, f->plen, seg, strlen(seg), nl) != 0 ? -1 : 1;
  }
  struct bs_pv *st = x->u.obj.state;
  const struct bs_pv_objx *ox = x->u.obj.x;
  for (;; f->phase++, f->i = 0) {
    switch (f->phase) {
    case 0: /* BUILD state: a dict's items, else the whole state as "_state" */
      if (st && st->kind == BS_PV_DICT) {
        if (f->i >= st->u.dict.keys.n)
          continue;
        *child = st->u.dict.vals.items[f->i];
        return key_seg(c, st->u.dict.keys.items[f->i++], f->plen, nl) != 0 ? -1 : 1;
      }
      if (!st || f->i++ > 0)
        continue;
      *child = st;
      return path_seg(c, f->plen, "_state", 6, nl) != 0 ? -1 : 1;
    case 1: /* constructor arguments of an unknown class: tensors only */
      if (f->known || !x->u.obj.args || f->i++ > 0)
        continue;
      *child = x->u.obj.args;
      *values = false;
      return path_seg(c, f->plen, "_args", 5, nl) != 0 ? -1 : 1;
    case 2: /* APPENDs */
      if (!ox || f->i >= ox->items.n)
        continue;
      *child = ox->items.items[f->i];
      snprintf(seg, sizeof seg, "%zu", f->i++);
      return path_seg(c, f->plen, seg, strlen(seg), nl) != 0 ? -1 : 1;
    case 3: /* SETITEMs */
      if (!ox || f->i >= ox->dkeys.n)
        continue;
      *child = ox->dvals.items[f->i];
      return key_seg(c, ox->dkeys.items[f->i++], f->plen, nl) != 0 ? -1 : 1;
    default: return 0;
    }
  }
}

int pth_flatten(struct pth_ctx *c, struct bs_pv *root)
{
  if (!(c->path = bs_malloc(BS_MAX_KEY_LEN + 2)))
    return pth_nomem(c);
  c->path[0] = '\0';
  if (visit(c, root, 0, true, false) != 0)
    return -1;
  while (c->depth > 0) {
    struct pth_frame *f = &c->stack[c->depth - 1];
    struct bs_pv *child;
    size_t nl;
    bool values;
    int r = next_child(c, f, &child, &nl, &values);
    if (r < 0)
      return -1;
    if (r == 0) {
      if (c->nfound == f->nfound0)
        f->x->walked = true;
      f->x->walking = false;
      c->depth--;
      continue;
    }
    if (visit(c, child, nl, values, f->again) != 0) /* may move c->stack */
      return -1;
  }
  return 0;
}
