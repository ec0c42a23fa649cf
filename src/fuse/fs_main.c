/* burnstore's mount (bs_mount_main): the command line (fs_args.c), SOURCE
 * opened and checked (fs_prepare.c), the status file and the target lock
 * claimed before mounting (claim), the FUSE session (serve), the write-back
 * after the session ends (write_back), the daemon's runtime files removed as
 * it exits. `burnstore -u` is fs_unmount.c, `burnstore status` fs_status.c.
 *
 * The waiting unmount: the daemon holds an exclusive flock on a status file
 * (in /run/burnstore, keyed by the mountpoint) from before it mounts until
 * it exits, and writes "ok" or the error into it at the end. `burnstore -u`
 * unmounts, then blocks on that lock, so it returns only after the write-back
 * has finished, with its result. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/http_client.h"
#include "core/target.h"
#include "fs_log.h"
#include "fs_mount.h"
#include "fs_mounts.h"
#include "fs_views.h"
#include "main/mount.h"
#include "policy/stage_index.h"
#include "policy/writeback.h"

static void fs_destroy(struct fs *fs)
{
  fs_npy_destroy(fs);
  fs_view_destroy(fs);
  fs_journal_stop(fs);
  fs_xattr_destroy(fs);
  bs_edit_destroy(&fs->edit);
  bs_tree_destroy(&fs->tree);
  bs_catalog_destroy(&fs->cat);
  bs_free(fs->fixed);
  if (fs->staging_fd >= 0)
    close(fs->staging_fd);
  if (fs->staging_lock >= 0)
    close(fs->staging_lock);
  bs_free(fs->report);
  bs_keyopts_destroy(&fs->keys);
  bs_free(fs->source);
  bs_free(fs->output);
  bs_free(fs->staging);
  pthread_rwlock_destroy(&fs->lock);
  pthread_mutex_destroy(&fs->stage_lock);
}

/* A URL mount's requests end with its session: the kernel mount can be
 * gone (burnstore -u, fusermount3 -u) while a worker still waits for a
 * stalled server, and libfuse waits for its workers before the loop
 * returns. A thread polls the session's fd (an error once the kernel let go
 * of the mount) and its exit flag, and cancels the requests of every read
 * begun by then (not the write-back's, which come after). */

struct watch {
  struct fuse_session *se;
  int wake[2]; /* a pipe: watch_end's byte ends it */
  pthread_t thread;
};

static void *watch_session(void *arg)
{
  struct watch *w = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = fuse_session_fd(w->se)}, {.fd = w->wake[0], .events = POLLIN}};
    int k = poll(p, 2, 200);
    if (k > 0 && p[1].revents)
      return NULL;
    if ((k > 0 && (p[0].revents & (POLLERR | POLLHUP | POLLNVAL))) || fuse_session_exited(w->se))
      break;
  }
  bs_http_cancel_all();
  return NULL;
}

static int watch_begin(struct watch *w)
{
  if (pipe2(w->wake, O_CLOEXEC) != 0)
    return -1;
  if (pthread_create(&w->thread, NULL, watch_session, w) != 0) {
    close(w->wake[0]);
    close(w->wake[1]);
    return -1;
  }
  return 0;
}

static void watch_end(struct watch *w)
{
  if (write(w->wake[1], "x", 1) < 0) {
    /* (a pipe of our own: cannot be full) */
  }
  pthread_join(w->thread, NULL);
  close(w->wake[0]);
  close(w->wake[1]);
}

/* One mount's session-level state, from the claim to the exit. */
struct run {
  struct fs fs;
  struct args a;
  char *mnt;                             /* absolute mountpoint, owned */
  char spath[PATH_MAX], lpath[PATH_MAX]; /* status file, log */
  int sfd, tfd;                          /* status file, target lock */
  bool daemonized;
};

/* Before mounting: the mountpoint, the status file's lock, the target lock
 * and the staging directory (exclusive, locked), so that a failure is
 * reported here and not after the daemon has detached. 0, or 1 (printed). */
