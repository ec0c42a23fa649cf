#include "core/utf8.h"

#include <stdio.h>
#include <string.h>

size_t bs_utf8_len(const uint8_t *s, size_t left)
{
  uint8_t c = s[0];
  size_t len;
  uint32_t cp;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF)
    len = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4)
    len = 4, cp = c & 0x07;
  else
    return 0;
  if (len > left)
    return 0;
  for (size_t k = 1; k < len; k++) {
    if ((s[k] & 0xC0) != 0x80)
      return 0;
    cp = cp << 6 | (s[k] & 0x3F);
  }
  if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return len;
}

bool bs_utf8_valid(const void *s, size_t n, size_t *bad)
{
  const uint8_t *u = s;
  for (size_t i = 0; i < n;) {
    size_t l = bs_utf8_len(u + i, n - i);
    if (l == 0) {
      if (bad)
        *bad = i;
      return false;
    }
    i += l;
  }
  return true;
}

const char *bs_name_printable(const char *name, char *buf, size_t n)
{
  size_t len = strlen(name), o = 0;
  for (size_t i = 0; i < len && n > 0;) {
    size_t l = bs_utf8_len((const uint8_t *)name + i, len - i);
    if (l == 0 && o + 4 < n) {
      snprintf(buf + o, n - o, "\\x%02x", (unsigned char)name[i]);
      o += 4, i++;
    } else if (l > 0 && o + l < n) {
      memcpy(buf + o, name + i, l);
      o += l, i += l;
    } else {
      break;
    }
  }
  if (n > 0)
    buf[o < n ? o : n - 1] = '\0';
  return buf;
}
