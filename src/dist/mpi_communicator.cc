// The MPI Communicator. All MPI calls happen on one communication thread (the thread
// that initialised MPI, so MPI_THREAD_FUNNELED suffices): the training thread queues
// collectives and goes on computing, which is how gradient buckets overlap the
// backward pass. Each collective is started non-blocking and driven by MPI_Test, with
// short sleeps between tests once it has been pending a while, so a rank that waits for
// its peers does not take the core its compute threads run on.
//
// Failure detection: every collective has a deadline. When one passes, this rank asks
// every peer (a ping on a separate tag, answered by the peer's communication thread even
// while its training thread is stuck) how many collectives it has issued. A peer that
// does not answer is dead or stopped; one that answers with a lower count is behind
// (hung or crashed before the collective). The report names them, then MPI_Abort ends
// every rank. A rank that dies outright is also caught by mpirun, which ends the job.
// The deprecated MPI C++ bindings stay out: only the C API is used and linked.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/exit_codes.h"
#include "base/log.h"
#include "dist/communicator.h"
#include "dist/host_list.h"

namespace hyperion::dist {
namespace {

constexpr int kPingTag = 0x4859;  // "HY": failure-detection ping
constexpr int kPongTag = 0x4860;
constexpr int kSendRecvTag = 0x4861;

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
}

int as_int(size_t n, const char* call) {
  HYP_CHECK(n <= static_cast<size_t>(INT32_MAX),
            "{}: {} elements exceed MPI's int count limit; use smaller buckets", call, n);
  return static_cast<int>(n);
}

// Serial on purpose: this runs on the communication thread, and an OpenMP region here
// would start a second thread team competing with the training thread's (the loop
// vectorises; the trainer avoids it altogether by reducing with kSum).
void scale(float* data, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) data[i] *= s;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) : timeout_s_(timeout_s) {
    HYP_CHECK(timeout_s > 0, "collective_timeout_s must be > 0, got {}", timeout_s);
    thread_ = std::thread([this] { thread_main(); });
    std::unique_lock<std::mutex> lock(mutex_);
    cv_done_.wait(lock, [&] { return initialised_ || error_ != nullptr; });
    if (error_) {
      lock.unlock();
      thread_.join();
      std::rethrow_exception(error_);
    }
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_work_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "mpi"; }
  std::string host(int r) const override {
    return r >= 0 && r < world_ ? hosts_[static_cast<size_t>(r)] : "?";
  }

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    abort_code_.store(code);
    cv_work_.notify_all();
    // The communication thread calls MPI_Abort, which ends this process too.
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

 protected:
  Request submit(std::function<void()> op) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const Request id = ++submitted_;
    queue_.push_back({id, std::move(op)});
    cv_work_.notify_one();
    return id;
  }

  void wait_for(Request r) override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_done_.wait(lock, [&] { return completed_ >= r || error_ != nullptr; });
    if (error_) std::rethrow_exception(error_);
  }

  void do_all_reduce(float* data, size_t count, ReduceOp op) override {
    // MPI counts are ints: large buffers go in pieces.
    constexpr size_t kPiece = size_t{1} << 30;
    for (size_t off = 0; off < count; off += kPiece) {
      const size_t n = std::min(kPiece, count - off);
      MPI_Request req;
      MPI_Iallreduce(MPI_IN_PLACE, data + off, static_cast<int>(n), MPI_FLOAT, mpi_op(op),
                     MPI_COMM_WORLD, &req);
      complete(req, "all_reduce", n * sizeof(float));
    }
    if (op == ReduceOp::kAvg) scale(data, count, 1.0f / static_cast<float>(world_));
  }

  void do_reduce_scatter_v(const float* send, float* recv, const size_t* counts,
                           ReduceOp op) override {
    std::vector<int> c(static_cast<size_t>(world_));
    size_t total = 0;
    for (int r = 0; r < world_; ++r) {
      c[static_cast<size_t>(r)] = as_int(counts[r], "reduce_scatter");
      total += counts[r];
    }
    const size_t mine = counts[rank_];
    // MPI's in-place reduce-scatter takes its input from recv; copy out when the caller
    // used the in-place layout (recv inside send).
    std::vector<float> staged;
    const float* in = send;
    const auto s = reinterpret_cast<uintptr_t>(send);
    const auto r = reinterpret_cast<uintptr_t>(recv);
    if (mine != 0 && r >= s && r < s + total * sizeof(float)) {
      staged.assign(send, send + total);
      in = staged.data();
    }
    MPI_Request req;
    MPI_Ireduce_scatter(in, recv, c.data(), MPI_FLOAT, mpi_op(op), MPI_COMM_WORLD, &req);
    complete(req, "reduce_scatter", total * sizeof(float));
    if (op == ReduceOp::kAvg) scale(recv, mine, 1.0f / static_cast<float>(world_));
  }

  void do_all_gather_bytes(void* data, const size_t* counts) override {
    std::vector<int> c(static_cast<size_t>(world_)), displ(static_cast<size_t>(world_));
    size_t off = 0;
    for (int r = 0; r < world_; ++r) {
      c[static_cast<size_t>(r)] = as_int(counts[r], "all_gather");
      displ[static_cast<size_t>(r)] = as_int(off, "all_gather");
      off += counts[r];
    }
    MPI_Request req;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, c.data(), displ.data(), MPI_BYTE,
                    MPI_COMM_WORLD, &req);
    complete(req, "all_gather", off);
  }

  void do_broadcast(void* data, size_t bytes, int root) override {
    MPI_Request req;
    MPI_Ibcast(data, as_int(bytes, "broadcast"), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    complete(req, "broadcast", bytes);
  }

  void do_barrier() override {
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    complete(req, "barrier", 0);
  }

  void do_all_to_all_v(const void* send, const size_t* send_bytes, void* recv,
                       const size_t* recv_bytes) override {
    const size_t w = static_cast<size_t>(world_);
    std::vector<int> sc(w), sd(w), rc(w), rd(w);
    size_t so = 0, ro = 0;
    for (size_t r = 0; r < w; ++r) {
      sc[r] = as_int(send_bytes[r], "all_to_all_v");
      sd[r] = as_int(so, "all_to_all_v");
      rc[r] = as_int(recv_bytes[r], "all_to_all_v");
      rd[r] = as_int(ro, "all_to_all_v");
      so += send_bytes[r];
      ro += recv_bytes[r];
    }
    MPI_Request req;
    MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE,
                   MPI_COMM_WORLD, &req);
    complete(req, "all_to_all_v", so);
  }

  void do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv, size_t recv_bytes,
                   int source) override {
    MPI_Request reqs[2];
    MPI_Irecv(recv, as_int(recv_bytes, "sendrecv"), MPI_BYTE, source, kSendRecvTag,
              MPI_COMM_WORLD, &reqs[0]);
    MPI_Isend(send, as_int(send_bytes, "sendrecv"), MPI_BYTE, dest, kSendRecvTag, MPI_COMM_WORLD,
              &reqs[1]);
    complete(reqs[1], "sendrecv", send_bytes);
    complete(reqs[0], "sendrecv", recv_bytes);
  }

 private:
  struct Item {
    Request id;
    std::function<void()> op;
  };

  void thread_main() {
    try {
      int provided = 0;
      int init = 0;
      MPI_Initialized(&init);
      HYP_CHECK(!init, "mpi: MPI is already initialised in this process");
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &world_);
      gather_hosts();
      post_ping_recv();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      cv_done_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      initialised_ = true;
    }
    cv_done_.notify_all();
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // Idle: wake every 2 ms to answer pings and to notice an abort request.
        while (queue_.empty() && !stop_ && abort_code_.load() < 0) {
          lock.unlock();
          serve_pings();
          lock.lock();
          cv_work_.wait_for(lock, std::chrono::milliseconds(2));
        }
        if (abort_code_.load() >= 0) do_abort();
        if (queue_.empty() && stop_) break;
        item = std::move(queue_.front());
        queue_.pop_front();
        current_ = item.id;
      }
      std::exception_ptr failure;
      try {
        item.op();
      } catch (...) {
        failure = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        completed_ = item.id;
        if (failure) error_ = failure;
      }
      cv_done_.notify_all();
    }
    // Peers may still ping while we finish; the ping receive is cancelled first.
    MPI_Cancel(&ping_req_);
    MPI_Wait(&ping_req_, MPI_STATUS_IGNORE);
    for (MPI_Request& r : pong_reqs_) MPI_Wait(&r, MPI_STATUS_IGNORE);
    MPI_Finalize();
  }

  [[noreturn]] void do_abort() {
    notify_abort_observer();
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, abort_code_.load());
    std::_Exit(abort_code_.load());
  }

  // Every rank's hostname, in rank order (fixed-size slots: one MPI_Allgather).
  void gather_hosts() {
    constexpr size_t kSlot = 256;
    std::string mine = this_host_name();
    mine.resize(kSlot - 1, '\0');
    std::vector<char> all(kSlot * static_cast<size_t>(world_), '\0');
    MPI_Allgather(mine.c_str(), static_cast<int>(kSlot), MPI_CHAR, all.data(),
                  static_cast<int>(kSlot), MPI_CHAR, MPI_COMM_WORLD);
    hosts_.clear();
    for (int r = 0; r < world_; ++r) hosts_.emplace_back(all.data() + kSlot * static_cast<size_t>(r));
  }

  void post_ping_recv() {
    MPI_Irecv(&ping_value_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kPingTag, MPI_COMM_WORLD, &ping_req_);
  }

  // Answers pending pings with the number of collectives this rank's training thread has
  // issued so far.
  void serve_pings() {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      MPI_Test(&ping_req_, &flag, &status);
      if (!flag) break;
      int64_t issued = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        issued = static_cast<int64_t>(submitted_);
      }
      pong_values_.push_back(issued);
      pong_reqs_.emplace_back();
      MPI_Isend(&pong_values_.back(), 1, MPI_INT64_T, status.MPI_SOURCE, kPongTag, MPI_COMM_WORLD,
                &pong_reqs_.back());
      post_ping_recv();
    }
    // Retire finished pong sends (a deque keeps the values' addresses stable).
    while (!pong_reqs_.empty()) {
      int flag = 0;
      MPI_Test(&pong_reqs_.front(), &flag, MPI_STATUS_IGNORE);
      if (!flag) break;
      pong_reqs_.pop_front();
      pong_values_.pop_front();
    }
  }

  // Drives `req` to completion: tight tests first (short collectives finish at once),
  // then tests with sleeps, so a long wait for peers leaves the core to compute threads.
  void complete(MPI_Request& req, const char* what, size_t bytes) {
    const Clock::time_point start = Clock::now();
    int spins = 0;
    for (;;) {
      int flag = 0;
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (flag) return;
      if (abort_code_.load() >= 0) do_abort();
      if (++spins < 64) continue;
      serve_pings();
      if (since(start) > timeout_s_) diagnose_and_abort(what, bytes);
      // Back off from 10 us to 400 us: a peer still computing its backward can keep us
      // waiting for a whole layer, and frequent wake-ups would steal that much more of
      // the core this rank's compute thread runs on.
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(400, 10 * (spins - 63))));
    }
  }

  [[noreturn]] void diagnose_and_abort(const char* what, size_t bytes) {
    const Request mine = current_;
    const size_t w = static_cast<size_t>(world_);
    std::vector<int64_t> ping(w, static_cast<int64_t>(mine)), pong(w, -1);
    std::vector<MPI_Request> sends(w, MPI_REQUEST_NULL), recvs(w, MPI_REQUEST_NULL);
    std::vector<int> answered(w, 0);
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      MPI_Isend(&ping[static_cast<size_t>(p)], 1, MPI_INT64_T, p, kPingTag, MPI_COMM_WORLD,
                &sends[static_cast<size_t>(p)]);
      MPI_Irecv(&pong[static_cast<size_t>(p)], 1, MPI_INT64_T, p, kPongTag, MPI_COMM_WORLD,
                &recvs[static_cast<size_t>(p)]);
    }
    const Clock::time_point start = Clock::now();
    while (since(start) < 3.0) {
      serve_pings();
      bool all = true;
      for (int p = 0; p < world_; ++p) {
        if (p == rank_ || answered[static_cast<size_t>(p)]) continue;
        MPI_Test(&recvs[static_cast<size_t>(p)], &answered[static_cast<size_t>(p)],
                 MPI_STATUS_IGNORE);
        all = all && answered[static_cast<size_t>(p)];
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string dead, behind;
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      const size_t i = static_cast<size_t>(p);
      if (!answered[i]) {
        dead += fmt::format("{}{}", dead.empty() ? "" : ", ", rank_and_host(*this, p));
      } else if (pong[i] < static_cast<int64_t>(mine)) {
        behind += fmt::format("{}{} issued {}", behind.empty() ? "" : ", ", rank_and_host(*this, p),
                              pong[i]);
      }
    }
    std::string cause;
    if (!dead.empty())
      cause += fmt::format("{} not responding (dead, stopped or cut off)", dead);
    if (!behind.empty())
      cause += fmt::format("{}behind, never reached this collective: {}", cause.empty() ? "" : "; ",
                           behind);
    if (cause.empty()) cause = "every rank answered and reached it (a network stall?)";
    log_error(
        "{}: collective #{} ({}, {} bytes) did not finish within collective_timeout_s = {} "
        "s: {}. Aborting the job.",
        rank_and_host(*this, rank_), mine, what, bytes, timeout_s_, cause);
    // A peer that does not answer is a lost process or host: a system failure, restarted
    // (launch/restart_policy.h). Peers that answer but never reach the collective are a
    // hang of the job's own making, and restarting it would hang again.
    abort_code_.store(dead.empty() ? 3 : kExitSystemFailure);
    do_abort();
  }

  double timeout_s_;
  int rank_ = 0, world_ = 1;
  std::vector<std::string> hosts_;  // by rank, set before the constructor returns
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<Item> queue_;
  Request submitted_ = 0, completed_ = 0, current_ = 0;
  bool initialised_ = false, stop_ = false;
  std::exception_ptr error_;
  std::atomic<int> abort_code_{-1};
  // Failure-detection state (communication thread only).
  int64_t ping_value_ = 0;
  MPI_Request ping_req_ = MPI_REQUEST_NULL;
  std::deque<int64_t> pong_values_;
  std::deque<MPI_Request> pong_reqs_;
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

}  // namespace

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(text, &len);  // one of the few calls allowed before MPI_Init
  std::string out(text, static_cast<size_t>(std::max(len, 0)));
  if (const size_t comma = out.find(','); comma != std::string::npos) out.resize(comma);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\0')) out.pop_back();
  return out;
}

