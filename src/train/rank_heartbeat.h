// What each rank of a multi-host job was doing when the job ended, for the launcher's
// report. A rank lost with its host (killed, powered off, cut off) says nothing itself,
// and mpirun then ends the job with a message that does not name it; so each rank keeps a
// small status file in a directory the launcher made on the shared filesystem
// (HYPERION_LAUNCH_DIR) and rewrites it every second, and within 0.2 s of a change:
// host, pid, time, and its state:
//
//   running          training (the last rewrite's time says until when)
//   signal N         got stop signal N (mpirun's SIGTERM to the survivors of a failure,
//                    or a scheduler's stop)
//   aborting         this rank ended the job itself (an error, or a peer it found dead)
//   exited           finished normally
//
// After mpirun fails, the ranks still "running" are the lost ones: no signal reached
// them, they did not finish and they did not abort. diagnose_lost_ranks names them and
// their hosts.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hyperion {

inline constexpr const char* kLaunchDirEnv = "HYPERION_LAUNCH_DIR";
// Made in the launch directory by the first rank that aborts the job: the launcher waits
// on this one name rather than reading every rank's status while the job runs.
inline constexpr const char* kAbortedMarker = "aborted";

class RankHeartbeat {
 public:
  // Starts the writer thread; `dir` must exist (the launcher made it).
  RankHeartbeat(std::string dir, int rank, std::string host);
  ~RankHeartbeat();  // writes "exited" unless aborting() was called
  RankHeartbeat(const RankHeartbeat&) = delete;
  RankHeartbeat& operator=(const RankHeartbeat&) = delete;

  // This rank is about to end the job (written at once, before MPI_Abort).
  void aborting();

 private:
  void write(const std::string& state, bool final_state = false);
  void loop();

  std::string dir_, path_, host_;
  int rank_;
  std::atomic<bool> aborting_{false};
  std::mutex mutex_, write_mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

struct RankStatus {
  int rank = -1;
  std::string host;
  long pid = 0;
  double time = 0;  // unix seconds of the last rewrite
  std::string state;
};

// Every rank's last status in `dir` (rank order; files that do not parse are skipped).
std::vector<RankStatus> read_rank_status(const std::string& dir);

// The launcher's report after a failed job of `world` ranks: the lost ranks (still
// "running", or with no status file at all) by host, and how long before the job ended
// each was last heard from; empty when none was lost (the ranks' own errors say why).
std::string diagnose_lost_ranks(const std::vector<RankStatus>& status, int world,
                                double ended_at);

}  // namespace hyperion
