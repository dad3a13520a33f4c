#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/error.h"

namespace hyperion {

const char* file_kind_name(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int open_regular_file(const std::string& path, int64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot read '{}': {}", path, os_error_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read '{}': {}", path, os_error_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot read '{}': it is {}, not a regular file", path, file_kind_name(st.st_mode));
  }
  // Regular files ignore O_NONBLOCK, but a later reader should not see it.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size != nullptr) *size = static_cast<int64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, int64_t max_bytes) {
  int64_t size = 0;
  const int fd = open_regular_file(path, &size);
  if (size > max_bytes) {
    ::close(fd);
    fail("cannot read '{}': it is {} bytes, more than the {} this file may have", path, size,
         max_bytes);
  }
  // Read straight into the string; one more read past the size it had finds a file that
  // grew (or a /proc file whose size says 0).
  std::string out(static_cast<size_t>(std::max<int64_t>(size, 0)), '\0');
  size_t got = 0;
  char chunk[1 << 16];
  for (;;) {
    const bool into_out = got < out.size();
    char* dst = into_out ? out.data() + got : chunk;
    const size_t room = into_out ? out.size() - got : sizeof(chunk);
    const ssize_t n = ::read(fd, dst, room);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      fail("cannot read '{}': {}", path, os_error_text(err));
    }
    if (n == 0) break;
    if (static_cast<int64_t>(got) + n > max_bytes) {  // it grew while read
      ::close(fd);
      fail("cannot read '{}': it grew past the {} bytes this file may have", path, max_bytes);
    }
    if (!into_out) out.append(chunk, static_cast<size_t>(n));
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);  // it shrank while read
  return out;
}

void check_regular_file(const std::string& path) {
  ::close(open_regular_file(path, nullptr));
}

}  // namespace hyperion
