/* Writable mounts: staging on disk, and the call of the write-back on unmount.
 *
 * A file's bytes stay in the source checkpoint until it is first written;
 * then they move to a staging file (one per tensor) in a staging directory
 * beside the output. At unmount the core's write-back (core/writeback.h)
 * turns the tree into a catalog whose tensors point either at the source or
 * at staging files, saves its INDEX and runs the writer chosen at mount
 * (fs->writer). Nothing is held whole in memory, and no fd is held per staged
 * file: a file's staging fd is open only while the file is (bs_entry.fd),
 * other uses open it for the call.
 *
 * The model (which bytes, dtype, shape) is the core's editable catalog
 * (core/edit.h); this file does the staging I/O. Locks: see fs_ops.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/journal.h"
#include "core/safe_open.h"
#include "formats/writers.h"
#include "fs.h"
#include "policy/writeback.h"

/* fs->staging is a template ending in XXXXXX until the directory exists:
 * mkdtemp makes a fresh one (never one another daemon uses, whatever PIDs
 * are reused), and an flock on its "lock" file, held until the daemon exits,
 * tells `burnstore --finish` and other daemons that it is alive. */
int fs_staging_create(struct fs *fs)
{
  if (fs->staging_fd >= 0)
    return 0;
  return bs_staging_create(fs->staging, &fs->staging_fd, &fs->staging_lock);
}

static void stage_name(const struct bs_entry *e, char *name, size_t n)
{
  snprintf(name, n, "%llu", (unsigned long long)e->stage);
}

int fs_stage(struct fs *fs, struct bs_entry *e, uint64_t keep)
{
  pthread_mutex_lock(&fs->stage_lock);
  int rc = fs_staging_create(fs);
  unsigned long id = ++fs->next_stage;
  int dirfd = fs->staging_fd;
  pthread_mutex_unlock(&fs->stage_lock);
  if (rc)
    return rc;
  char name[32];
  snprintf(name, sizeof name, "%lu", id);
  bs_err cerr;
  bs_err_clear(&cerr);
  int fd = bs_safe_openat(dirfd, fs->staging, name, O_RDWR | O_CREAT | O_EXCL, 0600, BS_SAFE_REG,
                          NULL, &cerr);
  if (fd < 0)
    return -cerr.code;
  /* Copy the clean bytes we keep, in chunks (never the whole tensor). Only
   * this file's lock is held: other files stay readable meanwhile. */
  const struct bs_tensor *t = e->stage == 0 ? bs_entry_origin(&fs->edit, e) : NULL;
  if (t && keep > e->size)
    keep = e->size;
  if (t && keep) {
    enum { CHUNK = 1 << 20 };
    char *buf = bs_malloc(CHUNK);
    if (!buf) {
      close(fd);
      bs_safe_unlinkat(dirfd, name, 0);
      return -ENOMEM;
    }
    for (uint64_t off = 0; off < keep;) {
      size_t n = keep - off < CHUNK ? (size_t)(keep - off) : CHUNK;
      long r = bs_tensor_read(&fs->cat, t, off, buf, n);
      if (r <= 0 || pwrite(fd, buf, (size_t)r, (off_t)off) != r) {
        int err = r < 0 ? (int)-r : errno ? errno : EIO;
        bs_free(buf);
        close(fd);
        bs_safe_unlinkat(dirfd, name, 0);
        return -err;
      }
      off += (uint64_t)r;
    }
    bs_free(buf);
  }
  e->stage = id;
  e->size = t ? keep : 0;
  bs_edit_log_stage(&fs->edit, e);
  if (e->nopen > 0) {
    if (e->fd >= 0)
      close(e->fd);
    e->fd = fd;
  } else {
    close(fd);
  }
  return 0;
}

int fs_stage_open(struct fs *fs, const struct bs_entry *e, int flags)
{
  char name[32];
  stage_name(e, name, sizeof name);
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_safe_openat(fs->staging_fd, fs->staging, name, flags, 0, BS_SAFE_REG, NULL, &err);
  return fd < 0 ? -err.code : fd;
}

