// Collective communication for multi-process training: the trainer sends gradients
// through a Communicator, one bucket at a time (pointer + count into a flat gradient
// buffer). The *_async forms return at once and run on the implementation's
// communication thread (MPI), so reductions of early buckets overlap later backward work;
// wait() blocks until a request is done. Every blocking call is an async call + wait.
//
// The public calls are non-virtual: they validate the arguments (null buffers with a
// non-zero count, roots out of range, invalid ReduceOp, partially overlapping buffers:
// hyperion::Error naming the call), time the call and count its bytes, then call the
// protected do_* hook that an implementation overrides. So every implementation (the
// single-process one and the Open MPI one, mpi_communicator.cc) gets the same checks and
// the same counters.
//
// Buffer conventions (the NCCL ones, so an MPI/NCCL backend maps 1:1):
//   all_reduce(data, count, op): in place over `count` floats on every rank.
//   reduce_scatter(send, recv, recv_count, op): send holds world * recv_count floats;
//     rank r receives the reduction of block r. In place when
//     recv == send + rank * recv_count.
//   all_gather(send, recv, send_bytes): recv holds world * send_bytes bytes, rank r's
//     contribution at offset r * send_bytes. In place when
//     send == recv + rank * send_bytes.
//   broadcast(data, bytes, root): root's bytes are copied to every rank.
//   reduce_scatter_v(send, recv, counts, op): send holds sum(counts) floats, rank r
//     receives the reduction of its block (counts[r] floats at offset sum(counts[<r])).
//   all_gather_v(data, counts): in place; rank r's counts[r] floats at offset
//     sum(counts[<r]) of data are copied to every rank.
//   all_to_all_v(send, send_bytes, recv, recv_bytes): rank r sends the block of
//     send_bytes[p] bytes (packed in rank order) to rank p and receives recv_bytes[p]
//     bytes from rank p into recv (packed in rank order). Must not overlap.
// Any other overlap between send and recv is an error. Every rank must make the same
// sequence of collective calls with the same counts.
//
// ReduceOp::kAvg is the sum divided by world_size (computed in f32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace hyperion::dist {

enum class ReduceOp { kSum, kAvg, kMax };
const char* reduce_op_name(ReduceOp op);

enum class Collective { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kAllToAll };
inline constexpr int kNumCollectives = 6;
const char* collective_name(Collective c);

