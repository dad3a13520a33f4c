// Where a command's --tokenizer points: a tokenizer file (tokenizer.json or a
// SentencePiece .model), a directory holding one (a checkpoint, a prepared dataset, a
// Hugging Face model download), or a training run directory (its latest checkpoint's).
#pragma once

#include <string>

namespace hyperion::cli {

// The path Tokenizer::load takes; throws naming `command` and `path` when there is none.
std::string tokenizer_path(const std::string& path, const char* command);

}  // namespace hyperion::cli
