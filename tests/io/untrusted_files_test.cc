// Every reader of a user-given path opens it without blocking and reads only a regular
// file of plausible size (base/input_file.h): a FIFO with no writer, a device, a
// directory or an oversized file is refused by name, at once (a FIFO used to block open()
// forever; /dev/zero grew a chat template or hostfile without bound). Through each reader:
// whole-file reads, memory maps (safetensors, GGUF), token shards, line readers, Criteo
// files, hostfiles, and a tokenizer directory's files; and a model directory's symbolic
// links stay inside it (io/model_dir_file.h).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "base/input_file.h"
#include "base/line_reader.h"
#include "dist/host_list.h"
#include "io/atomic_file.h"
#include "io/model_dir_file.h"
#include "io/token_shard.h"
#include "recsys/criteo_reader.h"
#include "text/tokenizer.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;
using testing_util::TempDir;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A FIFO with no writer: opening it for reading without O_NONBLOCK blocks forever.
std::string make_fifo(const TempDir& d, const std::string& name) {
  const std::string path = (d.path / name).string();
  EXPECT_EQ(::mkfifo(path.c_str(), 0644), 0);
  return path;
}

TEST(UntrustedFiles, EveryReaderRefusesAFifoWithoutBlocking) {
  TempDir d;
  const std::string fifo = make_fifo(d, "fifo");
  const std::vector<std::pair<std::string, std::function<void()>>> readers = {
      {"read_file", [&] { io::read_file(fifo); }},
      {"MappedFile", [&] { io::MappedFile::open(fifo); }},
      {"TokenShard", [&] { io::TokenShard::open(fifo); }},
      {"LineReader", [&] { LineReader r(fifo, 1024); }},
      {"CriteoReader",
       [&] { recsys::CriteoReader r(fifo, std::vector<int64_t>(recsys::kCriteoTables, 10)); }},
      {"hostfile", [&] { dist::read_hostfile(fifo); }},
  };
  for (const auto& [name, read] : readers) {
    const std::string msg = error_of(read);
    EXPECT_TRUE(has(msg, fifo) && has(msg, "is a FIFO, not a regular file")) << name << ": " << msg;
  }
}

TEST(UntrustedFiles, DevicesAndDirectoriesAreRefusedByName) {
  TempDir d;
  for (const std::string& path : {std::string("/dev/zero"), std::string("/dev/null")}) {
    EXPECT_TRUE(has(error_of([&] { io::read_file(path); }), "is a character device")) << path;
    EXPECT_TRUE(has(error_of([&] { dist::read_hostfile(path); }), "is a character device"))
        << path;
  }
  EXPECT_TRUE(has(error_of([&] { io::read_file(d.path.string()); }), "is a directory"));
  // A hostfile that is a directory used to "list no hosts".
  const std::string hosts = error_of([&] { dist::read_hostfile(d.path.string()); });
  EXPECT_TRUE(has(hosts, "is a directory")) << hosts;
}

TEST(UntrustedFiles, SizeIsCheckedBeforeReading) {
  TempDir d;
  const std::string big = d.write("big.txt", std::string(5000, 'x'));
  EXPECT_EQ(io::read_file(big, 5000).size(), 5000u);
  const std::string msg = error_of([&] { io::read_file(big, 4999); });
  EXPECT_TRUE(has(msg, "5000 bytes, more than the 4999")) << msg;
  // A hostfile of megabytes is refused whole, and a long line is not echoed whole.
  const std::string huge = d.write("hosts-huge", std::string(2 << 20, 'a') + "\n");
  EXPECT_TRUE(has(error_of([&] { dist::read_hostfile(huge); }), "more than the"));
  const std::string line = d.write("hosts-line", std::string(100000, '!') + "\n");
  const std::string bad = error_of([&] { dist::read_hostfile(line); });
  EXPECT_TRUE(has(bad, "is not a host name")) << bad.substr(0, 200);
  EXPECT_LT(bad.size(), 400u);
}

// A tokenizer directory: its tokenizer.json as a FIFO or a directory is named as such
// (it used to be reported as a missing tokenizer.model), and so is a companion file
// (tokenizer_config.json as a directory used to lose the chat template silently).
TEST(UntrustedFiles, TokenizerDirectoryFilesAreNamed) {
  {
    TempDir d;
    make_fifo(d, "tokenizer.json");
    const std::string msg = error_of([&] { text::Tokenizer::load(d.path.string()); });
    EXPECT_TRUE(has(msg, "tokenizer.json") && has(msg, "is a FIFO")) << msg;
  }
  {
    TempDir d;
    fs::create_directory(d.path / "tokenizer.json");
    const std::string msg = error_of([&] { text::Tokenizer::load(d.path.string()); });
    EXPECT_TRUE(has(msg, "tokenizer.json") && has(msg, "is a directory")) << msg;
  }
}

// Symbolic links in a model directory: followed within it and, for a Hugging Face hub
// snapshot, into its repository's blobs/; refused by name anywhere else.
TEST(UntrustedFiles, ModelDirectoryLinksStayInsideIt) {
  TempDir d;
  const fs::path model = d.path / "model";
  fs::create_directories(model / "sub");
  std::ofstream(model / "sub" / "real.json") << "{}";
  std::ofstream(d.path / "secret") << "outside";
  fs::create_symlink("sub/real.json", model / "inside.json");
  fs::create_symlink(d.path / "secret", model / "config.json");
  fs::create_symlink("../secret", model / "up.json");
  EXPECT_EQ(io::model_dir_file(model.string(), "inside.json"), (model / "inside.json").string());
  EXPECT_EQ(io::model_dir_file(model.string(), "missing.json"),
            (model / "missing.json").string());
  for (const char* name : {"config.json", "up.json"}) {
    const std::string msg = error_of([&] { io::model_dir_file(model.string(), name); });
    EXPECT_TRUE(has(msg, "outside the model directory") && has(msg, "secret")) << msg;
  }
  for (const char* name : {"..", ".", "a/b", ""})
    EXPECT_TRUE(has(error_of([&] { io::model_dir_file(model.string(), name); }),
                    "is not a file name"))
        << name;
  // The hub's layout: snapshots/<rev>/config.json -> ../../blobs/<hash>.
  const fs::path repo = d.path / "hub" / "models--org--tiny";
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / "abc123");
  std::ofstream(repo / "blobs" / "f00d") << "{}";
  fs::create_symlink("../../blobs/f00d", repo / "snapshots" / "abc123" / "config.json");
  fs::create_symlink(d.path / "secret", repo / "snapshots" / "abc123" / "tokenizer.json");
  const std::string snap = (repo / "snapshots" / "abc123").string();
  EXPECT_NO_THROW(io::model_dir_file(snap, "config.json"));
  const std::string msg = error_of([&] { io::model_dir_file(snap, "tokenizer.json"); });
  EXPECT_TRUE(has(msg, "hub repository's blobs/")) << msg;
  // Through the readers: the checkpoint's config and a tokenizer directory.
  const std::string tok = error_of([&] { text::Tokenizer::load(snap); });
  EXPECT_TRUE(has(tok, "outside the model directory")) << tok;
}

TEST(UntrustedFiles, CheckRegularFileForThirdPartyReaders) {
  TempDir d;
  EXPECT_NO_THROW(check_regular_file(d.write("ok", "x")));
  EXPECT_TRUE(has(error_of([&] { check_regular_file(make_fifo(d, "f")); }), "is a FIFO"));
  EXPECT_TRUE(has(error_of([&] { check_regular_file((d.path / "missing").string()); }),
                  "No such file or directory"));
}

}  // namespace
}  // namespace hyperion
