// `hyperion generate --json-schema FILE` and `--grammar FILE` through the binary: the
// text follows the schema or grammar (sampled at temperature 1 from a tiny trained
// model), and bad files are usage errors (exit status 2) naming the file and the place.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "../test_files.h"
#include "cli_test_util.h"
#include "io/atomic_file.h"
#include "text/grammar/gbnf.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using hyperion::testing_util::run_cli;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class StructuredCli : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing::TempDir() + "hyperion_structured_" + std::to_string(::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    const auto r = run_cli("train --json dataset_path=" + hyperion::testing_util::small_corpus() +
                               " vocab_size=512 base_emb_dim=64 base_num_decoder_layers=2 base_num_query_heads=4"
                               " base_num_kv_heads=2 base_mlp_dim=192 max_target_length=256"
                               " per_device_batch_size=2 peak_tflops=1 sample_count=0 eval_batches=1 steps=2"
                               " base_output_directory=" +
                               root_ + " run_name=tiny",
                           false);
    ASSERT_EQ(r.code, 0) << r.out;
    checkpoint_ = json::parse(r.out)["checkpoint"];
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  static std::string file(const std::string& name, const std::string& text) {
    const std::string path = root_ + "/" + name;
    hyperion::io::write_file_atomic(path, text);
    return path;
  }
  static std::string root_, checkpoint_;
};
std::string StructuredCli::root_, StructuredCli::checkpoint_;

TEST_F(StructuredCli, OutputFollowsTheSchemaOrGrammar) {
  const std::string schema =
      file("s.json", R"({"type": "object", "properties": {"ok": {"type": "boolean"},
                           "n": {"type": "integer", "minimum": -5, "maximum": 40},
                           "tag": {"enum": ["red", "green"]}},
                         "required": ["ok", "n", "tag"], "additionalProperties": false})");
  for (int seed = 0; seed < 3; ++seed) {
    const auto r = run_cli("generate --checkpoint " + checkpoint_ + " --json-schema " + schema +
                               " --prompt Data: --max-tokens 200 --temperature 1 --seed " + std::to_string(seed) +
                               " --json",
                           false);
    ASSERT_EQ(r.code, 0) << r.out;
    const json out = json::parse(r.out);
    ASSERT_EQ(out["finish_reason"], "stop") << r.out;
    const json v = json::parse(out["text"].get<std::string>());
    ASSERT_TRUE(v.is_object()) << out["text"];
    EXPECT_EQ(v.size(), 3U);
    EXPECT_TRUE(v["ok"].is_boolean());
    EXPECT_TRUE(v["n"].is_number_integer() && v["n"] >= -5 && v["n"] <= 40) << v;
    EXPECT_TRUE(v["tag"] == "red" || v["tag"] == "green") << v;
  }
  const std::string gbnf = "root ::= \"[\" [0-9]{1,3} (\",\" [0-9]{1,3}){0,3} \"]\"";
  const std::string grammar = file("g.gbnf", gbnf);
  const auto r = run_cli("generate --checkpoint " + checkpoint_ + " --grammar " + grammar +
                             " --max-tokens 60 --temperature 1 --json",
                         false);
  ASSERT_EQ(r.code, 0) << r.out;
  const json out = json::parse(r.out);
  // At most 17 characters: the grammar ends well within 60 tokens.
  EXPECT_EQ(out["finish_reason"], "stop") << r.out;
  EXPECT_TRUE(hyperion::text::grammar_accepts(hyperion::text::parse_gbnf(gbnf), out["text"].get<std::string>()))
      << out["text"];
}

TEST_F(StructuredCli, BadFilesAreUsageErrorsNamingTheFileAndPlace) {
  const std::string unsupported = file("bad.json", R"({"type": "object", "properties": {"a": {"not": {}}}})");
  auto r = run_cli("generate --checkpoint " + checkpoint_ + " --json-schema " + unsupported);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, unsupported) && contains(r.out, "properties.a")) << r.out;
  const std::string not_json = file("notjson.json", "{\"type\": ");
  r = run_cli("generate --checkpoint " + checkpoint_ + " --json-schema " + not_json);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "not valid JSON")) << r.out;
  const std::string bad_gbnf = file("bad.gbnf", "root ::= \"a\"\n  item ::= (\"b\"\n");
  r = run_cli("generate --checkpoint " + checkpoint_ + " --grammar " + bad_gbnf);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "line 2, column")) << r.out;
  r = run_cli("generate --checkpoint " + checkpoint_ + " --grammar " + root_ + "/missing.gbnf");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "missing.gbnf")) << r.out;
  r = run_cli("generate --checkpoint " + checkpoint_ + " --grammar " + bad_gbnf + " --json-schema " + not_json);
  EXPECT_EQ(r.code, 2) << r.out;
}

}  // namespace
