// `hyperion train --hosts`: mpirun as a child of the launcher rather than in its place, so
// that when the job fails the launcher can say which host was lost. mpirun ends a job
// whose remote daemon vanished within about a second, but its message names no host (and
// blames start-up); the ranks' status files (train/rank_heartbeat.h) do.
#pragma once

#include <string>
#include <vector>

namespace hyperion::cli {

// Runs `cmd` (mpirun ...) with HYPERION_LAUNCH_DIR = `launch_dir` (made here, removed
// after), passing SIGINT and SIGTERM on to it. When it fails, logs the lost ranks and
// hosts of the `world`-rank job. Returns the exit status to end with (mpirun's, or 128 +
// the signal that ended it).
int supervise_mpirun(const std::vector<std::string>& cmd, const std::string& launch_dir,
                     int world);

}  // namespace hyperion::cli
