/* What a conversion makes of a checkpoint (convert.h). */
#include "policy/convert.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "policy/decode_as.h"

/* Every floating tensor shown as `as`, or refused: one that has no decoder
 * is never copied in its own dtype. */
static int as_all(struct bs_catalog *cat, enum bs_dtype as, const char *opt, bs_err *err)
{
  if (bs_catalog_decode_as(cat, as, err) != 0)
    return -1;
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    char buf[400];
    const char *why = t->hidden ? NULL : bs_tensor_why_stored(t, as, buf, sizeof buf);
    if (why)
      return bs_fail(err, ENOTSUP, BS_OFF_NONE, t->name,
                     "%s%s: %s (exclude it with -o exclude=REGEX)", opt, bs_dtype_name(as), why);
  }
  return 0;
}

int bs_convert_prepare(struct bs_catalog *cat, const struct bs_writer *w, const enum bs_dtype *as,
                       const char *opt, bs_err *err)
{
  if (as && as_all(cat, *as, opt, err) != 0)
    return -1;
  cat->format = w->format;
  if (bs_writer_check(w, cat, err) != 0)
    return -1;
  return w->default_meta ? w->default_meta(cat, err) : 0;
}

/* What values_line has put in its line. */
struct vgroups {
  char *line;
  size_t cap, len, shown;
  bool cut;
};

/* Add key group[0..glen) of count values to g's line: "epoch", or
 * "optimizer.* (11)" for a group of several or of dotted keys. */
static void vgroup_put(struct vgroups *g, const char *group, size_t glen, size_t count)
{
  if (g->cut)
    return;
  const char *sep = g->shown ? ", " : "";
  int k = count > 1 || group[glen] == '.'
              ? snprintf(g->line + g->len, g->cap - g->len, "%s%.*s.* (%zu)", sep, (int)glen, group,
                         count)
              : snprintf(g->line + g->len, g->cap - g->len, "%s%.*s", sep, (int)glen, group);
  if (k < 0 || g->len + (size_t)k >= g->cap - 8) {
    g->cut = true;
    g->line[g->len] = '\0';
    return;
  }
  g->len += (size_t)k;
  g->shown++;
}

/* The source's non-tensor values, grouped by their first segment in the
 * source's order; a long list is cut with "...". The number of values. */
static size_t values_line(const char *values_json, char *line, size_t cap)
{
  json_t *v = json_loads(values_json, 0, NULL);
  size_t n = json_is_object(v) ? json_object_size(v) : 0;
  struct vgroups g = {.line = line, .cap = cap};
  line[0] = '\0';
  const char *key, *group = NULL;
  size_t glen = 0, count = 0;
  json_t *val;
  json_object_foreach(v, key, val)
  {
    const char *dot = strchr(key, '.');
    size_t l = dot ? (size_t)(dot - key) : strlen(key);
    if (group && l == glen && memcmp(key, group, l) == 0) {
      count++;
      continue;
    }
    if (group)
      vgroup_put(&g, group, glen, count);
    group = key, glen = l, count = 1;
  }
  if (group)
    vgroup_put(&g, group, glen, count);
  if (g.cut)
    strcat(line, ", ...");
  json_decref(v);
  return n;
}

size_t bs_convert_left_out(const struct bs_catalog *cat, const struct bs_writer *w,
                           char lines[BS_LEFT_OUT_MAX][BS_LEFT_OUT_LINE])
{
  size_t k = 0, ids = 0;
  if (w->drops_meta && cat->nmeta)
    snprintf(lines[k++], BS_LEFT_OUT_LINE,
             "%zu metadata entries not written (a torch.save file has no place for them)",
             cat->nmeta);
  for (size_t i = 0; i < cat->count && !w->param_ids; i++)
    ids += !cat->tensors[i].hidden && cat->tensors[i].has_param_id;
  if (ids)
    snprintf(lines[k++], BS_LEFT_OUT_LINE,
             "%zu tensors' parameter ids (Burnpack's param_id) not written (the %s writer has no "
             "place for them)",
             ids, w->name);
  char groups[320 + 8]; /* (room for ", ...") */
  size_t n = cat->values_json ? values_line(cat->values_json, groups, 320) : 0;
  if (n)
    snprintf(lines[k++], BS_LEFT_OUT_LINE,
             "%zu non-tensor value%s of the source not written (the %s writer writes tensors%s "
             "only): %s",
             n, n == 1 ? "" : "s", w->name, w->drops_meta ? "" : " and metadata", groups);
  return k;
}
