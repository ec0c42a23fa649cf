/* The write-back and its recovery, without FUSE (writeback.h). */
#include "policy/writeback.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/journal.h"
#include "core/safe_open.h"
#include "core/strmap.h"
#include "core/target.h"
#include "formats/formats.h"
#include "policy/decode_as.h"
#include "policy/journal_replay.h"
#include "policy/stage_index.h"

/* ---- output -> writer ---------------------------------------------------------------------- */

const struct bs_writer *bs_wb_sharded(const struct bs_writer *w, uint64_t max_shard_size,
                                      bs_err *err)
{
  if (!max_shard_size)
    return w;
  /* Shards are a SafeTensors thing: x.safetensors becomes x-0000K-of-0000N + its index. */
  if (w && w->format == BS_FMT_SAFETENSORS)
    w = bs_writer_for_format(BS_FMT_ST_SHARDED);
  if (!w || w->format != BS_FMT_ST_SHARDED) {
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
            "max_shard_size= applies to outputs written as SafeTensors (.safetensors or "
            ".safetensors.index.json)");
    return NULL;
  }
  return w;
}

const struct bs_writer *bs_wb_writer(const char *path, const char *label, uint64_t max_shard_size,
                                     bs_err *err)
{
  const struct bs_writer *w = bs_writer_for_path(path);
  if (!w) {
    char exts[256];
    bs_writer_list(exts, sizeof exts);
    const char *ext = bs_path_extension(path);
    if (!*ext)
      bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
              "%s: no extension names the format to write (burnstore writes %s)", label, exts);
    else
      bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
              "%s: burnstore cannot write %s files (it writes %s, and never writes one format "
              "under another's extension)",
              label, ext, exts);
    return NULL;
  }
  return bs_wb_sharded(w, max_shard_size, err);
}

/* ---- The staging directory ----------------------------------------------------------------- */

/* One try: a private directory beneath its held parent (never reopened by
 * its path, which another user who may write the parent could redirect),
 * then its lock file, created and locked. */
static int staging_try(int pfd, const char *parent, char *tmpl, char *name, int *dirfd, int *lock)
{
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_safe_mkdtempat(pfd, parent, name, &err);
  if (fd < 0)
    return -(err.code ? err.code : EIO);
  memcpy(tmpl + strlen(tmpl) - strlen(name), name, strlen(name));
  int lk = bs_safe_openat(fd, tmpl, BS_STAGE_LOCK_NAME, O_RDWR | O_CREAT | O_EXCL, 0600,
                          BS_SAFE_REG, NULL, &err);
  /* Another writer removing dead daemons' empty staging directories
   * (bs_staging_sweep) may take or remove this one between the create and
   * the lock: then try a new one. */
  bool ok = lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) == 0 && bs_fd_named(fd, BS_STAGE_LOCK_NAME, lk);
  if (!ok) {
    int e = lk >= 0 ? EAGAIN : err.code;
    if (lk >= 0)
      close(lk);
    bs_safe_unlinkat(fd, BS_STAGE_LOCK_NAME, 0);
    struct stat was;
    if (fstat(fd, &was) == 0)
      bs_safe_unlink_same(pfd, name, &was, AT_REMOVEDIR);
    close(fd);
    return -e;
  }
  *dirfd = fd;
  *lock = lk;
  return 0;
}

int bs_staging_create(char *tmpl, int *dirfd, int *lock)
{
  size_t len = strlen(tmpl);
  const char *slash = strrchr(tmpl, '/');
  if (len < 6 || !slash || strcmp(tmpl + len - 6, "XXXXXX") != 0 || !slash[1])
    return -EINVAL;
  char parent[PATH_MAX], name[NAME_MAX + 1];
  if ((size_t)(slash - tmpl) >= sizeof parent || strlen(slash + 1) >= sizeof name)
    return -ENAMETOOLONG;
  snprintf(parent, sizeof parent, "%.*s", slash == tmpl ? 1 : (int)(slash - tmpl), tmpl);
  bs_err err;
  bs_err_clear(&err);
  int pfd = bs_safe_open_dir(parent, BS_SAFE_ANY_OWNER, &err);
  if (pfd < 0)
    return -(err.code ? err.code : EIO);
  int rc = -EAGAIN;
  for (int tries = 0; rc == -EAGAIN && tries < 5; tries++) {
    snprintf(name, sizeof name, "%s", slash + 1);
    memcpy(tmpl + len - 6, "XXXXXX", 6);
    memcpy(name + strlen(name) - 6, "XXXXXX", 6);
    rc = staging_try(pfd, parent, tmpl, name, dirfd, lock);
  }
  close(pfd);
  return rc;
}

