// Collective communication for data-parallel training: the trainer sends gradients
// through a Communicator, one bucket at a time (pointer + count into a flat gradient
// buffer), so reductions of early buckets can overlap later backward work once an
// asynchronous implementation exists.
//
// The public calls are non-virtual: they validate the arguments (null buffers with a
// non-zero count, roots out of range, invalid ReduceOp, partially overlapping buffers:
// hyperion::Error naming the call), time the call and count its bytes, then call the
// protected do_* hook that an implementation overrides. So every implementation (the
// single-process one here, MPI later) gets the same checks and the same counters.
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
// Any other overlap between send and recv is an error. Every rank must make the same
// sequence of collective calls with the same counts.
//
// ReduceOp::kAvg is the sum divided by world_size (computed in f32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace hyperion::dist {

enum class ReduceOp { kSum, kAvg, kMax };
const char* reduce_op_name(ReduceOp op);

enum class Collective { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
inline constexpr int kNumCollectives = 5;
const char* collective_name(Collective c);

// Per-collective counters. Bytes are the payload this rank hands to the collective
// (bytes_sent) and gets back from it (bytes_received), independent of the algorithm
// the backend uses on the wire:
//   all_reduce:      sent count * 4,              received count * 4
//   reduce_scatter:  sent world * recv_count * 4, received recv_count * 4
//   all_gather:      sent send_bytes,             received world * send_bytes
//   broadcast:       root sent bytes, others received bytes
//   barrier:         0, 0
struct CollectiveStats {
  uint64_t calls = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double seconds = 0.0;  // wall time inside the call
};

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "single", later "mpi"

  void all_reduce(float* data, size_t count, ReduceOp op);
  void reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op);
  void all_gather(const void* send, void* recv, size_t send_bytes);
  void broadcast(void* data, size_t bytes, int root);
  void barrier();

  // Counters for metrics and benchmarks: totals over all collectives, or one kind.
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;
  uint64_t calls() const;
  double seconds() const;
  const CollectiveStats& stats(Collective c) const { return stats_[static_cast<int>(c)]; }
  void reset_stats();

 protected:
  // Called with validated arguments (non-null buffers when the size is non-zero, root
  // in range, a valid op, no partial overlap). Sizes may be zero.
  virtual void do_all_reduce(float* data, size_t count, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const float* send, float* recv, size_t recv_count,
                                 ReduceOp op) = 0;
  virtual void do_all_gather(const void* send, void* recv, size_t send_bytes) = 0;
  virtual void do_broadcast(void* data, size_t bytes, int root) = 0;
  virtual void do_barrier() = 0;

 private:
  CollectiveStats& at(Collective c) { return stats_[static_cast<int>(c)]; }
  CollectiveStats stats_[kNumCollectives];
};

// World of one (rank 0): all_reduce leaves the data as is (sum, avg and max of one
// value), reduce_scatter and all_gather copy (nothing when in place), broadcast
// requires root 0, barrier returns at once.
std::unique_ptr<Communicator> make_single_process_communicator();

}  // namespace hyperion::dist
