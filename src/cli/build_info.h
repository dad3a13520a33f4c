// What this binary is: version, git commit, build type, compiler, the SIMD code paths
// compiled in (and the one this CPU runs), and the versions of the libraries it was
// built against. `hyperion --version` prints it; `hyperion info --json` includes it.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace hyperion {

struct BuildInfo {
  std::string version;     // the project version (CMake's project())
  std::string git_commit;  // `git describe --always --dirty` at build time, or "unknown"
  std::string build_type;  // Release, Debug, RelWithDebInfo (+ sanitizers)
  std::string compiler;
  std::vector<std::string> simd_compiled;  // Highway targets built into the kernels
  std::string simd_active;                 // the best of them this CPU supports
  std::vector<std::string> isa_paths;      // hand-written ISA paths (chosen at run time)
  std::vector<std::pair<std::string, std::string>> libraries;  // name, version
};

const BuildInfo& build_info();

// Multi-line text for `hyperion --version`.
std::string build_info_text();

}  // namespace hyperion