/* Its lock file, opened as any file burnstore did not just create (a
 * symbolic link is never followed, nor created through; a FIFO never
 * blocks), created if missing with `create`. -1 with err. */
static int open_lock(const struct bs_stage_dir *stg, bool create, bs_err *err)
{
  return bs_safe_openat(stg->fd, stg->path, BS_STAGE_LOCK_NAME, O_RDWR | (create ? O_CREAT : 0),
                        0600, BS_SAFE_REG, NULL, err);
}

/* dir/name is a dead daemon's staging directory holding only its lock (and
 * a journal of no change): remove it (under that lock, so no daemon or
 * --finish can be using it). One of another user's, or one others may
 * write, is left alone with a line to `notes`. */
static void remove_empty_staging(int pfd, const char *dir, const char *name, FILE *notes)
{
  char path[PATH_MAX];
  bs_err err;
  bs_err_clear(&err);
  if (bs_path_join_buf(path, sizeof path, dir, name, &err) != 0)
    return;
  struct stat st;
  struct bs_stage_dir stg = {bs_safe_openat(pfd, dir, name, O_RDONLY | O_DIRECTORY, 0,
                                            BS_SAFE_DIR | BS_SAFE_PRIVATE, &st, &err),
                             path};
  if (stg.fd < 0) {
    if (notes && (err.code == EPERM || err.code == ENOTDIR || err.code == ELOOP))
      fprintf(notes, "burnstore: %s (a staging directory's name: left alone)\n", err.msg);
    return;
  }
  int lk = open_lock(&stg, false, &err);
  bool locked = lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) == 0;
  char target[PATH_MAX];
  if (locked && bs_stage_done(&stg, target, sizeof target)) {
    /* Its write-back completed; a kill cut the removal short. */
    bs_stage_dir_remove(stg.fd, path, target[0] ? target : NULL);
    if (notes)
      fprintf(notes,
              "burnstore: removed %s: its write-back%s%s had completed (a kill cut its cleanup "
              "short)\n",
              path, target[0] ? " of " : "", target);
    close(lk);
    close(stg.fd);
    return;
  }
  DIR *d = locked ? bs_safe_dirstream(stg.fd) : NULL;
  /* Its lock, and a journal that records no change, are not data. */
  bool empty = d != NULL;
  for (struct dirent *de; empty && (de = readdir(d)) != NULL;)
    empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            strcmp(de->d_name, BS_STAGE_LOCK_NAME) == 0 ||
            (strcmp(de->d_name, BS_JOURNAL_NAME) == 0 && bs_journal_nothing_to_finish(&stg));
  if (d)
    closedir(d);
  if (empty)
    bs_safe_unlinkat(stg.fd, BS_JOURNAL_NAME, 0);
  if (empty && bs_safe_unlinkat(stg.fd, BS_STAGE_LOCK_NAME, 0) == 0)
    bs_safe_unlink_same(pfd, name, &st, AT_REMOVEDIR);
  if (lk >= 0)
    close(lk);
  close(stg.fd);
}

void bs_staging_sweep(const char *tmpl, FILE *notes)
{
  const char *slash = strrchr(tmpl, '/');
  size_t tl = strlen(tmpl);
  if (!slash || tl < 6 || strcmp(tmpl + tl - 6, "XXXXXX") != 0)
    return;
  char dir[PATH_MAX], prefix[NAME_MAX + 1];
  size_t dl = slash == tmpl ? 1 : (size_t)(slash - tmpl), pl0 = tl - 6 - (size_t)(slash + 1 - tmpl);
  if (dl >= sizeof dir || pl0 >= sizeof prefix)
    return; /* no such directory can exist: nothing to sweep, never a cut prefix */
  snprintf(dir, sizeof dir, "%.*s", (int)dl, tmpl);
  snprintf(prefix, sizeof prefix, "%.*s", (int)pl0, slash + 1);
  size_t pl = strlen(prefix);
  bs_err err;
  bs_err_clear(&err);
  int pfd = bs_safe_open_dir(dir, BS_SAFE_ANY_OWNER, &err);
  DIR *d = pfd >= 0 ? bs_safe_dirstream(pfd) : NULL;
  for (struct dirent *de; d && (de = readdir(d)) != NULL;)
    if (strncmp(de->d_name, prefix, pl) == 0 && strlen(de->d_name) == pl + 6)
      remove_empty_staging(pfd, dir, de->d_name, notes);
  if (d)
    closedir(d);
  if (pfd >= 0)
    close(pfd);
}

