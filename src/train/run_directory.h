// The run directory every training job writes into (checkpoints/, metrics.jsonl,
// events.jsonl, logs/): chosen once, agreed by every rank, and locked by rank 0 so that
// a second job cannot interleave its files with this one's. Shared by the language
// model trainer and the recommender trainer.
#pragma once

#include <optional>
#include <string>

#include "dist/communicator.h"
#include "io/directory_lock.h"
#include "train/train_config.h"

namespace hyperion {

// A run directory is one hyperion made: it holds the marker kRunMarker, written when the
// directory is created. (Runs made before the marker existed are recognised by the lock
// file every training takes, io/directory_lock.h, and get the marker.) hyperion never
// adopts a directory it did not make: it neither rotates its checkpoints nor appends to
// its files.
inline constexpr const char* kRunMarker = ".hyperion-run";
bool is_run_directory(const std::string& dir);

// Where a training writes. `resume` "": base_output_directory/run_name (or
// <name>-<timestamp> without a run_name), refused when it exists, is not empty and is not
// a run directory. `resume` a run directory: that directory (refused when it is not one).
// `resume` a checkpoint: its run directory when it sits at RUN/checkpoints/STEP of one;
// any other checkpoint (copied elsewhere, downloaded) starts a new run directory, named
// as without `resume`, that continues from it.
std::string choose_run_directory(const TrainConfig& t, const std::string& resume);

// Chooses the run directory (on rank 0; every rank agrees), creates it with its marker
// and locks it. With several ranks, per-rank log files go to dir/logs/rank-R.log (rank 0
// keeps the console). Returns the directory; rank 0 holds `lock` on it. `created`, when
// given, says on rank 0 whether the directory did not exist before.
std::string open_run_directory(const TrainConfig& t, const std::string& resume,
                               dist::Communicator& comm, std::optional<io::DirectoryLock>& lock,
                               bool* created = nullptr);

// The same string on every rank: rank 0's (a collective).
std::string agree_on_rank0(dist::Communicator& comm, const std::string& value);

}  // namespace hyperion
