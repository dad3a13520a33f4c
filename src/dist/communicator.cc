#include "dist/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

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
    case Collective::kAllToAll:
      return "all_to_all";
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

size_t total_of(std::span<const size_t> counts) {
  size_t t = 0;
  for (size_t c : counts)
    HYP_CHECK(!__builtin_add_overflow(t, c, &t), "collective: sizes overflow");
  return t;
}

void check_counts(const char* call, std::span<const size_t> counts, int world) {
  HYP_CHECK(counts.size() == static_cast<size_t>(world),
            "{}: {} counts given for a world of {} ranks", call, counts.size(), world);
}

}  // namespace

Communicator::Request Communicator::run(Collective c, uint64_t sent, uint64_t received,
                                        std::function<void()> op) {
  return submit([this, c, sent, received, op = std::move(op)] {
    Timer timer;
    op();
    const double s = timer.seconds();
    std::lock_guard<std::mutex> lock(stats_mutex_);
    CollectiveStats& st = stats_[static_cast<int>(c)];
    st.calls += 1;
    st.bytes_sent += sent;
    st.bytes_received += received;
    st.seconds += s;
  });
}

Communicator::Request Communicator::submit(std::function<void()> op) {
  op();
  return ++inline_requests_;
}

void Communicator::wait_for(Request) {}

void Communicator::wait(Request r) {
  Timer timer;
  wait_for(r);
  const double s = timer.seconds();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  wait_seconds_ += s;
}

double Communicator::wait_seconds() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return wait_seconds_;
}

namespace {
std::atomic<void (*)()> g_abort_observer{nullptr};
}  // namespace

void set_abort_observer(void (*observer)()) {
  g_abort_observer.store(observer);
}

void notify_abort_observer() {
  if (void (*f)() = g_abort_observer.exchange(nullptr)) f();
}

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "?";
  return name;
}

std::string Communicator::host(int) const {
  return this_host_name();
}

std::string rank_and_host(const Communicator& comm, int r) {
  return fmt::format("rank {} (host {})", r, comm.host(r));
}

std::vector<std::string> hosts(const Communicator& comm) {
  std::vector<std::string> out;
  for (int r = 0; r < comm.world_size(); ++r)
    if (std::find(out.begin(), out.end(), comm.host(r)) == out.end()) out.push_back(comm.host(r));
  return out;
}

std::string placement_summary(const Communicator& comm) {
  std::string out;
  for (const std::string& h : hosts(comm)) {
    // Runs of consecutive ranks: "0-1, 4".
    std::string ranks;
    int count = 0;
    for (int r = 0; r < comm.world_size(); ++r) {
      if (comm.host(r) != h || (r > 0 && comm.host(r - 1) == h)) continue;
      int last = r;
      while (last + 1 < comm.world_size() && comm.host(last + 1) == h) ++last;
      ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ",
                           last == r ? fmt::format("{}", r) : fmt::format("{}-{}", r, last));
      count += last - r + 1;
    }
    out += fmt::format("{}{} (rank{} {})", out.empty() ? "" : ", ", h, count == 1 ? "" : "s",
                       ranks);
  }
  return out;
}

void Communicator::abort(int code) {
  std::exit(code);
}

Communicator::Request Communicator::all_reduce_async(float* data, size_t count, ReduceOp op) {
  const char* call = "all_reduce";
  check_op(call, op);
  const size_t bytes = checked_mul(call, count, sizeof(float));
  check_buffer(call, "data", data, bytes);
  return run(Collective::kAllReduce, bytes, bytes,
             [this, data, count, op] { do_all_reduce(data, count, op); });
}

void Communicator::all_reduce(float* data, size_t count, ReduceOp op) {
  wait(all_reduce_async(data, count, op));
}

Communicator::Request Communicator::reduce_scatter_v_async(const float* send, float* recv,
                                                           std::span<const size_t> counts,
                                                           ReduceOp op) {
  const char* call = "reduce_scatter";
  check_op(call, op);
  check_counts(call, counts, world_size());
  const size_t total = total_of(counts);
  const size_t send_bytes = checked_mul(call, total, sizeof(float));
  const size_t mine = counts[static_cast<size_t>(rank())];
  const size_t recv_bytes = mine * sizeof(float);
  size_t offset = 0;
  for (int r = 0; r < rank(); ++r) offset += counts[static_cast<size_t>(r)];
  check_buffer(call, "send", send, send_bytes);
  check_buffer(call, "recv", recv, recv_bytes);
  if (recv_bytes != 0) check_overlap(call, send, send_bytes, recv, recv_bytes, send + offset);
  std::vector<size_t> c(counts.begin(), counts.end());
  return run(
      Collective::kReduceScatter, send_bytes, recv_bytes,
      [this, send, recv, c = std::move(c), op] { do_reduce_scatter_v(send, recv, c.data(), op); });
}

void Communicator::reduce_scatter_v(const float* send, float* recv, std::span<const size_t> counts,
                                    ReduceOp op) {
  wait(reduce_scatter_v_async(send, recv, counts, op));
}

void Communicator::reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op) {
  checked_mul("reduce_scatter", checked_mul("reduce_scatter", recv_count, sizeof(float)),
              static_cast<size_t>(world_size()));
  const std::vector<size_t> counts(static_cast<size_t>(world_size()), recv_count);
  reduce_scatter_v(send, recv, counts, op);
}