LaunchInfo detect_launch() {
  LaunchInfo info;
  // Open MPI's mpirun, then PMIx/PMI launchers (hydra). Slurm's srun --mpi=pmix sets
  // PMIX_RANK but no size: the step's task count is Slurm's.
  const bool slurm_pmi = std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr;
  const int slurm_size =
      slurm_pmi ? env_int("SLURM_STEP_NUM_TASKS", env_int("SLURM_NTASKS", 0)) : 0;
  const int size =
      env_int("OMPI_COMM_WORLD_SIZE", env_int("PMIX_SIZE", env_int("PMI_SIZE", slurm_size)));
  if (size <= 0) return info;
  info.under_mpi = true;
  info.world = size;
  info.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMIX_RANK", env_int("PMI_RANK", 0)));
  // Ranks on this host: this node's entry (SLURM_NODEID) of SLURM_STEP_TASKS_PER_NODE,
  // "2" or "2(x3),1" (a step over 4 nodes may put 2 ranks on one and 1 on another).
  int slurm_local = 1;
  if (const char* per_node = std::getenv("SLURM_STEP_TASKS_PER_NODE"); slurm_pmi && per_node)
    slurm_local = std::max(1, slurm_tasks_on_node(per_node, env_int("SLURM_NODEID", 0)));
  info.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", slurm_local));
  info.local_rank =
      env_int("OMPI_COMM_WORLD_LOCAL_RANK",
              env_int("MPI_LOCALRANKID", slurm_pmi ? env_int("SLURM_LOCALID", 0) : 0));
  return info;
}

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s) {
  return std::make_unique<MpiCommunicator>(timeout_s);
}

std::unique_ptr<Communicator> make_communicator(const std::string& kind, double timeout_s) {
  if (kind == "single") return make_single_process_communicator();
  if (kind == "mpi") return make_mpi_communicator(timeout_s);
  HYP_CHECK(kind == "auto", "communicator: '{}' is not one of auto, single, mpi", kind);
  const LaunchInfo launch = detect_launch();
  if (launch.under_mpi && launch.world > 1) return make_mpi_communicator(timeout_s);
  return make_single_process_communicator();
}

}  // namespace hyperion::dist
