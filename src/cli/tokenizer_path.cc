#include "cli/tokenizer_path.h"

#include <filesystem>

#include "base/error.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"

namespace hyperion::cli {

std::string tokenizer_path(const std::string& path, const char* command) {
  namespace fs = std::filesystem;
  std::error_code ec;
  HYP_CHECK(fs::exists(path, ec), "{}: --tokenizer {}: no such file or directory", command, path);
  if (!fs::is_directory(path, ec)) return path;
  std::string f = text::tokenizer_file_in(path);
  if (f.empty() && fs::is_directory(fs::path(path) / "checkpoints", ec))
    f = text::tokenizer_file_in(resolve_checkpoint_dir(path));
  HYP_CHECK(!f.empty(),
            "{}: --tokenizer {}: the directory has neither tokenizer.json nor tokenizer.model",
            command, path);
  return f;
}

}  // namespace hyperion::cli
