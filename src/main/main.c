/* burnstore's one main: a CLI subcommand (ls, info, cat, diff, convert,
 * --finish, --list-staging) goes to the CLI on the core, anything else to the
 * mount (the FUSE daemon, or in a core-only build nomount.c). */
#include "cli.h"
#include "main/mount.h"

int main(int argc, char **argv)
{
  if (argc >= 2 && bs_cli_is_command(argv[1]))
    return bs_cli_main(argc - 1, argv + 1);
  return bs_mount_main(argc, argv, bs_cli_usage);
}
