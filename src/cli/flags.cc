#include "cli/flags.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace hyperion::cli {

std::string help_text(const CommandSpec& spec) {
  std::string out = fmt::format("usage: hyperion {}", spec.name);
  if (!spec.args.empty()) out += " " + spec.args;
  if (!spec.flags.empty()) out += " [options]";
  out += "\n\n" + spec.summary + "\n";
  if (!spec.flags.empty()) {
    out += "\noptions:\n";
    std::vector<std::string> left;
    size_t width = 0;
    for (const FlagSpec& f : spec.flags) {
      std::string l = "--" + f.name + (f.value.empty() ? "" : " " + f.value);
      width = std::max(width, l.size());
      left.push_back(std::move(l));
    }
    left.push_back("-h, --help");
    width = std::min<size_t>(std::max(width, left.back().size()), 28);
    for (size_t i = 0; i < left.size(); ++i) {
      const std::string help =
          i < spec.flags.size()
              ? spec.flags[i].help + (spec.flags[i].repeatable ? " (repeatable)" : "")
              : "show this help";
      if (left[i].size() > width)
        out += fmt::format("  {}\n  {:<{}}  {}\n", left[i], "", width, help);
      else
        out += fmt::format("  {:<{}}  {}\n", left[i], width, help);
    }
  }
  if (!spec.details.empty()) out += "\n" + spec.details + "\n";
  if (spec.config_keys != nullptr) {
    out += "\nconfig keys (key=value on the command line, or in a YAML file):\n";
    for (const ConfigKey& k : spec.config_keys()) {
      const std::string def = k.default_value.empty() ? "\"\"" : k.default_value;
      out += fmt::format("  {:<36} {} (default {})\n", k.name, k.help, def);
    }
  }
  if (!spec.example.empty()) out += "\nexample:\n  hyperion " + spec.example + "\n";
  return out;
}

Flags::Flags(const CommandSpec& spec, const Args& args) : spec_(spec) {
  auto find = [&](const std::string& name) -> const FlagSpec* {
    for (const FlagSpec& f : spec_.flags)
      if (f.name == name) return &f;
    return nullptr;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") throw HelpRequest{help_text(spec_)};
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    // `-x` is no positional (a config, a checkpoint, key=value) and no flag this parser
    // knows: a usage error rather than "no such file '-x'". A negative number passes.
    const bool single_dash = a.size() > 1 && a[0] == '-' && a[1] != '-';
    if (single_dash && !std::isdigit(static_cast<unsigned char>(a[1])) && a[1] != '.')
      usage_fail("{}: unknown flag {} (flags take two dashes; see hyperion {} --help)", spec_.name,
                 a, spec_.name);
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
    const FlagSpec* f = find(name);
    if (f == nullptr) {
      std::string known;
      for (const FlagSpec& s : spec_.flags) known += " --" + s.name;
      usage_fail("{}: unknown flag --{} (known:{}; see hyperion {} --help)", spec_.name, name,
                 known, spec_.name);
    }
    std::string value;
    if (f->value.empty()) {
      HYP_USAGE_CHECK(!inline_value, "{}: --{} takes no value", spec_.name, name);
      value.assign(1, '1');  // (not `= "1"`: GCC 12 -Wrestrict false positive)
    } else if (inline_value) {
      value.assign(body.begin() + eq + 1, body.end());
    } else {
      HYP_USAGE_CHECK(i + 1 < args.size(), "{}: --{} needs a value ({})", spec_.name, name,
                      f->value);
      value = args[++i];
    }
    std::vector<std::string>& slot = values_[name];
    HYP_USAGE_CHECK(slot.empty() || f->repeatable || f->value.empty(),
                    "{}: --{} given twice ('{}' and '{}')", spec_.name, name,
                    slot.empty() ? "" : slot.back(), value);
    slot.push_back(std::move(value));
  }
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> Flags::all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::string Flags::require(const std::string& name) const {
  HYP_USAGE_CHECK(has(name), "{}: missing required flag --{} (see hyperion {} --help)", spec_.name,
                  name, spec_.name);
  return get(name);
}

std::string Flags::nonempty(const std::string& name, const std::string& fallback) const {
  if (!has(name)) return fallback;
  const std::string v = get(name);
  HYP_USAGE_CHECK(v.find_first_not_of(" \t") != std::string::npos,
                  "{}: --{} must not be empty (leave the flag out for its default)", spec_.name,
                  name);
  return v;
}

std::vector<std::string> Flags::list(const std::string& name) const {
  std::vector<std::string> out;
  if (!has(name)) return out;
  const std::string text = nonempty(name);
  size_t from = 0;
  for (;;) {
    const size_t comma = std::min(text.find(',', from), text.size());
    const size_t b = text.find_first_not_of(" \t", from);
    const size_t e = text.find_last_not_of(" \t", comma == 0 ? 0 : comma - 1);
    const std::string item =
        b == std::string::npos || b >= comma || e == std::string::npos || e < b
            ? std::string()
            : text.substr(b, e - b + 1);
    HYP_USAGE_CHECK(!item.empty(), "{}: --{} '{}': empty item in the list (give A,B,...)",
                    spec_.name, name, text);
    HYP_USAGE_CHECK(std::find(out.begin(), out.end(), item) == out.end(),
                    "{}: --{} '{}': '{}' is given twice", spec_.name, name, text, item);
    out.push_back(item);
    if (comma == text.size()) break;
    from = comma + 1;
  }
  return out;
}

double Flags::number(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  const std::string flag = fmt::format("--{}", name);
  return parse_number(get(name), flag.c_str());
}

int64_t Flags::integer(const std::string& name, int64_t fallback) const {
  const double v = number(name, static_cast<double>(fallback));
  HYP_USAGE_CHECK(v == std::floor(v) && std::fabs(v) < 9e15,
                  "{}: --{} must be an integer, got '{}'", spec_.name, name, get(name));
  return static_cast<int64_t>(v);
}

NameAndOverrides split_positional(const Flags& flags, const char* what) {
  NameAndOverrides out;
  for (const std::string& a : flags.positional()) {
    if (a.find('=') != std::string::npos) {
      out.overrides.push_back(a);
    } else {
      HYP_USAGE_CHECK(out.name.empty(), "{}: expected one {}, got '{}' and '{}'", flags.spec().name,
                      what, out.name, a);
      out.name = a;
    }
  }
  return out;
}

double parse_number(const std::string& value, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HYP_USAGE_CHECK(used == value.size() && used > 0, "{}: expected a number, got '{}'", flag, value);
  return v;
}

}  // namespace hyperion::cli
