#include "io/file_identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>

#include "base/error.h"

namespace hyperion::io {

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void check_output_is_not_an_input(const std::string& output, const std::vector<std::string>& inputs,
                                  const std::string& what) {
  for (const std::string& in : inputs)
    HYP_CHECK(!same_file(output, in),
              "{}: the output {} is the input {} (the same file): writing it would destroy the "
              "input; choose another output",
              what, output, in);
}

std::string file_fingerprint(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail("{}: cannot stat: {}", path, os_error_text(errno));
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  return fmt::format("{} size {} mtime {}.{:09d} inode {}", ec ? path : abs,
                     static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                     static_cast<int64_t>(st.st_mtim.tv_nsec), static_cast<uint64_t>(st.st_ino));
}

std::string short_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace hyperion::io
