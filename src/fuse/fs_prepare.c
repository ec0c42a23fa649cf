/* Before mounting (fs_mount.h): SOURCE opened through the one open path
 * (bs_checkpoint_open: a URL, a directory's shard set, a file; key options,
 * adapter=, as=), a new checkpoint's empty catalog, the writer of a
 * writable mount chosen and every refusal made now rather than at unmount
 * (a dtype the output cannot hold, a rewrite in place that would lose
 * values, views on a writable mount), the modes shown, the staging
 * directory's name, the tree. */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/target.h"
#include "formats/writers.h"
#include "fs_mount.h"
#include "fs_views.h"
#include "policy/decode_as.h"
#include "policy/writeback.h"

/* -o output_as=: a floating tensor of the checkpoint that cannot be decoded
 * is refused at mount, as convert --as refuses it (one written into the
 * mount later is kept as stored, with a note in the write-back's report). */
static int refuse_undecodable(const char *source, const struct bs_catalog *cat, enum bs_dtype as,
                              bool skip_hidden)
{
  for (size_t i = 0; i < cat->count; i++) {
    const struct bs_tensor *t = &cat->tensors[i];
    if (t->hidden && skip_hidden)
      continue; /* an extraction does not write what the key options hide */
    char buf[400];
    const char *why = bs_tensor_why_stored(t, as, buf, sizeof buf);
    if (!why)
      continue;
    fprintf(stderr, PROG ": %s: tensor '%s': output_as=%s: %s (exclude it with -o exclude=REGEX)\n",
            source, t->name, bs_dtype_name(as), why);
    return -1;
  }
  return 0;
}

/* bs_writer_check on the dtypes the output will hold: with output_as=,
 * every decodable floating tensor is checked as that dtype (a quantized
 * .pth can be written as SafeTensors once dequantized). */
static int writer_check(struct fs *fs, bs_err *err)
{
  struct bs_catalog *cat = &fs->cat;
  if (!fs->has_output_as)
    return bs_writer_check(fs->writer, cat, err);
  enum bs_dtype *saved = bs_malloc(cat->count ? cat->count * sizeof *saved : 1);
  if (!saved)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  for (size_t i = 0; i < cat->count; i++) {
    saved[i] = cat->tensors[i].dtype;
    if (bs_tensor_decodable(&cat->tensors[i]))
      cat->tensors[i].dtype = fs->output_as;
  }
  int rc = bs_writer_check(fs->writer, cat, err);
  for (size_t i = 0; i < cat->count; i++)
    cat->tensors[i].dtype = saved[i];
  bs_free(saved);
  return rc;
}

/* The writer of a writable mount, from the output's extension (an rw mount
 * in place keeps the format the file holds). NULL after printing why. */
static const struct bs_writer *choose_writer(const struct fs *fs, const struct args *a, bool is_new)
{
  char exts[256];
  bs_writer_list(exts, sizeof exts);
  if (is_new && !bs_writer_for_path(fs->source)) {
    fprintf(stderr,
            PROG ": %s: does not exist; a new path is mounted as an empty checkpoint only if its "
                 "extension names a format burnstore writes: %s\n",
            a->source, exts);
    return NULL;
  }
  bs_err err;
  bs_err_clear(&err);
  const struct bs_writer *w;
  if (a->output) {
    char label[PATH_MAX + 8];
    snprintf(label, sizeof label, "output=%s", a->output);
    w = bs_wb_writer(a->output, label, a->max_shard_size, &err);
  } else if (is_new) {
    w = bs_wb_writer(fs->source, a->source, a->max_shard_size, &err);
  } else if (!(w = bs_writer_for_format(fs->cat.format))) {
    fprintf(stderr,
            PROG ": %s: a writable mount of a %s file needs -o output=PATH naming a format "
                 "burnstore writes: %s; it never overwrites a %s file\n",
            a->source, bs_format_name(fs->cat.format), exts, bs_format_name(fs->cat.format));
    return NULL;
  } else {
    w = bs_wb_sharded(w, a->max_shard_size, &err);
  }
  if (!w) {
    fs_fail_line(NULL, &err);
    return NULL;
  }
  return w;
}

