// The hosts a multi-host job runs on, as `hyperion train --hosts` and `--hostfile` take
// them (Open MPI's spellings, so a hostfile written for mpirun works unchanged):
//
//   --hosts h1:2,h2:2        host[:slots], comma-separated; slots default to 1
//   --hostfile FILE          one host per line, "h1 slots=2" (or "h1:2", or "h1"); blank
//                            lines and # comments are skipped
//
// Everything is checked before any rank starts: a host named twice, a slot count that is
// not a positive integer, a host name that does not resolve (named, with the resolver's
// reason), and a total slot count that disagrees with --nproc.
#pragma once

#include <string>
#include <vector>

namespace hyperion::dist {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// `origin` names the source in errors ("--hosts", "hostfile /path").
std::vector<HostSlots> parse_host_list(const std::string& text, const std::string& origin);
std::vector<HostSlots> read_hostfile(const std::string& path);

int total_slots(const std::vector<HostSlots>& hosts);
// Open MPI's --host value: "h1:2,h2:2".
std::string host_list_argument(const std::vector<HostSlots>& hosts);

// Every host name resolves (getaddrinfo); usage error naming the first that does not.
void check_hosts_resolve(const std::vector<HostSlots>& hosts, const std::string& origin);

// Slurm's tasks-per-node list ("2(x3),1": 2 tasks on each of the first three nodes, 1 on
// the fourth), as SLURM_STEP_TASKS_PER_NODE gives it: the count on node `node_id`
// (SLURM_NODEID), or 0 when the list does not parse or is too short.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

}  // namespace hyperion::dist
