#include "util/file_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace meshccl {

namespace {
// O_NONBLOCK keeps open() of a FIFO from waiting for a peer; once the file
// is known to be regular, reads and writes block as usual.
int checked(int fd, bool input, std::string* why) {
  struct stat st;
  const char* refused = nullptr;
  if (fstat(fd, &st) != 0) refused = std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) refused = "not a regular file";
  else if (st.st_uid != geteuid() && !(input && st.st_uid == 0)) refused = "owned by another user";
  else if (input && (st.st_mode & S_IWOTH) != 0) refused = "writable by other users";
  if (refused == nullptr && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) refused = std::strerror(errno);
  if (refused == nullptr && !input && ftruncate(fd, 0) != 0) refused = std::strerror(errno);
  if (refused == nullptr) return fd;
  *why = refused;
  close(fd);
  return -1;
}

// Why open() failed, in the check's own terms where the name shows it: the
// kernel answers EACCES for a symbolic link another user planted in a sticky
// directory such as /tmp (ELOOP for one of ours) and ENXIO for a FIFO nobody
// reads.
std::string refusal_of(const std::string& path, int err) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return "it is a symbolic link";
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    if (st.st_uid != geteuid()) return "owned by another user";
  }
  return std::strerror(err);
}
}  // namespace

int open_trusted_input(const std::string& path, std::string* why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  return checked(fd, true, why);
}

int open_private_output(const std::string& path, std::string* why) {
  // No O_TRUNC here: a file of another user is refused before it is touched.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    *why = refusal_of(path, errno);
    return -1;
  }
  return checked(fd, false, why);
}

}  // namespace meshccl