/* Rewritten in place (output = source, key options applied): the writer
 * must keep all the source holds (a .pth's non-tensor values), else it is
 * refused now; what it must keep where it is becomes fs->fixed. 0, or 1
 * (printed). */
static int check_in_place(struct fs *fs, const struct args *a)
{
  const struct bs_writer *w = fs->writer;
  if (!fs->writable || fs->force_write || !fs->cat.nsrcs || !w->in_place_ok)
    return 0;
  bs_err err;
  bs_err_clear(&err);
  bool *fixed = bs_calloc(fs->cat.count ? fs->cat.count : 1, sizeof *fixed);
  if (!fixed) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  if (w->in_place_ok(&fs->cat, fixed, &err) != 0) {
    fprintf(stderr,
            PROG ": %s: cannot be rewritten in place without losing what it holds: %s; write the "
                 "edit to a new file with -o output=NEW%s\n",
            a->source, err.msg, w->extensions[0]);
    bs_free(fixed);
    return 1;
  }
  for (size_t i = 0; i < fs->cat.count; i++)
    if (fixed[i]) {
      fs->fixed = fixed;
      return 0;
    }
  bs_free(fixed); /* nothing fixed: no check at unlink and rename */
  return 0;
}

static int prepare_rest(struct fs *fs, struct args *a, uint32_t bits);

/* Overwrite a URL's user-info and query in place (it is our argv: what ps
 * shows), once a copy of it is held. */
static void scrub_url(char *url)
{
  char *a = strstr(url, "://");
  if (!a)
    return;
  a += 3;
  size_t end = strcspn(a, "/?#");
  for (size_t i = end; i > 0; i--)
    if (a[i - 1] == '@') {
      memset(a, '*', i - 1);
      break;
    }
  char *q = strchr(a, '?');
  if (q)
    memset(q + 1, '*', strlen(q + 1));
}

/* The views (npy, adapter=, as=) are read-only: refused on a mount that
 * will be writable, before anything is opened. 0, or 1 (printed). */
static int refuse_views(const struct args *a)
{
  if (a->view) {
    fprintf(stderr,
            PROG ": view=%s is a read-only view: mount without rw and output= (burnstore convert "
                 "SOURCE OUT%s writes the file)\n",
            a->view->extensions[0] + 1, a->view->extensions[0]);
    return 1;
  }
  bool as = a->open.has_as;
  if (!a->npy && !as && !bs_adapter_any(&a->open.adapter))
    return 0;
  fprintf(stderr,
          PROG ": %s%s are read-only views: mount without rw and output= (burnstore "
               "convert -o adapter=pytorch writes an adapted file)\n",
          a->npy ? "npy and npy=only"
          : as   ? "as="
                 : "adapter=",
          !a->npy && as ? bs_dtype_name(a->open.as) : "");
  return 1;
}
/* SOURCE is a URL: opened by range requests through the one open path
 * (bs_checkpoint_open); read-only, or writable into a local output= (never
 * in place). From here on the URL is shown without credentials (messages,
 * the mount table). */
