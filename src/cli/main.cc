// hyperion <command> [options]: the single entry point of the CLI.
//
// Exit status: 0 on success, 1 when the command fails at run time (bad data, a file that
// cannot be written, a model that does not fit), 2 for usage errors (unknown command,
// flag or config key, a missing or malformed argument).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "base/terminate_handler.h"
#include "base/threads.h"
#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "dist/communicator.h"

namespace {

using hyperion::cli::all_commands;
using hyperion::cli::Command;

// The commands whose name starts with `group ` ("bench" -> bench peak, bench serve...).
std::vector<const Command*> group_members(const std::string& group) {
  std::vector<const Command*> out;
  for (const Command& c : all_commands())
    if (c.spec->name.rfind(group + " ", 0) == 0) out.push_back(&c);
  return out;
}

std::string usage_text() {
  std::string out =
      "usage: hyperion [--threads N] <command> [args...]\n"
      "       hyperion <command> --help     (flags, config keys and an example)\n\n"
      "commands:\n";
  for (const Command& c : all_commands())
    out += fmt::format("  {:<16} {}\n", c.spec->name, c.spec->summary);
  out +=
      "\nglobal options:\n"
      "  --threads N      worker threads (default: HYPERION_THREADS or all cores)\n"
      "  --version        version, git commit, build type, SIMD paths, library versions\n"
      "  -h, --help       show this help\n\n"
      "exit status: 0 success, 1 failure at run time, 2 usage error\n\n"
      "example:\n  hyperion train tiny steps=200\n";
  return out;
}

std::string group_usage(const std::string& group) {
  std::string out = fmt::format("usage: hyperion {} <name> [options]\n\n", group);
  for (const Command* c : group_members(group))
    out += fmt::format("  {:<16} {}\n", c->spec->name, c->spec->summary);
  out += fmt::format("\nhyperion {} <name> --help shows a command's flags.\n", group);
  // One example: the first member's (the table lists the members in a useful order).
  const std::vector<const Command*> members = group_members(group);
  if (!members.empty() && !members.front()->spec->example.empty())
    out += "\nexample:\n  hyperion " + members.front()->spec->example + "\n";
  return out;
}

bool is_help(const std::string& a) {
  return a == "-h" || a == "--help";
}

int dispatch(int argc, char** argv, int i) {
  using namespace hyperion;
  const std::string first = argv[i];
  const std::string second = i + 1 < argc ? argv[i + 1] : "";
  for (const Command& c : all_commands()) {
    if (c.spec->name == first) return c.run(cli::Args(argv + i + 1, argv + argc));
    if (c.spec->name == first + " " + second) return c.run(cli::Args(argv + i + 2, argv + argc));
  }
  if (!group_members(first).empty()) {
    if (is_help(second)) {
      std::fputs(group_usage(first).c_str(), stdout);
      return 0;
    }
    if (second.empty()) usage_fail("{}: expected a name\n\n{}", first, group_usage(first));
    usage_fail("{}: unknown name '{}'\n\n{}", first, second, group_usage(first));
  }
  usage_fail("unknown command '{}'\n\n{}", first, usage_text());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace hyperion;
  install_terminate_handler();
  try {
    int i = 1;
    int threads = 0;
    for (; i < argc; ++i) {
      std::string a = argv[i];
      if (is_help(a)) {
        std::fputs(usage_text().c_str(), stdout);
        return 0;
      } else if (a == "--version" || a == "-V") {
        std::fputs(build_info_text().c_str(), stdout);
        return 0;
      } else if (a == "--threads" || a.rfind("--threads=", 0) == 0) {
        std::string v = a == "--threads" ? (i + 1 < argc ? argv[++i] : "") : a.substr(10);
        char* end = nullptr;
        long n = std::strtol(v.c_str(), &end, 10);
        HYP_USAGE_CHECK(!v.empty() && *end == '\0' && n >= 1 && n <= 4096,
                        "--threads: expected an integer between 1 and 4096, got '{}'", v);
        threads = static_cast<int>(n);
      } else if (a.rfind("-", 0) == 0) {
        usage_fail("unknown option '{}' (global options: --threads N, --version, --help)", a);
      } else {
        break;
      }
    }
    if (i >= argc) usage_fail("expected a command\n\n{}", usage_text());
    if (threads > 0) {
      set_num_threads(threads);
      if (threads > hardware_cores())
        log_warn(
            "--threads {}: this process may use {} CPUs; a larger OpenMP team is preempted at "
            "every barrier and runs several times slower (bench/decode_threads.sh measures it)",
            threads, hardware_cores());
    } else if (const dist::LaunchInfo launch = dist::detect_launch();
               launch.under_mpi && std::getenv("HYPERION_THREADS") == nullptr &&
               std::getenv("OMP_NUM_THREADS") == nullptr) {
      // Ranks sharing a host split its cores (one threading model per process, and no
      // two ranks' pools fighting over the same cores).
      set_num_threads(std::max(1, hardware_cores() / std::max(1, launch.local_size)));
    } else {
      init_threads();
    }
    return dispatch(argc, argv, i);
  } catch (const cli::HelpRequest& h) {
    std::fputs(h.text.c_str(), stdout);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "hyperion: usage error: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "hyperion: error: %s\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // create_directories and friends: an environment problem (read-only, disk full,
    // permissions), named with the path, not an internal error.
    std::fprintf(stderr, "hyperion: error: %s: %s\n", e.path1().c_str(),
                 os_error_text(e.code().value()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fputs(kOutOfMemoryMessage, stderr);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hyperion: internal error: %s\n", e.what());
    return 1;
  }
}