void bs_staging_remove(const char *dir, const char *target, int *dirfd, int *lock)
{
  /* Only a directory the caller created and still holds the lock of. */
  if (*dirfd < 0 || *lock < 0)
    return;
  bs_stage_dir_remove(*dirfd, dir, target);
  close(*dirfd);
  *dirfd = -1;
  close(*lock);
  *lock = -1;
}

/* ---- One write-back ------------------------------------------------------------------------ */

/* What the INDEX says besides the catalog: target, pid, checkpoint. */
static int index_head(const struct bs_wb *wb, struct bs_stage_index *idx, bs_err *err)
{
  const struct bs_catalog *src = wb->edit->src;
  bs_stage_index_init(idx);
  idx->pid = (long)getpid();
  idx->target = (char *)wb->target; /* borrowed, never freed */
  idx->format = wb->writer->format;
  idx->max_shard_size = wb->opts.max_shard_size;
  idx->has_output_as = wb->has_output_as;
  idx->output_as = wb->output_as;
  idx->has_mode = wb->opts.has_mode;
  idx->mode = wb->opts.mode & 0666;
  idx->ncksrcs = src->nsrcs;
  const char *reopen = NULL;
  if (src->nsrcs && bs_src_remote(&src->srcs[0], &reopen, NULL)) {
    /* A URL: recorded as the URL that opens the same bytes again, each
     * source with its validator (the INDEX's src records). */
    if (!reopen)
      return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                     "%s: a URL with credentials in it is not written to the staging INDEX",
                     wb->source ? wb->source : "?");
    idx->ck.path = (char *)reopen; /* borrowed */
    idx->ck.remote = true;
    idx->ck.size = src->srcs[0].size;
  } else if (src->nsrcs) {
    struct bs_src_ident id;
    if (!wb->source || !bs_src_ident(&src->srcs[0], &id))
      return bs_fail(err, EIO, BS_OFF_NONE, NULL, "%s: cannot stat the checkpoint",
                     wb->source ? wb->source : "?");
    idx->ck.path = (char *)wb->source; /* borrowed */
    idx->ck.size = id.size;
    idx->ck.dev = id.dev;
    idx->ck.ino = id.ino;
    idx->ck.mtime_sec = id.mtime_sec;
    idx->ck.mtime_nsec = id.mtime_nsec;
  }
  return 0;
}

/* Serialize and save the INDEX (the borrowed fields of idx are not freed). */
static int save_index(const struct bs_wb *wb, const struct bs_stage_index *idx,
                      const struct bs_catalog *out, bs_err *err)
{
  struct bs_buf buf = {0};
  int rc = bs_stage_index_format(idx, out, wb->staging, &buf, err);
  if (rc == 0)
    rc = bs_stage_index_save(*wb->staging_fd, &buf, err);
  bs_buf_destroy(&buf);
  return rc;
}

/* When the output catalog cannot be built (a file is inconsistent), an INDEX
 * marked incomplete still names every staged file (key, dtype, shape), so a
 * user can recover the bytes by hand; --finish refuses it. It walks the
 * tree, not the output catalog, which stops at the first bad file. */