static int prepare_url(struct fs *fs, struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  char *url = (char *)a->source; /* argv's own memory: writable */
  if (a->rw && !a->output) {
    char *shown = bs_http_redact(url);
    fprintf(stderr,
            PROG ": %s: a URL is never written in place: mount it with -o output=LOCAL (a "
                 "writable mount written to a local file), or read-only\n",
            shown ? shown : "the URL");
    bs_free(shown);
    return 1;
  }
  if (a->output && refuse_views(a))
    return 1;
  clock_gettime(CLOCK_REALTIME, &fs->mtime);
  /* argv is what ps shows: its credentials go before the first request */
  char *copy = bs_strdup(url);
  scrub_url(url);
  int rc = copy ? bs_checkpoint_open(&fs->cat, copy, &a->open, &fs->source, &err) : -1;
  if (copy) {
    explicit_bzero(copy, strlen(copy));
    bs_free(copy);
  }
  if (!fs->source) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  a->source = fs->source;
  if (rc != 0)
    return fs_fail_line(a->source, &err);
  for (size_t i = 0; i < fs->cat.nsrcs; i++) { /* (-o unvalidated let it through) */
    const char *v = NULL;
    if (bs_src_remote(&fs->cat.srcs[i], NULL, &v) && strncmp(v, "If-Match:", 9) != 0)
      fs->unvalidated = true;
  }
  if (a->output) {
    /* The staging INDEX records the URL and each file's validator, so that
     * --finish after a kill reads the same bytes or refuses. */
    const char *reopen = NULL, *validator = NULL;
    bool remote = fs->cat.nsrcs && bs_src_remote(&fs->cat.srcs[0], &reopen, &validator);
    size_t bare = 0; /* (each shard's validator is checked at --finish too) */
    while (remote && reopen && bare < fs->cat.nsrcs &&
           bs_src_remote(&fs->cat.srcs[bare], NULL, &validator) && *validator)
      bare++;
    if (remote && (!reopen || bare < fs->cat.nsrcs)) {
      const char *shard = reopen && fs->cat.nsrcs > 1 ? fs->cat.srcs[bare].name : NULL;
      fprintf(stderr,
              PROG ": %s: a writable mount of it is refused: %s%s%s, so --finish after a crash "
                   "could not tell its bytes changed; mount it read-only and copy the tensors, "
                   "or burnstore convert URL OUT\n",
              a->source,
              !reopen ? "the URL holds credentials (user-info or a query), which are never "
                        "written to the staging directory (use BURNSTORE_HTTP_TOKEN)"
                      : "the server sends neither an ETag nor a Last-Modified",
              shard ? " for " : "", shard ? shard : "");
      return 1;
    }
    fs->writable = true;
    if (!(fs->writer = choose_writer(fs, a, false)))
      return 1;
    if (!(fs->output = bs_write_path(a->output, &err)))
      return fs_fail_line(NULL, &err);
    fs->force_write = true;
  }
  return prepare_rest(fs, a, 0444);
}

/* The output of a writable mount: output= (never through another user's
 * link), else SOURCE itself. 0, or 1 (printed). */
static int set_output(struct fs *fs, const struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  fs->output = a->output ? bs_write_path(a->output, &err) : bs_strdup(fs->source);
  if (fs->output)
    return 0;
  if (err.code)
    return fs_fail_line(NULL, &err);
  fprintf(stderr, PROG ": %s: %s\n", a->output ? a->output : a->source, strerror(errno));
  return 1;
}

