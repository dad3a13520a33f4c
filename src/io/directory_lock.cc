#include "io/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "base/error.h"

namespace hyperion::io {

namespace {

std::string read_all(int fd) {
  std::string out;
  char buf[256];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    at += n;
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\0')) out.pop_back();
  return out;
}

std::string holder_text() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  char when[32] = "?";
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return fmt::format("pid {} on host {} since {}", static_cast<int64_t>(::getpid()), host, when);
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create the lock {}: {}", path, os_error_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_all(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      fail("{} {} is in use by another process ({}); wait for it to finish, or use another "
           "directory (run_name=...)",
           what, dir, holder.empty() ? "holder unknown" : holder);
    fail("cannot lock {}: {}", path, os_error_text(err));
  }
  previous_ = read_all(fd_);
  const std::string me = holder_text() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0)
    fail("cannot write the lock {}: {}", path, os_error_text(errno));
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  // Empty means "not held" for the next reader; the flock goes with the descriptor.
  if (::ftruncate(fd_, 0) != 0) {
  }
  ::close(fd_);
}

}  // namespace hyperion::io