static void save_incomplete_index(const struct bs_wb *wb, const char *why)
{
  const struct bs_edit *ed = wb->edit;
  if (*wb->staging_fd < 0)
    return;
  bs_err err;
  bs_err_clear(&err);
  struct bs_stage_index idx;
  if (index_head(wb, &idx, &err) != 0)
    return;
  idx.ncksrcs = 0;
  idx.incomplete = (char *)why;
  size_t cap = 0;
  for (uint64_t ino = BS_TREE_ROOT; ino < ed->tree->n; ino++) {
    const struct bs_node *nd = &ed->tree->nodes[ino];
    const struct bs_entry *e = bs_tree_user(ed->tree, ino);
    if (!nd->live || nd->is_dir || !e || !e->stage)
      continue;
    if (bs_grow((void **)&idx.files, &cap, idx.nfiles + 1, sizeof *idx.files) != 0)
      break;
    struct bs_stage_file *sf = &idx.files[idx.nfiles];
    struct bs_eff eff;
    bs_entry_effective(ed, e, &eff);
    char name[32];
    snprintf(name, sizeof name, "%llu", (unsigned long long)e->stage);
    sf->file = bs_strdup(name);
    sf->key = bs_tree_key(ed->tree, ino, ed->flat);
    if (!sf->key)
      sf->key = bs_strdup(nd->name);
    sf->dtype = eff.dtype;
    /* "-" (not set: 1-D if the size allows) unless explicit or the origin's. */
    sf->has_shape = !eff.shape_inferred;
    sf->rank = eff.shape_inferred ? 0 : eff.rank;
    sf->shape = eff.shape_inferred ? NULL : (uint64_t *)eff.shape; /* borrowed, never freed */
    if (!sf->file || !sf->key) { /* out of memory: list the files so far */
      bs_free(sf->file);
      bs_free(sf->key);
      break;
    }
    idx.nfiles++;
  }
  (void)save_index(wb, &idx, NULL, &err);
  for (size_t i = 0; i < idx.nfiles; i++) {
    bs_free(idx.files[i].file);
    bs_free(idx.files[i].key);
  }
  bs_free(idx.files);
}

int bs_wb_run(const struct bs_wb *wb, char **report, bs_err *err)
{
  *report = NULL;
  struct bs_catalog out;
  bs_catalog_init(&out);
  out.format = wb->writer->format;
  int rc = -1;
  bool built = false;
  struct bs_stage_dir stg = {*wb->staging_fd, wb->staging};
  /* (the edit's metadata borrowed: the mount serves nothing while its
   * write-back runs) */
  if (bs_edit_catalog_view(wb->edit, &stg, wb->keep_hidden, &out, err) != 0)
    goto out;
  if (wb->writer->default_meta && wb->writer->default_meta(&out, err) != 0)
    goto out;
  built = true;
  if (*wb->staging_fd < 0) {
    int sc = bs_staging_create(wb->staging, wb->staging_fd, wb->staging_lock);
    if (sc != 0) {
      bs_fail(err, -sc, BS_OFF_NONE, NULL, "cannot create the staging directory for the INDEX: %s",
              strerror(-sc));
      goto out;
    }
  }
  /* The INDEX, on disk and fsynced before the writer starts: a write-back
   * killed from here on leaves a staging directory `burnstore --finish`
   * completes. An INDEX that cannot be saved fails the write-back. */
  struct bs_stage_index sidx;
  if (index_head(wb, &sidx, err) != 0 || save_index(wb, &sidx, &out, err) != 0)
    goto out;
  /* -o output_as=: after the INDEX, which describes the bytes as stored. */
  if (wb->has_output_as && bs_catalog_decode_as(&out, wb->output_as, err) != 0)
    goto out;
  rc = bs_writer_write_file_opts(wb->writer, &out, wb->target, &wb->opts, err);
  if (rc == 0 && out.notes)
    *report = out.notes, out.notes = NULL;
out:
  if (rc != 0 && !built) {
    char line[700];
    save_incomplete_index(wb, bs_err_format(err, NULL, line, sizeof line));
  }
  bs_catalog_destroy(&out);
  return rc;
}

/* ---- The journal --------------------------------------------------------------------------- */

