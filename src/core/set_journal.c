/* The commit protocol of multi-file outputs; see set_journal.h. Every file
 * operation is relative to the directory's fd, on plain names only, so a
 * journal (which a user could edit) can never reach outside it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/safe_open.h"
#include "core/set_journal.h"
#include "core/strmap.h"
#include "core/target.h"

#define MAGIC "burnstore-set-journal 1\n"
#define TAG ".burnstore-journal"
#define TMP_TAG ".burnstore-tmp-"
#define WAIT_MS 5000 /* how long a reader waits for a committed live writer */

bool bs_set_is_member(const char *name, const char *suffix)
{
  size_t n = strlen(name);
  return bs_plain_name(name) && name[0] != '.' && n > strlen(suffix) &&
         bs_ends_with(name, n, suffix, true);
}

/* ---- The journal's text --------------------------------------------------------------------- */

void bs_set_plan_destroy(struct bs_set_plan *p)
{
  bs_free(p->copy);
  bs_free(p->newf);
  bs_free(p->oldf);
  bs_free(p->ren);
  memset(p, 0, sizeof *p);
}

static int jfail(bs_err *err, const char *where, size_t line, const char *what)
{
  return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "%s: line %zu: %s", where, line, what);
}

int bs_set_plan_parse(const char *where, const char *suffix, const void *bytes, size_t n,
                      struct bs_set_plan *p, bs_err *err)
{
  const char *text = bytes;
  memset(p, 0, sizeof *p);
  if (n > BS_SET_JOURNAL_MAX)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "%s: a journal of %zu bytes (limit %u)", where, n,
                   BS_SET_JOURNAL_MAX);
  if (!(p->copy = bs_malloc(n + 1)))
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  memcpy(p->copy, text, n);
  p->copy[n] = '\0';
  struct bs_strmap news = {0};
  int rc = -1;
  size_t line = 0;
  for (char *at = p->copy; at < p->copy + n;) {
    char *nl = memchr(at, '\n', (size_t)(p->copy + n - at));
    size_t start = (size_t)(at - p->copy);
    line++;
    if (!nl) /* a record cut by a kill: not there */
      break;
    *nl = '\0';
    char *f[3] = {at, NULL, NULL};
    size_t nf = 1;
    for (char *t = strchr(at, '\t'); t && nf < 3; t = strchr(t + 1, '\t')) {
      *t = '\0';
      f[nf++] = t + 1;
    }
    at = nl + 1;
    if (line == 1) {
      if (strncmp(f[0], MAGIC, sizeof MAGIC - 2) != 0 || nf != 1 ||
          strlen(f[0]) != sizeof MAGIC - 2)
        break; /* not even the first record: nothing was created */
      continue;
    }
    if (p->committed) {
      jfail(err, where, line, "a record after the commit");
      goto out;
    }
    bool ok = true;
    if (!p->prepared && strcmp(f[0], "index") == 0 && nf == 2) {
      ok = !p->index && bs_plain_name(f[1]);
      p->index = ok ? f[1] : NULL;
    } else if (!p->prepared && strcmp(f[0], "new") == 0 && nf == 2) {
      ok = bs_plain_name(f[1]) &&
           bs_set_is_member(f[1], suffix) != (p->index && !strcmp(f[1], p->index));
      if (ok && (bs_grow((void **)&p->newf, &p->cnew, p->nnew + 1, sizeof *p->newf) != 0 ||
                 bs_strmap_put(&news, f[1], p->nnew) < 0)) {
        bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
        goto out;
      }
      if (ok)
        p->newf[p->nnew++] = f[1];
    } else if (!p->prepared && strcmp(f[0], "old") == 0 && nf == 2) {
      ok = bs_set_is_member(f[1], suffix);
      if (ok && bs_grow((void **)&p->oldf, &p->cold, p->nold + 1, sizeof *p->oldf) != 0) {
        bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
        goto out;
      }
      if (ok)
        p->oldf[p->nold++] = f[1];
    } else if (!p->prepared && strcmp(f[0], "prepared") == 0 && nf == 1) {
      size_t k;
      ok = p->index && bs_strmap_get(&news, p->index, &k);
      p->prepared = ok;
    } else if (p->prepared && strcmp(f[0], "rename") == 0 && nf == 3) {
      size_t k;
      /* the temp file of that final: ".FINAL" TMP_TAG "XXXXXX", as the sink names it */
      size_t fl = strlen(f[2]);
      ok = bs_plain_name(f[1]) && f[1][0] == '.' && strncmp(f[1] + 1, f[2], fl) == 0 &&
           strncmp(f[1] + 1 + fl, TMP_TAG, strlen(TMP_TAG)) == 0 && bs_strmap_get(&news, f[2], &k);
      if (ok && bs_grow((void **)&p->ren, &p->cren, p->nren + 1, sizeof *p->ren) != 0) {
        bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
        goto out;
      }
      if (ok)
        p->ren[p->nren++] = (struct bs_set_rename){f[1], f[2]};
    } else if (p->prepared && strcmp(f[0], "commit") == 0 && nf == 2) {
      char want[17];
      snprintf(want, sizeof want, "%016" PRIx64, bs_fnv1a(BS_FNV1A_INIT, text, start));
      /* A commit record that does not match was cut by a crash before its
       * fsync returned: nothing was renamed yet. */
      p->committed = strcmp(f[1], want) == 0;
      if (!p->committed)
        break;
    } else {
      ok = false;
    }
    if (!ok) {
      if (!p->prepared)
        break; /* cut or bad before "prepared": nothing was created */
      jfail(err, where, line, "a record burnstore does not write; fix or remove the journal");
      goto out;
    }
  }
  rc = 0;
