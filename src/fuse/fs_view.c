/* The one-file views of a read-only mount (-o view=safetensors|gguf|bpk):
 * the mount holds one regular file, SOURCE's name with the view's
 * extension, whose bytes are the file `burnstore convert SOURCE OUT.EXT`
 * writes with the same options. Nothing is written: the writer's plan of
 * that file (core/layout.h: its header built at mount, then segments of
 * the source's tensors, its values and zeros) is made once here through
 * the same preparation as convert (policy/convert.h) and the same row of
 * the writers table, and every READ is served from it: a range inside one
 * tensor goes down the plain files' read path (spliced from the file, lent
 * from a URL's cache), any other range is gathered (bs_layout_read). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "fs_views.h"
#include "policy/convert.h"

const struct bs_writer *fs_view_writer(const char *name)
{
  char path[32];
  if (strlen(name) + 3 > sizeof path || strchr(name, '.') || strchr(name, '/'))
    return NULL;
  snprintf(path, sizeof path, "x.%s", name);
  const struct bs_writer *w = bs_writer_for_path(path);
  return w && w->layout ? w : NULL;
}

/* The view's file name: SOURCE's base name (a URL's last path segment,
 * without its query), less the extension of its format (a shard set's
 * ".safetensors.index.json" whole: model.safetensors.index.json gives
 * model), plus the view's first extension. bs_malloc'd, or NULL. */
static char *view_name(const char *source, const struct bs_writer *w)
{
  const char *end = source + strcspn(source, "?#");
  if (!bs_src_is_url(source))
    end = source + strlen(source);
  while (end > source && end[-1] == '/')
    end--;
  const char *base = end;
  while (base > source && base[-1] != '/')
    base--;
  size_t len = (size_t)(end - base);
  char buf[BS_NAME_MAX + 1];
  if (len == 0 || len >= sizeof buf)
    snprintf(buf, sizeof buf, "checkpoint");
  else
    snprintf(buf, sizeof buf, "%.*s", (int)len, base);
  const struct bs_writer *src = bs_writer_for_path(buf);
  size_t blen = strlen(buf);
  for (const char *const *e = src ? src->extensions : NULL; e && *e; e++) {
    size_t el = strlen(*e);
    if (blen > el && strcasecmp(buf + blen - el, *e) == 0) {
      buf[blen - el] = '\0';
      break;
    }
  }
  if (!src) {
    /* A checkpoint's extension no writer has (.ckpt); any other dot is the
     * name's own (Qwen2.5-0.5B keeps its dots). */
    static const char *const other[] = {".ckpt", ".pkl", ".tar", ".mpk", ".model", ".pt2", NULL};
    char *dot = strrchr(buf, '.');
    for (const char *const *e = other; dot && dot != buf && *e; e++)
      if (strcasecmp(dot, *e) == 0)
        *dot = '\0';
  }
  const char *ext = w->extensions[0];
  size_t n = strlen(buf), el = strlen(ext);
  if (n + el > BS_NAME_MAX)
    n = BS_NAME_MAX - el;
  char *out = bs_malloc(n + el + 1);
  if (out) {
    memcpy(out, buf, n);
    memcpy(out + n, ext, el + 1);
  }
  return out;
}

int fs_view_build(struct fs *fs, const struct bs_writer *w, const enum bs_dtype *as, bs_err *err)
{
  char *name = NULL;
  bs_layout_init(&fs->view);
  if (bs_convert_prepare(&fs->cat, w, as, "as=", err) != 0 || !(name = view_name(fs->source, w)) ||
      bs_writer_layout(w, &fs->cat, name, &fs->view, err) != 0 ||
      bs_tree_init(&fs->tree, err) != 0 ||
      bs_tree_add(&fs->tree, BS_TREE_ROOT, name, false, -1, &fs->view_ino, err) != 0) {
    if (!name && !err->code)
      bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    bs_free(name);
    return -1;
  }
  bs_free(name);
  /* What the view leaves out of the source: the log and the root's xattr. */
  char lines[BS_LEFT_OUT_MAX][BS_LEFT_OUT_LINE];
  size_t k = bs_convert_left_out(&fs->cat, w, lines);
  struct bs_buf b = {0};
  bool ok = true;
  for (size_t i = 0; i < k && ok; i++)
    ok = bs_buf_put(&b, lines[i], strlen(lines[i])) == 0 && bs_buf_put(&b, "\n", 1) == 0;
  if (!ok || (k && bs_buf_put(&b, "", 1) != 0)) {
    bs_buf_destroy(&b);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  fs->view_omitted = (char *)b.data; /* NULL: nothing left out */
  return 0;
}

void fs_view_log(const struct fs *fs)
{
  for (const char *p = fs->view_omitted; p && *p;) {
    const char *nl = strchr(p, '\n');
    int len = nl ? (int)(nl - p) : (int)strlen(p);
    fuse_log(FUSE_LOG_NOTICE, "burnstore: view: %.*s\n", len, p);
    p += len + (nl ? 1 : 0);
  }
}

void fs_view_destroy(struct fs *fs)
{
  bs_layout_destroy(&fs->view);
  bs_free(fs->view_omitted);
  fs->view_omitted = NULL;
  fs->view_ino = 0;
}

/* A gathered read failed with EIO: the log line of each changed source of
 * the segments in [off, off + size), as the tensor files' reads log it. */
static void log_changed(struct fs *fs, uint64_t off, size_t size)
{
  const struct bs_layout *l = &fs->view;
  size_t i = bs_layout_find(l, off);
  uint32_t last = UINT32_MAX; /* (a run of one source's segments: checked once) */
  for (i = i == SIZE_MAX ? 0 : i; i < l->n && l->seg[i].off < off + size; i++) {
    const struct bs_seg *s = &l->seg[i];
    uint32_t src = s->kind == BS_SEG_SRC ? s->idx
                   : s->kind == BS_SEG_TENSOR && s->idx < fs->cat.count
                       ? fs->cat.tensors[s->idx].src
                       : UINT32_MAX;
    if (src != last && src != UINT32_MAX)
      (void)fs_src_changed(fs, src);
    last = src;
  }
}

void fs_view_read(fuse_req_t req, struct fs *fs, size_t size, uint64_t off)
{
  const struct bs_layout *l = &fs->view;
  if (off >= l->size || size == 0) {
    fuse_reply_buf(req, NULL, 0);
    return;
  }
  if (size > l->size - off)
    size = (size_t)(l->size - off);
  size_t i = bs_layout_find(l, off);
  const struct bs_seg *s = i < l->n ? &l->seg[i] : NULL;
  if (s && s->kind == BS_SEG_TENSOR && s->idx < fs->cat.count && off + size <= s->off + s->len) {
    /* inside one tensor: the plain files' read path */
    fs_read_tensor(req, fs, &fs->cat.tensors[s->idx], size, off - s->off);
    return;
  }
  if (s && s->kind == BS_SEG_BYTES && off + size <= s->off + s->len) {
    /* inside the built bytes (the header every loader reads first): from
     * the plan, not copied first */
    fuse_reply_buf(req, (const char *)l->bytes.data + s->at + (off - s->off), size);
    return;
  }
  char *buf = bs_malloc(size);
  if (!buf) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  long n = bs_layout_read(l, &fs->cat, off, buf, size);
  if (n == -EIO)
    log_changed(fs, off, size);
  if (n < 0)
    fuse_reply_err(req, (int)-n);
  else
    fuse_reply_buf(req, buf, (size_t)n);
  bs_free(buf);
}