struct bs_journal *bs_wb_journal_start(const struct bs_wb *wb, bs_err *err)
{
  struct bs_catalog out;
  bs_catalog_init(&out);
  out.format = wb->writer->format;
  struct bs_buf buf = {0}, origins = {0};
  struct bs_strmap keys = {0};
  struct bs_journal *j = NULL;
  struct bs_stage_index idx;
  /* BASE: the INDEX a write-back right now would save (no file staged). */
  struct bs_stage_dir stg = {*wb->staging_fd, wb->staging};
  if (*wb->staging_fd < 0 || bs_edit_catalog_view(wb->edit, &stg, wb->keep_hidden, &out, err) ||
      index_head(wb, &idx, err) != 0 || bs_stage_index_format(&idx, &out, wb->staging, &buf, err))
    goto out;
  /* Its origins: which base tensor each file of the tree is (by its key). */
  const struct bs_tree *t = wb->edit->tree;
  for (size_t i = 0; i < out.count; i++)
    if (bs_strmap_put(&keys, out.tensors[i].name, i) < 0)
      goto oom;
  for (uint64_t ino = BS_TREE_ROOT; ino < t->n; ino++) {
    const struct bs_node *nd = &t->nodes[ino];
    if (!nd->live || nd->is_dir)
      continue;
    char *key = bs_tree_key(t, ino, wb->edit->flat);
    size_t ti;
    bool found = key && bs_strmap_get(&keys, key, &ti);
    bs_free(key);
    uint8_t pair[16];
    bs_put_le64(pair, ino);
    bs_put_le64(pair + 8, ti);
    if (!found || bs_buf_put(&origins, pair, sizeof pair) != 0)
      goto oom;
  }
  j = bs_journal_create(*wb->staging_fd, buf.data, buf.len, origins.data, origins.len, err);
  goto out;
oom:
  bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "cannot describe the mount in its journal");
out:
  bs_strmap_destroy(&keys);
  bs_buf_destroy(&origins);
  bs_buf_destroy(&buf);
  bs_catalog_destroy(&out);
  return j;
}

/* ---- --list-staging ------------------------------------------------------------------------ */

/* Whether its daemon (or a --finish) holds its lock. */
static bool staging_alive(const struct bs_stage_dir *stg)
{
  bs_err err;
  bs_err_clear(&err);
  int lk = open_lock(stg, false, &err);
  if (lk < 0)
    return false;
  bool alive = flock(lk, LOCK_EX | LOCK_NB) != 0;
  close(lk);
  return alive;
}

static void print_shape(FILE *f, bool has, uint32_t rank, const uint64_t *shape)
{
  char buf[BS_MAX_RANK * 21 + 3];
  if (has)
    bs_shape_format(buf, sizeof buf, rank, shape);
  fputs(has ? buf : "-", f);
}

/* The log a failed write-back left in its staging directory (why it
 * failed), each line after "log: " (one that is no file of ours is named,
 * never read). */
static void print_stage_log(const struct bs_stage_dir *stg, FILE *out)
{
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_safe_openat(stg->fd, stg->path, BS_STAGE_LOG_NAME, O_RDONLY, 0,
                          BS_SAFE_REG | BS_SAFE_PRIVATE, NULL, &err);
  FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
  if (!f) {
    if (fd >= 0)
      close(fd);
    else if (err.code != ENOENT)
      fprintf(out, "log: not read: %s\n", err.msg);
    return;
  }
  char line[1300];
  while (fgets(line, sizeof line, f))
    fprintf(out, "log: %s%s", line, strchr(line, '\n') ? "" : "\n");
  fclose(f);
}

/* A staging directory without an INDEX (its daemon died while mounted or
 * before its write-back saved one): name its files, which hold raw bytes. */
