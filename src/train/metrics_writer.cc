#include "train/metrics_writer.h"

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/atomic_file.h"
#include "base/line_reader.h"

namespace hyperion {

namespace {

// Keeps the metrics of steps <= `step`, streamed (a line at a time) into the new file.
void truncate_metrics(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  LineReader in(path, 1 << 20);  // a metrics line is a few hundred bytes
  io::AtomicFileWriter out(path);
  std::string_view line;
  for (LineReader::Status st; (st = in.next(line)) != LineReader::Status::kEnd;) {
    if (st != LineReader::Status::kLine) continue;  // corrupt: dropped
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= step) {
      out.write(line);
      out.write("\n");
    }
  }
  out.commit();
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& run_dir, bool enabled, int64_t resume_step)
    : path_(run_dir + "/metrics.jsonl") {
  if (!enabled) return;
  if (resume_step > 0) truncate_metrics(path_, resume_step);
  out_.open(path_, std::ios::app);
  HYP_CHECK(out_.good(), "cannot open {} for writing: {}", path_, os_error_text(errno));
}

void MetricsWriter::write(const StepMetrics& m, int64_t tokens_seen, bool multi_rank, bool moe) {
  if (!out_.is_open()) return;
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["grad_norm"] = m.grad_norm;
  j["lr"] = m.lr;
  j["step_s"] = m.step_s;
  j["tokens_per_s"] = m.tokens_per_s;
  j["tflops"] = m.tflops;
  j["mfu"] = m.mfu;
  j["emfu"] = m.emfu;
  j["data_wait_s"] = m.data_wait_s;
  j["tokens_seen"] = tokens_seen;
  if (multi_rank) {
    j["comm_s"] = m.comm_s;
    j["comm_exposed_s"] = m.comm_wait_s;
    j["comm_bytes_sent"] = m.comm_bytes;
  }
  if (moe) {
    j["lm_loss"] = m.lm_loss;
    j["moe_lb_loss"] = m.moe.lb_loss;
    j["moe_z_loss"] = m.moe.z_loss;
    j["moe_dropped_fraction"] = m.moe.dropped_fraction;
    j["expert_load_min"] = m.moe.load_min;
    j["expert_load_max"] = m.moe.load_max;
    j["expert_load_cv"] = m.moe.load_cv;
  }
  if (m.dpo) {
    j["rewards/chosen"] = m.rewards_chosen;
    j["rewards/rejected"] = m.rewards_rejected;
    j["rewards/accuracies"] = m.rewards_accuracies;
    j["rewards/margins"] = m.rewards_margins;
  }
  if (m.samples_per_s > 0) j["samples_per_s"] = m.samples_per_s;
  if (m.auc >= 0) j["auc"] = m.auc;
  if (m.eval_loss >= 0) j["eval_loss"] = m.eval_loss;
  if (m.skipped) j["skipped"] = true;
  if (m.device_peak_mib >= 0) j["device_peak_mib"] = m.device_peak_mib;
  out_ << j.dump() << "\n";
  out_.flush();
  HYP_CHECK(out_.good(), "cannot append to {}: {}", path_, os_error_text(errno));
}

}  // namespace hyperion
