/* The target lock's key and refusal (core/target.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/catalog.h"
#include "core/source.h"
#include "core/target.h"
#include "formats/writers.h"

static char dir[64];

static void setup(void)
{
  snprintf(dir, sizeof dir, "/tmp/bs-target-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  /* Each test's own run directory, so that parallel runs never share a lock. */
  char run[PATH_MAX];
  snprintf(run, sizeof run, "%s/run", dir);
  cr_assert_eq(mkdir(run, 0700), 0);
  setenv("XDG_RUNTIME_DIR", run, 1);
}

static void teardown(void)
{
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

TestSuite(target, .init = setup, .fini = teardown);

/* The key of dir + rest. */
static char *key(const char *rest)
{
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s%s", dir, rest);
  bs_err err;
  bs_err_clear(&err);
  char *k = bs_target_key(p, bs_writer_target_name, &err);
  cr_assert_not_null(k, "%s: %s", p, err.msg);
  return k;
}

Test(target, key_names_a_shard_set_once)
{
  char want[PATH_MAX];
  char *real = realpath(dir, NULL);
  snprintf(want, sizeof want, "%s/m.safetensors", real);
  free(real);
  const char *forms[] = {"/m.safetensors", "/m.safetensors.index.json",
                         "/m-00001-of-00003.safetensors", "/./m-3-of-3.safetensors",
                         "/run/../m.safetensors"};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    char *k = key(forms[i]);
    cr_assert_str_eq(k, want, "%s", forms[i]);
    bs_free(k);
  }
  /* Not a set: other names keep their own key. */
  const char *others[] = {"/m-00001-of-x.safetensors", "/m-of-3.safetensors", "/m.bpk",
                          "/m.safetensors.json"};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    char *k = key(others[i]);
    cr_assert_str_neq(k, want, "%s", others[i]);
    bs_free(k);
  }
}

Test(target, key_follows_a_symlink)
{
  char link[PATH_MAX], target[PATH_MAX];
  snprintf(target, sizeof target, "%s/real.bpk", dir);
  snprintf(link, sizeof link, "%s/link.bpk", dir);
  FILE *f = fopen(target, "w");
  cr_assert_not_null(f);
  fclose(f);
  cr_assert_eq(symlink(target, link), 0);
  char *a = key("/real.bpk"), *b = key("/link.bpk");
  cr_assert_str_eq(a, b);
  bs_free(a);
  bs_free(b);
}

/* The mount table's name of a mountpoint: a directory as given (its
 * parent resolved), a symlink (or a chain of them) by its target, a
 * missing name by its own absolute path. */
