// `hyperion train [CONFIG] [key=value ...]` and `hyperion plan CONFIG [key=value ...]`.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kernels/moe_routing.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "base/error.h"
#include "base/log.h"
#include "base/system_memory.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/mpirun_supervisor.h"
#include "dist/communicator.h"
#include "dist/host_list.h"
#include "dist/mpirun_command.h"
#include "model/decoder_config.h"
#include "train/rank_heartbeat.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace hyperion::cli {

namespace {

std::string config_name(const std::string& arg) {
  return arg.empty() ? "tiny" : std::filesystem::path(arg).stem().string();
}

}  // namespace

const CommandSpec kTrainSpec = {
    "train",
    "[CONFIG] [key=value ...]",
    "pre-train a Llama, Mixtral or Gemma model (no CONFIG: the embedded tiny preset on the bundled "
    "corpus), or a DLRM-V2 recommender (model_type: dlrm)",
    {{"resume", "DIR", "continue a run from its latest checkpoint (restores its config)"},
     {"stop-at", "STEP", "stop after this step, as if interrupted (the run can be resumed)"},
     {"nproc", "N", "run N MPI ranks (data / FSDP / expert parallel), on this host or --hosts"},
     {"hosts", "H1:N,H2:N", "run the ranks on these hosts, N slots each (mpirun --host)"},
     {"hostfile", "FILE", "the hosts from a file, one per line: 'h1 slots=2' (mpirun's format)"},
     {"threads-per-rank", "N", "threads of every rank (default: its host's cores / its ranks)"},
     {"allow-run-as-root", "", "let --nproc start mpirun as root"},
     {"quiet", "", "no per-step log lines"},
     {"json", "", "print the result as one JSON object"}},
    "CONFIG is a YAML file or a preset name (tiny, llama-25m, llama-110m, mixtral-tiny, "
    "llama2-7b, dlrm-tiny, ...;\nconfigs/). Later key=value overrides win. Guide: "
    "docs/TRAINING.md, "
    "docs/MOE.md, docs/SCALING.md, docs/MULTI_HOST.md.",
    "train llama-25m steps=200 learning_rate=1e-3",
    train_config_schema};

const CommandSpec kPlanSpec = {
    "plan",
    "CONFIG [key=value ...]",
    "parameters, FLOPs per token (per example for a recommender) and training memory per "
    "process of a config",
    {{"json", "", "print the plan as one JSON object"},
     {"nproc", "N", "recommenders: memory per rank with the tables over N ranks (default 1)"}},
    "CONFIG and keys as for `hyperion train` (see hyperion train --help).",
    "plan llama2-7b per_device_batch_size=1 --json"};

