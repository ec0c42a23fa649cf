/* The mount half of a core-only build (-DBURNSTORE_FUSE=OFF): it cannot
 * mount; -V and -h say so, anything else is a usage error. */
#include <stdio.h>
#include <string.h>

#include "core/version.h"
#include "main/mount.h"

int bs_mount_main(int argc, char **argv, const char *cli_usage)
{
  if (argc >= 2 && (strcmp(argv[1], "-V") == 0 || strcmp(argv[1], "--version") == 0)) {
    printf("burnstore %s (built without FUSE)\n", BURNSTORE_VERSION);
    return 0;
  }
  FILE *f =
      argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) ? stdout : stderr;
  fprintf(f,
          "usage:\n%s\nThis burnstore was built without FUSE: it cannot mount.\n"
          "burnstore COMMAND --help describes each command.\n",
          cli_usage);
  return f == stdout ? 0 : 2;
}
