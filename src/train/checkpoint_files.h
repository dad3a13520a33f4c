// What a trainer owns inside <run dir>/checkpoints, shared by the language-model and the
// recommender trainers: the step directories it publishes and, inside each, the files it
// wrote. Rotation and re-saves delete only those files (by name), so anything a user put
// into a checkpoint directory (an exported GGUF, notes, an evaluation) is never deleted:
// the directory is then kept with those files, and the log says so.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace hyperion {

// A file name a trainer writes into a checkpoint: model.safetensors, model-R-of-N
// shards and their index, optimizer.safetensors and its shards, config.json,
// tokenizer.model, trainer_state.json, quantization.safetensors.
bool is_trainer_checkpoint_file(const std::string& name);

// A directory name that is a step number ("200"), with the step.
bool parse_step_name(const std::string& name, int64_t* step);

// Step directories under `checkpoints_dir`, oldest first (complete or not).
std::vector<std::pair<int64_t, std::filesystem::path>> list_step_dirs(
    const std::string& checkpoints_dir);

// Deletes the trainer's files of one checkpoint directory, then the directory when
// nothing else is left in it. Returns the names of the files kept (not the trainer's).
std::vector<std::string> remove_checkpoint(const std::filesystem::path& dir);

// Publishes the complete checkpoint written into `tmp` as `checkpoints_dir`/`step` (fsync,
// rename, fsync), then deletes the oldest complete checkpoints beyond `keep`, never the
// one just published (a run resumed from an older checkpoint may hold newer ones). A
// re-save of an existing step replaces the trainer's files and keeps any others.
void publish_checkpoint(const std::string& checkpoints_dir, const std::string& tmp, int64_t step,
                        int64_t keep);

}  // namespace hyperion