namespace {

// The launcher's own flags, not passed on to the ranks: (name, takes a value).
constexpr std::pair<const char*, bool> kLauncherFlags[] = {{"--nproc", true},
                                                           {"--hosts", true},
                                                           {"--hostfile", true},
                                                           {"--threads-per-rank", true},
                                                           {"--allow-run-as-root", false}};

// `--nproc N` (and `--hosts` / `--hostfile`): re-runs this command as N MPI ranks through
// mpirun. On one host ranks are bound to cores when there are enough, and the cores are
// split between them; over several, each rank takes its host's cores / its ranks there
// (or --threads-per-rank). The host list is checked here, before any rank starts.
[[noreturn]] void launch_ranks(const Args& args, const Flags& f,
                               const std::string& base_output_directory) {
  const bool allow_root = f.has("allow-run-as-root");
  HYP_USAGE_CHECK(!(f.has("hosts") && f.has("hostfile")),
                  "train: give --hosts or --hostfile, not both");
  std::vector<dist::HostSlots> hosts;
  std::string origin;
  if (f.has("hosts")) {
    origin = "--hosts";
    hosts = dist::parse_host_list(f.get("hosts"), origin);
  } else if (f.has("hostfile")) {
    origin = "hostfile " + f.get("hostfile");
    hosts = dist::read_hostfile(f.get("hostfile"));
  }
  const int64_t nproc = f.has("nproc") ? f.integer("nproc", 1) : dist::total_slots(hosts);
  HYP_USAGE_CHECK(nproc >= 1 && nproc <= 4096, "train: --nproc must be between 1 and 4096, got {}",
                  nproc);
  HYP_USAGE_CHECK(hosts.empty() || nproc == dist::total_slots(hosts),
                  "train: --nproc {} disagrees with the {} slots of {} ({}); give as many ranks "
                  "as slots",
                  nproc, dist::total_slots(hosts), origin, dist::host_list_argument(hosts));
  HYP_USAGE_CHECK(!f.has("threads-per-rank") || (f.integer("threads-per-rank", 1) >= 1 &&
                                                  f.integer("threads-per-rank", 1) <= 4096),
                  "train: --threads-per-rank must be between 1 and 4096");
  if (!hosts.empty()) dist::check_hosts_resolve(hosts, "train " + origin);
  HYP_USAGE_CHECK(
      ::geteuid() != 0 || allow_root || std::getenv("OMPI_ALLOW_RUN_AS_ROOT") != nullptr,
      "train --nproc: running as root, which Open MPI refuses by default; pass "
      "--allow-run-as-root to allow it");
  const int cores = hardware_cores();
  dist::MpirunOptions o;
  o.nproc = static_cast<int>(nproc);
  o.threads_per_rank = f.has("threads-per-rank")
                           ? static_cast<int>(f.integer("threads-per-rank", 1))
                       : hosts.empty() ? std::max<int>(1, cores / o.nproc)
                                       : 0;
  o.allow_root = allow_root;
  o.hosts = dist::host_list_argument(hosts);
  if (!hosts.empty())
    log_info("train: {} ranks on {} hosts ({})", nproc, hosts.size(), o.hosts);
  std::vector<std::string> program;
  // This binary's real path (mpirun would resolve /proc/self/exe to itself).
  program.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  program.push_back("train");
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool launcher = false;
    for (const auto& [flag, valued] : kLauncherFlags) {
      const std::string name(flag);
      if (a == name) {
        launcher = true;
        if (valued) ++i;
      } else if (valued && a.rfind(name + "=", 0) == 0) {
        launcher = true;
      }
    }
    if (!launcher) program.push_back(a);
  }
  if (!hosts.empty()) {
    // The ranks' status files, on the filesystem every host shares (the runs' parent).
    o.forward_env.push_back(kLaunchDirEnv);
    const std::string launch_dir = fmt::format("{}/.launch/{}-{}", base_output_directory,
                                               dist::this_host_name(), ::getpid());
    std::exit(supervise_mpirun(dist::mpirun_command(o, cores, program), launch_dir,
                               static_cast<int>(nproc)));
  }
  std::vector<std::string> cmd = dist::mpirun_command(o, cores, program);
  std::vector<char*> argv;
  for (std::string& c : cmd) argv.push_back(c.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  ::execvp("mpirun", argv.data());
  fail("train --nproc: cannot run mpirun ({}); install openmpi-bin (scripts/setup.sh)",
       std::strerror(errno));
}

}  // namespace

