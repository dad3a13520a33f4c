// The command table: main's dispatch and the order of `hyperion --help`.
#include "cli/commands.h"

namespace hyperion::cli {

const std::vector<Command>& all_commands() {
  static const std::vector<Command> table = {
      {&kTrainSpec, cmd_train},
      {&kPlanSpec, cmd_plan},
      {&kDataPrepareSpec, cmd_data_prepare},
      {&kTokenizeSpec, cmd_tokenize},
      {&kEvalSpec, cmd_eval},
      {&kGenerateSpec, cmd_generate},
      {&kConvertSpec, cmd_convert},
      {&kServeSpec, cmd_serve},
      {&kBenchPeakSpec, cmd_bench_peak},
      {&kBenchKernelsSpec, cmd_bench_kernels},
      {&kBenchMoeSpec, cmd_bench_moe},
      {&kBenchServeSpec, cmd_bench_serve},
      {&kBenchGrammarSpec, cmd_bench_grammar},
      {&kBenchDecodeSpec, cmd_bench_decode},
      {&kBenchEmbeddingSpec, cmd_bench_embedding},
      {&kBenchDiffusionSpec, cmd_bench_diffusion},
      {&kBenchImagesSpec, cmd_bench_images},
      {&kGoodputSpec, cmd_goodput},
      {&kMonitorSpec, cmd_monitor},
      {&kClusterCreateSpec, cmd_cluster_create},
      {&kClusterDeleteSpec, cmd_cluster_delete},
      {&kClusterListSpec, cmd_cluster_list},
      {&kClusterDescribeSpec, cmd_cluster_describe},
      {&kClusterSuperviseSpec, cmd_cluster_supervise},
      {&kWorkloadCreateSpec, cmd_workload_create},
      {&kWorkloadListSpec, cmd_workload_list},
      {&kWorkloadDeleteSpec, cmd_workload_delete},
      {&kWorkloadStatusSpec, cmd_workload_status},
      {&kWorkloadLogsSpec, cmd_workload_logs},
      {&kWorkloadExecSpec, cmd_workload_exec},
      {&kDiffusionForwardSpec, cmd_diffusion_forward},
      {&kInfoSpec, cmd_info},
  };
  return table;
}

}  // namespace hyperion::cli
