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

// `resume`: a run or checkpoint directory to continue ("" = base_output_directory/
// run_name, or <name>-<timestamp> without a run_name). With several ranks, per-rank log
// files go to dir/logs/rank-R.log (rank 0 keeps the console). Returns the directory;
// rank 0 holds `lock` on it.
std::string open_run_directory(const TrainConfig& t, const std::string& resume,
                               dist::Communicator& comm, std::optional<io::DirectoryLock>& lock);

// The same string on every rank: rank 0's (a collective).
std::string agree_on_rank0(dist::Communicator& comm, const std::string& value);

}  // namespace hyperion