int cmd_train(const Args& args) {
  const Flags f(kTrainSpec, args);
  const auto [config, overrides] = split_positional(f, "CONFIG (file or preset)");
  // Read and check the whole config first: with --nproc, a bad path or key is reported
  // once, here, before mpirun starts N copies of the mistake. A resumed run restores the
  // config it saved; key=value arguments are explicit changes to it.
  const bool resuming = f.has("resume");
  HYP_USAGE_CHECK(!resuming || config.empty(),
                  "train: --resume restores the run's saved config; give only key=value changes, "
                  "not a CONFIG ('{}')",
                  config);
  std::vector<std::string> changes;
  Config c = resuming ? load_resumed_train_config(f.get("resume"), overrides, &changes)
                      : load_train_config(config, overrides);
  const std::string name =
      resuming ? std::filesystem::path(f.get("resume")).lexically_normal().filename().string()
               : config_name(config);
  const TrainConfig parsed = parse_train_config(c, name);
  if ((f.has("nproc") || f.has("hosts") || f.has("hostfile")) && !dist::detect_launch().under_mpi)
    launch_ranks(args, f, parsed.base_output_directory);
  TrainOptions opts;
  opts.resume = f.get("resume");
  opts.quiet = f.has("quiet");
  opts.stop_at = f.integer("stop-at", 0);
  HYP_USAGE_CHECK(opts.stop_at >= 0, "train: --stop-at must be >= 0");
  if (dist::detect_launch().rank == 0)
    for (const std::string& change : changes) log_info("resume: changed {}", change);
  TrainResult r = run_training(c, name, opts);
  // Stopped by SIGTERM or SIGINT after saving: exit as a process killed by it would
  // (128 + the signal), which schedulers read as "stopped", not "succeeded".
  const int stopped_code = r.stopped_by_signal ? 128 + r.stopped_by_signal : 0;
  if (dist::detect_launch().rank != 0) return stopped_code;  // rank 0 reports for the job
  if (r.stopped_by_signal) {
    std::printf(
        "stopped at step %lld of the run by signal %d; checkpoint %s (the same "
        "command resumes from it)\n",
        static_cast<long long>(r.steps), r.stopped_by_signal,
        r.checkpoint.empty() ? "none (enable_checkpointing=false)" : r.checkpoint.c_str());
    return stopped_code;
  }
  if (f.has("json")) {
    nlohmann::ordered_json j;
    j["run_dir"] = r.run_dir;
    j["checkpoint"] = r.checkpoint;
    j["start_step"] = r.start_step;
    j["steps"] = r.steps;
    // null, not 0, for what was not measured (no step run by this process, no held-out
    // data): a 0 perplexity reads as a perfect model.
    const nlohmann::ordered_json none;
    j["final_loss"] = r.history.empty() ? none : nlohmann::ordered_json(r.history.back().loss);
    j["eval_loss"] = r.eval_tokens > 0 ? nlohmann::ordered_json(r.eval_loss) : none;
    j["eval_perplexity"] =
        r.eval_tokens > 0 && r.auc < 0 ? nlohmann::ordered_json(r.eval_perplexity) : none;
    j["eval_tokens"] = r.eval_tokens;
    j["tokens_per_s"] = r.mean_tokens_per_s;
    j["mfu"] = r.mean_mfu;
    j["emfu"] = r.mean_emfu;
    j["peak_gflops"] = r.peak_gflops;
    j["peak_bf16_gflops"] = r.peak_bf16_gflops;
    j["seconds"] = r.seconds;
    j["world_size"] = r.world_size;
    j["parallel_mode"] = r.parallel_mode;
    j["peak_rss_mib"] = r.peak_rss_mib;
    j["device_peak_mib"] =
        r.device_peak_mib >= 0 ? nlohmann::ordered_json(r.device_peak_mib) : none;
    j["samples"] = r.samples;
    if (r.auc >= 0) j["auc"] = r.auc;
    if (r.mean_samples_per_s > 0) j["samples_per_s"] = r.mean_samples_per_s;
    print_json(j, 2);
  } else {
    std::printf("\nrun dir     %s\n", r.run_dir.c_str());
    if (!r.checkpoint.empty()) std::printf("checkpoint  %s\n", r.checkpoint.c_str());
    if (r.mean_samples_per_s > 0) {  // a recommender
      std::printf("steps       %lld (%.1f s, %.0f samples/s, MFU %.1f%%)\n",
                  static_cast<long long>(r.steps), r.seconds, r.mean_samples_per_s,
                  100 * r.mean_mfu);
      if (r.auc >= 0)
        std::printf("held-out    AUC %.4f, loss %.4f (%lld examples)\n", r.auc, r.eval_loss,
                    static_cast<long long>(r.eval_tokens));
      return 0;
    }
    std::printf("steps       %lld (%.1f s, %.0f tokens/s, MFU %.1f%%, EMFU %.1f%%)\n",
                static_cast<long long>(r.steps), r.seconds, r.mean_tokens_per_s, 100 * r.mean_mfu,
                100 * r.mean_emfu);
    if (r.eval_tokens > 0)
      std::printf("held-out    loss %.4f, perplexity %.2f (%lld tokens)\n", r.eval_loss,
                  r.eval_perplexity, static_cast<long long>(r.eval_tokens));
    if (r.device_peak_mib >= 0)
      std::printf("device      %.0f MiB peak allocated\n", r.device_peak_mib);
    for (size_t i = 0; i < r.samples.size(); ++i)
      std::printf("\nsample %zu:\n%s\n", i + 1, r.samples[i].c_str());
  }
  return 0;
}

