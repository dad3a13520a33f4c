// The MPI communicator's collectives at the world size mpirun gives (CTest runs 2 and 4
// ranks): every result is checked against the value computed locally from what each
// rank contributes (data derived from the rank number).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "dist/communicator.h"
#include "mpi_test_env.h"

namespace hyperion::dist {
namespace {

float value(int rank, size_t i) {
  return static_cast<float>(rank + 1) * 0.5f + static_cast<float>(i % 97);
}

TEST(Mpi, IdentityMatchesLauncher) {
  const LaunchInfo launch = detect_launch();
  ASSERT_TRUE(launch.under_mpi);
  EXPECT_EQ(test_comm().name(), "mpi");
  EXPECT_EQ(test_comm().world_size(), launch.world);
  EXPECT_EQ(test_comm().rank(), launch.rank);
  EXPECT_GE(test_comm().world_size(), 2);
}

// Every rank knows every rank's host, and pairs exchange point to point along shifts.
TEST(Mpi, HostsAndSendRecvAlongShifts) {
  const int w = test_comm().world_size(), r = test_comm().rank();
  for (int p = 0; p < w; ++p) EXPECT_FALSE(test_comm().host(p).empty());
  EXPECT_EQ(test_comm().host(r), this_host_name());
  for (int k = 1; k < w; ++k) {
    std::vector<int32_t> send(1000, 100 * r + k), recv(1000, -1);
    test_comm().sendrecv(send.data(), send.size() * 4, (r + k) % w, recv.data(), recv.size() * 4,
                         (r - k + w) % w);
    EXPECT_EQ(recv[0], 100 * ((r - k + w) % w) + k);
    EXPECT_EQ(recv[999], recv[0]);
  }
}

TEST(Mpi, AllReduceSumAvgMax) {
  const int w = test_comm().world_size(), r = test_comm().rank();
  const size_t n = 100003;  // odd size, not a multiple of anything
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    std::vector<float> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = value(r, i);
    test_comm().all_reduce(data.data(), n, op);
    for (size_t i = 0; i < n; i += 977) {
      float sum = 0, mx = -1e30f;
      for (int q = 0; q < w; ++q) {
        sum += value(q, i);
        mx = std::max(mx, value(q, i));
      }
      const float want = op == ReduceOp::kSum ? sum : op == ReduceOp::kAvg ? sum / float(w) : mx;
      ASSERT_NEAR(data[i], want, 1e-4f * std::abs(want)) << reduce_op_name(op) << " i=" << i;
    }
  }
}

TEST(Mpi, AsyncBucketsCompleteInOrderAndOverlapWork) {
  const int w = test_comm().world_size(), r = test_comm().rank();
  const size_t n = 1 << 20, bucket = 1 << 16;
  std::vector<float> grads(n);
  for (size_t i = 0; i < n; ++i) grads[i] = value(r, i);
  std::vector<Communicator::Request> reqs;
  double local = 0;
  for (size_t off = 0; off < n; off += bucket) {
    reqs.push_back(test_comm().all_reduce_async(grads.data() + off, bucket, ReduceOp::kAvg));
    for (int k = 0; k < 20000; ++k) local += std::sqrt(double(k + off));  // "backward" work
  }
  EXPECT_GT(local, 0);
  for (size_t i = 1; i < reqs.size(); ++i) EXPECT_GT(reqs[i], reqs[i - 1]);
  test_comm().wait(reqs.back());  // waiting on the last finishes every earlier one
  for (size_t i = 0; i < n; i += 4099) {
    float sum = 0;
    for (int q = 0; q < w; ++q) sum += value(q, i);
    ASSERT_NEAR(grads[i], sum / float(w), 1e-4f * sum) << i;
  }
  for (Communicator::Request q : reqs) test_comm().wait(q);  // already done: returns at once
}

TEST(Mpi, ReduceScatterEqualAndInPlace) {
  const int w = test_comm().world_size(), r = test_comm().rank();
  const size_t per = 1001;
  std::vector<float> send(per * size_t(w)), recv(per);
  for (size_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
  test_comm().reduce_scatter(send.data(), recv.data(), per, ReduceOp::kSum);
  for (size_t i = 0; i < per; ++i) {
    float sum = 0;
    for (int q = 0; q < w; ++q) sum += value(q, size_t(r) * per + i);
    ASSERT_NEAR(recv[i], sum, 1e-4f * sum) << i;
  }
  // In place: the result lands in this rank's block.
  test_comm().reduce_scatter(send.data(), send.data() + size_t(r) * per, per, ReduceOp::kAvg);
  for (size_t i = 0; i < per; ++i)
    ASSERT_NEAR(send[size_t(r) * per + i], recv[i] / float(w), 1e-3f);
}

TEST(Mpi, ReduceScatterVAndAllGatherVWithUnevenAndEmptyBlocks) {
  const int w = test_comm().world_size(), r = test_comm().rank();
  std::vector<size_t> counts(static_cast<size_t>(w));
  for (int q = 0; q < w; ++q) counts[size_t(q)] = q == 1 ? 0 : size_t(1000 + 37 * q);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  size_t off = 0;
  for (int q = 0; q < r; ++q) off += counts[size_t(q)];
  std::vector<float> send(total), recv(counts[size_t(r)] + 1);
  for (size_t i = 0; i < total; ++i) send[i] = value(r, i);
  auto req = test_comm().reduce_scatter_v_async(send.data(), recv.data(), counts, ReduceOp::kSum);
  test_comm().wait(req);
  for (size_t i = 0; i < counts[size_t(r)]; ++i) {
    float sum = 0;
    for (int q = 0; q < w; ++q) sum += value(q, off + i);
    ASSERT_NEAR(recv[i], sum, 1e-4f * sum);
  }
  // All-gather: each rank fills only its block, everyone ends with all blocks.
  std::vector<float> data(total, -1.0f);
  for (size_t i = 0; i < counts[size_t(r)]; ++i) data[off + i] = float(r * 100000 + int(i));
  test_comm().wait(test_comm().all_gather_v_async(data.data(), counts));
  size_t o = 0;
  for (int q = 0; q < w; ++q) {
    for (size_t i = 0; i < counts[size_t(q)]; ++i)
      ASSERT_EQ(data[o + i], float(q * 100000 + int(i)));
    o += counts[size_t(q)];
  }
}

TEST(Mpi, AllGatherBytesBroadcastBarrier) {
  const int w = test_comm().world_size(), r = test_comm().rank();
  const size_t bytes = 13;
  std::vector<unsigned char> mine(bytes), all(bytes * size_t(w));
  for (size_t i = 0; i < bytes; ++i) mine[i] = static_cast<unsigned char>(r * 16 + int(i));
  test_comm().all_gather(mine.data(), all.data(), bytes);
  for (int q = 0; q < w; ++q)
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(all[size_t(q) * bytes + i], q * 16 + int(i));
  for (int root = 0; root < w; ++root) {
    std::vector<int> b(7, r == root ? root + 5 : -1);
    test_comm().broadcast(b.data(), b.size() * sizeof(int), root);
    for (int x : b) ASSERT_EQ(x, root + 5);
  }
  test_comm().barrier();
}

TEST(Mpi, AllToAllVSendsEachBlockToItsRank) {
  const int w = test_comm().world_size(), r = test_comm().rank();
  // Rank s sends (s + d) % 3 * 8 + 1 ints to rank d (some 1-int blocks, all distinct).
  auto n_of = [](int s, int d) { return size_t(((s + d) % 3) * 8 + 1); };
  std::vector<size_t> sb(static_cast<size_t>(w)), rb(static_cast<size_t>(w));
  std::vector<int> send;
  for (int d = 0; d < w; ++d) {
    sb[size_t(d)] = n_of(r, d) * sizeof(int);
    rb[size_t(d)] = n_of(d, r) * sizeof(int);
    for (size_t i = 0; i < n_of(r, d); ++i) send.push_back(r * 1000 + d * 100 + int(i));
  }
  std::vector<int> recv(std::accumulate(rb.begin(), rb.end(), size_t{0}) / sizeof(int));
  test_comm().all_to_all_v(send.data(), sb, recv.data(), rb);
  size_t o = 0;
  for (int s = 0; s < w; ++s)
    for (size_t i = 0; i < n_of(s, r); ++i) ASSERT_EQ(recv[o++], s * 1000 + r * 100 + int(i));
}

TEST(Mpi, CountersAndErrorsNameTheCall) {
  test_comm().reset_stats();
  std::vector<float> x(256, 1.0f);
  test_comm().all_reduce(x.data(), x.size(), ReduceOp::kSum);
  const CollectiveStats s = test_comm().stats(Collective::kAllReduce);
  EXPECT_EQ(s.calls, 1u);
  EXPECT_EQ(s.bytes_sent, 1024u);
  EXPECT_EQ(s.bytes_received, 1024u);
  EXPECT_GT(s.seconds, 0.0);
  const std::vector<size_t> wrong(size_t(test_comm().world_size()) + 1, 1);
  try {
    test_comm().all_gather_v(x.data(), wrong);
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyperion::dist