static int list_raw_staging(const struct bs_stage_dir *stg, FILE *out, bs_err *err)
{
  const char *dir = stg->path;
  DIR *d = bs_safe_dirstream(stg->fd);
  if (!d)
    return bs_fail(err, errno, BS_OFF_NONE, NULL, "%s: %s", dir, strerror(errno));
  bool alive = staging_alive(stg);
  struct stat jst;
  if (fstatat(stg->fd, BS_JOURNAL_NAME, &jst, AT_SYMLINK_NOFOLLOW) == 0)
    fprintf(out,
            "staging %s\nno INDEX: %s; its JOURNAL names them (%lld bytes): burnstore --finish "
            "rebuilds the output from it\n",
            dir,
            alive ? "its daemon is running and has not started a write-back"
                  : "the daemon died while mounted",
            (long long)jst.st_size);
  else
    fprintf(out,
            "staging %s\nno INDEX: %s; its files hold raw bytes, without keys (--finish cannot "
            "use them)\n",
            dir,
            alive ? "its daemon is running and has not started a write-back"
                  : "the daemon died before its write-back described them");
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    struct stat st;
    if (de->d_name[0] == '.' || strcmp(de->d_name, BS_STAGE_LOCK_NAME) == 0 ||
        strcmp(de->d_name, BS_JOURNAL_NAME) == 0 || strcmp(de->d_name, BS_STAGE_LOG_NAME) == 0 ||
        fstatat(stg->fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    fprintf(out, "-\t-\t-\t%lld\tstaged %s/%s\n", (long long)st.st_size, dir, de->d_name);
  }
  closedir(d);
  print_stage_log(stg, out);
  return 1;
}

/* A staging directory named by the user (--finish, --list-staging): held
 * open, a directory of the caller's (or root's) that no one else may write;
 * another user's is refused in one line naming its owner. */
static int open_staging_arg(const char *dir, bs_err *err)
{
  return bs_safe_open_dir(dir, BS_SAFE_PRIVATE, err);
}

int bs_wb_list(const char *dir, FILE *out, bs_err *err)
{
  struct bs_stage_dir stg = {open_staging_arg(dir, err), dir};
  if (stg.fd < 0)
    return -1;
  char done[PATH_MAX];
  if (bs_stage_done(&stg, done, sizeof done)) {
    fprintf(out,
            "staging %s\nthe write-back%s%s completed (DONE): nothing to finish; burnstore "
            "--finish or the next writable mount of its target removes it\n",
            dir, done[0] ? " of " : "", done);
    close(stg.fd);
    return 0;
  }
  struct bs_stage_index idx;
  if (bs_stage_index_load(&stg, &idx, err) != 0) {
    int rc = -1;
    if (err->code == ENOENT) {
      bs_err_clear(err);
      rc = list_raw_staging(&stg, out, err);
    }
    close(stg.fd);
    return rc;
  }
  bool alive = staging_alive(&stg);
  fprintf(out, "staging %s\ntarget %s (%s)\ndaemon pid %ld (%s)\n", dir, idx.target,
          bs_format_name(idx.format), idx.pid, alive ? "running: do not --finish" : "gone");
  if (idx.ck.path)
    fprintf(out, "checkpoint %s (%llu bytes)\n", idx.ck.path, (unsigned long long)idx.ck.size);
  if (idx.incomplete)
    fprintf(out, "incomplete: %s\n", idx.incomplete);
  for (size_t i = 0; i < idx.cat.count; i++) {
    const struct bs_tensor *t = &idx.cat.tensors[i];
    fprintf(out, "%s\t%s\t", t->name, bs_dtype_name(t->dtype));
    print_shape(out, true, t->rank, t->shape);
    fprintf(out, "\t%llu\t", (unsigned long long)t->nbytes);
    if (t->src == UINT32_MAX)
      fprintf(out, "empty\n");
    else if (idx.srcs[t->src].stage)
      fprintf(out, "staged %s/%s\n", dir, idx.srcs[t->src].file);
    else
      fprintf(out, "checkpoint source %u at %llu%s\n", t->src, (unsigned long long)t->off,
              t->x->strides ? " (strided)" : "");
  }
  for (size_t i = 0; i < idx.nfiles; i++) {
    const struct bs_stage_file *f = &idx.files[i];
    fprintf(out, "%s\t%s\t", f->key, bs_dtype_name(f->dtype));
    print_shape(out, f->has_shape, f->rank, f->shape);
    struct stat st;
    char path[PATH_MAX];
    if (bs_path_join_buf(path, sizeof path, dir, f->file, err) != 0) {
      bs_stage_index_destroy(&idx);
      close(stg.fd);
      return -1;
    }
    bool there = fstatat(stg.fd, f->file, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
    fprintf(out, "\t%lld\tstaged %s\n", there ? (long long)st.st_size : -1LL, path);
  }
  print_stage_log(&stg, out);
  bs_stage_index_destroy(&idx);
  close(stg.fd);
  return 0;
}

/* ---- --finish ------------------------------------------------------------------------------ */

/* After a kill between the rename and the removal of the staging directory,
 * the target already is the result: every tensor of the INDEX is in it with
 * its dtype and shape, and the staged ones with their bytes. */
static bool target_is_result(const struct bs_stage_index *idx, const struct bs_stage_dir *stg)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  bs_err err;
  bs_err_clear(&err);
  struct bs_src src;
  struct bs_open_opts oo = {0};
  if (bs_src_open(&src, idx->target, &err) != 0 || bs_open_any(&cat, &src, &oo, &err) != 0)
    return false;
  bool same = cat.count == idx->cat.count;
  enum { CHUNK = 1 << 20 };
  char *a = bs_malloc(CHUNK), *b = bs_malloc(CHUNK);
  same = same && a && b;
  /* The target's tensors by key: one look-up each, not a scan each. */
  struct bs_strmap keys = {0};
  for (size_t i = 0; same && i < cat.count; i++)
    same = bs_strmap_put(&keys, cat.tensors[i].key, i) == 0;
  for (size_t i = 0; same && i < idx->cat.count; i++) {
    const struct bs_tensor *t = &idx->cat.tensors[i];
    size_t k;
    const struct bs_tensor *u = bs_strmap_get(&keys, t->name, &k) ? &cat.tensors[k] : NULL;
    same = u && u->dtype == t->dtype && u->rank == t->rank && u->nbytes == t->nbytes &&
           (t->rank == 0 || memcmp(u->shape, t->shape, t->rank * sizeof *t->shape) == 0);
    if (!same || t->src == UINT32_MAX || !idx->srcs[t->src].stage)
      continue;
    int fd = bs_safe_openat(stg->fd, stg->path, idx->srcs[t->src].file, O_RDONLY, 0, BS_SAFE_REG,
                            NULL, &err);
    same = fd >= 0;
    for (uint64_t off = 0; same && off < t->nbytes;) {
      size_t n = t->nbytes - off < CHUNK ? (size_t)(t->nbytes - off) : CHUNK;
      same = pread(fd, a, n, (off_t)(t->off + off)) == (ssize_t)n &&
             bs_tensor_read(&cat, u, off, b, n) == (long)n && memcmp(a, b, n) == 0;
      off += n;
    }
    if (fd >= 0)
      close(fd);
  }
  bs_strmap_destroy(&keys);
  bs_free(a);
  bs_free(b);
  bs_catalog_destroy(&cat);
  return same;
}

/* Nothing in it but its lock file: what a removal cut short between DONE
 * and the lock leaves. */
static bool holds_only_its_lock(const struct bs_stage_dir *stg)
{
  DIR *d = bs_safe_dirstream(stg->fd);
  bool only = d != NULL;
  for (struct dirent *de; only && (de = readdir(d)) != NULL;)
    only = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
           strcmp(de->d_name, BS_STAGE_LOCK_NAME) == 0;
  if (d)
    closedir(d);
  return only;
}

static int refuse_alive(const char *dir, long pid, bs_err *err)
{
  char p[32] = "";
  if (pid > 0)
    snprintf(p, sizeof p, " (pid %ld)", pid);
  return bs_fail(err, EBUSY, BS_OFF_NONE, NULL,
                 "%s belongs to a running burnstore daemon%s: unmount its mount (burnstore -u) "
                 "and let it write back instead",
                 dir, p);
}

int bs_wb_finish(const char *arg, unsigned flags, struct bs_wb_finished *res, bs_err *err)
{
  memset(res, 0, sizeof *res);
  char *dir = realpath(arg, NULL);
  if (!dir)
    return bs_fail(err, errno, BS_OFF_NONE, NULL, "%s: %s", arg, strerror(errno));
  int ret = -1, lk = -1, tfd = -1;
  struct bs_buf notes = {0};
  struct bs_stage_index idx;
  bs_stage_index_init(&idx);
  /* Held from here on: everything in it is reached through this fd. */
  struct bs_stage_dir stg = {open_staging_arg(dir, err), dir};
  if (stg.fd < 0)
    goto out;
  /* Held until the directory is removed: a second --finish waits its turn.
   * A lock file that is a symbolic link creates nothing where it points. */
  if ((lk = open_lock(&stg, true, err)) < 0)
    goto out;
  if (flock(lk, LOCK_EX | LOCK_NB) != 0) {
    long pid = bs_stage_index_load(&stg, &idx, err) == 0 ? idx.pid : 0;
    bs_err_clear(err);
    refuse_alive(dir, pid, err);
    goto out;
  }
  /* Its write-back completed and a kill cut the removal short (DONE), or
   * that removal left only the lock: nothing to finish, all to remove. */
  char done[PATH_MAX] = "";
  res->completed = bs_stage_done(&stg, done, sizeof done);
  if (res->completed || (res->empty = holds_only_its_lock(&stg))) {
    bs_stage_dir_remove(stg.fd, dir, done[0] ? done : NULL);
    res->target = done[0] ? bs_strdup(done) : NULL;
    ret = 0;
    goto out;
  }
  bool loaded = bs_stage_index_load(&stg, &idx, err) == 0;
  if (!loaded && err->code != ENOENT)
    goto out;
  if (!loaded) {
    /* No INDEX: the daemon died while mounted. Its journal says what the
     * mount held; rebuild the INDEX from it, then finish as usual. */
    bs_err noindex = *err;
    bs_err_clear(err);
    struct bs_buf text = {0};
    int jr = bs_journal_rebuild(&stg, flags & BS_WB_SALVAGE, &text, &notes, &res->salvaged, err);
    bs_stage_index_destroy(&idx);
    if (jr == 0)
      jr = bs_stage_index_parse(text.data, text.len, &idx, err);
    bs_buf_destroy(&text);
    if (jr != 0) {
      if (jr > 0)
        *err = noindex;
      goto out;
    }
  }
  if (idx.incomplete) {
    bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
            "%s: the write-back stopped before it could describe the output (%s); the staged "
            "files are listed by burnstore --list-staging, fix them in a new mount",
            dir, idx.incomplete);
    goto out;
  }
  char who[PATH_MAX + 16];
  snprintf(who, sizeof who, "--finish %s", dir);
  /* A set whose commit a kill interrupted is rolled forward or back first. */
  if ((tfd = bs_writer_lock(idx.target, who, err)) < 0 || bs_writer_recover(idx.target, err) != 0)
    goto out;
  if (bs_stage_index_attach(&idx, &stg, err) != 0) {
    if (err->code == ESTALE && idx.ck.path && strcmp(idx.ck.path, idx.target) == 0 &&
        target_is_result(&idx, &stg)) {
      bs_err_clear(err);
      bs_stage_dir_remove(stg.fd, dir, idx.target);
      res->already = true;
      res->target = bs_strdup(idx.target);
      ret = 0;
      goto out;
    }
    res->err_dir = arg;
    goto out;
  }
  const struct bs_writer *w = bs_writer_for_format(idx.format);
  if (!w) {
    bs_fail(err, ENOTSUP, BS_OFF_NONE, NULL,
            "%s: the INDEX names format %s, which burnstore does not write", dir,
            bs_format_name(idx.format));
    goto out;
  }
  /* A new target gets the mode the mount's write-back would have given it,
   * which the INDEX records (a new checkpoint's: none, 0644). An INDEX of
   * before that record: as private as the checkpoint is now (owner-only if
   * it cannot be stat'd). */
  struct bs_write_opts wo = {
      .max_shard_size = idx.max_shard_size, .has_mode = idx.has_mode, .mode = idx.mode};
  struct stat ck;
  if (!idx.has_mode && idx.ck.path && !idx.ck.remote) { /* (a URL's: the default) */
    wo.has_mode = true;
    wo.mode = stat(idx.ck.path, &ck) == 0
                  ? bs_sources_mode(&idx.cat, idx.ncksrcs, ck.st_mode) & 0666
                  : 0600;
  }
  if ((idx.has_output_as && bs_catalog_decode_as(&idx.cat, idx.output_as, err) != 0) ||
      bs_writer_write_file_opts(w, &idx.cat, idx.target, &wo, err) != 0) {
    res->kept = true;
    goto out;
  }
  /* After a salvage the directory stays: its staged files hold the bytes
   * the dropped records named. */
  if (!res->salvaged)
    bs_stage_dir_remove(stg.fd, dir, idx.target);
  res->target = bs_strdup(idx.target);
  res->tensors = idx.cat.count;
  ret = 0;
out:
  if (notes.len && bs_buf_put(&notes, "", 1) == 0)
    res->notes = (char *)notes.data, notes = (struct bs_buf){0};
  bs_buf_destroy(&notes);
  bs_target_unlock(tfd);
  bs_stage_index_destroy(&idx);
  if (lk >= 0)
    close(lk);
  if (stg.fd >= 0)
    close(stg.fd);
  free(dir);
  return ret;
}
