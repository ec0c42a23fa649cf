#include "core/alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static long fail_countdown = -1;

void bs_alloc_fail_after(long n)
{
  fail_countdown = n;
}

static int should_fail(void)
{
  if (fail_countdown < 0)
    return 0;
  if (fail_countdown == 0) {
    fail_countdown = -1;
    return 1;
  }
  fail_countdown--;
  return 0;
}

void *bs_malloc(size_t n)
{
  if (should_fail())
    return NULL;
  return malloc(n ? n : 1);
}

void *bs_calloc(size_t n, size_t size)
{
  if (should_fail())
    return NULL;
  return calloc(n ? n : 1, size ? size : 1);
}

void *bs_realloc(void *p, size_t n)
{
  if (should_fail())
    return NULL;
  return realloc(p, n ? n : 1);
}

void bs_free(void *p)
{
  free(p);
}

char *bs_strndup(const char *s, size_t n)
{
  char *d = bs_malloc(n + 1);
  if (!d)
    return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *bs_strdup(const char *s)
{
  return bs_strndup(s, strlen(s));
}

char *bs_path_join(const char *dir, const char *name)
{
  size_t a = strlen(dir), b = strlen(name);
  char *p = bs_malloc(a + b + 2);
  if (p) {
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
  }
  return p;
}

bool bs_ends_with(const char *s, size_t n, const char *suffix, bool nocase)
{
  size_t k = strlen(suffix);
  if (n < k)
    return false;
  return nocase ? strncasecmp(s + n - k, suffix, k) == 0 : memcmp(s + n - k, suffix, k) == 0;
}

int bs_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
  if (need <= *cap)
    return 0;
  size_t ncap = *cap ? *cap : 8;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2)
      return -1;
    ncap *= 2;
  }
  if (elem && ncap > SIZE_MAX / elem)
    return -1;
  void *p = bs_realloc(*arr, ncap * elem);
  if (!p)
    return -1;
  *arr = p;
  *cap = ncap;
  return 0;
}
