#include "base/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "base/error.h"

namespace hyperion {
namespace {

Config make_config() {
  return Config({
      {"steps", ConfigType::kInt, "100", "training steps"},
      {"learning_rate", ConfigType::kFloat, "3e-4", "peak learning rate"},
      {"remat", ConfigType::kBool, "false", "recompute activations"},
      {"run_name", ConfigType::kString, "default", "run directory name"},
      {"optimizer.beta1", ConfigType::kFloat, "0.9", "AdamW beta1"},
  });
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected hyperion::Error";
  return "";
}

TEST(Config, DefaultsYamlAndOverridesLayerInOrder) {
  Config c = make_config();
  EXPECT_EQ(c.get_int("steps"), 100);
  EXPECT_EQ(c.source_of("steps"), "default");
  c.load_yaml_string("steps: 200\nremat: yes\noptimizer:\n  beta1: 0.95\nrun_name: tiny\n",
                     "base.yml");
  EXPECT_EQ(c.get_int("steps"), 200);
  EXPECT_TRUE(c.get_bool("remat"));
  EXPECT_DOUBLE_EQ(c.get_float("optimizer.beta1"), 0.95);
  EXPECT_EQ(c.get_string("run_name"), "tiny");
  EXPECT_EQ(c.source_of("optimizer.beta1"), "base.yml:4");
  c.apply_override("steps=50");
  c.apply_override("learning_rate=1e-3");
  c.apply_override("run_name=a=b");  // only the first '=' splits
  EXPECT_EQ(c.get_int("steps"), 50);
  EXPECT_DOUBLE_EQ(c.get_float("learning_rate"), 1e-3);
  EXPECT_EQ(c.get_string("run_name"), "a=b");
  EXPECT_EQ(c.source_of("steps"), "command line");
  EXPECT_EQ(c.values().at("remat"), "true");
}

TEST(Config, UnknownKeysAreErrorsWithSuggestion) {
  Config c = make_config();
  std::string msg = error_of([&] { c.load_yaml_string("stpes: 3\n", "configs/tiny.yml"); });
  EXPECT_NE(msg.find("configs/tiny.yml:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown config key 'stpes'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'steps'"), std::string::npos) << msg;
  msg = error_of([&] { c.apply_override("nonsense_key_entirely=1"); });
  EXPECT_NE(msg.find("command line"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
}

TEST(Config, WrongTypesNameKeyAndSource) {
  Config c = make_config();
  std::string msg = error_of([&] { c.load_yaml_string("steps: 1.5\n", "x.yml"); });
  EXPECT_NE(msg.find("x.yml:1: config key 'steps' must be an integer, got '1.5'"),
            std::string::npos)
      << msg;
  msg = error_of([&] { c.apply_override("remat=maybe"); });
  EXPECT_NE(msg.find("'remat' must be true or false"), std::string::npos) << msg;
  msg = error_of([&] { c.apply_override("learning_rate=fast"); });
  EXPECT_NE(msg.find("'learning_rate' must be a number"), std::string::npos) << msg;
  EXPECT_THROW(c.apply_override("learning_rate=inf"), Error);
  EXPECT_THROW(c.apply_override("steps=99999999999999999999"), Error);
  EXPECT_THROW(c.apply_override("noequals"), Error);
  EXPECT_THROW(c.apply_override("=3"), Error);
  // A failed set leaves the previous value.
  EXPECT_EQ(c.get_int("steps"), 100);
  // Reading a key as the wrong type is a programming error, reported as such.
  EXPECT_THROW(c.get_float("steps"), Error);
}

TEST(Config, MalformedYamlAndStructure) {
  Config c = make_config();
  std::string msg = error_of([&] { c.load_yaml_string("steps: [1, 2\n", "bad.yml"); });
  EXPECT_NE(msg.find("bad.yml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid YAML"), std::string::npos) << msg;
  msg = error_of([&] { c.load_yaml_string("steps: [1, 2]\n", "list.yml"); });
  EXPECT_NE(msg.find("'steps' must be a single value"), std::string::npos) << msg;
  msg = error_of([&] { c.load_yaml_string("- a\n- b\n", "seq.yml"); });
  EXPECT_NE(msg.find("mapping"), std::string::npos) << msg;
  msg = error_of([&] { c.load_yaml_string("steps:\n", "null.yml"); });
  EXPECT_NE(msg.find("'steps' has no value"), std::string::npos) << msg;
  c.load_yaml_string("", "empty.yml");  // an empty file changes nothing
  EXPECT_EQ(c.get_int("steps"), 100);
}

TEST(Config, DuplicateKeysAreUsageErrorsNamingBothLines) {
  Config c = make_config();
  std::string msg;
  try {
    c.load_yaml_string("steps: 5\nlearning_rate: 0.1\nsteps: 50\n", "dup.yml");
    ADD_FAILURE() << "a duplicate key was accepted";
  } catch (const UsageError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("dup.yml:3: key 'steps' is given twice (first on line 1)"), std::string::npos)
      << msg;
  // A nested map and a dotted key that flatten to the same key are the same key twice.
  Config n({{"optimizer.lr", ConfigType::kFloat, "1", ""}});
  msg = error_of([&] { n.load_yaml_string("optimizer:\n  lr: 2\noptimizer.lr: 3\n", "n.yml"); });
  EXPECT_NE(msg.find("'optimizer.lr' is given twice"), std::string::npos) << msg;
  // Unknown keys and wrong types are usage errors too (exit status 2 in the CLI).
  EXPECT_THROW(c.apply_override("no_such_key=1"), UsageError);
  EXPECT_THROW(c.apply_override("steps=many"), UsageError);
}

TEST(Config, FilesAreReadAndMissingFilesNamed) {
  char path[] = "/tmp/hyperion_config_testXXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path);
    out << "# comment\nsteps: 7\nlearning_rate: 0.01\n";
  }
  Config c = make_config();
  c.load_yaml_file(path);
  EXPECT_EQ(c.get_int("steps"), 7);
  EXPECT_EQ(c.source_of("learning_rate"), std::string(path) + ":3");
  std::remove(path);
  std::string msg = error_of([&] { c.load_yaml_file("/nonexistent/dir/base.yml"); });
  EXPECT_NE(msg.find("/nonexistent/dir/base.yml: cannot open config file"), std::string::npos)
      << msg;
}

TEST(Config, SchemaErrors) {
  EXPECT_THROW(Config({{"a", ConfigType::kInt, "1", ""}, {"a", ConfigType::kInt, "2", ""}}), Error);
  EXPECT_THROW(Config({{"a", ConfigType::kInt, "x", ""}}), Error);
}

}  // namespace
}  // namespace hyperion
