// A reader of the Prometheus text exposition format (0.0.4): every sample of a scrape with
// its name, labels, value and its family's type. `hyperion monitor` scrapes the training
// ranks' exporters (monitor/metrics_exporter.h) with it; metrics_registry.h's
// parse_prometheus_value looks up one known sample, this reads them all.
//
// Accepted: `# TYPE name kind` lines (other comments are skipped), sample lines
// `name{label="value",...} value [timestamp]` with \\, \" and \n escapes in label values,
// values as Prometheus spells them (+Inf, -Inf, NaN). A histogram's or summary's
// name_bucket/_sum/_count samples take the family's type.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "monitor/metrics_registry.h"

namespace hyperion::monitor {

struct PrometheusSample {
  std::string name;
  Labels labels;  // in the order written
  double value = 0;
  // The family's `# TYPE`: counter, gauge, histogram, summary, or untyped (also when no
  // TYPE line names it).
  std::string type;
};

// Every sample in `text`, in order. Throws hyperion::Error naming the line number and
// the line for a sample line that does not parse (a missing value, an unterminated
// label set, a value that is not a number).
std::vector<PrometheusSample> parse_prometheus_text(std::string_view text);

// The value of label `name`, or "" when the sample has none.
std::string label_value(const PrometheusSample& sample, std::string_view name);

}  // namespace hyperion::monitor
