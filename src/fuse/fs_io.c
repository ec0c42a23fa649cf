/* The session's I/O on /dev/fuse (libfuse's fuse_session_custom_io, 3.14):
 * plain read, writev and splice, as libfuse's own, with one change: the
 * INIT reply of a writable mount also asks for FUSE_HANDLE_KILLPRIV_V2
 * (kernel protocol 7.33, Linux 5.11), which libfuse before 3.16 cannot ask
 * for.
 *
 * Why: without it the kernel asks the daemon for security.capability
 * (a GETXATTR round trip) before every write(2) into the mount, to know
 * whether the write must drop it; at dd bs=32k that was one request per
 * 32 KiB, as many as the writes themselves. With it the super block is
 * SB_NOSEC: a file found without set-id bits and capabilities is marked so
 * once, and the daemon drops set-id bits itself, as it already did on
 * every write (op_write_buf) and now does on truncation and chown (do_setattr),
 * the other two cases the flag hands over. The mount has no
 * security.capability to drop (fs_xattr.c refuses security.*).
 *
 * The message format is the kernel's ABI (<linux/fuse.h>): the reply is a
 * fuse_out_header and a fuse_init_out, whose `flags` word gets the bit. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stddef.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fs.h"

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
  (void)userdata;
  return read(fd, buf, len);
}

static ssize_t io_splice_receive(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                                 unsigned int flags, void *userdata)
{
  (void)userdata;
  return splice(fdin, offin, fdout, offout, len, flags);
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
  struct fs *fs = userdata;
  struct fuse_init_out init;
  /* The first reply after op_init asked for it is INIT's (no other request
   * comes before INIT is answered). */
  if (atomic_exchange(&fs->killpriv_pending, false) && count == 2 &&
      iov[0].iov_len == sizeof(struct fuse_out_header) &&
      ((const struct fuse_out_header *)iov[0].iov_base)->error == 0 &&
      iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + sizeof init.flags &&
      iov[1].iov_len <= sizeof init) {
    memcpy(&init, iov[1].iov_base, iov[1].iov_len);
    init.flags |= FUSE_HANDLE_KILLPRIV_V2;
    struct iovec v[2] = {iov[0], {.iov_base = &init, .iov_len = iov[1].iov_len}};
    ssize_t r = writev(fd, v, 2);
    if (r >= 0)
      fs->killpriv = true;
    return r;
  }
  return writev(fd, iov, count);
}

int fs_io_begin(struct fuse_session *se, struct fs *fs)
{
  (void)fs;
  static const struct fuse_custom_io io = {
      .writev = io_writev,
      .read = io_read,
      .splice_receive = io_splice_receive,
      .splice_send = io_splice_receive,
  };
  return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

void fs_io_init(struct fs *fs, const struct fuse_conn_info *conn)
{
  /* 7.33 brought the flag; the kernel offers it whenever it knows it. */
  if (fs->writable && fs->custom_io && (conn->proto_major > 7 || conn->proto_minor >= 33))
    atomic_store(&fs->killpriv_pending, true);
}
