// The mpirun command line that starts N ranks of a program on this host or on a list of
// hosts: shared by `hyperion train --nproc [--hosts]` and the local cluster backend's
// workloads (launch/), so both launch ranks the same way.
#pragma once

#include <string>
#include <vector>

namespace hyperion::dist {

struct MpirunOptions {
  int nproc = 1;
  // OMP_NUM_THREADS and HYPERION_THREADS of every rank; 0: not set, each rank splits its
  // own host's cores between the ranks there (hosts whose core counts differ).
  int threads_per_rank = 1;
  bool allow_root = false;   // --allow-run-as-root (Open MPI refuses root otherwise)
  // Bind each rank to threads_per_rank cores of its own. Off when the caller already
  // confined the job to a set of cores (sched_setaffinity) that ranks share.
  bool bind_to_cores = true;
  // Open MPI's --host value ("h1:2,h2:2", dist/host_list.h): the ranks over those hosts,
  // unbound (the hosts' cores are not known here). Empty: this host.
  std::string hosts;
  // Environment variables of this process passed on to every rank (mpirun -x NAME).
  std::vector<std::string> forward_env;
};

// "mpirun", "-np", N, ..., then `program` (its argv, program path first). Ranks are bound
// only when there are enough cores for one each (`cores`); otherwise oversubscribed.
std::vector<std::string> mpirun_command(const MpirunOptions& o, int cores,
                                        const std::vector<std::string>& program);

}  // namespace hyperion::dist
