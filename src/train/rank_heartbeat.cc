#include "train/rank_heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

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
    : dir_(std::move(dir)),
      path_(fmt::format("{}/rank-{}", dir_, rank)),
      host_(std::move(host)),
      rank_(rank) {
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
  if (!aborting_.load()) write("exited", true);
}

void RankHeartbeat::aborting() {
  if (aborting_.exchange(true)) return;
  write("aborting", true);
  const int fd = ::open(fmt::format("{}/{}", dir_, kAbortedMarker).c_str(),
                        O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
}

// Temp file + rename, so a reader never sees half a line; no fsync (a status is worth
// nothing after a crash of this machine, and thousands of ranks fsyncing on a shared
// filesystem every second would cost the filesystem more than the report is worth). A
// status that cannot be written (a full disk) only costs the launcher's report.
void RankHeartbeat::write(const std::string& state, bool final_state) {
  // One writer at a time, and once this rank is aborting nothing else overwrites it (the
  // writer thread may have read the old state just before).
  std::lock_guard<std::mutex> lock(write_mutex_);
  if (aborting_.load() && !final_state) return;
  const std::string text = fmt::format("{} {} {} {:.3f} {}\n", rank_, host_, ::getpid(),
                                       monitor::unix_time(), state);
  const std::string tmp = fmt::format("{}.tmp-{}", path_, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path_.c_str()) != 0) ::unlink(tmp.c_str());
}

// A change of state (a stop signal) is written within 0.2 s; an unchanged one is
// refreshed once a second.
void RankHeartbeat::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  std::string last = "running";
  auto written = std::chrono::steady_clock::now();
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (stop_ || aborting_.load()) continue;
    const int sig = stop_signal_received();
    const std::string state = sig != 0 ? fmt::format("signal {}", sig) : std::string("running");
    const auto now = std::chrono::steady_clock::now();
    if (state == last && now - written < std::chrono::seconds(1)) continue;
    lock.unlock();
    write(state);
    lock.lock();
    last = state;
    written = now;
  }
}

std::vector<RankStatus> read_rank_status(const std::string& dir) {
  std::map<int, RankStatus> by_rank;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string file = e.path().filename().string();
    if (file.rfind("rank-", 0) != 0 || file.find(".tmp-") != std::string::npos) continue;
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
