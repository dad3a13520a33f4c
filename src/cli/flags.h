// Every command's interface as data (CommandSpec): its arguments, flags with their help,
// the config keys it reads and an example. The same spec drives `--help` and the flag
// parser, so the two cannot disagree.
//
// Parsing: `--name value`, `--name=value`, boolean `--name`, repeatable flags, and
// positional arguments. `-h`/`--help` anywhere asks for the command's help. Unknown
// flags, missing values and malformed numbers are usage errors (exit status 2) naming
// the flag.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "cli/commands.h"

namespace hyperion::cli {

struct FlagSpec {
  std::string name;   // without the leading "--"
  std::string value;  // the value's placeholder ("N", "FILE"); empty for a switch
  std::string help;
  bool repeatable = false;  // may be given several times (Flags::all)
};

struct CommandSpec {
  std::string name;     // as typed after `hyperion`: "train", "bench serve"
  std::string args;     // positional arguments: "[CONFIG] [key=value ...]"
  std::string summary;  // one line
  std::vector<FlagSpec> flags;
  std::string details;  // further paragraphs: config keys or where they are documented
  std::string example;  // one command line (without the leading "hyperion ")
  // The command's `key=value` config keys, listed by --help with type, default and help.
  std::vector<ConfigKey> (*config_keys)() = nullptr;
};

// The command's --help text: usage, summary, flags, details and the example.
std::string help_text(const CommandSpec& spec);

// Thrown when `-h` or `--help` is given: main prints `text` to stdout and exits 0.
struct HelpRequest {
  std::string text;
};

class Flags {
 public:
  Flags(const CommandSpec& spec, const Args& args);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value given (repeatable flags: every value, in order, from all()).
  std::string get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> all(const std::string& name) const;
  // Usage error naming the flag when missing.
  std::string require(const std::string& name) const;
  // The value, which must not be empty when the flag is given ("" is a usage error, never
  // "the default" or "all"); `fallback` when the flag is absent.
  std::string nonempty(const std::string& name, const std::string& fallback = "") const;
  // A comma-separated list ("a,b,c"; spaces around items ignored). Usage errors name the
  // flag for an empty list, an empty item ("a,,b", "a,") and an item given twice. Empty
  // when the flag is absent.
  std::vector<std::string> list(const std::string& name) const;
  // Usage errors name the flag and the value when it is not a number / an integer.
  double number(const std::string& name, double fallback) const;
  int64_t integer(const std::string& name, int64_t fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }
  const CommandSpec& spec() const { return spec_; }

 private:
  const CommandSpec& spec_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// Positional arguments split into at most one name (a config, a checkpoint) and
// `key=value` overrides. Usage errors name the command.
struct NameAndOverrides {
  std::string name;
  std::vector<std::string> overrides;
};
NameAndOverrides split_positional(const Flags& flags, const char* what);

// Prints a command's --json result (one object, then a newline). Text that is not valid
// UTF-8 (a sample cut inside a character, a path with Latin-1 bytes) is written with
// U+FFFD in place of the bad bytes: the output is always valid JSON, never an exception
// after the work is done. `indent` as nlohmann's dump (-1: one line).
template <typename Json>
void print_json(const Json& j, int indent = 2) {
  std::printf("%s\n", j.dump(indent, ' ', false, Json::error_handler_t::replace).c_str());
}

}  // namespace hyperion::cli
