/* `burnstore` of a core-only build (-DBURNSTORE_FUSE=OFF): the checkpoint
 * subcommands, --finish and --list-staging, without the mount. */
#include <stdio.h>
#include <string.h>

#include "burnstore/version.h"
#include "cli.h"

int main(int argc, char **argv)
{
  if (argc >= 2 && bs_cli_is_command(argv[1]))
    return bs_cli_main(argc - 1, argv + 1);
  if (argc >= 2 && (strcmp(argv[1], "-V") == 0 || strcmp(argv[1], "--version") == 0)) {
    printf("burnstore %s (built without FUSE)\n", BURNSTORE_VERSION);
    return 0;
  }
  FILE *f =
      argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) ? stdout : stderr;
  fprintf(f,
          "usage:\n%s\nThis burnstore was built without FUSE: it cannot mount.\n"
          "burnstore COMMAND --help describes each command.\n",
          bs_cli_usage);
  return f == stdout ? 0 : 2;
}
