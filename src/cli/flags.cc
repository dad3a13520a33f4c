#include "cli/flags.h"

#include <cmath>

#include "base/error.h"

namespace hyperion::cli {

Flags::Flags(const char* command, const Args& args, std::set<std::string> with_value,
             std::set<std::string> switches)
    : command_(command) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    // Separate strings (no self-assignment of substrings): GCC 12's -Wrestrict misfires
    // on `name = name.substr(...)` under the sanitizer build.
    const std::string body(a.begin() + 2, a.end());
    const size_t eq = body.find('=');
    const bool inline_value = eq != std::string::npos;
    const std::string name = inline_value ? std::string(body.begin(), body.begin() + eq) : body;
    std::string value =
        inline_value ? std::string(body.begin() + eq + 1, body.end()) : std::string();
    if (switches.count(name)) {
      HYP_CHECK(!inline_value, "{}: --{} takes no value", command_, name);
      values_[name].assign(1, '1');  // (not `= "1"`: GCC 12 -Wrestrict false positive)
    } else if (with_value.count(name)) {
      if (!inline_value) {
        HYP_CHECK(i + 1 < args.size(), "{}: --{} needs a value", command_, name);
        value = args[++i];
      }
      values_[name] = value;
    } else {
      std::string known;
      for (const auto& s : with_value) known += fmt::format(" --{}", s);
      for (const auto& s : switches) known += fmt::format(" --{}", s);
      fail("{}: unknown flag --{} (known:{})", command_, name, known);
    }
  }
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Flags::require(const std::string& name) const {
  auto it = values_.find(name);
  HYP_CHECK(it != values_.end(), "{}: missing required flag --{}", command_, name);
  return it->second;
}

double Flags::number(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  const std::string flag = fmt::format("--{}", name);
  return parse_number(get(name), flag.c_str());
}

int64_t Flags::integer(const std::string& name, int64_t fallback) const {
  const double v = number(name, static_cast<double>(fallback));
  HYP_CHECK(v == std::floor(v) && std::fabs(v) < 9e15, "{}: --{} must be an integer, got '{}'",
            command_, name, get(name));
  return static_cast<int64_t>(v);
}

}  // namespace hyperion::cli
