// Runs a program (no shell) and captures what it prints: the Slurm backend's way of
// talking to sbatch, squeue, scontrol, scancel and sinfo.
#pragma once

#include <string>
#include <vector>

namespace hyperion::launch {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed; 127 when the program was not found
  std::string out;     // stdout
  std::string err;     // stderr
  bool ok() const { return exit_code == 0; }
};

// Runs argv[0] (looked up in PATH) with the given arguments and waits for it, killing it
// after timeout_s. Throws hyperion::Error only when it cannot be started at all.
CommandResult run_command(const std::vector<std::string>& argv, double timeout_s = 60);

// "sbatch --parsable ..." for error messages.
std::string command_line(const std::vector<std::string>& argv);

}  // namespace hyperion::launch
