// The host list of `train --hosts` / `--hostfile`, the mpirun command built from it, and
// the placement summary every rank logs.
#include "dist/host_list.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "dist/communicator.h"
#include "dist/mpirun_command.h"

namespace hyperion::dist {
namespace {

// The usage error's message ("" when none was thrown).
std::string usage_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(HostList, ParsesHostsAndSlots) {
  const auto h = parse_host_list("node1:2, node2,node-3.cluster:4", "--hosts");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].host, "node1");
  EXPECT_EQ(h[0].slots, 2);
  EXPECT_EQ(h[1].host, "node2");
  EXPECT_EQ(h[1].slots, 1);
  EXPECT_EQ(h[2].host, "node-3.cluster");
  EXPECT_EQ(total_slots(h), 7);
  EXPECT_EQ(host_list_argument(h), "node1:2,node2:1,node-3.cluster:4");
}

TEST(HostList, BadListsNameTheEntry) {
  EXPECT_NE(usage_error([] { parse_host_list("a:0", "--hosts"); }).find("slots '0'"),
            std::string::npos);
  EXPECT_NE(usage_error([] { parse_host_list("a:two", "--hosts"); }).find("slots 'two'"),
            std::string::npos);
  EXPECT_NE(usage_error([] { parse_host_list("a,,b", "--hosts"); }).find("empty entry"),
            std::string::npos);
  EXPECT_NE(usage_error([] { parse_host_list("a:1,a:2", "--hosts"); }).find("host a is listed twice"),
            std::string::npos);
  EXPECT_NE(usage_error([] { parse_host_list("a b", "--hosts"); }).find("'a b' is not a host name"),
            std::string::npos);
}

TEST(HostList, ReadsMpirunHostfiles) {
  const std::string path = testing::TempDir() + "/hostfile";
  {
    std::ofstream f(path);
    f << "# two nodes\n\nnode1 slots=2 max_slots=4\nnode2   # one slot\nnode3:3\n";
  }
  const auto h = read_hostfile(path);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(host_list_argument(h), "node1:2,node2:1,node3:3");
  {
    std::ofstream f(path);
    f << "node1 slots=2\nnode2 cores=4\n";
  }
  const std::string e = usage_error([&] { read_hostfile(path); });
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("cores=4"), std::string::npos) << e;
  EXPECT_NE(usage_error([] { read_hostfile("/no/such/hostfile"); }).find("/no/such/hostfile"),
            std::string::npos);
  std::remove(path.c_str());
}

TEST(HostList, AHostThatDoesNotResolveIsNamed) {
  check_hosts_resolve(parse_host_list("localhost:2", "--hosts"), "--hosts");
  const std::string e = usage_error(
      [] { check_hosts_resolve(parse_host_list("localhost,nohost.invalid", "--hosts"), "--hosts"); });
  EXPECT_NE(e.find("host nohost.invalid does not resolve"), std::string::npos) << e;
}

TEST(HostList, SlurmTasksPerNodeIsReadForOneNode) {
  EXPECT_EQ(slurm_tasks_on_node("2", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2,1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2,1", 1), 1);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 0), 3);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 1), 3);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 2), 1);
  EXPECT_EQ(slurm_tasks_on_node("1,4(x3)", 3), 4);
  // Past the end, negative nodes and garbage: 0 (the caller falls back to 1).
  EXPECT_EQ(slurm_tasks_on_node("2,1", 2), 0);
  EXPECT_EQ(slurm_tasks_on_node("2", -1), 0);
  EXPECT_EQ(slurm_tasks_on_node("", 0), 0);
  EXPECT_EQ(slurm_tasks_on_node("two", 0), 0);
  EXPECT_EQ(slurm_tasks_on_node("2(y3)", 1), 0);
  EXPECT_EQ(slurm_tasks_on_node("2(x0)", 0), 0);
  EXPECT_EQ(slurm_tasks_on_node("2(x3)z", 0), 0);
  EXPECT_EQ(slurm_tasks_on_node("2(x2000000000),1(x2000000000)", 5), 0);
}

TEST(MpirunCommand, HostsAreUnboundAndThreadsLeftToEachHost) {
  MpirunOptions o;
  o.nproc = 4;
  o.threads_per_rank = 0;
  o.hosts = "h1:2,h2:2";
  o.forward_env = {"HYPERION_LAUNCH_DIR"};
  const auto cmd = mpirun_command(o, 2, {"/bin/hyperion", "train"});
  const std::string line = [&] {
    std::string s;
    for (const auto& w : cmd) s += w + " ";
    return s;
  }();
  EXPECT_NE(line.find("-np 4 --host h1:2,h2:2 --map-by slot --bind-to none"), std::string::npos)
      << line;
  EXPECT_NE(line.find("-x HYPERION_LAUNCH_DIR"), std::string::npos) << line;
  EXPECT_EQ(line.find("HYPERION_THREADS"), std::string::npos) << line;
  EXPECT_NE(line.find("/bin/hyperion train"), std::string::npos) << line;
  o.threads_per_rank = 3;
  const auto pinned = mpirun_command(o, 2, {"x"});
  EXPECT_NE(std::find(pinned.begin(), pinned.end(), "HYPERION_THREADS=3"), pinned.end());
}

// Ranks 0-1 on a, 2 on b, 3 on a again.
class PlacedComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 4; }
  std::string name() const override { return "placed"; }
  std::string host(int r) const override { return r == 2 ? "b" : "a"; }

 protected:
  void do_all_reduce(float*, size_t, ReduceOp) override {}
  void do_reduce_scatter_v(const float*, float*, const size_t*, ReduceOp) override {}
  void do_all_gather_bytes(void*, const size_t*) override {}
  void do_broadcast(void*, size_t, int) override {}
  void do_barrier() override {}
  void do_all_to_all_v(const void*, const size_t*, void*, const size_t*) override {}
};

TEST(Placement, SummaryGroupsRanksByHost) {
  PlacedComm comm;
  EXPECT_EQ(placement_summary(comm), "a (ranks 0-1, 3), b (rank 2)");
  EXPECT_EQ(hosts(comm), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(rank_and_host(comm, 2), "rank 2 (host b)");
}

}  // namespace
}  // namespace hyperion::dist
