#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator.h"

namespace hyperion::dist {
namespace {

// Sets launcher variables for one test and restores the environment after it.
class LaunchEnv {
 public:
  explicit LaunchEnv(std::vector<std::pair<std::string, std::string>> vars) {
    for (const char* k : kAll) {
      const char* v = ::getenv(k);
      saved_.emplace_back(k, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(k);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~LaunchEnv() {
    for (const auto& [k, v] : saved_) {
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }

 private:
  static constexpr const char* kAll[] = {"OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_LOCAL_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "PMIX_SIZE",
                                         "PMIX_RANK",
                                         "PMI_SIZE",
                                         "PMI_RANK",
                                         "MPI_LOCALNRANKS",
                                         "MPI_LOCALRANKID",
                                         "SLURM_STEP_NUM_TASKS",
                                         "SLURM_NTASKS",
                                         "SLURM_STEP_TASKS_PER_NODE",
                                         "SLURM_LOCALID",
                                         "SLURM_NODEID",
                                         "SLURM_PROCID"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(DetectLaunch, AloneIsNotUnderMpi) {
  LaunchEnv env({});
  const LaunchInfo l = detect_launch();
  EXPECT_FALSE(l.under_mpi);
  EXPECT_EQ(l.world, 1);
}

TEST(DetectLaunch, OpenMpiMpirun) {
  LaunchEnv env({{"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  const LaunchInfo l = detect_launch();
  EXPECT_TRUE(l.under_mpi);
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.local_size, 2);
  EXPECT_EQ(l.local_rank, 1);
}

// srun --mpi=pmix sets PMIX_RANK but no size: the step's task count is used.
TEST(DetectLaunch, SlurmSrunWithPmix) {
  LaunchEnv env({{"PMIX_RANK", "5"},
                 {"SLURM_STEP_NUM_TASKS", "6"},
                 {"SLURM_NTASKS", "8"},
                 {"SLURM_STEP_TASKS_PER_NODE", "3(x2)"},
                 {"SLURM_LOCALID", "2"},
                 {"SLURM_PROCID", "5"}});
  const LaunchInfo l = detect_launch();
  EXPECT_TRUE(l.under_mpi);
  EXPECT_EQ(l.world, 6);
  EXPECT_EQ(l.rank, 5);
  EXPECT_EQ(l.local_size, 3);
  EXPECT_EQ(l.local_rank, 2);
}

// A step over two nodes with 2 ranks on the first and 1 on the second: the second
// node's rank sees 1 rank on its host, not the first node's 2.
TEST(DetectLaunch, SlurmUnevenNodesTakeThisNodesCount) {
  LaunchEnv env({{"PMIX_RANK", "2"},
                 {"SLURM_STEP_NUM_TASKS", "3"},
                 {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
                 {"SLURM_NODEID", "1"},
                 {"SLURM_LOCALID", "0"}});
  const LaunchInfo l = detect_launch();
  EXPECT_EQ(l.world, 3);
  EXPECT_EQ(l.local_size, 1);
  EXPECT_EQ(l.local_rank, 0);
}

// srun without an MPI plugin starts independent processes: not one MPI job.
TEST(DetectLaunch, SlurmWithoutPmiIsNotMpi) {
  LaunchEnv env({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}});
  EXPECT_FALSE(detect_launch().under_mpi);
}

}  // namespace
}  // namespace hyperion::dist