void fs_stage_free(struct fs *fs, struct bs_entry *e)
{
  if (e->fd >= 0) {
    close(e->fd);
    e->fd = -1;
  }
  if (e->stage) {
    char name[32];
    stage_name(e, name, sizeof name);
    if (bs_safe_unlinkat(fs->staging_fd, name, 0) != 0)
      fuse_log(FUSE_LOG_ERR, "burnstore: %s/%s: cannot remove: %s\n", fs->staging, name,
               strerror(errno));
  }
  bs_entry_drop(&fs->edit, e);
}

void fs_raise_nofile(void)
{
  if (bs_raise_nofile() != 0)
    fuse_log(FUSE_LOG_WARNING, "burnstore: cannot raise RLIMIT_NOFILE: %s\n", strerror(errno));
}

void fs_staging_remove(struct fs *fs)
{
  bs_staging_remove(fs->staging, fs->output, &fs->staging_fd, &fs->staging_lock);
}

/* The write-back of this mount, as the core sees it. */
static void fill_wb(struct fs *fs, struct bs_wb *wb)
{
  /* A filter on a checkpoint written back in place restricts the view; it
   * never deletes what it hides. An extraction writes what the mount shows. */
  *wb = (struct bs_wb){.target = fs->output,
                       .writer = fs->writer,
                       .opts = fs->wopts,
                       .source = fs->source,
                       .edit = &fs->edit,
                       .keep_hidden = fs->cat.nsrcs > 0 && !fs->force_write, /* a source */
                       .has_output_as = fs->has_output_as,
                       .output_as = fs->output_as,
                       .staging = fs->staging,
                       .staging_fd = &fs->staging_fd,
                       .staging_lock = &fs->staging_lock};
}

int fs_writeback(struct fs *fs, bs_err *err)
{
  bs_free(fs->report);
  fs->report = NULL;
  struct bs_wb wb;
  fill_wb(fs, &wb);
  int rc = bs_wb_run(&wb, &fs->report, err);
  char note[400];
  if (rc == 0 && fs_journal_note(fs, note, sizeof note)) {
    /* one more report line, after the writer's */
    size_t rl = fs->report ? strlen(fs->report) : 0;
    char *r = bs_malloc(rl + strlen(note) + 2);
    if (r) {
      snprintf(r, rl + strlen(note) + 2, "%s%s%s", rl ? fs->report : "",
               rl && fs->report[rl - 1] != '\n' ? "\n" : "", note);
      bs_free(fs->report);
      fs->report = r;
    }
  }
  return rc;
}

void fs_journal_start(struct fs *fs)
{
  if (!fs->writable || fs->nojournal)
    return;
  struct bs_wb wb;
  fill_wb(fs, &wb);
  bs_err err;
  bs_err_clear(&err);
  fs->journal = bs_wb_journal_start(&wb, &err);
  if (!fs->journal) {
    char line[600];
    fprintf(stderr,
            "burnstore: warning: no staging journal (%s): a kill while mounted would lose the "
            "names of what was written\n",
            bs_err_format(&err, NULL, line, sizeof line));
  }
  fs->edit.journal = fs->journal;
}

void fs_journal_stop(struct fs *fs)
{
  fs->edit.journal = NULL;
  int e = bs_journal_close(fs->journal);
  if (fs->journal)
    fs->journal_sync_err = e;
  fs->journal = NULL;
}

const char *fs_journal_note(const struct fs *fs, char *buf, size_t n)
{
  if (!fs->journal_sync_err)
    return NULL;
  snprintf(buf, n,
           "note: the staging journal stopped being durable while mounted (fdatasync: %s): a "
           "crash of the machine then could have lost changes; this write-back is unaffected",
           strerror(fs->journal_sync_err));
  return buf;
}