namespace {

// A recommender's plan: parameters, FLOPs per example and the memory of each rank, the
// tables placed by dlrm.sharding over `ranks` (row: an equal share of every table;
// table: the largest table bounds the busiest rank).
int plan_dlrm(const TrainConfig& t, int64_t ranks, bool json) {
  const recsys::DlrmConfig& d = t.dlrm;
  const int64_t per_row = sparse_optimizer_state_per_row(d.sparse_optimizer, d.embedding_dim);
  const int64_t row_bytes = d.embedding_dim * int64_t(dtype_size(d.embedding_dtype));
  int64_t rows = 0, largest = 0;
  for (int64_t r : d.table_rows) rows += r, largest = std::max(largest, r);
  const int64_t table_bytes = rows * row_bytes, state_bytes = rows * per_row * 4;
  const int64_t rank_rows = d.sharding == recsys::Sharding::kRow
                                ? (rows + ranks - 1) / ranks
                                : std::max(largest, (rows + ranks - 1) / ranks);
  const int64_t dense_bytes = 3 * 4 * d.dense_params();  // weights, gradients, Adagrad
  const int64_t act_bytes =
      t.per_device_batch_size * 4 * (d.interaction_dim() * (2 * d.cross_layers + 4) + 4096);
  const int64_t rank_bytes = rank_rows * (row_bytes + per_row * 4) + dense_bytes + act_bytes;
  const double fwd = d.forward_flops_per_example();
  if (json) {
    nlohmann::ordered_json j;
    j["name"] = t.name;
    j["model_type"] = "dlrm";
    j["tables"] = d.tables();
    j["table_rows"] = rows;
    j["embedding_dim"] = d.embedding_dim;
    j["embedding_params"] = d.embedding_params();
    j["dense_params"] = d.dense_params();
    j["params"] = d.embedding_params() + d.dense_params();
    j["forward_flops_per_example"] = fwd;
    j["flops_per_example"] = 3 * fwd;
    j["batch"] = t.per_device_batch_size;
    j["ranks"] = ranks;
    j["sharding"] = recsys::sharding_name(d.sharding);
    j["memory"] = {{"tables", table_bytes},
                   {"table_optimizer_state", state_bytes},
                   {"dense_with_gradients_and_adagrad", dense_bytes},
                   {"activations_per_rank", act_bytes},
                   {"per_rank", rank_bytes}};
    print_json(j, 2);
    return 0;
  }
  std::printf("%s: DLRM, %lld tables (%lld rows, dim %lld): %.3fB embedding + %.3fM dense params\n",
              t.name.c_str(), static_cast<long long>(d.tables()), static_cast<long long>(rows),
              static_cast<long long>(d.embedding_dim), double(d.embedding_params()) / 1e9,
              double(d.dense_params()) / 1e6);
  std::printf("FLOPs per example: %.3g forward, %.3g training (%.3g per step of %lld per rank)\n",
              fwd, 3 * fwd, 3 * fwd * double(t.per_device_batch_size),
              static_cast<long long>(t.per_device_batch_size));
  std::printf("memory: tables %s + %s state (%s), dense part %s, activations %s per rank\n",
              format_bytes(table_bytes).c_str(), format_bytes(state_bytes).c_str(),
              sparse_optimizer_name(d.sparse_optimizer), format_bytes(dense_bytes).c_str(),
              format_bytes(act_bytes).c_str());
  std::printf("per rank over %lld ranks (%s-wise tables): %s; this machine has %s\n",
              static_cast<long long>(ranks), recsys::sharding_name(d.sharding),
              format_bytes(rank_bytes).c_str(), format_bytes(machine_memory_bytes()).c_str());
  return 0;
}

}  // namespace

