// Helpers shared by the tests that read and write files: a per-test temporary directory,
// plain (non-atomic) writes for deliberately malformed fixtures, and error-message checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion::testing_util {

// Whether a temporary file of an atomic write of `path` ("<path>.tmp.<pid>.<n>") is left
// beside it.
inline bool temp_files_left(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path(), ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}

// A fresh directory named after the running test (and the process), removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = info == nullptr
                                 ? std::string("suite")
                                 : std::string(info->test_suite_name()) + "_" + info->name();
    path =
        std::filesystem::temp_directory_path() / ("hyp_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path / name).string(); }
  // Writes `content` to `name` in the directory and returns its path.
  std::string write(const std::string& name, const std::string& content) const;
  // Names of the files in the directory, sorted (to find stray temporaries).
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

// The bundled corpus's first 256 KB (whole documents), written once per test process and
// removed at its exit: what the end-to-end training and CLI tests prepare and train on.
// Preparing the whole 2 MB corpus was most of those tests' time (7 s a run under
// AddressSanitizer, in every test process).
inline const std::string& small_corpus() {
  struct File {
    std::string dir, path;
    ~File() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  };
  static const File file = [] {
    std::ifstream in(std::string(HYPERION_SOURCE_DIR) + "/data/corpus/fortunes.txt",
                     std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t cut = text.find("\n%\n", 256 << 10);
    if (cut != std::string::npos) text.resize(cut + 3);
    // Named as the corpus (the stem names its prepared dataset), in a directory per process.
    File f;
    f.dir = ::testing::TempDir() + "hyperion_corpus_" + std::to_string(::getpid());
    f.path = f.dir + "/fortunes.txt";
    std::filesystem::create_directories(f.dir);
    std::ofstream out(f.path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), std::streamsize(text.size()));
    out.close();
    if (text.size() < (64 << 10) || !out) ADD_FAILURE() << "cannot make " << f.path;
    return f;
  }();
  return file.path;
}

// Plain (non-atomic, no fsync) write for the many small malformed files tests make.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string TempDir::write(const std::string& name, const std::string& content) const {
  const std::string p = file(name);
  write_bytes(p, content);
  return p;
}

// Expects fn to throw hyperion::Error whose message contains every one of needles.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected hyperion::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& s : needles)
      EXPECT_NE(msg.find(s), std::string::npos) << "message '" << msg << "' lacks '" << s << "'";
  }
}

}  // namespace hyperion::testing_util
