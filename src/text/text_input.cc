#include "text/text_input.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "base/error.h"
#include "base/source_dir.h"
#include "io/atomic_file.h"

namespace hyperion::text {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
  });
}

// Splits on '\n', dropping a trailing '\r' from each line and the empty piece after a final
// newline.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

// Joins lines [begin, end) with '\n' after trimming blank lines at both ends; empty when
// nothing but blank lines remain.
std::string join_trimmed(const std::vector<std::string_view>& lines, size_t begin, size_t end) {
  while (begin < end && is_blank(lines[begin])) ++begin;
  while (end > begin && is_blank(lines[end - 1])) --end;
  std::string doc;
  for (size_t i = begin; i < end; ++i) {
    if (i > begin) doc += '\n';
    doc.append(lines[i]);
  }
  return doc;
}

std::vector<std::string> parse_txt(std::string_view text) {
  const std::vector<std::string_view> lines = split_lines(text);
  const bool fortune =
      std::any_of(lines.begin(), lines.end(), [](std::string_view l) { return l == "%"; });
  auto is_separator = [&](std::string_view l) { return fortune ? l == "%" : is_blank(l); };
  std::vector<std::string> docs;
  size_t begin = 0;
  for (size_t i = 0; i <= lines.size(); ++i) {
    if (i == lines.size() || is_separator(lines[i])) {
      std::string doc = join_trimmed(lines, begin, i);
      if (!doc.empty()) docs.push_back(std::move(doc));
      begin = i + 1;
    }
  }
  return docs;
}

std::vector<std::string> parse_jsonl(const std::string& path, std::string_view text) {
  const std::vector<std::string_view> lines = split_lines(text);
  std::vector<std::string> docs;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t lineno = i + 1;
    if (is_blank(lines[i])) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(lines[i]);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: invalid JSON: {}", path, lineno, e.what());
    }
    HYP_CHECK(j.is_object(), "{}:{}: expected a JSON object with a string field 'text', got {}",
              path, lineno, j.type_name());
    auto it = j.find("text");
    HYP_CHECK(it != j.end(), "{}:{}: missing field 'text'", path, lineno);
    HYP_CHECK(it->is_string(), "{}:{}: field 'text' must be a string, got {}", path, lineno,
              it->type_name());
    std::string doc = it->get<std::string>();
    if (!is_blank(doc)) docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace

std::vector<std::string> read_documents(const std::string& path) {
  const bool txt = ends_with(path, ".txt");
  const bool jsonl = ends_with(path, ".jsonl");
  HYP_CHECK(txt || jsonl, "read_documents: '{}': unsupported file type (expected .txt or .jsonl)",
            path);
  std::string content = io::read_file(path);
  std::string_view text = content;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 byte order mark
  return txt ? parse_txt(text) : parse_jsonl(path, text);
}

std::optional<std::string> find_bundled_corpus() {
  namespace fs = std::filesystem;
  for (const std::string& dir :
       {std::string("data/corpus"), std::string(source_dir()) + "/data/corpus"}) {
    if (!fs::is_directory(dir)) continue;
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".txt" || e.path().extension() == ".jsonl")
        found.push_back(e.path().string());
    std::sort(found.begin(), found.end());
    if (!found.empty()) return found.front();
  }
  return std::nullopt;
}

std::string require_bundled_corpus(const std::string& why) {
  if (auto path = find_bundled_corpus()) return *path;
  fail("the bundled corpus (data/corpus/*.txt) was not found in the working directory or in {} ({})",
       source_dir(), why);
}

}  // namespace hyperion::text