/* Open and validate SOURCE fully, build the tree. Prints the error. */
int fs_prepare(struct fs *fs, struct args *a)
{
  bs_err err;
  bs_err_clear(&err);
  fs->staging_fd = -1;
  fs->staging_lock = -1;
  fs->flat = a->flat;
  fs->nojournal = a->nojournal;
  fs->owner.uid = a->has_uid ? a->uid : getuid();
  fs->owner.gid = a->has_gid ? a->gid : getgid();
  pthread_rwlock_init(&fs->lock, NULL);
  pthread_mutex_init(&fs->stage_lock, NULL);
  bs_catalog_init(&fs->cat);
  if (bs_src_is_url(a->source))
    return prepare_url(fs, a);
  const struct bs_http_opts *h = &a->open.http;
  if (h->cache_bytes || h->timeout_s || h->unvalidated) {
    fprintf(stderr, PROG ": %s: http_cache=, http_timeout= and unvalidated apply to a URL SOURCE\n",
            a->source);
    return 1;
  }
  /* A link is the checkpoint it names: rw edits that file, and the link
   * stays a link (its rename would replace the link). Another user's link
   * is not followed by hand; rw refuses it (it could name any file). */
  fs->source = a->rw && !a->output ? bs_write_path(a->source, &err) : bs_link_path(a->source);
  if (!fs->source) {
    if (err.code)
      return fs_fail_line(NULL, &err);
    fprintf(stderr, PROG ": %s: %s\n", a->source, strerror(errno));
    return 1;
  }
  struct stat st;
  if (stat(fs->source, &st) != 0) {
    if (errno != ENOENT) {
      fprintf(stderr, PROG ": %s: %s\n", a->source, strerror(errno));
      return 1;
    }
    /* ro, or a read-only view asked without rw or output=: the source was
     * meant to exist (not a new checkpoint to refuse the view of) */
    const char *view = a->ro                              ? "ro"
                       : a->rw || a->output               ? NULL
                       : a->view                          ? "with view="
                       : a->npy                           ? "with npy"
                       : a->open.has_as                   ? "with as="
                       : bs_adapter_any(&a->open.adapter) ? "with adapter="
                                                          : NULL;
    if (view) {
      fprintf(stderr, PROG ": %s: no such file (a new checkpoint cannot be mounted %s)\n",
              a->source, view);
      return 1;
    }
    /* A new checkpoint: an empty writable mount, nothing to open. */
    fs->writable = true;
    if (refuse_views(a) || !(fs->writer = choose_writer(fs, a, true)) || set_output(fs, a))
      return 1;
    if (bs_keys_apply(&fs->cat, &a->open.keys, &err) != 0)
      return fs_fail_line(a->source, &err);
    clock_gettime(CLOCK_REALTIME, &fs->mtime);
    return prepare_rest(fs, a, 0444);
  }
  if ((a->rw || a->output) && refuse_views(a))
    return 1;
  /* The one open path: a directory is the checkpoint it holds (fs->source
   * becomes a shard set's index), a set a kill interrupted is recovered
   * first, then the format, key options, adapter=, as=. */
  char *name = NULL;
  int rc = bs_checkpoint_open(&fs->cat, fs->source, &a->open, &name, &err);
  if (rc != 0 || !name) {
    bs_free(name);
    return fs_fail_line(a->source, &err);
  }
  bs_free(fs->source);
  fs->source = name;
  if (stat(fs->source, &st) != 0) {
    fprintf(stderr, PROG ": %s: %s\n", a->source, strerror(errno));
    return 1;
  }
  fs->mtime = st.st_mtim;
  /* The bits every file of the checkpoint grants: a sharded one's index
   * and each of its shards (a 0600 shard keeps the set private). */
  unsigned mode = bs_sources_mode(&fs->cat, fs->cat.nsrcs, st.st_mode);
  if (a->rw || a->output) {
    fs->writable = true;
    if (!(fs->writer = choose_writer(fs, a, false)) || set_output(fs, a))
      return 1;
    fs->force_write = strcmp(fs->output, fs->source) != 0;
    /* A new output is as private as its source (cp keeps the mode). */
    fs->wopts.has_mode = true;
    fs->wopts.mode = mode & 0666;
  }
  return prepare_rest(fs, a, mode & 0444);
}

