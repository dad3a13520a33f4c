// Model directories, tokenizers and host lists as untrusted input, through the hyperion
// binary (docs/RELIABILITY.md): a FIFO, a device or a directory where a file belongs is
// refused at once by name, never waited on or read without end.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

// Running out of memory is a named error with exit 1, never an abort: a 64 MB text
// tokenized under a 400 MB address-space limit (not under the sanitizers, which reserve
// terabytes of shadow memory).
TEST(UntrustedInputs, OutOfMemoryIsANamedErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "an address-space limit cannot apply under a sanitizer";
#endif
  TempDir d;
  const nlohmann::json tok = {
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {" ", 2}, {"ab", 3}}},
        {"merges", {"a b"}}}}};
  std::ofstream(d.path / "tokenizer.json") << tok.dump();
  {
    std::ofstream text(d.path / "big.txt", std::ios::binary);
    std::string chunk;
    for (int i = 0; i < (1 << 20) / 3; ++i) chunk += "ab ";
    for (int i = 0; i < 64; ++i) text << chunk;
  }
  const auto r = hyperion::testing_util::run_shell(
      "ulimit -v 400000; " + std::string(HYPERION_CLI_PATH) + " tokenize --tokenizer " +
      d.path.string() + " --file " + (d.path / "big.txt").string() + " --json 2>&1 >/dev/null");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "hyperion: error: out of memory")) << r.out;
}

}  // namespace
