// `hyperion goodput RUN_DIR`: the job's goodput and badput by kind from its event log
// (monitor/goodput.h), across every process that worked on the run.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/flags.h"
#include "monitor/goodput.h"

namespace hyperion::cli {

const CommandSpec kGoodputSpec = {
    "goodput",
    "RUN_DIR",
    "goodput and badput of a training run, across restarts, from RUN_DIR/events.jsonl",
    {{"json", "", "print the report as one JSON object (keys goodput, badput, ...)"}},
    "Goodput is productive step time (less data waits) over the job's wall time, from the "
    "first process's launch to the last event. Badput kinds: program_startup, "
    "initialization, data_loading, checkpoint_save, checkpoint_restore, wasted_progress "
    "(steps a crash lost), recovery (between a crash and the next launch), other "
    "(evaluation, samples). docs/MONITORING.md has the definitions.",
    "goodput runs/tiny --json"};

int cmd_goodput(const Args& args) {
  const Flags flags(kGoodputSpec, args);
  HYP_USAGE_CHECK(flags.positional().size() == 1,
                  "goodput: expected one RUN_DIR (or events.jsonl), got {} arguments",
                  flags.positional().size());
  const std::string& dir = flags.positional()[0];
  HYP_USAGE_CHECK(std::filesystem::exists(dir), "goodput: '{}': no such run directory", dir);
  const monitor::GoodputReport r = monitor::compute_goodput(dir);
  if (flags.has("json")) {
    std::printf("%s\n", monitor::goodput_json(r).c_str());
    return 0;
  }
  std::string out = fmt::format(
      "goodput {:.1f}%  ({:.1f} s productive of {:.1f} s; {} process{}, {} disruption{}, "
      "{} steps kept, {} lost{})\n",
      100 * r.goodput, r.productive_s, r.total_s, r.processes, r.processes == 1 ? "" : "es",
      r.disruptions, r.disruptions == 1 ? "" : "s", r.steps_kept, r.steps_lost,
      r.finished ? "" : "; not finished");
  for (const std::string& k : monitor::badput_kinds()) {
    const double s = r.badput.count(k) ? r.badput.at(k) : 0.0;
    out += fmt::format("  {:<20} {:>10.2f} s  {:>5.1f}%\n", k, s,
                       r.total_s > 0 ? 100 * s / r.total_s : 0.0);
  }
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace hyperion::cli