/* What follows the source's opening, for a file and a URL alike. */
static int prepare_rest(struct fs *fs, struct args *a, uint32_t bits)
{
  bs_err err;
  bs_err_clear(&err);
  /* The files show SOURCE's read bits, so a private checkpoint stays
   * private under allow_other; on a writable mount the owner may write (the
   * source's write bits are about the source, not about this mount). */
  bits = (bits | (fs->writable ? 0200u : 0u)) & ~a->umask;
  fs->owner.file_mode = bits;
  fs->owner.dir_mode = (bits | (bits & 0444) >> 2) & ~a->umask;
  if (a->direct_io && fs->writable) {
    fprintf(stderr, PROG ": direct_io applies to read-only mounts\n");
    return 1;
  }
  fs->direct_io = a->direct_io;
  /* A URL's bytes come in 1 MiB blocks: READs of 1 MiB (not the kernel's
   * 128 KiB) cost fewer requests and wake-ups (bench.py remote). A local
   * file's READs are spliced, where 1 MiB ones were slower. */
  fs->readahead_given = a->readahead_kb >= 0;
  fs->readahead_kb = fs->readahead_given        ? (unsigned)a->readahead_kb
                     : bs_src_is_url(a->source) ? READAHEAD_URL
                                                : 0;
  if (fs->readahead_given && fs->readahead_kb && !bs_src_is_url(a->source))
    fs_readahead_warn(fs->readahead_kb);
  if (bs_src_is_url(a->source))
    fs->max_background = URL_BACKGROUND;
  if (a->max_shard_size && !fs->writer) {
    fprintf(stderr, PROG ": max_shard_size= applies to a writable mount written as SafeTensors "
                         "(.safetensors or .safetensors.index.json)\n");
    return 1;
  }
  fs->wopts.max_shard_size = a->max_shard_size;
  if (a->output_as && !fs->writer) {
    fprintf(stderr, PROG ": output_as= applies to a writable mount (rw or output=)\n");
    return 1;
  }
  if (a->output_as) {
    fs->has_output_as = true;
    (void)bs_dtype_from_name(a->output_as, &fs->output_as); /* parse_opts checked it */
  }
  if (fs->writable && !fs->output) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  if (fs->writable) {
    char buf[PATH_MAX];
    /* A mkdtemp template: created in fs_staging_create, exclusively. */
    if (a->staging) {
      char *d = bs_abs_path(a->staging);
      if (!d) {
        fprintf(stderr, PROG ": staging=%s: %s\n", a->staging, strerror(errno));
        return 1;
      }
      int w = snprintf(buf, sizeof buf, "%s/burnstore-XXXXXX", d);
      bs_free(d);
      if (w < 0 || (size_t)w >= sizeof buf) {
        fprintf(stderr,
                PROG ": staging=%s: %s (its staging directory's path would be over %d "
                     "bytes)\n",
                a->staging, strerror(ENAMETOOLONG), PATH_MAX - 1);
        return 1;
      }
    } else {
      const char *slash = strrchr(fs->output, '/');
      int w = snprintf(buf, sizeof buf, "%.*s/.%s.staging-XXXXXX", (int)(slash - fs->output),
                       fs->output, slash + 1);
      if (w < 0 || (size_t)w >= sizeof buf || strlen(slash + 1) + 16 > NAME_MAX) {
        fprintf(stderr,
                PROG ": %s: %s (the staging directory beside it, .NAME.staging-XXXXXX, would be "
                     "too long: use -o staging=DIR)\n",
                fs->output, strerror(ENAMETOOLONG));
        return 1;
      }
    }
    if (!(fs->staging = bs_strdup(buf))) {
      fprintf(stderr, PROG ": out of memory\n");
      return 1;
    }
  }
  /* (key options, adapter= and as= were applied as SOURCE was opened) */
  /* A conversion that cannot succeed is refused now, not at unmount. */
  if (fs->writer && writer_check(fs, &err) != 0)
    return fs_fail_line(a->source, &err);
  if (fs->has_output_as &&
      refuse_undecodable(a->source, &fs->cat, fs->output_as, fs->force_write) != 0)
    return 1;
  if (check_in_place(fs, a) != 0)
    return 1;
  if (a->view && a->npy) {
    fprintf(stderr, PROG ": view= shows one file: npy applies to the tensor files of a mount "
                         "without it\n");
    return 1;
  }
  if (a->view ? fs_view_build(fs, a->view, a->open.has_as ? &a->open.as : NULL, &err) != 0
              : bs_tree_init(&fs->tree, &err) != 0 ||
                    bs_tree_build(&fs->tree, &fs->cat, fs->flat, &err) != 0 ||
                    fs_npy_build(fs, a->npy, &err) != 0)
    return fs_fail_line(a->source, &err);
  if (bs_edit_init(&fs->edit, &fs->cat, &fs->tree, fs->flat, &err) != 0 ||
      (fs->writable && bs_edit_attach(&fs->edit, &fs->mtime, &fs->owner, &err) != 0))
    return fs_fail_line(a->source, &err);
  fs->keys = a->open.keys;
  memset(&a->open.keys, 0, sizeof a->open.keys);
  if (fs_xattr_init(fs, &err) != 0)
    return fs_fail_line(a->source, &err);
  /* The parsers' temporary memory (a JSON or CBOR tree of the whole header)
   * is freed by now; give it back, so the daemon stays O(tensors). */
  malloc_trim(0);
  fs->timeout = fs->writable ? 1.0 : 86400.0;
  return 0;
}
