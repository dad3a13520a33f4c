#include "base/error.h"
#include "cli/commands.h"

namespace hyperion::cli {

double parse_number(const std::string& value, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HYP_CHECK(used == value.size() && used > 0, "{}: expected a number, got '{}'", flag, value);
  return v;
}

int cmd_bench_peak(const Args& args);
int cmd_bench_kernels(const Args& args);
int cmd_bench_moe(const Args& args);
int cmd_bench_serve(const Args& args);
int cmd_bench_decode(const Args& args);

int cmd_bench(const Args& args) {
  HYP_CHECK(!args.empty(), "bench: expected a benchmark name: peak, kernels, moe, serve or decode");
  Args rest(args.begin() + 1, args.end());
  if (args[0] == "peak") return cmd_bench_peak(rest);
  if (args[0] == "kernels") return cmd_bench_kernels(rest);
  if (args[0] == "moe") return cmd_bench_moe(rest);
  if (args[0] == "serve") return cmd_bench_serve(rest);
  if (args[0] == "decode") return cmd_bench_decode(rest);
  fail("bench: unknown benchmark '{}' (expected peak, kernels, moe, serve or decode)", args[0]);
}

}  // namespace hyperion::cli
