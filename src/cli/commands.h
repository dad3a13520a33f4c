// CLI subcommands. Each takes the arguments after its own name and returns the exit
// code; errors are thrown as hyperion::Error (exit 1) or hyperion::UsageError (exit 2)
// and reported by main. Each command's interface is a CommandSpec (cli/flags.h) defined
// beside it; main's table below lists them in the order `hyperion --help` shows.
#pragma once

#include <string>
#include <vector>

namespace hyperion::cli {

using Args = std::vector<std::string>;
struct CommandSpec;

// Parses a number given to `flag`; throws hyperion::UsageError naming the flag and value.
double parse_number(const std::string& value, const char* flag);

struct Command {
  const CommandSpec* spec;  // spec->name is what the user types: "train", "bench serve"
  int (*run)(const Args& args);
};

// Every command, in help order.
const std::vector<Command>& all_commands();

#define HYPERION_DECLARE_COMMAND(fn, spec_name) \
  extern const CommandSpec spec_name;           \
  int fn(const Args& args);

HYPERION_DECLARE_COMMAND(cmd_train, kTrainSpec)
HYPERION_DECLARE_COMMAND(cmd_plan, kPlanSpec)
HYPERION_DECLARE_COMMAND(cmd_data_prepare, kDataPrepareSpec)
HYPERION_DECLARE_COMMAND(cmd_tokenize, kTokenizeSpec)
HYPERION_DECLARE_COMMAND(cmd_eval, kEvalSpec)
HYPERION_DECLARE_COMMAND(cmd_generate, kGenerateSpec)
HYPERION_DECLARE_COMMAND(cmd_convert, kConvertSpec)
HYPERION_DECLARE_COMMAND(cmd_serve, kServeSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_peak, kBenchPeakSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_kernels, kBenchKernelsSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_moe, kBenchMoeSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_serve, kBenchServeSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_grammar, kBenchGrammarSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_decode, kBenchDecodeSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_embedding, kBenchEmbeddingSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_diffusion, kBenchDiffusionSpec)
HYPERION_DECLARE_COMMAND(cmd_bench_images, kBenchImagesSpec)
HYPERION_DECLARE_COMMAND(cmd_goodput, kGoodputSpec)
HYPERION_DECLARE_COMMAND(cmd_monitor, kMonitorSpec)
HYPERION_DECLARE_COMMAND(cmd_cluster_create, kClusterCreateSpec)
HYPERION_DECLARE_COMMAND(cmd_cluster_delete, kClusterDeleteSpec)
HYPERION_DECLARE_COMMAND(cmd_cluster_list, kClusterListSpec)
HYPERION_DECLARE_COMMAND(cmd_cluster_describe, kClusterDescribeSpec)
HYPERION_DECLARE_COMMAND(cmd_cluster_supervise, kClusterSuperviseSpec)
HYPERION_DECLARE_COMMAND(cmd_workload_create, kWorkloadCreateSpec)
HYPERION_DECLARE_COMMAND(cmd_workload_list, kWorkloadListSpec)
HYPERION_DECLARE_COMMAND(cmd_workload_delete, kWorkloadDeleteSpec)
HYPERION_DECLARE_COMMAND(cmd_workload_status, kWorkloadStatusSpec)
HYPERION_DECLARE_COMMAND(cmd_workload_logs, kWorkloadLogsSpec)
HYPERION_DECLARE_COMMAND(cmd_workload_exec, kWorkloadExecSpec)
HYPERION_DECLARE_COMMAND(cmd_diffusion_forward, kDiffusionForwardSpec)
HYPERION_DECLARE_COMMAND(cmd_info, kInfoSpec)

#undef HYPERION_DECLARE_COMMAND

}  // namespace hyperion::cli
