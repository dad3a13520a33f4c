#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"

namespace hyperion::io {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hyperion::Error";
  return "";
}

TEST(AtomicFile, RefusesToReplaceAnythingButARegularFile) {
  TempDir dir;
  // A device: /dev/null stays a character device (as root the rename would replace it).
  std::string msg = error_of([] { write_file_atomic("/dev/null", "x"); });
  EXPECT_NE(msg.find("'/dev/null'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a character device"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_FALSE(testing_util::temp_files_left("/dev/null"));
  // A directory.
  fs::create_directories(dir.file("sub"));
  msg = error_of([&] { write_file_atomic(dir.file("sub"), "x"); });
  EXPECT_NE(msg.find("a directory"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_directory(dir.file("sub")));
  // A symbolic link: neither the link nor its target is replaced.
  const std::string target = dir.write("target.txt", "keep");
  fs::create_symlink(target, dir.file("link"));
  msg = error_of([&] { write_file_atomic(dir.file("link"), "x"); });
  EXPECT_NE(msg.find("a symbolic link"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_symlink(dir.file("link")));
  EXPECT_EQ(read_file(target), "keep");
  // A FIFO (opening it for writing would block forever).
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  msg = error_of([&] { AtomicFileWriter w(dir.file("fifo")); });
  EXPECT_NE(msg.find("a FIFO"), std::string::npos) << msg;
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"fifo", "link", "sub", "target.txt"}));
}

TEST(AtomicFile, WriteCreatesFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  write_file_atomic(path, "hello");
  EXPECT_EQ(read_file(path), "hello");
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"out.bin"});
  write_file_atomic(path, std::string("\0bytes\xff", 7));  // replaces
  EXPECT_EQ(read_file(path), std::string("\0bytes\xff", 7));
  write_file_atomic(path, "");
  EXPECT_EQ(read_file(path), "");
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, StreamingMixesSmallAndLargeWrites) {
  TempDir dir;
  const std::string path = dir.file("stream.bin");
  std::mt19937 rng(1);
  std::string expected;
  {
    AtomicFileWriter w(path);
    EXPECT_EQ(w.temp_path().rfind(path + ".tmp." + std::to_string(::getpid()) + ".", 0), 0u)
        << w.temp_path();
    for (size_t n : {size_t{1}, size_t{7}, size_t{3} << 20, size_t{100}, size_t{1} << 20,
                     size_t{(1 << 20) - 1}, size_t{5}}) {
      std::string chunk(n, '\0');
      for (auto& c : chunk) c = static_cast<char>(rng());
      w.write(chunk.data(), chunk.size());
      expected += chunk;
    }
    EXPECT_EQ(w.bytes_written(), expected.size());
    EXPECT_FALSE(fs::exists(path));  // nothing visible before commit
    w.commit();
    EXPECT_THROW(w.write("x"), Error);
    EXPECT_THROW(w.commit(), Error);
  }
  EXPECT_EQ(read_file(path), expected);
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"stream.bin"});
}

TEST(AtomicFile, AbandonedWriterKeepsPreviousFile) {
  TempDir dir;
  const std::string path = dir.file("model.bin");
  write_file_atomic(path, "old contents");
  {
    AtomicFileWriter w(path);
    w.write(std::string(3 << 20, 'n'));  // large enough to reach the file
    EXPECT_TRUE(fs::exists(w.temp_path()));
  }  // destroyed without commit
  EXPECT_EQ(read_file(path), "old contents");
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"model.bin"});

  // An exception thrown mid-write unwinds through the writer the same way.
  EXPECT_THROW(
      {
        AtomicFileWriter w(path);
        w.write("partial");
        fail("simulated failure while producing '{}'", path);
      },
      Error);
  EXPECT_EQ(read_file(path), "old contents");
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"model.bin"});
}

TEST(AtomicFile, ErrorsNameThePath) {
  TempDir dir;
  const std::string missing_dir = dir.file("no/such/dir/out.bin");
  std::string msg = error_of([&] { write_file_atomic(missing_dir, "x"); });
  EXPECT_NE(msg.find(missing_dir), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;

  const std::string missing = dir.file("missing.txt");
  msg = error_of([&] { read_file(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;

  msg = error_of([&] { read_file(dir.path.string()); });
  EXPECT_NE(msg.find(dir.path.string()), std::string::npos) << msg;

  msg = error_of([&] { fsync_directory(dir.file("nope")); });
  EXPECT_NE(msg.find(dir.file("nope")), std::string::npos) << msg;

  msg = error_of([&] { MappedFile::open(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;

  // Renaming over a directory fails at commit; the temporary must not be left behind.
  fs::create_directories(dir.file("adir/sub"));
  msg = error_of([&] { write_file_atomic(dir.file("adir"), "x"); });
  EXPECT_NE(msg.find(dir.file("adir")), std::string::npos) << msg;
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"adir"});
}

TEST(AtomicFile, RelativePathInCurrentDirectory) {
  TempDir dir;
  const fs::path old = fs::current_path();
  fs::current_path(dir.path);
  write_file_atomic("plain.txt", "data");  // parent directory is "."
  fs::current_path(old);
  EXPECT_EQ(read_file(dir.file("plain.txt")), "data");
}

TEST(MappedFileTest, MapsContentsAndMoves) {
  TempDir dir;
  write_file_atomic(dir.file("a"), "abcdef");
  MappedFile m = MappedFile::open(dir.file("a"));
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), "abcdef");
  MappedFile moved = std::move(m);
  EXPECT_EQ(moved.size(), 6u);
  EXPECT_EQ(moved.data()[5], 'f');
  write_file_atomic(dir.file("empty"), "");
  MappedFile e = MappedFile::open(dir.file("empty"));
  EXPECT_EQ(e.size(), 0u);
  EXPECT_EQ(e.data(), nullptr);
  EXPECT_THROW(MappedFile::open(dir.path.string()), Error);  // a directory
}

}  // namespace
}  // namespace hyperion::io
