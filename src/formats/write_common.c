/* What every writer shares (write_common.h). */
#include "formats/write_common.h"

#include <errno.h>
#include <string.h>

#include "core/utf8.h"

unsigned bs_write_new_mode(const struct bs_write_opts *o)
{
  return o && o->has_mode ? o->mode & 0666 : 0644;
}

int bs_writer_name_text(const char *name, size_t max, bool empty_ok, const char *why, bs_err *err)
{
  size_t len = strlen(name), bad;
  char key[sizeof err->key];
  bs_name_printable(name, key, sizeof key);
  if (len == 0 && !empty_ok)
    return bs_fail(err, EINVAL, BS_OFF_NONE, NULL, "an empty name: %s", why);
  if (!bs_utf8_valid(name, len, &bad))
    return bs_fail(err, EINVAL, BS_OFF_NONE, key,
                   "the name is not valid UTF-8 (byte %zu is 0x%02x): %s", bad,
                   (unsigned char)name[bad], why);
  if (len > max)
    return bs_fail(err, EINVAL, BS_OFF_NONE, key, "a name of %zu bytes, over the limit of %zu: %s",
                   len, max, why);
  return 0;
}

const char *bs_writer_alias_hint(enum bs_dtype dt)
{
  switch (dt) {
  case BS_DT_FLEX32: return "; its bytes are F32: set user.burnstore.dtype to F32 to write them";
  case BS_DT_BOOL_U8: return "; its bytes are BOOL: set user.burnstore.dtype to BOOL to write them";
  default: return "";
  }
}