static int claim(struct run *r)
{
  struct fs *fs = &r->fs;
  char *mnt = r->mnt = fs_mountpoint_path(r->a.mountpoint);
  struct stat mst;
  if (!mnt || stat(mnt, &mst) != 0 || !S_ISDIR(mst.st_mode)) {
    fprintf(stderr, PROG ": mountpoint %s: %s\n", r->a.mountpoint,
            strerror(mnt && stat(mnt, &mst) == 0 ? ENOTDIR : errno));
    return 1;
  }
  /* Staging inside the mount would have the daemon call into its own mount
   * while serving it: a deadlock no signal ends. */
  size_t mlen = strlen(mnt);
  if (fs->staging && strncmp(fs->staging, mnt, mlen) == 0 &&
      (fs->staging[mlen] == '/' || strcmp(mnt, "/") == 0)) {
    fprintf(stderr,
            PROG ": the staging directory %s would be inside the mountpoint %s: put the output "
                 "elsewhere or use -o staging=DIR outside it\n",
            fs->staging, mnt);
    return 1;
  }
  /* The status file, locked before mounting (see the top of this file);
   * the runtime files of daemons that are gone are removed first. */
  bs_run_sweep();
  if (fs_mount_files(mnt, r->spath, r->lpath) != 0)
    return 1;
  /* A daemon that was just unmounted may still be on its way out. */
  for (int i = 0; (r->sfd = bs_run_lock(r->spath)) < 0 && errno == EWOULDBLOCK; i++) {
    if (i >= 1500 || fs_is_mounted(mnt)) {
      fprintf(stderr, PROG ": %s is already served by another burnstore daemon\n", mnt);
      return 1;
    }
    usleep(20000);
  }
  if (r->sfd < 0) {
    /* Without its status file no one could wait for the write-back. */
    fprintf(stderr, PROG ": %s: cannot lock its status file %s: %s\n", mnt, r->spath,
            strerror(errno));
    return 1;
  }
  if (!fs->writable)
    return 0;
  /* One writer per target (target.h). */
  bs_err err;
  bs_err_clear(&err);
  r->tfd = bs_writer_lock(fs->output, mnt, &err);
  if (r->tfd < 0)
    fs_fail_line(NULL, &err);
  else
    bs_staging_sweep(fs->staging, stderr); /* dead daemons' empty staging directories */
  int sc = r->tfd < 0 ? -1 : fs_staging_create(fs);
  if (sc != 0) {
    if (sc < 0 && r->tfd >= 0)
      fprintf(stderr, PROG ": cannot create a staging directory from %s: %s\n", fs->staging,
              strerror(-sc));
    return 1;
  }
  return 0;
}

/* Mount, detach (without -f) and serve until unmounted. 0 once served, 1 if
 * the loop failed, -1 if nothing was mounted (printed). */