Test(target, mountpoint_path_resolves_only_a_symlink)
{
  char *real = realpath(dir, NULL), p[PATH_MAX], want[PATH_MAX];
  cr_assert_not_null(real);
  snprintf(p, sizeof p, "%s/m", dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/l", dir);
  cr_assert_eq(symlink("m", p), 0);
  snprintf(p, sizeof p, "%s/d", dir);
  cr_assert_eq(symlink("gone", p), 0);
  snprintf(p, sizeof p, "%s/s", dir); /* a trailing slash: not stat-ed either */
  cr_assert_eq(symlink("m/", p), 0);
  snprintf(p, sizeof p, "%s/chain", dir); /* a chain, absolute then relative */
  char abs[PATH_MAX];
  snprintf(abs, sizeof abs, "%s/l", dir);
  cr_assert_eq(symlink(abs, p), 0);
  snprintf(p, sizeof p, "%s/loop", dir); /* a loop ends after 40 hops */
  cr_assert_eq(symlink("loop", p), 0);
  const char *cases[][2] = {{"/m", "/m"},   {"/l", "/m"},     {"/l/", "/m"},
                            {"/./l", "/m"}, {"/d", "/gone"},  {"/none", "/none"},
                            {"/s", "/m"},   {"/chain", "/m"}, {"/loop", "/loop"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(p, sizeof p, "%s%s", dir, cases[i][0]);
    snprintf(want, sizeof want, "%s%s", real, cases[i][1]);
    char *got = bs_follow_links(p, false);
    cr_assert_not_null(got, "%s", p);
    cr_assert_str_eq(got, want, "%s", p);
    bs_free(got);
  }
  free(real);
}

Test(target, second_writer_refused_naming_the_holder)
{
  char t[PATH_MAX], idx[PATH_MAX];
  snprintf(t, sizeof t, "%s/m.safetensors", dir);
  snprintf(idx, sizeof idx, "%s/m.safetensors.index.json", dir);
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_target_lock(t, bs_writer_target_name, "/some/mountpoint", &err);
  cr_assert_geq(fd, 0, "%s", err.msg);
  int fd2 = bs_target_lock(idx, bs_writer_target_name, "convert", &err);
  cr_assert_eq(fd2, -1);
  cr_assert_eq(err.code, EBUSY);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
  cr_assert(strstr(err.msg, "/some/mountpoint") && strstr(err.msg, pid), "%s", err.msg);
  /* A mount whose session ended says so in its record: it is writing back. */
  cr_assert(strstr(err.msg, "already the target of a writable mount on /some/mountpoint"), "%s",
            err.msg);
  bs_target_lock_update(fd, t, "/some/mountpoint", true);
  bs_err_clear(&err);
  cr_assert_eq(bs_target_lock(idx, bs_writer_target_name, "convert", &err), -1);
  cr_assert(strstr(err.msg, "still being written back by the daemon of /some/mountpoint") &&
                strstr(err.msg, "already unmounted"),
            "%s", err.msg);
  bs_target_lock_update(fd, t, "convert", false);
  bs_err_clear(&err);
  cr_assert_eq(bs_target_lock(t, bs_writer_target_name, "--finish /x", &err), -1);
  cr_assert(strstr(err.msg, "being written by burnstore convert"), "%s", err.msg);
  close(fd);
  bs_err_clear(&err);
  fd2 = bs_target_lock(idx, bs_writer_target_name, "convert", &err);
  cr_assert_geq(fd2, 0, "free once the holder let go: %s", err.msg);
  close(fd2);
}

Test(target, refusal_of_a_long_path_keeps_holder_and_pid)
{
  char t[PATH_MAX];
  int n = snprintf(t, sizeof t, "%s/", dir);
  memset(t + n, 'd', 150); /* a long directory name */
  t[n + 150] = '\0';
  cr_assert_eq(mkdir(t, 0700), 0);
  strcat(t, "/model.bpk");
  bs_err err;
  bs_err_clear(&err);
  int fd = bs_target_lock(t, bs_writer_target_name, "/mnt/a-mountpoint-with-a-rather-long-name-too",
                          &err);
  cr_assert_geq(fd, 0, "%s", err.msg);
  cr_assert_eq(bs_target_lock(t, bs_writer_target_name, "convert", &err), -1);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
  cr_assert(strstr(err.msg, "/mnt/a-mountpoint-with-a-rather-long-name-too") &&
                strstr(err.msg, pid) && strstr(err.msg, "model.bpk"),
            "%s", err.msg);
  close(fd);
}

/* The modes a new output takes from its sources are the opened files'.
 * Another file renamed over a source's name after the open (whoever may
 * write its directory) granted its own bits: 0600 opened, 0644 put in its
 * place gave a 0644 output. Now a name that is no longer the opened file
 * grants others nothing. */
Test(target, sources_mode_is_the_opened_files)
{
  char path[128], other[128];
  snprintf(path, sizeof path, "%s/src", dir);
  snprintf(other, sizeof other, "%s/other", dir);
  FILE *f = fopen(path, "w");
  cr_assert(f && fputs("private", f) >= 0 && fclose(f) == 0);
  cr_assert_eq(chmod(path, 0600), 0);
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  struct bs_src s;
  bs_err err;
  bs_err_clear(&err);
  uint32_t idx;
  cr_assert_eq(bs_src_open(&s, path, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_catalog_add_src(&cat, &s, &idx, &err), 0, "%s", err.msg);
  cr_assert_eq(bs_sources_mode(&cat, cat.nsrcs, 0666), 0600);
  f = fopen(other, "w");
  cr_assert(f && fputs("public", f) >= 0 && fclose(f) == 0);
  cr_assert_eq(chmod(other, 0644), 0);
  cr_assert_eq(rename(other, path), 0);
  cr_assert_eq(bs_sources_mode(&cat, cat.nsrcs, 0666), 0600,
               "the swapped-in file's 0644 granted: %o", bs_sources_mode(&cat, cat.nsrcs, 0666));
  bs_catalog_destroy(&cat);
}