out:
  bs_strmap_destroy(&news);
  if (rc != 0)
    bs_set_plan_destroy(p);
  return rc;
}

/* ---- Applying it ---------------------------------------------------------------------------- */

static int sync_dir(const struct bs_set *s, bs_err *err)
{
  if (fsync(s->dirfd) != 0 && errno != EINVAL) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s: fsync of the directory failed: %s", s->dir,
                   strerror(e));
  }
  return 0;
}

static bool exists(const struct bs_set *s, const char *name, struct stat *st)
{
  return fstatat(s->dirfd, name, st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Whether a file of the set was made by this user or root (`journal`: and
 * no one else may write it): another user who may write the directory can
 * plant or edit a journal or a temp file, and applying it renames and
 * removes files of the set. */
static bool made_by_us(const struct stat *st, bool journal)
{
  return S_ISREG(st->st_mode) && (st->st_uid == geteuid() || st->st_uid == 0) &&
         (!journal || !(st->st_mode & (S_IWGRP | S_IWOTH)));
}

/* An open refused because the name is no regular file (a FIFO, a device, a
 * directory, a symbolic link): it cannot be a journal burnstore wrote. */
static bool not_a_journal(const bs_err *e)
{
  return e->code == EINVAL || e->code == EISDIR || e->code == ELOOP || e->code == ENXIO;
}

/* The journal goes last: a kill before this re-applies the same steps. */
static int drop_journal(struct bs_set *s, bs_err *err)
{
  if (bs_safe_unlinkat(s->dirfd, s->jname, 0) != 0 && errno != ENOENT) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s/%s: cannot remove the journal: %s", s->dir,
                   s->jname, strerror(e));
  }
  return sync_dir(s, err);
}

/* `recovering`: the journal is not the text this process just committed,
 * so its temp files must be made_by_us (a writer's own were created and
 * held by it: on a file system that shows other owners, vfat or NFS with
 * root_squash, its commit goes on). */
