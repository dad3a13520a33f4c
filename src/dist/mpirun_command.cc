#include "dist/mpirun_command.h"

#include <fmt/format.h>

namespace hyperion::dist {

std::vector<std::string> mpirun_command(const MpirunOptions& o, int cores,
                                        const std::vector<std::string>& program) {
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(o.nproc)};
  if (o.allow_root) cmd.push_back("--allow-run-as-root");
  if (!o.hosts.empty()) {
    cmd.insert(cmd.end(), {"--host", o.hosts, "--map-by", "slot", "--bind-to", "none"});
  } else if (o.bind_to_cores && o.nproc <= cores) {
    // Each rank on its own cores (threads_per_rank cores per rank).
    cmd.insert(cmd.end(),
               {"--map-by", fmt::format("slot:PE={}", o.threads_per_rank), "--bind-to", "core"});
  } else {
    cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
  }
  for (const std::string& name : o.forward_env) cmd.insert(cmd.end(), {"-x", name});
  if (o.threads_per_rank > 0)
    cmd.insert(cmd.end(), {"-x", fmt::format("OMP_NUM_THREADS={}", o.threads_per_rank), "-x",
                           fmt::format("HYPERION_THREADS={}", o.threads_per_rank)});
  cmd.insert(cmd.end(), program.begin(), program.end());
  return cmd;
}

}  // namespace hyperion::dist