static int serve(struct run *r, char *argv0)
{
  struct fs *fs = &r->fs;
  /* libfuse splits -o at commas; one in the source path is escaped "\,". */
  char esc[2 * PATH_MAX], *o = esc;
  for (const char *p = fs->source; *p && o < esc + sizeof esc - 2; p++) {
    if (*p == ',' || *p == '\\')
      *o++ = '\\';
    *o++ = *p;
  }
  *o = '\0';
  char fsname[2 * PATH_MAX + 2048 + 96];
  /* direct_io: requests just under 1 MiB, so that a reply still fits
   * libfuse's 1 MiB splice pipe (header included). */
  const char *mr = strstr(r->a.fuse_extra, "max_read=");
  bool dio_max = fs->direct_io && !mr;
  /* op_init repeats it: libfuse refuses an init that disagrees. */
  fs->max_read = dio_max ? 1044480u : mr ? (unsigned)strtoul(mr + 9, NULL, 10) : 0;
  /* The kernel checks the modes it is shown, on every mount (the ops check
   * nothing themselves): what `ls -l` says is what holds, also for other
   * users under allow_other. */
  snprintf(fsname, sizeof fsname, "fsname=%s,subtype=burnstore,default_permissions%s%s%s%s", esc,
           fs->writable ? "" : ",ro", dio_max ? ",max_read=1044480" : "",
           r->a.fuse_extra[0] ? "," : "", r->a.fuse_extra);
  char *fargv[8];
  int fargc = 0;
  fargv[fargc++] = argv0;
  fargv[fargc++] = "-o";
  fargv[fargc++] = fsname;
  if (r->a.debug)
    fargv[fargc++] = "-d";
  fargv[fargc] = NULL;
  struct fuse_args fargs = FUSE_ARGS_INIT(fargc, fargv);
  int ret = -1;
  struct fuse_session *se = fuse_session_new(&fargs, &fs_ops, sizeof fs_ops, fs);
  if (!se) {
    fprintf(stderr, PROG ": cannot create the FUSE session\n");
    goto out;
  }
  if (fuse_set_signal_handlers(se) != 0)
    goto out_session;
  /* r->mnt is the mountpoint's real path (a symlink's target): the mount
   * table's name of it, for -u, status and readahead= alike. */
  if (fuse_session_mount(se, r->mnt) != 0) {
    char why[PATH_MAX + 256];
    if (fs_mount_diagnose(fsname, why, sizeof why))
      fprintf(stderr, PROG ": cannot mount on %s: %s\n", r->mnt, why);
    else
      fprintf(stderr,
              PROG ": cannot mount on %s (is /dev/fuse available, and the directory free?)\n",
              r->mnt);
    goto out_signals;
  }
  fs->custom_io = fs->writable && fs_io_begin(se, fs) == 0;
  if (fs->readahead_kb && !fs_bdi_of(r->mnt, fs->bdi, sizeof fs->bdi) && fs->readahead_given)
    fprintf(stderr, PROG ": readahead=: %s is not in /proc/self/mountinfo: not applied\n", r->mnt);
  r->daemonized = !r->a.foreground;
  if (r->daemonized) {
    /* (a URL's client thread does not survive the fork: stopped here, the
     * daemon starts its own at its first request) */
    bs_http_client_stop();
    if (fuse_daemonize(0) != 0) {
      fuse_session_unmount(se);
      goto out_signals;
    }
    fs_log_detach();
    /* The real daemon PID, everywhere (status file, target lock). */
    fs_status_running(r->sfd, fs, r->mnt);
    if (fs->writable)
      bs_target_lock_update(r->tfd, fs->output, r->mnt, false);
  }
  bool stopper = fs->writable && fs_stop_begin(se, r->mnt) == 0;
  bool url = bs_src_is_url(r->a.source);
  struct watch w = {.se = se, .wake = {-1, -1}};
  bool watched = url && watch_begin(&w) == 0;
  if (r->a.single) {
    ret = fuse_session_loop(se);
  } else {
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    fuse_loop_cfg_set_idle_threads(cfg, 10);
    /* A URL's reads may wait for a server up to http_timeout: workers
     * enough that readers stuck on one tensor leave others to stat, list
     * and read the rest (libfuse's default is 10). */
    if (url)
      fuse_loop_cfg_set_max_threads(cfg, URL_WORKERS);
    ret = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
  }
  if (watched)
    watch_end(&w);
  if (stopper)
    fs_stop_end();
  fuse_session_unmount(se);
  ret = ret < 0 ? 1 : 0;
out_signals:
  fuse_remove_signal_handlers(se);
out_session:
  fuse_session_destroy(se);
out:
  fuse_opt_free_args(&fargs);
  return ret;
}

/* After the kernel has let go of the mount: the write-back (a reshard is a
 * write, even with nothing changed), its result into the status file and
 * syslog. 0, or 1. */
