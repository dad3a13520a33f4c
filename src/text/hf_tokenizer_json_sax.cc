#include "text/hf_tokenizer_json_sax.h"

#include "base/error.h"

namespace hyperion::text {

namespace {

using nlohmann::json;

// A SAX handler: a document builder (a stack of open containers) that hands the values
// of root.model.vocab and root.model.merges to the tables instead.
class Handler : public nlohmann::json_sax<json> {
 public:
  Handler(json& root, BpeTables& tables) : root_(root), tables_(tables) {}

  std::string error;  // the parser's message, when it stopped on a syntax error

  bool null() override { return value(json()); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (capture_ == Capture::kVocab && nest_ == 0) return vocab_value(v);
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (capture_ == Capture::kVocab && nest_ == 0)
      return vocab_value(v <= uint64_t{INT64_MAX} ? static_cast<int64_t>(v) : BpeTables::kNotAnId);
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool binary(binary_t& v) override { return value(json(std::move(v))); }

  bool string(string_t& s) override {
    if (capture_ == Capture::kMerges) {
      if (nest_ == 0) {  // "a b"
        tables_.merges.push_back({offset(), length(s), 0, BpeTables::Merge::Form::kString});
        append(s);
        return true;
      }
      if (nest_ == 1 && tables_.merges.back().form == BpeTables::Merge::Form::kPair) {
        BpeTables::Merge& m = tables_.merges.back();  // a part of ["a", "b"]
        if (pair_parts_ == 0) m.left = length(s);
        if (pair_parts_ < 2) append(s), m.length += length(s);
        ++pair_parts_;
        return true;
      }
      return true;
    }
    return value(json(std::move(s)));
  }

  bool key(string_t& k) override {
    if (capture_ == Capture::kVocab) {
      if (nest_ == 0) key_offset_ = offset(), key_length_ = length(k), append(k);
      return true;
    }
    if (capture_ != Capture::kNone) return true;
    keys_.back() = std::move(k);
    // A repeated key replaces the earlier value, as in the document: forget the tables.
    if (in_root_model() && keys_[1] == "vocab") tables_.has_vocab = false, tables_.vocab.clear();
    if (in_root_model() && keys_[1] == "merges") tables_.has_merges = false, tables_.merges.clear();
    if (stack_.size() == 1 && keys_[0] == "model") {
      tables_.has_vocab = tables_.has_merges = false;
      tables_.vocab.clear(), tables_.merges.clear();
    }
    return true;
  }

  bool start_object(std::size_t) override {
    if (capture_ != Capture::kNone) return open_inside_capture(false);
    if (in_root_model() && keys_[1] == "vocab") {
      capture_ = Capture::kVocab, nest_ = 0;
      tables_.has_vocab = true;
      return true;
    }
    return open(json::object());
  }
  bool end_object() override {
    if (capture_ != Capture::kNone) return close_inside_capture();
    return close();
  }
  bool start_array(std::size_t) override {
    if (capture_ != Capture::kNone) return open_inside_capture(true);
    if (in_root_model() && keys_[1] == "merges") {
      capture_ = Capture::kMerges, nest_ = 0;
      tables_.has_merges = true;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (capture_ != Capture::kNone) return close_inside_capture();
    return close();
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }

 private:
  enum class Capture { kNone, kVocab, kMerges };

  // The innermost open container is root.model, an object.
  bool in_root_model() const {
    return stack_.size() == 2 && stack_[0]->is_object() && keys_[0] == "model" &&
           stack_[1]->is_object();
  }

  // A value where the document is being built (or, while capturing, a value of the
  // wrong kind).
  bool value(json&& v) {
    if (capture_ == Capture::kVocab) return nest_ == 0 ? vocab_value(BpeTables::kNotAnId) : true;
    if (capture_ == Capture::kMerges) {
      if (nest_ == 0) tables_.merges.push_back({});  // kOther
      if (nest_ == 1) pair_parts_ = 3;                // a part that is not a string
      return true;
    }
    place(std::move(v));
    return true;
  }
  json* place(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[keys_.back()];
    slot = std::move(v);
    return &slot;
  }
  bool open(json&& container) {
    stack_.push_back(place(std::move(container)));
    keys_.emplace_back();
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  // The file is at most 2 GB (kReadFileMaxBytes), so every text and offset fits 32 bits.
  uint32_t offset() const { return static_cast<uint32_t>(tables_.text.size()); }
  static uint32_t length(const std::string& s) { return static_cast<uint32_t>(s.size()); }
  void append(const std::string& s) { tables_.text.insert(tables_.text.end(), s.begin(), s.end()); }

  bool vocab_value(int64_t id) {
    tables_.vocab.push_back({key_offset_, key_length_, id});
    return true;
  }
  // A container inside the captured one: a vocab value or a merge of the wrong kind, or
  // a merge written as a list.
  bool open_inside_capture(bool list) {
    if (capture_ == Capture::kVocab && nest_ == 0) vocab_value(BpeTables::kNotAnId);
    if (capture_ == Capture::kMerges && nest_ == 0) {
      using F = BpeTables::Merge::Form;
      tables_.merges.push_back({offset(), 0, 0, list ? F::kPair : F::kOther});
      pair_parts_ = 0;
    }
    if (capture_ == Capture::kMerges && nest_ == 1) pair_parts_ = 3;  // a part that is a container
    ++nest_;
    return true;
  }
  bool close_inside_capture() {
    if (nest_ == 0) {  // the captured container itself
      capture_ = Capture::kNone;
      return true;
    }
    --nest_;
    if (capture_ == Capture::kMerges && nest_ == 0) {
      BpeTables::Merge& m = tables_.merges.back();
      // A list that was not two strings, or an object: neither form.
      if (m.form == BpeTables::Merge::Form::kPair && pair_parts_ != 2)
        m.form = BpeTables::Merge::Form::kOther;
    }
    return true;
  }

  json& root_;
  BpeTables& tables_;
  std::vector<json*> stack_;       // open containers of the document
  std::vector<std::string> keys_;  // the current key of each (unused for a list)
  Capture capture_ = Capture::kNone;
  int nest_ = 0;  // containers open inside the captured one
  int pair_parts_ = 0;
  uint32_t key_offset_ = 0, key_length_ = 0;
};

}  // namespace

json parse_tokenizer_json(const std::string& json_text, const std::string& path,
                          BpeTables& tables) {
  HYP_CHECK(json_text.size() < (size_t{1} << 32), "tokenizer: {}: larger than 4 GB", path);
  tables = {};
  // Every text is a part of the file: one reservation, no copies as it grows (pages are
  // only committed as they are written).
  tables.text.reserve(json_text.size());
  json root;
  Handler handler(root, tables);
  if (!json::sax_parse(json_text, &handler) || !handler.error.empty())
    fail("tokenizer: {}: not valid JSON (truncated or damaged?): {}", path,
         handler.error.empty() ? std::string("the parser stopped") : handler.error);
  return root;
}

}  // namespace hyperion::text
