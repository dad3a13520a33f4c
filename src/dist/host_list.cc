#include "dist/host_list.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <sstream>

#include <fmt/format.h>

#include "base/error.h"
#include "base/input_file.h"

namespace hyperion::dist {

namespace {

// A hostfile holds at most this much: thousands of hosts, not a data file given by mistake.
constexpr int64_t kMaxHostfileBytes = int64_t{1} << 20;

// What an error quotes of a user's text: at most 80 characters (a megabyte-long line is
// not echoed whole).
std::string clip(const std::string& s) {
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

int parse_slots(const std::string& text, const std::string& where) {
  int v = 0;
  size_t used = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HYP_USAGE_CHECK(used == text.size() && !text.empty() && v >= 1 && v <= 4096,
                  "{}: slots '{}' is not an integer between 1 and 4096", where, clip(text));
  return v;
}

// A host name as a resolver takes it: letters, digits, '-', '.', '_' (and ':' is the
// slot separator, so IPv6 literals are not accepted here).
void check_name(const std::string& host, const std::string& where) {
  const bool ok = !host.empty() && host.size() <= 253 &&
                  std::all_of(host.begin(), host.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ||
                           c == '_';
                  });
  HYP_USAGE_CHECK(ok, "{}: '{}' is not a host name", where, clip(host));
}

void add(std::vector<HostSlots>& out, HostSlots h, const std::string& where) {
  check_name(h.host, where);
  for (const HostSlots& o : out)
    HYP_USAGE_CHECK(o.host != h.host, "{}: host {} is listed twice (give it one entry with its "
                    "slot count)", where, h.host);
  out.push_back(std::move(h));
}

HostSlots host_colon_slots(const std::string& item, const std::string& where) {
  const size_t colon = item.find(':');
  if (colon == std::string::npos) return {item, 1};
  return {item.substr(0, colon), parse_slots(item.substr(colon + 1), where)};
}

}  // namespace

std::vector<HostSlots> parse_host_list(const std::string& text, const std::string& origin) {
  std::vector<HostSlots> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    HYP_USAGE_CHECK(!item.empty(), "{}: empty entry in '{}' (expected host[:slots],...)", origin,
                    clip(text));
    add(out, host_colon_slots(item, origin), origin);
  }
  HYP_USAGE_CHECK(!out.empty(), "{}: no hosts given (expected host[:slots],...)", origin);
  return out;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  // A regular file of plausible size (a FIFO, device or directory is refused by name).
  std::string text;
  try {
    text = read_regular_file(path, kMaxHostfileBytes);
  } catch (const Error& e) {
    throw UsageError(fmt::format("hostfile {}: {}", path, e.what()));
  }
  std::stringstream in(text);
  std::vector<HostSlots> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string where = fmt::format("hostfile {} line {}", path, n);
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = trim(line);
    if (line.empty()) continue;
    std::stringstream words(line);
    std::string host, word;
    words >> host;
    HostSlots h = host_colon_slots(host, where);
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0) {
        h.slots = parse_slots(word.substr(6), where);
      } else {
        // max_slots= and the like change nothing for a job that fills its slots exactly.
        HYP_USAGE_CHECK(word.rfind("max_slots=", 0) == 0,
                        "{}: unknown field '{}' (expected: host [slots=N])", where, clip(word));
      }
    }
    add(out, std::move(h), where);
  }
  HYP_USAGE_CHECK(!out.empty(), "hostfile {}: lists no hosts", path);
  return out;
}

int total_slots(const std::vector<HostSlots>& hosts) {
  int n = 0;
  for (const HostSlots& h : hosts) n += h.slots;
  return n;
}

std::string host_list_argument(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const HostSlots& h : hosts)
    out += fmt::format("{}{}:{}", out.empty() ? "" : ",", h.host, h.slots);
  return out;
}

void check_hosts_resolve(const std::vector<HostSlots>& hosts, const std::string& origin) {
  for (const HostSlots& h : hosts) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(h.host.c_str(), nullptr, &hints, &res);
    if (res != nullptr) ::freeaddrinfo(res);
    HYP_USAGE_CHECK(rc == 0, "{}: host {} does not resolve ({}); no rank was started", origin,
                    h.host, ::gai_strerror(rc));
  }
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id) {
  if (node_id < 0) return 0;
  std::istringstream in(tasks_per_node);
  std::string item;
  int64_t first = 0;  // the first node this item covers
  while (std::getline(in, item, ',')) {
    int count = 0, repeat = 1;
    char open = 0, x = 0, close = 0, rest = 0;
    std::istringstream one(item);
    if (!(one >> count) || count < 0) return 0;
    if (one >> open) {
      if (open != '(' || !(one >> x >> repeat >> close) || x != 'x' || close != ')' || repeat < 1)
        return 0;
      if (one >> rest) return 0;  // "2(x3)z"
    }
    if (repeat > 1000000) return 0;  // no job has a million nodes: garbage
    if (node_id < first + repeat) return count;
    first += repeat;
  }
  return 0;
}

}  // namespace hyperion::dist
