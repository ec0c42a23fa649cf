/* The options' size grammar (size.h). */
#include "core/size.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/checked.h"

int bs_parse_size(const char *s, uint64_t *out)
{
  static const struct {
    const char *unit;
    uint64_t mul;
    bool bits_if_b; /* "Gb": gigabits, as Hugging Face reads it */
  } units[] = {
      {"B", 1, false},
      {"K", 1ull << 10, false},
      {"M", 1ull << 20, false},
      {"G", 1ull << 30, false},
      {"T", 1ull << 40, false},
      {"KIB", 1ull << 10, false},
      {"MIB", 1ull << 20, false},
      {"GIB", 1ull << 30, false},
      {"TIB", 1ull << 40, false},
      {"KB", 1000ull, true},
      {"MB", 1000000ull, true},
      {"GB", 1000000000ull, true},
      {"TB", 1000000000000ull, true},
  };
  size_t n = strlen(s), digits = 0;
  while (digits < n && s[digits] >= '0' && s[digits] <= '9')
    digits++;
  if (digits == 0 || digits > 19)
    return -1;
  uint64_t v = strtoull(s, NULL, 10), mul = 1;
  const char *unit = s + digits;
  bool bits = false;
  if (*unit) {
    size_t i = 0;
    for (; i < sizeof units / sizeof units[0]; i++)
      if (strcasecmp(unit, units[i].unit) == 0)
        break;
    if (i == sizeof units / sizeof units[0] || strcmp(unit, "b") == 0)
      return -1; /* (a bare "b" would be bits of nothing we write) */
    mul = units[i].mul;
    bits = units[i].bits_if_b && unit[strlen(unit) - 1] == 'b';
  }
  if (!bs_mul_u64(v, mul, &v))
    return -1;
  *out = bits ? v / 8 : v;
  return 0;
}
