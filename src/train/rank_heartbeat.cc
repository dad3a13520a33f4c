#include "train/rank_heartbeat.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "base/log.h"
#include "io/atomic_file.h"
#include "monitor/event_log.h"
#include "dist/communicator.h"
#include "train/stop_signal.h"

namespace hyperion {

namespace fs = std::filesystem;

namespace {

// The live heartbeat, for the communicator's abort path (a collective timeout ends the
// job from the communication thread, not through the trainer).
std::atomic<RankHeartbeat*> g_live{nullptr};

void on_abort() {
  if (RankHeartbeat* h = g_live.load()) h->aborting();
}

}  // namespace

RankHeartbeat::RankHeartbeat(std::string dir, int rank, std::string host)
    : path_(fmt::format("{}/rank-{}", dir, rank)), host_(std::move(host)), rank_(rank) {
  write("running");
  thread_ = std::thread([this] { loop(); });
  g_live.store(this);
  dist::set_abort_observer(on_abort);
}

RankHeartbeat::~RankHeartbeat() {
  dist::set_abort_observer(nullptr);
  g_live.store(nullptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (!aborting_.load()) write("exited");
}

void RankHeartbeat::aborting() {
  if (aborting_.exchange(true)) return;
  write("aborting");
}

void RankHeartbeat::write(const std::string& state) {
  // A status that cannot be written (a full disk) only costs the launcher's report.
  try {
    io::write_file_atomic(path_, fmt::format("{} {} {} {:.3f} {}\n", rank_, host_, ::getpid(),
                                             monitor::unix_time(), state));
  } catch (const std::exception& e) {
    log_debug("heartbeat: {}", e.what());
  }
}

void RankHeartbeat::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (stop_ || aborting_.load()) continue;
    const int sig = stop_signal_received();
    lock.unlock();
    write(sig != 0 ? fmt::format("signal {}", sig) : std::string("running"));
    lock.lock();
  }
}

std::vector<RankStatus> read_rank_status(const std::string& dir) {
  std::map<int, RankStatus> by_rank;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("rank-", 0) != 0) continue;
    std::ifstream in(e.path());
    RankStatus s;
    std::string line;
    if (!std::getline(in, line)) continue;
    std::istringstream words(line);
    if (!(words >> s.rank >> s.host >> s.pid >> s.time)) continue;
    std::getline(words >> std::ws, s.state);
    if (s.rank >= 0) by_rank[s.rank] = s;
  }
  std::vector<RankStatus> out;
  for (auto& [r, s] : by_rank) out.push_back(std::move(s));
  return out;
}

std::string diagnose_lost_ranks(const std::vector<RankStatus>& status, int world,
                                double ended_at) {
  std::vector<bool> seen(static_cast<size_t>(std::max(world, 0)), false);
  // Host -> its lost ranks' descriptions, in rank order of first appearance.
  std::vector<std::pair<std::string, std::string>> lost;
  auto add = [&](const std::string& host, const std::string& what) {
    for (auto& [h, w] : lost)
      if (h == host) {
        w += ", " + what;
        return;
      }
    lost.emplace_back(host, what);
  };
  for (const RankStatus& s : status) {
    if (s.rank < world) seen[static_cast<size_t>(s.rank)] = true;
    if (s.state != "running") continue;
    add(s.host, fmt::format("rank {} (last heard {:.1f} s before the job ended)", s.rank,
                            std::max(0.0, ended_at - s.time)));
  }
  // A rank with no file at all never got as far as the trainer (its host failed at
  // start-up); counted only when others did report.
  std::string never;
  for (int r = 0; r < world && !status.empty(); ++r)
    if (!seen[static_cast<size_t>(r)]) never += fmt::format("{}{}", never.empty() ? "" : ", ", r);
  std::string out;
  for (const auto& [host, what] : lost)
    out += fmt::format("{}host {}: {}", out.empty() ? "" : "; ", host, what);
  if (!out.empty()) out = "lost without a word (host down, killed or cut off): " + out;
  if (!never.empty())
    out += fmt::format("{}rank {} never reported (did not start)", out.empty() ? "" : "; ", never);
  return out;
}

}  // namespace hyperion
