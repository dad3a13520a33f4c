#include "monitor/prometheus_text.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>

#include "base/error.h"

namespace hyperion::monitor {

namespace {

bool name_char(char c, bool first) {
  const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_' || c == ':';
  return first ? alpha : alpha || std::isdigit(static_cast<unsigned char>(c)) != 0;
}

std::optional<double> parse_value(std::string_view s) {
  if (s == "+Inf" || s == "Inf") return HUGE_VAL;
  if (s == "-Inf") return -HUGE_VAL;
  if (s == "NaN") return std::nan("");
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

void skip_blanks(std::string_view line, size_t& pos) {
  while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
}

// `{k="v",...}` from line[pos] == '{'; leaves pos past '}'. nullopt when malformed.
std::optional<Labels> parse_labels(std::string_view line, size_t& pos) {
  Labels out;
  ++pos;
  while (true) {
    while (pos < line.size() && (line[pos] == ' ' || line[pos] == ',')) ++pos;
    if (pos >= line.size()) return std::nullopt;
    if (line[pos] == '}') {
      ++pos;
      return out;
    }
    const size_t eq = line.find('=', pos);
    if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"')
      return std::nullopt;
    std::string key(line.substr(pos, eq - pos));
    while (!key.empty() && key.back() == ' ') key.pop_back();
    if (key.empty()) return std::nullopt;
    std::string value;
    for (pos = eq + 2; pos < line.size() && line[pos] != '"'; ++pos) {
      if (line[pos] == '\\') {
        if (++pos >= line.size()) return std::nullopt;
        value += line[pos] == 'n' ? '\n' : line[pos];
      } else {
        value += line[pos];
      }
    }
    if (pos >= line.size()) return std::nullopt;  // unterminated value
    ++pos;
    out.emplace_back(std::move(key), std::move(value));
  }
}

// A sample's family type: its own name's TYPE, else that of the name less a histogram's
// or summary's suffix.
std::string type_of(const std::map<std::string, std::string, std::less<>>& types,
                    const std::string& name) {
  if (auto it = types.find(name); it != types.end()) return it->second;
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) != 0)
      continue;
    auto it = types.find(std::string_view(name).substr(0, name.size() - suffix.size()));
    if (it != types.end() && (it->second == "histogram" || it->second == "summary"))
      return it->second;
  }
  return "untyped";
}

}  // namespace

std::vector<PrometheusSample> parse_prometheus_text(std::string_view text) {
  std::vector<PrometheusSample> out;
  std::map<std::string, std::string, std::less<>> types;
  int line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t pos = 0;
    skip_blanks(line, pos);
    if (pos == line.size()) continue;
    auto malformed = [&](const char* why) {
      fail("Prometheus text line {}: {}: '{}'", line_no, why, line);
    };
    if (line[pos] == '#') {
      // `# TYPE name kind`; HELP and other comments carry nothing this reader needs.
      std::string_view rest = line.substr(pos + 1);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      if (rest.substr(0, 5) != "TYPE ") continue;
      rest.remove_prefix(5);
      const size_t sp = rest.find(' ');
      if (sp == std::string_view::npos) continue;
      std::string_view kind = rest.substr(sp + 1);
      while (!kind.empty() && kind.back() == ' ') kind.remove_suffix(1);
      types[std::string(rest.substr(0, sp))] = std::string(kind);
      continue;
    }
    PrometheusSample s;
    const size_t name_start = pos;
    while (pos < line.size() && name_char(line[pos], pos == name_start)) ++pos;
    if (pos == name_start) malformed("not a metric name");
    s.name = std::string(line.substr(name_start, pos - name_start));
    skip_blanks(line, pos);
    if (pos < line.size() && line[pos] == '{') {
      std::optional<Labels> labels = parse_labels(line, pos);
      if (!labels) malformed("malformed label set");
      s.labels = std::move(*labels);
      skip_blanks(line, pos);
    }
    const size_t end = line.find_first_of(" \t", pos);  // a timestamp may follow
    const std::optional<double> v = parse_value(line.substr(pos, end - pos));
    if (!v) malformed(pos == line.size() ? "no value" : "the value is not a number");
    s.value = *v;
    s.type = type_of(types, s.name);
    out.push_back(std::move(s));
  }
  return out;
}

std::string label_value(const PrometheusSample& sample, std::string_view name) {
  for (const auto& [k, v] : sample.labels)
    if (k == name) return v;
  return "";
}

}  // namespace hyperion::monitor
