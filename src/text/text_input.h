// Reading raw training text into documents.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace hyperion::text {

// Reads the documents of one input file, chosen by extension:
//   .txt    If any line holds only "%" (fortune format), those lines separate documents
//           and blank lines stay inside them. Otherwise documents are separated by one or
//           more blank (empty or whitespace-only) lines. Lines are joined with '\n'.
//   .jsonl  One JSON object per line with a string field "text"; blank lines are skipped.
//           Errors name file:line and the field.
// Carriage returns before '\n' are dropped. Empty documents are skipped. Other
// extensions, unreadable files and bad JSON throw hyperion::Error naming the file.
std::vector<std::string> read_documents(const std::string& path);

// The bundled corpus: the first data/corpus/*.txt or *.jsonl (by name) under the working
// directory, else under the source tree; nullopt when neither has one.
std::optional<std::string> find_bundled_corpus();
// find_bundled_corpus() or an error naming both places searched; `why` says what needed
// it and what to give instead ("dataset_path is empty", "give a text file with --corpus").
std::string require_bundled_corpus(const std::string& why);

}  // namespace hyperion::text