Communicator::Request Communicator::all_gather_v_async(float* data,
                                                       std::span<const size_t> counts) {
  const char* call = "all_gather";
  check_counts(call, counts, world_size());
  const size_t total = total_of(counts);
  const size_t bytes = checked_mul(call, total, sizeof(float));
  check_buffer(call, "data", data, bytes);
  std::vector<size_t> c(counts.begin(), counts.end());
  for (size_t& x : c) x *= sizeof(float);  // cannot overflow: the total was checked
  const size_t mine = c[static_cast<size_t>(rank())];
  return run(Collective::kAllGather, mine, bytes,
             [this, data, c = std::move(c)] { do_all_gather_bytes(data, c.data()); });
}

void Communicator::all_gather_v(float* data, std::span<const size_t> counts) {
  wait(all_gather_v_async(data, counts));
}

void Communicator::all_gather(const void* send, void* recv, size_t send_bytes) {
  const char* call = "all_gather";
  const size_t recv_bytes = checked_mul(call, send_bytes, static_cast<size_t>(world_size()));
  check_buffer(call, "send", send, send_bytes);
  check_buffer(call, "recv", recv, recv_bytes);
  char* mine = static_cast<char*>(recv) + static_cast<size_t>(rank()) * send_bytes;
  if (send_bytes != 0) check_overlap(call, recv, recv_bytes, send, send_bytes, mine);
  // One in-place form serves every gather: copy this rank's block into place, then
  // gather the equal byte blocks in place.
  if (send_bytes != 0 && send != mine) std::memcpy(mine, send, send_bytes);
  const std::vector<size_t> counts(static_cast<size_t>(world_size()), send_bytes);
  wait(run(Collective::kAllGather, send_bytes, recv_bytes,
           [this, recv, counts] { do_all_gather_bytes(recv, counts.data()); }));
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  const char* call = "broadcast";
  HYP_CHECK(root >= 0 && root < world_size(),
            "broadcast: root {} is out of range for world size {}", root, world_size());
  check_buffer(call, "data", data, bytes);
  const bool is_root = rank() == root;
  wait(run(Collective::kBroadcast, is_root ? bytes : 0, is_root ? 0 : bytes,
           [this, data, bytes, root] { do_broadcast(data, bytes, root); }));
}

void Communicator::barrier() {
  wait(run(Collective::kBarrier, 0, 0, [this] { do_barrier(); }));
}

void Communicator::all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                                std::span<const size_t> recv_bytes) {
  const char* call = "all_to_all_v";
  check_counts(call, send_bytes, world_size());
  check_counts(call, recv_bytes, world_size());
  const size_t st = total_of(send_bytes), rt = total_of(recv_bytes);
  check_buffer(call, "send", send, st);
  check_buffer(call, "recv", recv, rt);
  if (st != 0 && rt != 0) check_overlap(call, send, st, recv, rt, nullptr);
  const size_t self = static_cast<size_t>(rank());
  std::vector<size_t> s(send_bytes.begin(), send_bytes.end()),
      r(recv_bytes.begin(), recv_bytes.end());
  HYP_CHECK(s[self] == r[self], "all_to_all_v: this rank sends itself {} bytes but expects {}",
            s[self], r[self]);
  const size_t sent = st - s[self], received = rt - r[self];  // before the moves below
  wait(run(Collective::kAllToAll, sent, received,
           [this, send, recv, s = std::move(s), r = std::move(r)] {
             do_all_to_all_v(send, s.data(), recv, r.data());
           }));
}

void Communicator::sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                            size_t recv_bytes, int source) {
  const char* call = "sendrecv";
  HYP_CHECK(dest >= 0 && dest < world_size() && source >= 0 && source < world_size(),
            "{}: dest {} or source {} is outside the world of size {}", call, dest, source,
            world_size());
  check_buffer(call, "send", send, send_bytes);
  check_buffer(call, "recv", recv, recv_bytes);
  if (send_bytes != 0 && recv_bytes != 0) check_overlap(call, send, send_bytes, recv, recv_bytes, nullptr);
  wait(run(Collective::kAllToAll, send_bytes, recv_bytes,
           [=, this] { do_sendrecv(send, send_bytes, dest, recv, recv_bytes, source); }));
}

void Communicator::do_sendrecv(const void* send, size_t send_bytes, int dest, void* recv,
                               size_t recv_bytes, int source) {
  HYP_CHECK(dest == rank() && source == rank() && send_bytes == recv_bytes,
            "sendrecv: {} communicator can only exchange with itself", name());
  if (send_bytes != 0) std::memcpy(recv, send, send_bytes);
}

uint64_t Communicator::bytes_sent() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  uint64_t total = 0;
  for (const CollectiveStats& s : stats_) total += s.bytes_sent;
  return total;
}

uint64_t Communicator::bytes_received() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  uint64_t total = 0;
  for (const CollectiveStats& s : stats_) total += s.bytes_received;
  return total;
}

uint64_t Communicator::calls() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  uint64_t total = 0;
  for (const CollectiveStats& s : stats_) total += s.calls;
  return total;
}

double Communicator::seconds() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  double total = 0;
  for (const CollectiveStats& s : stats_) total += s.seconds;
  return total;
}

CollectiveStats Communicator::stats(Collective c) const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_[static_cast<int>(c)];
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  for (CollectiveStats& s : stats_) s = CollectiveStats{};
  wait_seconds_ = 0.0;
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
  void do_reduce_scatter_v(const float* send, float* recv, const size_t* counts,
                           ReduceOp) override {
    if (counts[0] != 0 && send != recv) std::memcpy(recv, send, counts[0] * sizeof(float));
  }
  void do_all_gather_bytes(void*, const size_t*) override {}
  void do_broadcast(void*, size_t, int) override {}
  void do_barrier() override {}
  void do_all_to_all_v(const void* send, const size_t* send_bytes, void* recv,
                       const size_t*) override {
    if (send_bytes[0] != 0) std::memcpy(recv, send, send_bytes[0]);
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace hyperion::dist
