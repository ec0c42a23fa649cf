/* The mount half of `burnstore`: everything that is not a CLI subcommand
 * (mount, -u, -h, -V). The FUSE daemon (src/fuse/fs_main.c) defines it; a
 * core-only build links src/main/nomount.c instead, which cannot mount.
 * No FUSE header here: main.c dispatches without knowing FUSE. */
#ifndef BURNSTORE_MAIN_MOUNT_H
#define BURNSTORE_MAIN_MOUNT_H

/* argv as main's. cli_usage: the subcommands' usage lines, for --help.
 * Returns the exit status. */
int bs_mount_main(int argc, char **argv, const char *cli_usage);

#endif
