#include "launch/workload_spec.h"

#include <cctype>

#include "base/error.h"

namespace hyperion::launch {

const char* backend_name(Backend b) {
  return b == Backend::kLocal ? "local" : "slurm";
}

Backend parse_backend(const std::string& name) {
  if (name == "local") return Backend::kLocal;
  if (name == "slurm") return Backend::kSlurm;
  usage_fail("--backend must be local or slurm, got '{}'", name);
}

const char* priority_name(Priority p) {
  switch (p) {
    case Priority::kLow:
      return "low";
    case Priority::kMedium:
      return "medium";
    case Priority::kHigh:
      return "high";
  }
  return "?";
}

Priority parse_priority(const std::string& name) {
  if (name == "low") return Priority::kLow;
  if (name == "medium") return Priority::kMedium;
  if (name == "high") return Priority::kHigh;
  usage_fail("--priority must be low, medium or high, got '{}'", name);
}

namespace {
constexpr const char* kStateNames[] = {"queued",    "running", "restarting", "preempted",
                                       "succeeded", "failed",  "deleted"};
}

const char* state_name(WorkloadState s) {
  return kStateNames[static_cast<int>(s)];
}

WorkloadState parse_state(const std::string& name) {
  for (int i = 0; i < 7; ++i)
    if (name == kStateNames[i]) return static_cast<WorkloadState>(i);
  fail("unknown workload state '{}'", name);
}

bool is_final(WorkloadState s) {
  return s == WorkloadState::kSucceeded || s == WorkloadState::kFailed ||
         s == WorkloadState::kDeleted;
}

void check_name(const std::string& what, const std::string& name) {
  HYP_USAGE_CHECK(!name.empty(), "--{} is required (a name: lowercase letters, digits and '-')",
                  what);
  HYP_USAGE_CHECK(name.size() <= 40, "{} name '{}' is {} characters long; at most 40", what, name,
                  name.size());
  HYP_USAGE_CHECK(std::islower(static_cast<unsigned char>(name[0])),
                  "{} name '{}' must start with a lowercase letter", what, name);
  for (char c : name)
    HYP_USAGE_CHECK(std::islower(static_cast<unsigned char>(c)) ||
                        std::isdigit(static_cast<unsigned char>(c)) || c == '-',
                    "{} name '{}' has '{}': only lowercase letters, digits and '-' are allowed",
                    what, name, c);
  HYP_USAGE_CHECK(name.back() != '-', "{} name '{}' must not end with '-'", what, name);
}

}  // namespace hyperion::launch
