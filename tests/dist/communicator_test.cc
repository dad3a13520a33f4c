#include "dist/communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"

namespace hyperion::dist {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hyperion::Error";
  return "";
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  const std::string msg = error_of(fn);
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(SingleCommunicator, Identity) {
  auto comm = make_single_process_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->name(), "single");
  EXPECT_EQ(comm->calls(), 0u);
  EXPECT_EQ(comm->bytes_sent(), 0u);
}

TEST(SingleCommunicator, AllReduceLeavesDataForEveryOp) {
  auto comm = make_single_process_communicator();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    std::vector<float> data = {1.5f, -2.0f, 0.0f, 1e30f, -7.25f};
    const std::vector<float> before = data;
    comm->all_reduce(data.data(), data.size(), op);
    EXPECT_EQ(data, before) << reduce_op_name(op);
  }
  // Buckets by pointer + count into one flat buffer.
  std::vector<float> flat = iota_floats(1000, 0.0f);
  for (size_t off = 0; off < flat.size(); off += 128)
    comm->all_reduce(flat.data() + off, std::min<size_t>(128, flat.size() - off), ReduceOp::kAvg);
  EXPECT_EQ(flat, iota_floats(1000, 0.0f));
  comm->all_reduce(nullptr, 0, ReduceOp::kSum);  // empty bucket is fine
}

TEST(SingleCommunicator, ReduceScatterCopies) {
  auto comm = make_single_process_communicator();
  const std::vector<float> send = iota_floats(17, 3.0f);
  std::vector<float> recv(17, -1.0f);
  comm->reduce_scatter(send.data(), recv.data(), recv.size(), ReduceOp::kSum);
  EXPECT_EQ(recv, send);
  // In place: recv is this rank's block of send (rank 0: the same pointer).
  std::vector<float> inplace = iota_floats(9, 1.0f);
  comm->reduce_scatter(inplace.data(), inplace.data(), inplace.size(), ReduceOp::kAvg);
  EXPECT_EQ(inplace, iota_floats(9, 1.0f));
  comm->reduce_scatter(nullptr, nullptr, 0, ReduceOp::kMax);
}

TEST(SingleCommunicator, AllGatherCopies) {
  auto comm = make_single_process_communicator();
  const char msg[] = "hyperion";
  char out[sizeof(msg)] = {};
  comm->all_gather(msg, out, sizeof(msg));
  EXPECT_STREQ(out, "hyperion");
  std::vector<int32_t> same = {1, 2, 3};
  comm->all_gather(same.data(), same.data(), same.size() * sizeof(int32_t));
  EXPECT_EQ(same, (std::vector<int32_t>{1, 2, 3}));
  comm->all_gather(nullptr, nullptr, 0);
}

TEST(SingleCommunicator, BroadcastAndBarrier) {
  auto comm = make_single_process_communicator();
  uint64_t seed = 1234;
  comm->broadcast(&seed, sizeof(seed), 0);
  EXPECT_EQ(seed, 1234u);
  comm->barrier();
  expect_error([&] { comm->broadcast(&seed, sizeof(seed), 1); },
               {"broadcast", "root 1", "world size 1"});
  expect_error([&] { comm->broadcast(&seed, sizeof(seed), -1); }, {"broadcast", "root -1"});
}

TEST(SingleCommunicator, NullBuffersAreErrorsNamingTheCall) {
  auto comm = make_single_process_communicator();
  float buf[4] = {};
  expect_error([&] { comm->all_reduce(nullptr, 4, ReduceOp::kSum); }, {"all_reduce", "data"});
  expect_error([&] { comm->reduce_scatter(nullptr, buf, 4, ReduceOp::kSum); },
               {"reduce_scatter", "send"});
  expect_error([&] { comm->reduce_scatter(buf, nullptr, 4, ReduceOp::kSum); },
               {"reduce_scatter", "recv"});
  expect_error([&] { comm->all_gather(nullptr, buf, 16); }, {"all_gather", "send"});
  expect_error([&] { comm->all_gather(buf, nullptr, 16); }, {"all_gather", "recv"});
  expect_error([&] { comm->broadcast(nullptr, 8, 0); }, {"broadcast", "data"});
  expect_error([&] { comm->all_reduce(buf, 4, static_cast<ReduceOp>(9)); },
               {"all_reduce", "ReduceOp 9"});
  expect_error([&] { comm->reduce_scatter(buf, buf, 4, static_cast<ReduceOp>(-1)); },
               {"reduce_scatter", "ReduceOp"});
  expect_error([&] { comm->all_reduce(buf, SIZE_MAX / 2, ReduceOp::kSum); },
               {"all_reduce", "overflows"});
  // Partial overlap (not the in-place layout).
  expect_error([&] { comm->reduce_scatter(buf, buf + 1, 3, ReduceOp::kSum); },
               {"reduce_scatter", "overlap"});
  expect_error([&] { comm->all_gather(buf + 1, buf, 8); }, {"all_gather", "overlap"});
  EXPECT_EQ(comm->calls(), 0u);  // failed validation is not counted
}