static int write_back(struct run *r)
{
  struct fs *fs = &r->fs;
  /* No op runs any more: what the journal holds the INDEX supersedes (it
   * stays until the write-back succeeds, for a kill before the INDEX). */
  fs_journal_stop(fs);
  if (fs->writable) /* the next writer's refusal: writing back, no longer mounted */
    bs_target_lock_update(r->tfd, fs->output, r->mnt, true);
  if (!fs->writable ||
      !(fs->dirty || fs->force_write || fs->wopts.max_shard_size || fs->has_output_as)) {
    if (fs->writable)
      fs_staging_remove(fs);
    fs_status_ok(r->sfd, fs, r->mnt, r->daemonized, false);
    return 0;
  }
  bs_err err;
  bs_err_clear(&err);
  fs_progress_begin(fs, r->spath);
  bs_log_hold(true); /* (a source's failure: in the write-back's line, with its tensor) */
  int wrc = fs_writeback(fs, &err);
  bs_log_hold(false); /* (a reason no message took: into the log now) */
  fs_progress_end();
  if (wrc != 0) {
    char line[900], msg[PATH_MAX * 2 + 1200], text[3 * PATH_MAX + 1400];
    bs_err_format(&err, NULL, line, sizeof line);
    char note[400];
    const char *jn = fs_journal_note(fs, note, sizeof note);
    snprintf(msg, sizeof msg,
             "write-back of %s (mount %s) failed, %s was not written: %s%s%s%s%s%s", fs->output,
             r->mnt, fs->output, line, fs->staging_fd >= 0 ? "; the written data is kept in " : "",
             fs->staging_fd >= 0 ? fs->staging : "",
             fs->staging_fd >= 0 ? " (burnstore --list-staging / --finish DIR)" : "",
             jn ? "; " : "", jn ? jn : "");
    fs_report(r->daemonized, LOG_ERR, msg);
    /* Kept with the staged data, for when nobody waits and there is no
     * syslog: the session's log, then this. */
    if (fs->staging_fd >= 0)
      (void)fs_log_save(fs->staging_fd, BS_STAGE_LOG_NAME, msg);
    snprintf(text, sizeof text, "error\n%s\npid %ld\n", msg, (long)getpid());
    fs_status_write(r->sfd, text);
    return 1;
  }
  fs_staging_remove(fs);
  fs_status_ok(r->sfd, fs, r->mnt, r->daemonized, true);
  return 0;
}

/* A daemon's runtime files, removed as it exits: the log, the progress
 * file, the target lock, and last the status file, whose lock it lets go
 * last (a `burnstore -u` waiting has the status and log files open, and
 * returns when that lock is let go). The fds are closed. */
static void run_files_remove(struct run *r)
{
  /* Only the holder of the status lock owns the log and progress files: a
   * mount refused because another daemon serves the mountpoint must not
   * remove that daemon's log. */
  if (r->sfd >= 0) {
    if (r->lpath[0])
      unlink(r->lpath);
    fs_progress_remove(r->spath);
  }
  if (r->tfd >= 0)
    bs_target_unlock(r->tfd);
  if (r->sfd >= 0) {
    bs_run_unlink(r->spath, r->sfd);
    close(r->sfd);
  }
  r->sfd = r->tfd = -1;
}

int bs_mount_main(int argc, char **argv, const char *cli_usage)
{
  if (argc >= 2 && strcmp(argv[1], "status") == 0)
    return fs_status_main(argc, argv);
  struct run r;
  memset(&r, 0, sizeof r);
  r.fs.staging_fd = r.fs.staging_lock = r.sfd = r.tfd = -1;
  fs_args_parse(&r.a, argc, argv, cli_usage);
  if (r.a.unmount) {
    fs_args_destroy(&r.a);
    return fs_unmount_main(r.a.mountpoint, r.a.verbose, r.a.progress);
  }
  /* A source's read failure while the checkpoint is opened is told in the
   * refusal's own line (bs_src_read takes its reason), not in one before. */
  bs_log_hold(true);
  int ret = fs_prepare(&r.fs, &r.a) != 0 || claim(&r) != 0 ? 1 : -1;
  bs_log_hold(false);
  if (ret < 0) {
    if (fs_log_open(r.lpath) != 0)
      r.lpath[0] = '\0';
    fs_view_log(&r.fs);
    fs_progress_init(r.spath);
    fs_journal_start(&r.fs);
    fs_status_running(r.sfd, &r.fs, r.mnt);
    ret = serve(&r, argv[0]);
    if (ret < 0) { /* nothing mounted */
      fs_staging_remove(&r.fs);
      fs_status_write(r.sfd, "error\nthe mount failed\n");
      ret = 1;
    } else if (write_back(&r) != 0) {
      ret = 1;
    }
    fs_log_close();
  }
  /* The output path outlives fs_destroy for the target lock's removal. */
  char *output = r.fs.output;
  r.fs.output = NULL;
  fs_destroy(&r.fs);
  r.fs.output = output;
  fs_args_destroy(&r.a);
  bs_free(r.mnt);
  run_files_remove(&r);
  bs_free(output);
  return ret;
}
