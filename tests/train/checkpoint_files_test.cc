// What checkpoint rotation and re-saves may delete (train/checkpoint_files.h): only the
// files a trainer writes, never a file a user put into a checkpoint directory, and never
// the checkpoint just written.
#include "train/checkpoint_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../test_files.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;
using testing_util::TempDir;

void put(const fs::path& p, const std::string& text = "x") {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// A complete checkpoint as the trainer writes it, in a temp directory beside the others.
std::string written(const fs::path& checkpoints, const std::string& tmp_name) {
  const fs::path tmp = checkpoints / tmp_name;
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json",
                        "tokenizer.model", "trainer_state.json"})
    put(tmp / f);
  return tmp.string();
}

TEST(CheckpointFiles, TrainerFileNames) {
  for (const char* f :
       {"model.safetensors", "model.safetensors.index.json", "optimizer.safetensors",
        "config.json", "tokenizer.model", "trainer_state.json", "quantization.safetensors",
        "model-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors",
        "model-1-of-2.safetensors"})
    EXPECT_TRUE(is_trainer_checkpoint_file(f)) << f;
  for (const char* f : {"model-f16.gguf", "notes.txt", "model-x-of-2.safetensors",
                        "model-1-of-.safetensors", "model.safetensors.bak", "eval.json"})
    EXPECT_FALSE(is_trainer_checkpoint_file(f)) << f;
}

TEST(CheckpointFiles, RotationKeepsWhatTheTrainerDidNotWrite) {
  TempDir dir;
  const fs::path ck = dir.path / "checkpoints";
  publish_checkpoint(ck.string(), written(ck, ".tmp-1"), 1, 1);
  put(ck / "1" / "model-f16.gguf", "an export");  // a user's file in checkpoint 1
  publish_checkpoint(ck.string(), written(ck, ".tmp-2"), 2, 1);
  // Checkpoint 1's trainer files are gone, the export stays (with its directory).
  EXPECT_TRUE(fs::exists(ck / "1" / "model-f16.gguf"));
  EXPECT_FALSE(fs::exists(ck / "1" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "1" / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(ck / "2" / "model.safetensors"));
  // A directory of the trainer's files only goes whole.
  publish_checkpoint(ck.string(), written(ck, ".tmp-3"), 3, 1);
  EXPECT_FALSE(fs::exists(ck / "2"));
  EXPECT_TRUE(fs::exists(ck / "3" / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(ck / "1" / "model-f16.gguf"));  // still, and not counted again
}

TEST(CheckpointFiles, ResavingAStepKeepsForeignFiles) {
  TempDir dir;
  const fs::path ck = dir.path / "checkpoints";
  publish_checkpoint(ck.string(), written(ck, ".tmp-a"), 5, 3);
  put(ck / "5" / "notes.txt", "mine");
  publish_checkpoint(ck.string(), written(ck, ".tmp-b"), 5, 3);
  std::ifstream in(ck / "5" / "notes.txt");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "mine");
  EXPECT_TRUE(fs::exists(ck / "5" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(ck / ".tmp-b"));
}

TEST(CheckpointFiles, TheCheckpointJustWrittenIsNeverRotatedAway) {
  // A run resumed from step 10 of a run that had gone on to 20 and 30: its step 11 is the
  // oldest, but it is the one just written.
  TempDir dir;
  const fs::path ck = dir.path / "checkpoints";
  for (int step : {10, 20, 30})
    publish_checkpoint(ck.string(), written(ck, ".tmp-" + std::to_string(step)), step, 5);
  publish_checkpoint(ck.string(), written(ck, ".tmp-11"), 11, 2);
  EXPECT_TRUE(fs::exists(ck / "11" / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(ck / "30" / "trainer_state.json"));
  EXPECT_FALSE(fs::exists(ck / "20"));
  EXPECT_FALSE(fs::exists(ck / "10"));
}

TEST(CheckpointFiles, StepNames) {
  int64_t step = -1;
  EXPECT_TRUE(parse_step_name("200", &step));
  EXPECT_EQ(step, 200);
  for (const char* bad : {"", "-1", "2a", "1234567890123456789", "200-f16.gguf", ".tmp-3"})
    EXPECT_FALSE(parse_step_name(bad, &step)) << bad;
}

}  // namespace
}  // namespace hyperion