// Per-collective counters. Bytes are the payload this rank hands to the collective
// (bytes_sent) and gets back from it (bytes_received), independent of the algorithm
// the backend uses on the wire:
//   all_reduce:      sent count * 4,              received count * 4
//   reduce_scatter:  sent world * recv_count * 4, received recv_count * 4
//   all_gather:      sent send_bytes,             received world * send_bytes
//   broadcast:       root sent bytes, others received bytes
//   barrier:         0, 0
//   all_to_all_v:    sent sum(send_bytes) less its own block, received likewise
// (the _v forms count like their equal-size forms with the actual block sizes).
struct CollectiveStats {
  uint64_t calls = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double seconds = 0.0;  // wall time executing the collective (on the comm thread)
};

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "single" or "mpi"
  // The host rank r runs on: its hostname, gathered when the communicator started (every
  // rank knows every rank's), so a failure report names the machine, not just the rank.
  virtual std::string host(int r) const;

  void all_reduce(float* data, size_t count, ReduceOp op);
  void reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op);
  void all_gather(const void* send, void* recv, size_t send_bytes);
  void broadcast(void* data, size_t bytes, int root);
  void barrier();
  void reduce_scatter_v(const float* send, float* recv, std::span<const size_t> counts,
                        ReduceOp op);
  void all_gather_v(float* data, std::span<const size_t> counts);
  void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes);
  // Point to point, as MPI_Sendrecv: send_bytes to rank `dest` while receiving recv_bytes
  // from rank `source` (the link check's probe: unlike a collective, a rank's time is its
  // own two links'). Counted with all_to_all.
  void sendrecv(const void* send, size_t send_bytes, int dest, void* recv, size_t recv_bytes,
                int source);

  // Asynchronous forms (same checks and counters). The buffers must stay valid and
  // untouched until wait() on the returned request. Requests complete in issue order.
  using Request = uint64_t;
  Request all_reduce_async(float* data, size_t count, ReduceOp op);
  Request reduce_scatter_v_async(const float* send, float* recv, std::span<const size_t> counts,
                                 ReduceOp op);
  Request all_gather_v_async(float* data, std::span<const size_t> counts);
  void wait(Request r);
  // Seconds the calling thread spent blocked in wait() (exposed communication).
  double wait_seconds() const;

  // Ends every rank of the job at once (a rank-local failure that the others would
  // otherwise wait for in their next collective). The single-process form exits.
  [[noreturn]] virtual void abort(int code);

  // Counters for metrics and benchmarks: totals over all collectives, or one kind.
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;
  uint64_t calls() const;
  double seconds() const;
  CollectiveStats stats(Collective c) const;
  void reset_stats();

 protected:
  // Called with validated arguments (non-null buffers when the size is non-zero, root
  // in range, a valid op, no partial overlap). Sizes may be zero.
  // counts / byte vectors have world_size() entries. kAvg arrives as is: the
  // implementation divides by world_size().
  virtual void do_all_reduce(float* data, size_t count, ReduceOp op) = 0;
  virtual void do_reduce_scatter_v(const float* send, float* recv, const size_t* counts,
                                   ReduceOp op) = 0;
  // In place over bytes: rank r's counts[r] bytes at offset sum(counts[<r]) (the float
  // all_gather_v arrives here with its counts in bytes).
  virtual void do_all_gather_bytes(void* data, const size_t* counts) = 0;
  virtual void do_broadcast(void* data, size_t bytes, int root) = 0;
  virtual void do_barrier() = 0;
  virtual void do_all_to_all_v(const void* send, const size_t* send_bytes, void* recv,
                               const size_t* recv_bytes) = 0;
  // Default: this rank to itself only (a copy).
  virtual void do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                           size_t recv_bytes, int source);
  // Runs `op` (which calls one do_* hook) where the implementation runs collectives and
  // returns its request number. The default runs it inline on the calling thread.
  virtual Request submit(std::function<void()> op);
  // Blocks until request r has run (rethrows its error). Default: nothing to wait for.
  virtual void wait_for(Request r);

 private:
  Request run(Collective c, uint64_t sent, uint64_t received, std::function<void()> op);
  mutable std::mutex stats_mutex_;
  CollectiveStats stats_[kNumCollectives];
  double wait_seconds_ = 0.0;
  Request inline_requests_ = 0;
};

// A function called once just before this process ends the whole job (MPI_Abort, from
// whichever thread does it: a collective timeout ends the job from the communication
// thread). Null: none. The trainer's launch status uses it (train/rank_heartbeat.h).
void set_abort_observer(void (*observer)());
void notify_abort_observer();

// This process's hostname ("?" when it has none).
std::string this_host_name();
// "rank 3 (host h2)".
std::string rank_and_host(const Communicator& comm, int r);
// The job's placement in rank order: "h1 (ranks 0-1), h2 (ranks 2-3)"; hosts() the
// distinct hosts, in the order of their first rank.
std::string placement_summary(const Communicator& comm);
std::vector<std::string> hosts(const Communicator& comm);

// World of one (rank 0): all_reduce leaves the data as is (sum, avg and max of one
// value), reduce_scatter and all_gather copy (nothing when in place), broadcast
// requires root 0, barrier returns at once.
std::unique_ptr<Communicator> make_single_process_communicator();

// How the process was started: under an MPI launcher (mpirun, srun with PMIx) or alone.
struct LaunchInfo {
  bool under_mpi = false;
  int rank = 0, world = 1;             // from the launcher's environment
  int local_rank = 0, local_size = 1;  // ranks on this host
};
LaunchInfo detect_launch();

// The MPI library's own name and version ("Open MPI v4.1.4"), for --version; needs no
// MPI_Init.
std::string mpi_library_version();

// The MPI communicator over MPI_COMM_WORLD (initialises MPI; one per process). Its
// collectives run on a communication thread that polls with short sleeps, so waiting
// never spins on a core the compute threads need. A collective that has not finished
// after `timeout_s` seconds (a dead or hung peer) logs which ranks are not responding
// or behind, then aborts the whole job. Throws when hyperion was built without MPI.
std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s);
// `kind`: "auto" (MPI when launched under an MPI launcher with more than one rank,
// else single), "single" or "mpi". Errors name the value.
std::unique_ptr<Communicator> make_communicator(const std::string& kind, double timeout_s);

}  // namespace hyperion::dist
