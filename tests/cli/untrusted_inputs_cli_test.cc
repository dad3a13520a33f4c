// Model directories, tokenizers and host lists as untrusted input, through the hyperion
// binary (docs/RELIABILITY.md): a FIFO, a device or a directory where a file belongs is
// refused at once by name, never waited on or read without end.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../test_files.h"
#include "cli_test_util.h"

namespace {

namespace fs = std::filesystem;
using hyperion::testing_util::run_cli;
using hyperion::testing_util::TempDir;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(UntrustedInputs, AFifoInAModelDirectoryIsRefusedAtOnce) {
  TempDir d;
  const fs::path model = d.path / "model";
  fs::create_directory(model);
  ASSERT_EQ(::mkfifo((model / "config.json").c_str(), 0644), 0);
  std::ofstream(model / "model.safetensors") << "";
  const auto r = run_cli("generate --checkpoint " + model.string() + " --prompt hi");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "config.json': it is a FIFO, not a regular file")) << r.out;
}

TEST(UntrustedInputs, ALinkOutOfAModelDirectoryIsRefused) {
  TempDir d;
  const fs::path model = d.path / "model";
  fs::create_directory(model);
  std::ofstream(d.path / "elsewhere.json") << "{}";
  fs::create_symlink(d.path / "elsewhere.json", model / "config.json");
  std::ofstream(model / "model.safetensors") << "";
  const auto r = run_cli("generate --checkpoint " + model.string() + " --prompt hi");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "outside the model directory")) << r.out;
}

TEST(UntrustedInputs, ATokenizerThatIsAFifoIsNamed) {
  TempDir d;
  ASSERT_EQ(::mkfifo((d.path / "tokenizer.json").c_str(), 0644), 0);
  const auto r = run_cli("tokenize --tokenizer " + d.path.string() + " --text hello");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "tokenizer.json': it is a FIFO")) << r.out;
}

// A model key given beside load_parameters_path would be ignored: a usage error (exit 2),
// checked before the checkpoint is read.
TEST(UntrustedInputs, AModelKeyBesideLoadParametersPathIsAUsageError) {
  const auto r = run_cli("train tiny load_parameters_path=/nonexistent base_emb_dim=64");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "base_emb_dim") && contains(r.out, "remove the key")) << r.out;
}

TEST(UntrustedInputs, AHostfileThatIsADeviceOrDirectoryIsAUsageError) {
  TempDir d;
  for (const std::string& path : {std::string("/dev/zero"), d.path.string()}) {
    const auto r = run_cli("train tiny steps=1 --hostfile " + path);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(contains(r.out, "not a regular file")) << r.out;
  }
}

}  // namespace