static int roll_forward(struct bs_set *s, const struct bs_set_plan *p, bool recovering, bs_err *err)
{
  bool synced = false;
  for (size_t i = 0; i < p->nren; i++) {
    const struct bs_set_rename *r = &p->ren[i];
    bool is_index = strcmp(r->final, p->index) == 0;
    if (is_index && !synced) { /* every shard in place before the index names them */
      if (sync_dir(s, err) != 0)
        return -1;
      synced = true;
    }
    struct stat st;
    if (exists(s, r->tmp, &st) && S_ISREG(st.st_mode)) {
      if (recovering && !made_by_us(&st, false))
        return bs_fail(err, EPERM, BS_OFF_NONE, NULL,
                       "%s/%s: the journal renames %s over it, a file of uid %u (not this user nor "
                       "root): refused, the journal is kept",
                       s->dir, r->final, r->tmp, (unsigned)st.st_uid);
      if (bs_safe_renameat(s->dirfd, r->tmp, r->final) != 0) {
        int e = errno;
        return bs_fail(err, e, BS_OFF_NONE, NULL, "%s/%s: cannot rename %s over it: %s", s->dir,
                       r->final, r->tmp, strerror(e));
      }
    } else if (!exists(s, r->final, &st)) {
      return bs_fail(err, ENOENT, BS_OFF_NONE, NULL,
                     "%s/%s: the journal commits %s, but neither it nor its temporary file %s "
                     "exists; the journal is kept",
                     s->dir, s->jname, r->final, r->tmp);
    }
  }
  if (sync_dir(s, err) != 0)
    return -1;
  struct bs_strmap news = {0};
  for (size_t i = 0; i < p->nnew; i++)
    if (bs_strmap_put(&news, p->newf[i], i) < 0) {
      bs_strmap_destroy(&news);
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    }
  int rc = 0;
  bool removed = false;
  for (size_t i = 0; i < p->nold && rc == 0; i++) {
    size_t k;
    struct stat st;
    /* Only files of this user's or root's (the writer checked the old set's
     * before it began; one planted since, at a name that was free, stays). */
    if (bs_strmap_get(&news, p->oldf[i], &k) || !exists(s, p->oldf[i], &st) ||
        !made_by_us(&st, false))
      continue; /* kept by the new set, already gone, or not ours to remove */
    if (bs_safe_unlink_same(s->dirfd, p->oldf[i], &st, 0) != 0 && errno != ENOENT) {
      int e = errno;
      rc = bs_fail(err, e, BS_OFF_NONE, NULL, "%s/%s: cannot remove this shard of the old set: %s",
                   s->dir, p->oldf[i], strerror(e));
    }
    removed = true;
  }
  bs_strmap_destroy(&news);
  /* The old files are gone for good before the journal that names them. */
  if (rc != 0 || (removed && sync_dir(s, err) != 0))
    return -1;
  return drop_journal(s, err);
}

/* Nothing was renamed: the dead temp files of the new names go (a live
 * writer's are locked, so never removed), then the journal. */
static int roll_back(struct bs_set *s, const struct bs_set_plan *p, bs_err *err)
{
  for (size_t i = 0; i < p->nnew; i++) {
    char *path = bs_path_join(s->dir, p->newf[i]);
    if (!path)
      return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    bs_atomic_clean_stale(path);
    bs_free(path);
  }
  return drop_journal(s, err);
}

/* Parse the journal's text (messages name it). */
static int plan(const struct bs_set *s, const void *text, size_t n, struct bs_set_plan *p,
                bs_err *err)
{
  char *where = bs_path_join(s->dir, s->jname);
  if (!where)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  int rc = bs_set_plan_parse(where, s->suffix, text, n, p, err);
  if (rc == 0 && p->index && strcmp(p->index, s->index) != 0) {
    /* two long index names may share a (cut) journal name: not this set's */
    rc = bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                 "%s: the journal is of index %.100s, not of %.100s; fix or remove it", where,
                 p->index, s->index);
    bs_set_plan_destroy(p);
  }
  bs_free(where);
  return rc;
}

static int apply(struct bs_set *s, const char *text, size_t n, bool recovering, bs_err *err)
{
  struct bs_set_plan p;
  if (plan(s, text, n, &p, err) != 0)
    return -1;
  int rc = p.committed ? roll_forward(s, &p, recovering, err) : roll_back(s, &p, err);
  bs_set_plan_destroy(&p);
  return rc;
}

/* ---- Opening -------------------------------------------------------------------------------- */

static void set_close(struct bs_set *s)
{
  if (s->fd >= 0)
    close(s->fd);
  if (s->dirfd >= 0)
    close(s->dirfd);
  bs_free(s->dir);
  bs_free(s->jname);
  bs_free(s->index);
  bs_buf_destroy(&s->jb);
  memset(s, 0, sizeof *s);
  s->fd = s->dirfd = -1;
}

