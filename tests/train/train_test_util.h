// Helpers shared by the end-to-end training tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/threads.h"

namespace hyperion::testing_util {

// A fresh temporary directory per test process and prefix (emptied on first use, then
// the same path): the runs of a test file share it, so the bundled corpus is prepared once.
// Removed when the process exits (a training test's directory holds checkpoints: hundreds
// of MB left in /tmp by every run otherwise).
inline std::string process_temp_root(const std::string& prefix) {
  struct Made {
    std::set<std::string> roots;
    ~Made() {
      std::error_code ec;
      for (const auto& r : roots) std::filesystem::remove_all(r, ec);
    }
  };
  static Made made;
  const std::string r = testing::TempDir() + prefix + "_" + std::to_string(::getpid());
  if (made.roots.insert(r).second) {
    std::filesystem::remove_all(r);
    std::filesystem::create_directories(r);
  }
  return r;
}

// A small Llama on the bundled corpus's first 256 KB (vocab 512, dim 64, 2 layers, 64-token sequences,
// batch 8): the overrides of every end-to-end training test; callers append their own
// (later overrides win).
inline std::vector<std::string> small_run_overrides(const std::string& root,
                                                    const std::string& run_name,
                                                    const std::string& dtype, int64_t steps) {
  return {"dataset_path=" + small_corpus(),
          "vocab_size=512",
          "base_emb_dim=64",
          "base_num_decoder_layers=2",
          "base_num_query_heads=4",
          "base_num_kv_heads=2",
          "base_mlp_dim=176",
          "max_target_length=64",
          "per_device_batch_size=8",
          "steps=" + std::to_string(steps),
          "learning_rate=3e-3",
          "warmup_steps_fraction=0.05",
          "dtype=" + dtype,
          "remat_policy=minimal",
          "base_output_directory=" + root,
          "run_name=" + run_name,
          "peak_tflops=1",
          "sample_count=1",
          "sample_max_tokens=8",
          "eval_batches=4",
          "log_period=1000"};
}

// The dataset the runs under `root` prepared from `stem` at vocabulary `vocab`
// (<root>/datasets/<stem>-v<vocab>-<key>/, the key being a hash of its inputs: the one
// directory of that prefix).
inline std::string prepared_dataset(const std::string& root, const std::string& stem = "fortunes",
                                    int vocab = 512) {
  const std::string prefix = stem + "-v" + std::to_string(vocab) + "-";
  std::string found;
  for (const auto& e : std::filesystem::directory_iterator(root + "/datasets"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) {
      EXPECT_TRUE(found.empty()) << "two datasets of prefix " << prefix << " under " << root;
      found = e.path().string();
    }
  EXPECT_FALSE(found.empty()) << "no dataset " << prefix << "* under " << root;
  return found;
}

// End-to-end training tests run single-threaded: CTest runs tests in parallel on a small
// machine, and OpenMP regions waiting on a descheduled second thread would make these
// runs slow without testing anything more (the kernel tests cover thread counts).
class ScopedSingleThread {
 public:
  ScopedSingleThread() : saved_(num_threads()) { set_num_threads(1); }
  ~ScopedSingleThread() { set_num_threads(saved_); }
  ScopedSingleThread(const ScopedSingleThread&) = delete;
  ScopedSingleThread& operator=(const ScopedSingleThread&) = delete;

 private:
  int saved_;
};

}  // namespace hyperion::testing_util