int cmd_plan(const Args& args) {
  const Flags f(kPlanSpec, args);
  const auto [config, overrides] = split_positional(f, "CONFIG (file or preset)");
  HYP_USAGE_CHECK(!config.empty(), "plan: expected a config file or preset name");
  Config c = load_train_config(config, overrides);
  TrainConfig t = parse_train_config(c, config_name(config));
  if (t.dlrm_model) {
    const int64_t ranks = f.integer("nproc", 1);
    HYP_USAGE_CHECK(ranks >= 1, "plan: --nproc must be >= 1");
    return plan_dlrm(t, ranks, f.has("json"));
  }
  const MemoryPlan full = memory_plan(t.model, t.per_device_batch_size, t.max_target_length, t.bf16,
                                      t.remat, t.moe.capacity_factor);
  // LoRA: gradients and moments for the adapters alone (the saving next to a full fine-tune).
  // (One process on the host: a bf16 base without quantisation drops its matrices' masters.)
  const MemoryPlan m = t.lora.enabled() ? lora_memory_plan(full, t.model, t.lora, t.bf16,
                                                           t.per_device_batch_size * t.max_target_length,
                                                           !t.quant.enabled() && t.hardware == Device::kHost)
                                        : full;
  const int64_t lora_params = t.lora.enabled() ? m.grad_bytes / 4 : 0;
  const double state_ratio = double(m.grad_bytes + m.optimizer_bytes) / double(full.grad_bytes + full.optimizer_bytes);
  const double fpt = t.model.train_flops_per_token(t.max_target_length);
  const bool moe = t.model.is_moe();
  const int64_t capacity = moe && t.moe.capacity_factor > 0
                               ? moe_capacity(t.max_target_length, t.model.n_experts_per_tok,
                                              t.model.n_experts, t.moe.capacity_factor)
                               : -1;
  if (f.has("json")) {
    nlohmann::ordered_json j;
    j["name"] = t.name;
    j["params"] = t.model.total_params();
    j["non_embedding_params"] = t.model.non_embedding_params();
    j["active_params"] = t.model.active_non_embedding_params() + t.model.embedding_params();
    j["flops_per_token"] = fpt;
    if (moe)
      j["moe"] = {{"experts", t.model.n_experts},
                  {"experts_per_token", t.model.n_experts_per_tok},
                  {"moe_layers", t.model.n_moe_layers()},
                  {"expert_ffn_dim", t.model.expert_ffn_dim()},
                  {"capacity_factor", t.moe.capacity_factor},
                  {"capacity", capacity},
                  {"dropless", capacity < 0}};
    j["forward_flops_per_token"] = t.model.forward_flops_per_token(t.max_target_length);
    j["batch"] = t.per_device_batch_size;
    j["seq_len"] = t.max_target_length;
    j["tokens_per_step"] = t.tokens_per_step();
    j["flops_per_step"] = fpt * double(t.tokens_per_step());
    j["dtype"] = t.bf16 ? "bfloat16" : "float32";
    j["remat_policy"] = remat_policy_name(t.remat);
    j["memory"] = {{"weights", m.weight_bytes},
                   {"compute_weights", m.compute_weight_bytes},
                   {"gradients", m.grad_bytes},
                   {"optimizer", m.optimizer_bytes},
                   {"activations", m.activation_bytes},
                   {"scratch", m.scratch_bytes},
                   {"total", m.total()}};
    if (t.lora.enabled())
      j["lora"] = {{"rank", t.lora.rank},
                   {"alpha", t.lora.alpha},
                   {"target_modules", lora_target_list(t.lora)},
                   {"trainable_params", lora_params},
                   {"full_finetune_gradients_and_optimizer", full.grad_bytes + full.optimizer_bytes},
                   {"gradients_and_optimizer", m.grad_bytes + m.optimizer_bytes},
                   {"gradients_and_optimizer_ratio", state_ratio}};
    print_json(j, 2);
    return 0;
  }
  auto gib = [](int64_t b) { return double(b) / (1024.0 * 1024.0 * 1024.0); };
  std::printf("%s: %.3fB params (%.3fB non-embedding), %.3g training FLOPs/token at seq %lld\n",
              t.name.c_str(), double(t.model.total_params()) / 1e9,
              double(t.model.non_embedding_params()) / 1e9, fpt,
              static_cast<long long>(t.max_target_length));
  if (moe) {
    std::printf(
        "MoE: %lld of %lld layers, %lld experts of ffn %lld, top-%lld; %.3fB params active "
        "per token; ",
        static_cast<long long>(t.model.n_moe_layers()), static_cast<long long>(t.model.n_layers),
        static_cast<long long>(t.model.n_experts), static_cast<long long>(t.model.expert_ffn_dim()),
        static_cast<long long>(t.model.n_experts_per_tok),
        double(t.model.active_non_embedding_params() + t.model.embedding_params()) / 1e9);
    if (capacity >= 0)
      std::printf("capped, capacity %lld per expert per sequence (factor %g)\n",
                  static_cast<long long>(capacity), t.moe.capacity_factor);
    else
      std::printf("dropless\n");
  }
  std::printf("memory per process, batch %lld, %s, remat %s:\n",
              static_cast<long long>(t.per_device_batch_size), t.bf16 ? "bf16" : "f32",
              remat_policy_name(t.remat));
  std::printf(
      "  weights (f32)      %9.3f GiB\n  bf16 copy          %9.3f GiB\n"
      "  gradients          %9.3f GiB\n  AdamW m, v         %9.3f GiB\n"
      "  activations        %9.3f GiB\n  scratch            %9.3f GiB\n"
      "  total              %9.3f GiB\n",
      gib(m.weight_bytes), gib(m.compute_weight_bytes), gib(m.grad_bytes), gib(m.optimizer_bytes),
      gib(m.activation_bytes), gib(m.scratch_bytes), gib(m.total()));
  if (t.lora.enabled())
    std::printf(
        "LoRA rank %lld on %s: %.3fM trainable params (%.3f%% of the model); gradients + AdamW %.4f GiB, "
        "%.2f%% of a full fine-tune's %.3f GiB\n",
        static_cast<long long>(t.lora.rank), lora_target_list(t.lora).c_str(), double(lora_params) / 1e6,
        100.0 * double(lora_params) / double(t.model.total_params()), gib(m.grad_bytes + m.optimizer_bytes),
        100.0 * state_ratio, gib(full.grad_bytes + full.optimizer_bytes));
  return 0;
}

}  // namespace hyperion::cli