/* dir, jname and dirfd of the set whose index is index_path. */
static int set_open_dir(struct bs_set *s, const char *index_path, const char *suffix, bs_err *err)
{
  memset(s, 0, sizeof *s);
  s->fd = s->dirfd = -1;
  s->suffix = suffix;
  const char *slash = strrchr(index_path, '/');
  const char *base = slash ? slash + 1 : index_path;
  size_t room = NAME_MAX - 1 - (sizeof TAG - 1), blen = strlen(base);
  s->dir = slash ? bs_strndup(index_path, slash == index_path ? 1 : (size_t)(slash - index_path))
                 : bs_strdup(".");
  s->jname = bs_malloc(1 + (blen < room ? blen : room) + sizeof TAG);
  s->index = bs_strdup(base);
  if (!s->dir || !s->jname || !s->index) {
    set_close(s);
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  }
  snprintf(s->jname, 1 + (blen < room ? blen : room) + sizeof TAG, ".%.*s%s",
           (int)(blen < room ? blen : room), base, TAG);
  if ((s->dirfd = bs_safe_open_dir(s->dir, BS_SAFE_ANY_OWNER, err)) < 0) {
    set_close(s);
    return -1;
  }
  return 0;
}

/* The journal's whole text (at most BS_SET_JOURNAL_MAX bytes). */
static int read_all(struct bs_set *s, struct bs_buf *b, bs_err *err)
{
  struct stat st;
  if (fstat(s->fd, &st) != 0 || (uint64_t)st.st_size > BS_SET_JOURNAL_MAX)
    return bs_fail(err, EFBIG, BS_OFF_NONE, NULL, "%s/%s: a journal of %lld bytes (limit %u)",
                   s->dir, s->jname, (long long)st.st_size, BS_SET_JOURNAL_MAX);
  b->len = 0;
  if (bs_grow((void **)&b->data, &b->cap, (size_t)st.st_size + 1, 1) != 0)
    return bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  ssize_t r = pread(s->fd, b->data, (size_t)st.st_size, 0);
  if (r < 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s/%s: %s", s->dir, s->jname, strerror(e));
  }
  b->len = (size_t)r;
  return 0;
}

static bool committed_text(const struct bs_set *s, const struct bs_buf *b)
{
  struct bs_set_plan p;
  bs_err sub;
  bs_err_clear(&sub);
  bool c = plan(s, b->data, b->len, &p, &sub) == 0 && p.committed;
  bs_set_plan_destroy(&p);
  return c;
}

/* A reader who may not write the journal (another user's set, a read-only
 * file system), or who must not apply it (not made_by_us): a journal
 * without its commit record leaves the old set whole, which it may read; a
 * committed one it cannot roll forward. `why` (a printf argument) says why. */
static int read_only_reader(struct bs_set *s, const char *why, bs_err *err)
{
  int e = errno;
  bs_err sub;
  bs_err_clear(&sub);
  s->fd = bs_safe_openat(s->dirfd, s->dir, s->jname, O_RDONLY, 0, BS_SAFE_REG | BS_SAFE_ANY_OWNER,
                         NULL, &sub);
  if (s->fd < 0)
    return sub.code == ENOENT || not_a_journal(&sub)
               ? 0
               : bs_fail(err, sub.code, BS_OFF_NONE, NULL, "cannot open the journal: %s", sub.msg);
  int rc = read_all(s, &s->jb, err);
  if (rc == 0 && committed_text(s, &s->jb))
    rc = bs_fail(err, why ? EPERM : e, BS_OFF_NONE, NULL,
                 "%s/%s: the write it records passed its commit point and must be completed by "
                 "someone who may write %s (burnstore ls or convert of the set as that user): %s",
                 s->dir, s->jname, s->dir, why ? why : strerror(e));
  close(s->fd);
  s->fd = -1;
  return rc;
}

/* Recover the journal of an opened set, if there is one. `writer`: a live
 * holder is another writer (EBUSY); else a live holder that has not
 * committed leaves the old set whole (nothing to do), one that has is
 * waited for. */
