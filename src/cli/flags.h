// Minimal flag parsing shared by the CLI commands: `--name value`, `--name=value`,
// boolean `--name`, and positional arguments. Unknown flags are errors naming the flag.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace hyperion::cli {

class Flags {
 public:
  // `with_value`: flags that take a value; `switches`: boolean flags.
  Flags(const char* command, const Args& args, std::set<std::string> with_value,
        std::set<std::string> switches);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // Errors naming the flag when missing.
  std::string require(const std::string& name) const;
  double number(const std::string& name, double fallback) const;
  int64_t integer(const std::string& name, int64_t fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace hyperion::cli
