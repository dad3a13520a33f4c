// CLI subcommands. Each takes the arguments after its own name and returns the exit
// code; errors are thrown as hyperion::Error and reported by main.
#pragma once

#include <string>
#include <vector>

namespace hyperion::cli {

using Args = std::vector<std::string>;

// Parses a number given to `flag`; throws hyperion::Error naming the flag and the value.
double parse_number(const std::string& value, const char* flag);

int cmd_bench(const Args& args);
int cmd_info(const Args& args);
int cmd_data(const Args& args);
int cmd_train(const Args& args);
int cmd_plan(const Args& args);
int cmd_eval(const Args& args);
int cmd_generate(const Args& args);
int cmd_convert(const Args& args);
int cmd_serve(const Args& args);

}  // namespace hyperion::cli
