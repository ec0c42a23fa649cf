/* Change detection of fd sources: what counts as a change of the file
 * under a mount (size, mtime, ctime while named) and what does not (the
 * file deleted or replaced by rename), and reads that refuse changed bytes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/catalog.h"

static bs_err err;
static char dir[64], path[128];
static struct bs_src src;

static void put(const char *p, const char *data, int flags)
{
  int fd = open(p, O_WRONLY | O_CREAT | flags, 0644);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, data, strlen(data)), (ssize_t)strlen(data));
  close(fd);
}

/* File timestamps come from a clock that may tick coarsely: let it move on
 * before changing the file, so that the change gets a new timestamp. */
static void tick(void)
{
  struct timespec d = {0, 20 * 1000 * 1000};
  nanosleep(&d, NULL);
}

static void setup(void)
{
  bs_err_clear(&err);
  snprintf(dir, sizeof dir, "/tmp/bs-src-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/f", dir);
  put(path, "0123456789abcdef", O_TRUNC);
  cr_assert_eq(bs_src_open(&src, path, &err), 0, "%s", err.msg);
  tick();
}

static void teardown(void)
{
  bs_src_destroy(&src);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}
TestSuite(src_changed, .init = setup, .fini = teardown);

static void expect_changed(const char *what)
{
  char why[128] = "";
  cr_assert(bs_src_changed(&src, why, sizeof why), "not seen as a change");
  cr_assert_not_null(strstr(why, what), "why: %s", why);
}

Test(src_changed, an_untouched_file_is_unchanged)
{
  cr_assert_not(bs_src_changed(&src, NULL, 0));
  char buf[4];
  cr_assert_eq(bs_src_pread(&src, 0, buf, 4), 4);
  cr_assert_not(bs_src_changed(&src, NULL, 0), "reading is no change");
}

Test(src_changed, truncation_is_a_change)
{
  cr_assert_eq(truncate(path, 0), 0);
  expect_changed("size changed from 16 to 0");
}

Test(src_changed, a_same_size_rewrite_of_the_same_inode_is_a_change)
{
  put(path, "FEDCBA9876543210", O_TRUNC); /* what cp over the file does */
  expect_changed("mtime");
}

Test(src_changed, an_edit_that_restores_the_mtime_is_a_change)
{
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  put(path, "X", 0); /* in place, same size */
  struct timespec ts[2] = {st.st_atim, st.st_mtim};
  cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0); /* touch -r */
  expect_changed("ctime");
}

Test(src_changed, deleting_or_replacing_the_file_by_rename_is_no_change)
{
  char other[160];
  snprintf(other, sizeof other, "%s/g", dir);
  put(other, "another file", O_TRUNC);
  cr_assert_eq(rename(other, path), 0); /* the old inode loses its name */
  cr_assert_not(bs_src_changed(&src, NULL, 0));
  cr_assert_eq(unlink(path), 0);
  cr_assert_not(bs_src_changed(&src, NULL, 0));
  char buf[16];
  cr_assert_eq(bs_src_pread(&src, 0, buf, 16), 16);
  cr_assert_eq(memcmp(buf, "0123456789abcdef", 16), 0, "the old bytes stay readable");
}

Test(src_changed, memory_sources_never_change)
{
  struct bs_src m;
  cr_assert_eq(bs_src_init_mem(&m, "abc", 3, "m", &err), 0);
  cr_assert_not(bs_src_changed(&m, NULL, 0));
  bs_src_destroy(&m);
}

Test(src_changed, tensor_reads_of_a_changed_source_fail_with_eio)
{
  struct bs_catalog cat;
  bs_catalog_init(&cat);
  uint32_t idx;
  cr_assert_eq(bs_catalog_add_src(&cat, &src, &idx, &err), 0);
  uint64_t shape[1] = {4};
  struct bs_tensor *t = bs_catalog_add(&cat, "t", BS_DT_U8, 1, shape, 0, &err);
  cr_assert_not_null(t);
  t->src = idx;
  t->off = 4;
  /* A strided view too: the 4 bytes at 0, 2, 4, 6 of a 8-byte storage. */
  struct bs_tensor *v = bs_catalog_add(&cat, "v", BS_DT_U8, 1, shape, 0, &err);
  cr_assert_not_null(v);
  v->src = idx;
  cr_assert_not_null(bs_tensor_x(&cat, v));
  v->x->strides = bs_malloc(sizeof *v->x->strides);
  v->x->strides[0] = 2;
  v->x->storage_bytes = 8;
  char buf[4];
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, buf, 4), 4);
  cr_assert_eq(memcmp(buf, "4567", 4), 0);
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[1], 0, buf, 4), 4);
  cr_assert_eq(memcmp(buf, "0246", 4), 0);
  put(path, "ZZZZ", 0); /* same size, other bytes */
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[0], 0, buf, 4), -EIO);
  cr_assert_eq(bs_tensor_read(&cat, &cat.tensors[1], 0, buf, 4), -EIO);
  /* A borrowed copy (the write-back's) refuses a changed source. */
  struct bs_src b;
  cr_assert_eq(bs_src_init_borrowed(&b, &cat.srcs[0], &err), -1);
  cr_assert_eq(err.code, EIO);
  cr_assert_not_null(strstr(err.msg, "changed since it was opened"), "%s", err.msg);
  bs_catalog_destroy(&cat);
}

Test(src_changed, a_borrowed_copy_keeps_the_stamp_of_the_first_open)
{
  struct bs_src b;
  cr_assert_eq(bs_src_init_borrowed(&b, &src, &err), 0, "%s", err.msg);
  cr_assert_not(bs_src_changed(&b, NULL, 0));
  cr_assert_eq(truncate(path, 8), 0);
  cr_assert(bs_src_changed(&b, NULL, 0));
  bs_src_destroy(&b);
  int fd = bs_src_fd_get(&src);
  cr_assert_geq(fcntl(fd, F_GETFD), 0, "the borrowed copy did not close the fd");
  bs_src_fd_put(&src, fd);
}
