#include "dist/communicator.h"

#include <cstring>

#include "base/error.h"
#include "base/timer.h"

namespace hyperion::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "invalid";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
  }
  return "invalid";
}

namespace {

void check_op(const char* call, ReduceOp op) {
  HYP_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kMax,
            "{}: invalid ReduceOp {}", call, static_cast<int>(op));
}

void check_buffer(const char* call, const char* name, const void* p, size_t bytes) {
  HYP_CHECK(p != nullptr || bytes == 0, "{}: {} buffer is null but {} bytes were requested", call,
            name, bytes);
}

// Byte counts of world * n must not wrap around.
size_t checked_mul(const char* call, size_t a, size_t b) {
  size_t r = 0;
  HYP_CHECK(!__builtin_mul_overflow(a, b, &r), "{}: buffer size {} * {} overflows", call, a, b);
  return r;
}

// Non-overlapping, or `inner` exactly at `expected` inside `outer` (the in-place form).
void check_overlap(const char* call, const void* outer, size_t outer_bytes, const void* inner,
                   size_t inner_bytes, const void* expected) {
  if (outer_bytes == 0 || inner_bytes == 0 || inner == expected) return;
  const auto o = reinterpret_cast<uintptr_t>(outer);
  const auto i = reinterpret_cast<uintptr_t>(inner);
  HYP_CHECK(o + outer_bytes <= i || i + inner_bytes <= o,
            "{}: send and recv buffers overlap (only the in-place layout is allowed: this "
            "rank's block of the larger buffer)",
            call);
}

// Adds the call's time and bytes to its counters when it returns (also when it throws,
// though the failure is what matters then).
class Scope {
 public:
  Scope(CollectiveStats& s, uint64_t sent, uint64_t received) : s_(s) {
    s_.calls += 1;
    s_.bytes_sent += sent;
    s_.bytes_received += received;
  }
  ~Scope() { s_.seconds += timer_.seconds(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  CollectiveStats& s_;
  Timer timer_;
};

}  // namespace

void Communicator::all_reduce(float* data, size_t count, ReduceOp op) {
  const char* call = "all_reduce";
  check_op(call, op);
  const size_t bytes = checked_mul(call, count, sizeof(float));
  check_buffer(call, "data", data, bytes);
  Scope scope(at(Collective::kAllReduce), bytes, bytes);
  do_all_reduce(data, count, op);
}

void Communicator::reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op) {
  const char* call = "reduce_scatter";
  check_op(call, op);
  const size_t recv_bytes = checked_mul(call, recv_count, sizeof(float));
  const size_t send_bytes = checked_mul(call, recv_bytes, static_cast<size_t>(world_size()));
  check_buffer(call, "send", send, send_bytes);
  check_buffer(call, "recv", recv, recv_bytes);
  if (recv_bytes != 0) {
    check_overlap(call, send, send_bytes, recv, recv_bytes,
                  send + static_cast<size_t>(rank()) * recv_count);
  }
  Scope scope(at(Collective::kReduceScatter), send_bytes, recv_bytes);
  do_reduce_scatter(send, recv, recv_count, op);
}

void Communicator::all_gather(const void* send, void* recv, size_t send_bytes) {
  const char* call = "all_gather";
  const size_t recv_bytes = checked_mul(call, send_bytes, static_cast<size_t>(world_size()));
  check_buffer(call, "send", send, send_bytes);
  check_buffer(call, "recv", recv, recv_bytes);
  if (send_bytes != 0) {
    check_overlap(call, recv, recv_bytes, send, send_bytes,
                  static_cast<const char*>(recv) + static_cast<size_t>(rank()) * send_bytes);
  }
  Scope scope(at(Collective::kAllGather), send_bytes, recv_bytes);
  do_all_gather(send, recv, send_bytes);
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  const char* call = "broadcast";
  HYP_CHECK(root >= 0 && root < world_size(),
            "broadcast: root {} is out of range for world size {}", root, world_size());
  check_buffer(call, "data", data, bytes);
  const bool is_root = rank() == root;
  Scope scope(at(Collective::kBroadcast), is_root ? bytes : 0, is_root ? 0 : bytes);
  do_broadcast(data, bytes, root);
}

void Communicator::barrier() {
  Scope scope(at(Collective::kBarrier), 0, 0);
  do_barrier();
}

uint64_t Communicator::bytes_sent() const {
  uint64_t total = 0;
  for (const CollectiveStats& s : stats_) total += s.bytes_sent;
  return total;
}

uint64_t Communicator::bytes_received() const {
  uint64_t total = 0;
  for (const CollectiveStats& s : stats_) total += s.bytes_received;
  return total;
}

uint64_t Communicator::calls() const {
  uint64_t total = 0;
  for (const CollectiveStats& s : stats_) total += s.calls;
  return total;
}

double Communicator::seconds() const {
  double total = 0;
  for (const CollectiveStats& s : stats_) total += s.seconds;
  return total;
}

void Communicator::reset_stats() {
  for (CollectiveStats& s : stats_) s = CollectiveStats{};
}

namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "single"; }

 protected:
  // Sum, average and max over one rank are the value itself.
  void do_all_reduce(float*, size_t, ReduceOp) override {}
  void do_reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp) override {
    if (recv_count != 0 && send != recv) std::memcpy(recv, send, recv_count * sizeof(float));
  }
  void do_all_gather(const void* send, void* recv, size_t send_bytes) override {
    if (send_bytes != 0 && send != recv) std::memcpy(recv, send, send_bytes);
  }
  void do_broadcast(void*, size_t, int) override {}
  void do_barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace hyperion::dist