static int recover_open(struct bs_set *s, bool writer, bool *did, bs_err *err)
{
  for (int tries = 0; tries < 100; tries++) {
    bs_err sub;
    bs_err_clear(&sub);
    struct stat st;
    s->fd = bs_safe_openat(s->dirfd, s->dir, s->jname, O_RDWR, 0, BS_SAFE_REG | BS_SAFE_ANY_OWNER,
                           &st, &sub);
    if (s->fd < 0 && !writer && (sub.code == EACCES || sub.code == EROFS)) {
      errno = sub.code;
      return read_only_reader(s, NULL, err);
    }
    if (s->fd < 0) {
      if (sub.code == ENOENT || (!writer && not_a_journal(&sub)))
        return 0; /* (a FIFO or a link there records no write: the set is read as it is) */
      return bs_fail(err, sub.code, BS_OFF_NONE, NULL, "cannot open the journal: %s%s", sub.msg,
                     writer ? " (remove it to write this set)" : "");
    }
    if (!made_by_us(&st, true)) {
      close(s->fd);
      s->fd = -1;
      if (writer)
        return bs_fail(err, EPERM, BS_OFF_NONE, NULL,
                       "%s/%s: the journal is not this user's or root's, or others may write it: "
                       "it is not applied (its owner may complete it, or remove it)",
                       s->dir, s->jname);
      return read_only_reader(s, "the journal is not this user's or root's, or others may write it",
                              err);
    }
    bool locked = flock(s->fd, LOCK_EX | LOCK_NB) == 0;
    if (!locked && !writer && read_all(s, &s->jb, err) == 0 && !committed_text(s, &s->jb))
      return 0; /* a live writer still writing its temp files: the old set is whole */
    for (int ms = 0; !locked && !writer && ms < WAIT_MS; ms += 10) {
      nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
      locked = flock(s->fd, LOCK_EX | LOCK_NB) == 0;
    }
    if (!locked)
      return bs_fail(err, EBUSY, BS_OFF_NONE, NULL,
                     "%s/%s: another burnstore is writing this shard set right now", s->dir,
                     s->jname);
    if (!bs_fd_named(s->dirfd, s->jname, s->fd)) { /* a recoverer removed it meanwhile */
      close(s->fd);
      s->fd = -1;
      continue;
    }
    if (read_all(s, &s->jb, err) != 0 ||
        apply(s, (const char *)s->jb.data, s->jb.len, true, err) != 0)
      return -1;
    if (did)
      *did = true;
    close(s->fd);
    s->fd = -1;
    return 0;
  }
  return bs_fail(err, EBUSY, BS_OFF_NONE, NULL, "%s/%s: the journal keeps changing", s->dir,
                 s->jname);
}

int bs_set_recover(const char *index_path, const char *suffix, bool *did, bs_err *err)
{
  if (did)
    *did = false;
  struct bs_set s;
  bs_err sub;
  bs_err_clear(&sub);
  if (set_open_dir(&s, index_path, suffix, &sub) !=
      0) /* no directory we can open: no journal we could see */
    return sub.code == ENOMEM ? bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory") : 0;
  bs_err_clear(&sub);
  int rc = recover_open(&s, false, did, &sub);
  set_close(&s);
  if (rc != 0 && sub.code == EBUSY)
    return bs_fail(err, EBUSY, BS_OFF_NONE, NULL, "%s", sub.msg);
  if (rc != 0)
    return bs_fail(err, sub.code, BS_OFF_NONE, NULL,
                   "a write of this shard set was interrupted and cannot be completed now: %s",
                   sub.msg);
  return 0;
}

static int put_rec(struct bs_buf *b, const char *tag, const char *a, const char *c)
{
  int bad = bs_buf_put(b, tag, strlen(tag));
  if (a)
    bad |= bs_buf_put(b, "\t", 1) | bs_buf_put(b, a, strlen(a));
  if (c)
    bad |= bs_buf_put(b, "\t", 1) | bs_buf_put(b, c, strlen(c));
  return bad | bs_buf_put(b, "\n", 1);
}

/* Append the bytes of s->jb from `from` on to the journal, and fsync it. */
static int write_journal(struct bs_set *s, size_t from, bs_err *err)
{
  for (size_t off = from; off < s->jb.len;) {
    ssize_t r = pwrite(s->fd, s->jb.data + off, s->jb.len - off, (off_t)off);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      int e = r < 0 ? errno : EIO;
      return bs_fail(err, e, BS_OFF_NONE, NULL, "%s/%s: cannot write the journal: %s", s->dir,
                     s->jname, strerror(e));
    }
    off += (size_t)r;
  }
  if (fsync(s->fd) != 0) {
    int e = errno;
    return bs_fail(err, e, BS_OFF_NONE, NULL, "%s/%s: fsync of the journal failed: %s", s->dir,
                   s->jname, strerror(e));
  }
  return 0;
}

