#include "kernels/cuda/op_profiler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "kernels/cuda/cuda_kernels.h"

namespace hyperion::cuda {
namespace {

// Long enough for the host to queue a decode step's few hundred launches behind it.
constexpr int64_t kHoldNs = 20'000'000;

OpProfiler* g_profiler = nullptr;

}  // namespace

OpProfiler* OpProfiler::from_environment() {
  const char* path = std::getenv("HYPERION_CUDA_OP_TIMES");
  if (path == nullptr || *path == '\0') return nullptr;
  static std::once_flag once;
  std::call_once(once, [&] {
    g_profiler = new OpProfiler(path);  // lives for the process: its table is written at exit
    std::atexit([] { g_profiler->write(); });
  });
  return g_profiler;
}

void OpProfiler::mark(const std::string& op, cudaStream_t stream) {
  if (!started_) {
    if (start_ == nullptr && cudaEventCreate(&start_) != cudaSuccess) return;
    cudaEventRecord(start_, stream);
    started_ = true;
  }
  cudaEvent_t e = nullptr;
  if (!free_.empty()) {
    e = free_.back();
    free_.pop_back();
  } else if (cudaEventCreate(&e) != cudaSuccess) {
    return;
  }
  cudaEventRecord(e, stream);
  pending_.emplace_back(op, e);
}

void OpProfiler::synchronized(cudaStream_t stream) {
  cudaEvent_t prev = start_;
  for (auto& [op, e] : pending_) {
    float ms = 0;
    if (prev != nullptr && cudaEventElapsedTime(&ms, prev, e) == cudaSuccess) {
      Total& t = totals_[op];
      ++t.launches;
      t.ms += ms;
    }
    prev = e;
  }
  for (auto& [op, e] : pending_) free_.push_back(e);
  pending_.clear();
  cudaGetLastError();
  // Hold the stream, then mark where the next ops start.
  hold_stream(stream, kHoldNs);
  if (start_ != nullptr) cudaEventRecord(start_, stream);
  started_ = start_ != nullptr;
}

void OpProfiler::write() const {
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double all = 0;
  for (const auto& [op, t] : rows) all += t.ms;
  const std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fputs(fmt::format("{:<48} {:>9} {:>11} {:>10} {:>7}\n", "op", "launches", "total_ms",
                         "mean_us", "share")
                 .c_str(),
             f);
  for (const auto& [op, t] : rows)
    std::fputs(fmt::format("{:<48} {:>9} {:>11.3f} {:>10.2f} {:>6.1f}%\n", op, t.launches, t.ms,
                           1e3 * t.ms / double(std::max<int64_t>(t.launches, 1)),
                           all > 0 ? 100.0 * t.ms / all : 0.0)
                   .c_str(),
               f);
  std::fclose(f);
  std::rename(tmp.c_str(), path_.c_str());
}

}  // namespace hyperion::cuda
