// The Slurm backend of `hyperion cluster` and `hyperion workload` (issue 18;
// docs/ORCHESTRATION.md). A cluster is a Slurm partition, or three that share nodes when
// hyperion creates them (NAME-low, NAME, NAME-high with priority tiers 1-3: with the
// site's PreemptType=preempt/partition_prio and PreemptMode=REQUEUE a higher tier
// preempts and requeues a lower one). A workload is one batch job whose script runs
// `hyperion workload exec`: that runs each attempt as a job step (`srun`, with
// --mpi=pmix for several ranks), applies the restart policy between attempts, and
// records the workload's status next to its output. Slurm's own view (squeue, scontrol)
// is merged in when a status is asked for: pending reasons, requeues, cancellations.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/cluster_store.h"
#include "launch/workload_spec.h"

namespace hyperion::launch::slurm {

// Throws naming SLURM_CONF and the command's error when Slurm does not answer.
void check_reachable();

// Fills the cluster's partitions: `partition` when given (it must exist), else creates
// NAME-low, NAME and NAME-high on `nodes` (Slurm node list; "ALL" by default). Throws
// naming the scontrol error (creating partitions needs a Slurm administrator).
void setup_partitions(ClusterSpec& c, const std::string& partition, const std::string& nodes);
void delete_partitions(const ClusterSpec& c);

// Nodes, CPUs and states of the cluster's partitions (sinfo, scontrol), and whether the
// site preempts by partition priority.
nlohmann::json describe(const ClusterSpec& c);

// Submits the workload's batch job (its status records the job id). Throws naming the
// sbatch error.
void submit(const ClusterStore& store, const ClusterSpec& c, const WorkloadSpec& w,
            const std::string& self_exe);

// The workload's status with Slurm's current view merged in.
WorkloadStatus live_status(const ClusterStore& store, const ClusterSpec& c, const WorkloadSpec& w);

// Cancels the job: SIGTERM to the batch script and every step, then (after grace_s)
// Slurm's own cancel (SIGTERM, KillWait, SIGKILL). Marks the workload deleted.
void delete_workload(const ClusterStore& store, const ClusterSpec& c, const WorkloadSpec& w,
                     double grace_s);

// `hyperion workload exec` inside the batch job: runs the attempts; returns the exit code
// the batch job ends with.
int exec_in_allocation(const ClusterStore& store, const ClusterSpec& c, const std::string& name);

// "Resources" -> "the resources it needs are in use", for `workload status`.
std::string explain_pending_reason(const std::string& reason);

}  // namespace hyperion::launch::slurm
