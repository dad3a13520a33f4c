// Per-op device time for the CUDA backend, without a profiler tool: with
// HYPERION_CUDA_OP_TIMES=FILE set, the backend records an event after every op it queues
// and, at each synchronisation, adds the time between consecutive events to the op's
// total. After each synchronisation a short kernel holds the stream (hold_stream) while
// the host queues the next ops, so they run back to back and the gaps between events are
// the ops' own time, not the host's launch latency. At exit FILE gets a table: each op's
// launches, total and mean time and share of the device time measured (ops recorded into
// a graph are not timed). For diagnosis only: the hold makes every step slower.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hyperion::cuda {

class OpProfiler {
 public:
  // Null unless HYPERION_CUDA_OP_TIMES names a file.
  static OpProfiler* from_environment();
  // After an op was queued on `stream`.
  void mark(const std::string& op, cudaStream_t stream);
  // After `stream` was synchronised: folds the events into the totals, then holds the
  // stream for the next ops.
  void synchronized(cudaStream_t stream);
  // Drops the totals so far (events still pending are timed into the new totals).
  void restart() { totals_.clear(); }

 private:
  explicit OpProfiler(std::string path) : path_(std::move(path)) {}
  void write() const;
  struct Total {
    int64_t launches = 0;
    double ms = 0;
  };
  std::string path_;
  cudaEvent_t start_ = nullptr;
  bool started_ = false;
  std::vector<std::pair<std::string, cudaEvent_t>> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, Total> totals_;
};

}  // namespace hyperion::cuda
