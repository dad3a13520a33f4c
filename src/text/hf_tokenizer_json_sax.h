// Parses a tokenizer.json in one pass: model.vocab and model.merges (nearly all of the
// file: 128k tokens and 280k merges for Llama 3, 262k and 515k for Gemma 3) go straight
// into flat tables, everything else into a JSON document for the readers of
// hf_tokenizer_json.cc.
//
// Why: building nlohmann-json's document for the whole file (a std::map node per token, a
// string per merge) and freeing it took most of a second for Llama 3 and two for Gemma 3;
// the parser alone takes a twentieth of that. Nothing is checked here beyond JSON syntax:
// a value of the wrong kind is recorded as such and named by the reader, which checks the
// tables in the file's order.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/large_allocator.h"

namespace hyperion::text {

struct BpeTables {
  // model.vocab, when it is an object (otherwise it stays in the document, where the
  // reader finds it is not), and model.merges, when it is a list.
  bool has_vocab = false, has_merges = false;

  // Offsets and lengths are 32-bit: a tokenizer file is read whole, and at most 2 GB.
  struct Token {
    uint32_t offset = 0;  // the token's text in `text`
    uint32_t length = 0;
    int64_t id = kNotAnId;  // kNotAnId: the value is not an integer that fits int64
  };
  static constexpr int64_t kNotAnId = INT64_MIN;
  LargeVector<Token> vocab;

  struct Merge {
    enum class Form : uint8_t { kString, kPair, kOther };
    uint32_t offset = 0;  // kString: "a b" as written; kPair: a then b, end to end
    uint32_t length = 0;
    uint32_t left = 0;  // kPair: the length of a
    Form form = Form::kOther;
  };
  LargeVector<Merge> merges;

  // The texts of tokens and merges, end to end.
  LargeVector<char> text;

  std::string_view token_text(const Token& t) const { return {text.data() + t.offset, t.length}; }
  std::string_view merge_text(const Merge& m) const { return {text.data() + m.offset, m.length}; }
};

// The document of `json_text` without the parts `tables` holds. A syntax error is an
// error naming `path` ("not valid JSON").
nlohmann::json parse_tokenizer_json(const std::string& json_text, const std::string& path,
                                    BpeTables& tables);

}  // namespace hyperion::text