int bs_set_begin(struct bs_set *s, const char *index_path, const char *suffix, bs_err *err)
{
  /* The journal holds the set's names one a line, tab-separated: a name
   * with a control character could not be read back, and the commit would
   * be taken for one cut before it began (nothing written, exit 0). */
  const char *base = strrchr(index_path, '/') ? strrchr(index_path, '/') + 1 : index_path;
  if (!bs_plain_name(base)) {
    char shown[NAME_MAX + 1];
    snprintf(shown, sizeof shown, "%s", base);
    memset(s, 0, sizeof *s);
    s->fd = s->dirfd = -1;
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL,
                   "%s: a shard set's name cannot hold a control character (its journal lists "
                   "the set's files one a line); name it without one",
                   bs_text_clean(shown));
  }
  if (set_open_dir(s, index_path, suffix, err) != 0)
    return -1;
  for (int tries = 0; s->fd < 0; tries++) {
    if (tries == 100 || recover_open(s, true, NULL, err) != 0)
      goto fail;
    /* Readable by those who may list the directory (it holds only the
     * set's file names): a reader who may not write it can still tell that
     * an uncommitted write left the old set whole (read_only_reader). */
    bs_err sub;
    bs_err_clear(&sub);
    s->fd = bs_safe_openat(s->dirfd, s->dir, s->jname, O_RDWR | O_CREAT | O_EXCL, 0644, BS_SAFE_REG,
                           NULL, &sub);
    if (s->fd < 0 && sub.code != EEXIST) {
      bs_fail(err, sub.code, BS_OFF_NONE, NULL, "cannot create the journal: %s", sub.msg);
      goto fail;
    }
    if (s->fd >= 0 &&
        (flock(s->fd, LOCK_EX | LOCK_NB) != 0 || !bs_fd_named(s->dirfd, s->jname, s->fd))) {
      close(s->fd); /* a recoverer took it between our create and our lock */
      s->fd = -1;
    }
  }
  return 0;
fail:
  set_close(s);
  return -1;
}

int bs_set_prepare(struct bs_set *s, const char *const *newf, size_t nnew, const char *const *oldf,
                   size_t nold, bs_err *err)
{
  s->jb.len = 0; /* it held the journal recovered by bs_set_begin, if any */
  int bad = bs_buf_put(&s->jb, MAGIC, sizeof MAGIC - 1) | put_rec(&s->jb, "index", s->index, NULL);
  for (size_t i = 0; i < nnew; i++)
    bad |= put_rec(&s->jb, "new", newf[i], NULL);
  for (size_t i = 0; i < nold; i++)
    bad |= put_rec(&s->jb, "old", oldf[i], NULL);
  bad |= put_rec(&s->jb, "prepared", NULL, NULL);
  if (bad)
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
  if (bad || write_journal(s, 0, err) != 0 || sync_dir(s, err) != 0) {
    bs_set_abort(s);
    return -1;
  }
  return 0;
}

static const char *base_of(const char *path)
{
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

int bs_set_commit(struct bs_set *s, struct bs_atomic *files, size_t n, bs_err *err)
{
  int rc = -1;
  size_t from = s->jb.len;
  int bad = 0;
  for (size_t i = 0; i < n; i++)
    bad |= put_rec(&s->jb, "rename", base_of(files[i].tmp), base_of(files[i].path));
  char hex[17];
  snprintf(hex, sizeof hex, "%016" PRIx64, bs_fnv1a(BS_FNV1A_INIT, s->jb.data, s->jb.len));
  bad |= put_rec(&s->jb, "commit", hex, NULL);
  if (bad) {
    bs_fail(err, ENOMEM, BS_OFF_NONE, NULL, "out of memory");
    goto out;
  }
  if (write_journal(s, from, err) != 0) {
    /* Roll back only when the commit record is surely not on disk; else the
     * temp files stay for the next recovery to decide. */
    bool undone = ftruncate(s->fd, (off_t)from) == 0 && fsync(s->fd) == 0;
    for (size_t i = 0; i < n; i++) {
      if (undone)
        bs_atomic_abort(&files[i]);
      else
        bs_atomic_release(&files[i]);
    }
    if (undone)
      bs_set_abort(s);
    goto out;
  }
  /* Committed: the temp files are the journal's now. The same code as a
   * recovery applies it, from the text just written. */
  for (size_t i = 0; i < n; i++)
    bs_atomic_release(&files[i]);
  if (apply(s, (const char *)s->jb.data, s->jb.len, false, err) == 0)
    rc = 0;
out:
  set_close(s);
  return rc;
}

void bs_set_abort(struct bs_set *s)
{
  if (!s->dir)
    return; /* zeroed, committed or aborted */
  if (s->fd >= 0)
    bs_safe_unlinkat(s->dirfd, s->jname, 0);
  set_close(s);
}
