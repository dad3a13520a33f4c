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
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switches.count(name)) {
      HYP_CHECK(!inline_value, "{}: --{} takes no value", command_, name);
      values_[name] = "1";
    } else if (with_value.count(name)) {
      if (!inline_value) {
        HYP_CHECK(i + 1 < args.size(), "{}: --{} needs a value", command_, name);
        value = args[++i];
      }
      values_[name] = value;
    } else {
      std::string known;
      for (const auto& s : with_value) known += " --" + s;
      for (const auto& s : switches) known += " --" + s;
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
  const std::string flag = "--" + name;
  return parse_number(get(name), flag.c_str());
}

int64_t Flags::integer(const std::string& name, int64_t fallback) const {
  const double v = number(name, static_cast<double>(fallback));
  HYP_CHECK(v == std::floor(v) && std::fabs(v) < 9e15, "{}: --{} must be an integer, got '{}'",
            command_, name, get(name));
  return static_cast<int64_t>(v);
}

}  // namespace hyperion::cli