TEST(SingleCommunicator, CountersPerCollective) {
  auto comm = make_single_process_communicator();
  std::vector<float> a(100), b(100);
  comm->all_reduce(a.data(), 100, ReduceOp::kSum);
  comm->all_reduce(a.data(), 50, ReduceOp::kSum);
  comm->reduce_scatter(a.data(), b.data(), 10, ReduceOp::kAvg);
  comm->all_gather(a.data(), b.data(), 24);
  comm->broadcast(a.data(), 8, 0);
  comm->barrier();
  const CollectiveStats& ar = comm->stats(Collective::kAllReduce);
  EXPECT_EQ(ar.calls, 2u);
  EXPECT_EQ(ar.bytes_sent, 600u);
  EXPECT_EQ(ar.bytes_received, 600u);
  EXPECT_GE(ar.seconds, 0.0);
  EXPECT_EQ(comm->stats(Collective::kReduceScatter).bytes_sent, 40u);
  EXPECT_EQ(comm->stats(Collective::kReduceScatter).bytes_received, 40u);
  EXPECT_EQ(comm->stats(Collective::kAllGather).bytes_received, 24u);
  EXPECT_EQ(comm->stats(Collective::kBroadcast).bytes_sent, 8u);  // rank 0 is the root
  EXPECT_EQ(comm->stats(Collective::kBroadcast).bytes_received, 0u);
  EXPECT_EQ(comm->stats(Collective::kBarrier).calls, 1u);
  EXPECT_EQ(comm->calls(), 6u);
  EXPECT_EQ(comm->bytes_sent(), 600u + 40u + 24u + 8u);
  EXPECT_EQ(comm->bytes_received(), 600u + 40u + 24u);
  EXPECT_GE(comm->seconds(), 0.0);
  comm->reset_stats();
  EXPECT_EQ(comm->calls(), 0u);
  EXPECT_EQ(comm->bytes_sent(), 0u);
  EXPECT_EQ(comm->seconds(), 0.0);
  EXPECT_STREQ(collective_name(Collective::kReduceScatter), "reduce_scatter");
}

// A world-4 rank-2 fake: checks that validation, in-place layouts and byte counts use
// rank and world size, as an MPI backend will see them.
class FakeComm final : public Communicator {
 public:
  int rank() const override { return 2; }
  int world_size() const override { return 4; }
  std::string name() const override { return "fake"; }
  int hooks = 0;

 protected:
  void do_all_reduce(float*, size_t, ReduceOp) override { ++hooks; }
  void do_reduce_scatter_v(const float*, float*, const size_t*, ReduceOp) override { ++hooks; }
  void do_all_gather_bytes(void*, const size_t*) override { ++hooks; }
  void do_broadcast(void*, size_t, int) override { ++hooks; }
  void do_barrier() override { ++hooks; }
  void do_all_to_all_v(const void*, const size_t*, void*, const size_t*) override { ++hooks; }
};

TEST(Communicator, SendRecvToItselfCopiesAndNamesABadPeer) {
  auto comm = make_single_process_communicator();
  std::vector<float> a(5, 2.0f), b(5, 0.0f);
  comm->sendrecv(a.data(), 20, 0, b.data(), 20, 0);
  EXPECT_EQ(b, a);
  expect_error([&] { comm->sendrecv(a.data(), 20, 1, b.data(), 20, 0); },
               {"sendrecv", "dest 1", "size 1"});
  EXPECT_EQ(comm->host(0), this_host_name());
}

TEST(Communicator, ValidationUsesRankAndWorld) {
  FakeComm comm;
  std::vector<float> send(40), recv(10);
  comm.reduce_scatter(send.data(), recv.data(), 10, ReduceOp::kSum);
  comm.reduce_scatter(send.data(), send.data() + 20, 10, ReduceOp::kSum);  // in place, rank 2
  expect_error([&] { comm.reduce_scatter(send.data(), send.data(), 10, ReduceOp::kSum); },
               {"reduce_scatter", "overlap"});
  expect_error([&] { comm.reduce_scatter(send.data(), send.data() + 30, 10, ReduceOp::kSum); },
               {"reduce_scatter", "overlap"});
  comm.all_gather(recv.data(), send.data(), 40);
  comm.all_gather(send.data() + 20, send.data(), 40);  // in place: rank 2's block
  expect_error([&] { comm.all_gather(send.data() + 10, send.data(), 40); },
               {"all_gather", "overlap"});
  comm.broadcast(recv.data(), 40, 3);
  expect_error([&] { comm.broadcast(recv.data(), 40, 4); }, {"broadcast", "root 4", "size 4"});
  EXPECT_EQ(comm.hooks, 5);
  EXPECT_EQ(comm.stats(Collective::kReduceScatter).bytes_sent, 2u * 160u);
  EXPECT_EQ(comm.stats(Collective::kReduceScatter).bytes_received, 2u * 40u);
  EXPECT_EQ(comm.stats(Collective::kAllGather).bytes_received, 2u * 160u);
  EXPECT_EQ(comm.stats(Collective::kBroadcast).bytes_sent, 0u);  // not the root
  EXPECT_EQ(comm.stats(Collective::kBroadcast).bytes_received, 40u);
}

}  // namespace
}  // namespace hyperion::dist
