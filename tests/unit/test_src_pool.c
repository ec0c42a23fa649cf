/* Shards opened on demand: the siblings of a file source share a bounded
 * pool of fds (least recently used closed first, never one in use), and a
 * shard reopened must be the file first opened, else it counts as changed. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/source.h"

#define NSHARDS 40

static bs_err err;
static char dir[64];
static struct bs_src idx, shards[NSHARDS];
static int fds0; /* open before the sources */

static void put(const char *name, const char *data)
{
  char p[128];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, data, strlen(data)), (ssize_t)strlen(data));
  close(fd);
}

static int open_fds(void)
{
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  int n = 0;
  while (readdir(d))
    n++;
  closedir(d);
  return n;
}

static void tick(void)
{
  struct timespec t = {0, 20 * 1000 * 1000};
  nanosleep(&t, NULL);
}

static void expect(int i)
{
  char want[16], got[16] = "";
  snprintf(want, sizeof want, "shard%04d", i);
  cr_assert_eq(bs_src_read(&shards[i], 0, got, 9, &err), 0, "shard %d: %s", i, err.msg);
  cr_assert_str_eq(got, want);
}

static void setup(void)
{
  bs_err_clear(&err);
  /* RLIMIT_NOFILE 80: a pool of 80 / 8 = 10 fds. */
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  rl.rlim_cur = 80;
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  snprintf(dir, sizeof dir, "/tmp/bs-pool-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  put("index.json", "{}");
  for (int i = 0; i < NSHARDS; i++) {
    char name[32], data[32];
    snprintf(name, sizeof name, "s%d", i);
    snprintf(data, sizeof data, "shard%04d", i);
    put(name, data);
  }
  char p[128];
  snprintf(p, sizeof p, "%s/index.json", dir);
  fds0 = open_fds();
  cr_assert_eq(bs_src_open(&idx, p, &err), 0, "%s", err.msg);
  for (int i = 0; i < NSHARDS; i++) {
    char name[32];
    snprintf(name, sizeof name, "s%d", i);
    cr_assert_eq(bs_src_open_sibling(&idx, name, &shards[i], &err), 0, "%s", err.msg);
  }
}

static void teardown(void)
{
  bs_src_destroy(&idx); /* before its shards: the pool lives while any uses it */
  for (int i = 0; i < NSHARDS; i++)
    bs_src_destroy(&shards[i]);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}
TestSuite(src_pool, .init = setup, .fini = teardown);

Test(src_pool, many_shards_hold_a_bounded_number_of_fds)
{
  cr_assert_str_eq(shards[3].name + strlen(dir), "/s3", "named beside the index: %s",
                   shards[3].name);
  cr_assert_eq(shards[3].size, 9);
  int base = fds0 + 1 + 80 / 8; /* the index and the pool */
  cr_assert_leq(open_fds(), base, "opening them held no more than the pool");
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < NSHARDS; i++)
      expect(round ? NSHARDS - 1 - i : i);
  cr_assert_leq(open_fds(), base, "reading every shard opened no more than the pool holds");
  for (int i = 0; i < NSHARDS; i++)
    cr_assert_not(bs_src_changed(&shards[i], NULL, 0), "shard %d reopened is unchanged", i);
  cr_assert_leq(open_fds(), base);
}

Test(src_pool, a_shard_changed_while_closed_is_seen_when_reopened)
{
  for (int i = 1; i < NSHARDS; i++) /* shard 0's fd is closed by now */
    expect(i);
  tick();
  put("s0", "SHARD0000"); /* same size, new bytes */
  char why[128] = "", buf[9];
  cr_assert(bs_src_changed(&shards[0], why, sizeof why));
  cr_assert_not_null(strstr(why, "modified"), "%s", why);
  cr_assert_eq(bs_src_pread(&shards[0], 0, buf, 9), -EIO, "changed bytes are never served");
  cr_assert_eq(bs_src_fd_get(&shards[0]), -1, "no fd to splice from either");
  expect(1); /* the others are fine */
}

Test(src_pool, a_shard_replaced_by_rename_while_closed_is_another_file)
{
  for (int i = 1; i < NSHARDS; i++)
    expect(i);
  put("new", "shard0000"); /* the same bytes, even */
  char a[128], b[128];
  snprintf(a, sizeof a, "%s/new", dir);
  snprintf(b, sizeof b, "%s/s0", dir);
  cr_assert_eq(rename(a, b), 0);
  char why[128] = "";
  cr_assert(bs_src_changed(&shards[0], why, sizeof why));
  cr_assert_not_null(strstr(why, "another file"), "%s", why);
}

Test(src_pool, an_fd_in_use_is_not_closed)
{
  int fd = bs_src_fd_get(&shards[0]);
  cr_assert_geq(fd, 0);
  for (int round = 0; round < 3; round++)
    for (int i = 1; i < NSHARDS; i++)
      expect(i);
  char got[10] = "";
  cr_assert_eq(pread(fd, got, 9, 0), 9, "the pinned fd is still open");
  cr_assert_str_eq(got, "shard0000");
  bs_src_fd_put(&shards[0], fd);
  for (int i = 1; i < NSHARDS; i++)
    expect(i);
  expect(0);
}

Test(src_pool, a_borrowed_shard_reads_through_the_pool)
{
  struct bs_src b;
  cr_assert_eq(bs_src_init_borrowed(&b, &shards[5], &err), 0, "%s", err.msg);
  for (int i = 0; i < NSHARDS; i++)
    expect(i);
  char got[10] = "";
  cr_assert_eq(bs_src_pread(&b, 0, got, 9), 9);
  cr_assert_str_eq(got, "shard0005");
  struct bs_src_ident id;
  cr_assert(bs_src_ident(&b, &id));
  struct stat st;
  cr_assert_eq(stat(shards[5].name, &st), 0);
  cr_assert_eq(id.ino, (uint64_t)st.st_ino);
  bs_src_destroy(&b);
}

Test(src_pool, memory_has_no_siblings)
{
  struct bs_src m, s;
  cr_assert_eq(bs_src_init_mem(&m, "abc", 3, "m", &err), 0);
  cr_assert_eq(bs_src_open_sibling(&m, "x", &s, &err), -1);
  cr_assert_eq(err.code, ENOTSUP);
  cr_assert_null(s.ops);
  bs_src_destroy(&m);
}

Test(src_pool, a_shard_turned_fifo_while_closed_is_refused_without_blocking, .timeout = 10)
{
  for (int i = 1; i < NSHARDS; i++)
    expect(i);
  char p[128];
  snprintf(p, sizeof p, "%s/s0", dir);
  cr_assert_eq(unlink(p), 0);
  cr_assert_eq(mkfifo(p, 0644), 0);
  char why[128] = "";
  cr_assert(bs_src_changed(&shards[0], why, sizeof why));
  cr_assert_not_null(strstr(why, "a FIFO"), "%s", why);
}

Test(src_pool, a_fifo_is_not_opened, .timeout = 10)
{
  char p[128];
  snprintf(p, sizeof p, "%s/fifo", dir);
  cr_assert_eq(mkfifo(p, 0644), 0);
  struct bs_src s;
  cr_assert_eq(bs_src_open_sibling(&idx, "fifo", &s, &err), -1);
  cr_assert_eq(err.code, EINVAL);
  cr_assert_not_null(strstr(err.msg, "is a FIFO, not a regular file"), "%s", err.msg);
  bs_err_clear(&err);
  cr_assert_eq(bs_src_open(&s, dir, &err), -1);
  cr_assert_not_null(strstr(err.msg, "is a directory"), "%s", err.msg);
}
