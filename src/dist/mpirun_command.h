// The mpirun command line that starts N ranks of a program on this host: shared by
// `hyperion train --nproc` and the local cluster backend's workloads (launch/), so both
// launch ranks the same way.
#pragma once

#include <string>
#include <vector>

namespace hyperion::dist {

struct MpirunOptions {
  int nproc = 1;
  int threads_per_rank = 1;  // OMP_NUM_THREADS and HYPERION_THREADS of every rank
  bool allow_root = false;   // --allow-run-as-root (Open MPI refuses root otherwise)
  // Bind each rank to threads_per_rank cores of its own. Off when the caller already
  // confined the job to a set of cores (sched_setaffinity) that ranks share.
  bool bind_to_cores = true;
};

// "mpirun", "-np", N, ..., then `program` (its argv, program path first). Ranks are bound
// only when there are enough cores for one each (`cores`); otherwise oversubscribed.
std::vector<std::string> mpirun_command(const MpirunOptions& o, int cores,
                                        const std::vector<std::string>& program);

}  // namespace hyperion::dist
