/* burnstore's one main: a CLI subcommand (ls, info, cat, diff, convert,
 * --finish, --list-staging) goes to the CLI on the core, anything else to the
 * mount (the FUSE daemon, or in a core-only build nomount.c). */
#include <malloc.h>

#include "cli.h"
#include "main/mount.h"

int main(int argc, char **argv)
{
  /* Every block of 256 KiB or more its own mapping, given back when freed,
   * and grown in place (mremap): glibc's default moves the threshold up to
   * 32 MiB after the first large free, so that a large catalog's arrays,
   * grown by doubling, left their old copies as holes in the heap (14 MB of
   * a million-tensor mount's 167 MB peak; issue 34). */
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  if (argc >= 2 && bs_cli_is_command(argv[1]))
    return bs_cli_main(argc - 1, argv + 1);
  return bs_mount_main(argc, argv, bs_cli_usage);
}
