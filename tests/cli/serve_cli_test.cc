// `hyperion serve` and `hyperion bench serve` as a user runs them: two processes, a
// trained checkpoint, a real socket. Greedy completions equal `hyperion generate`.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "../test_files.h"
#include "cli_test_util.h"
#include "server_process.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Result = hyperion::testing_util::CliResult;
using hyperion::testing_util::ServerProcess;

Result run(const std::string& args, bool with_stderr = false) {
  return hyperion::testing_util::run_cli(args, with_stderr);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ServeCli : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing::TempDir() + "hyperion_serve_cli_" + std::to_string(::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    const Result r = run("train --json dataset_path=" + hyperion::testing_util::small_corpus() +
                         " vocab_size=512 base_emb_dim=64"
                         " base_num_decoder_layers=2 base_num_query_heads=4 base_num_kv_heads=2"
                         " base_mlp_dim=192 max_target_length=96 per_device_batch_size=4 steps=20"
                         " learning_rate=3e-3 peak_tflops=1 sample_count=1 sample_max_tokens=4"
                         " eval_batches=2 base_output_directory=" +
                         root_ + " run_name=r");
    ASSERT_EQ(r.code, 0) << r.out;
    checkpoint_ = json::parse(r.out)["checkpoint"];
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  static std::string root_, checkpoint_;
};
std::string ServeCli::root_, ServeCli::checkpoint_;

TEST_F(ServeCli, ServesGenerateTextAndBenchServeReports) {
  ServerProcess server(checkpoint_,
                       {"max_concurrent_decodes=4", "weights=float32", "kv_dtype=float32"},
                       root_ + "/serve.log");
  ASSERT_GT(server.port(), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());

  // A greedy completion equals `hyperion generate` (same f32 weights).
  const Result gen =
      run("generate --checkpoint " + checkpoint_ +
          " --prompt 'The fool' --temperature 0 --max-tokens 12 --ignore-eos --json");
  ASSERT_EQ(gen.code, 0);
  const json g = json::parse(gen.out);
  const std::string body =
      R"({"prompt": "The fool", "max_tokens": 12, "temperature": 0, "ignore_eos": true})";
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(60, 0);
  auto res = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json c = json::parse(res->body);
  EXPECT_EQ(c["usage"]["completion_tokens"], 12);
  // generate prints the continuation decoded alone (SentencePiece drops its leading
  // space); the server keeps it, as a continuation of the prompt.
  std::string text = c["choices"][0]["text"];
  if (!text.empty() && text[0] == ' ' && g["text"].get<std::string>().rfind(' ', 0) != 0)
    text.erase(0, 1);
  EXPECT_EQ(text, g["text"].get<std::string>());

  const Result b =
      run("bench serve --url " + url + " --tokenizer " + root_ + "/r" +  // a run directory
          " --num-prompts 6 --min-input-len 8 --max-input-len 40 --min-output-len 4"
          " --max-output-len 8 --max-concurrency 3 --json");
  ASSERT_EQ(b.code, 0) << b.out;
  const json j = json::parse(b.out);
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 0);
  for (const char* k : {"request_throughput", "output_tokens_per_s"})
    EXPECT_GT(j[k].get<double>(), 0) << k;
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms"})
    for (const char* s : {"mean", "p50", "p90", "p99"})
      EXPECT_TRUE(j[k][s].is_number()) << k << "." << s;
  // Defaults (inputs up to 512, outputs up to 256) against a 96-token model: sized to
  // its max_model_len, so every request is served.
  const Result fitted = run("bench serve --url " + url + " --tokenizer " + checkpoint_ +
                                " --num-prompts 4 --max-concurrency 4 --json",
                            false);
  ASSERT_EQ(fitted.code, 0) << fitted.out;
  EXPECT_EQ(json::parse(fitted.out)["failed"], 0);
  // A failed request (a text prompt too long for the context) fails the run, naming why.
  const std::string dataset = root_ + "/too_long.jsonl";
  std::string words;
  for (int i = 0; i < 200; ++i) words += "the fool and the wise ";
  {
    std::ofstream out(dataset);
    out << json{{"prompt", "A short one"}, {"max_tokens", 4}}.dump() << "\n";
    out << json{{"prompt", words}, {"max_tokens", 4}}.dump() << "\n";
  }
  const Result failing = run("bench serve --url " + url + " --dataset-path " + dataset, true);
  EXPECT_EQ(failing.code, 1) << failing.out;
  EXPECT_NE(failing.out.find("1 of 2 requests failed"), std::string::npos) << failing.out;
  EXPECT_NE(failing.out.find("HTTP 400"), std::string::npos) << failing.out;
  EXPECT_EQ(server.stop(), 0);  // SIGTERM shuts down cleanly
}

// Streams a 90-token completion from the server at `port`, setting `first_chunk` at its
// first chunk, appending what arrives to `streamed` (when given), and sleeping
// `delay_ms` after each chunk (a slow reader).
void stream_90_tokens(int port, std::atomic<bool>& first_chunk, std::string* streamed,
                      int delay_ms) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt": "The", "max_tokens": 90, "ignore_eos": true, "stream": true})";
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (streamed != nullptr) streamed->append(data, len);
    first_chunk = true;
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  client.send(req, res, err);
}

TEST_F(ServeCli, SigtermDrainsStreamsAndExitsZero) {
  ServerProcess server(checkpoint_, {"--drain-timeout", "0", "max_concurrent_decodes=2"},
                       root_ + "/drain.log");
  ASSERT_GT(server.port(), 0);
  // A second server on the same port is refused, by name, before loading anything.
  const Result second =
      run("serve " + checkpoint_ + " --port " + std::to_string(server.port()), true);
  EXPECT_EQ(second.code, 1) << second.out;
  EXPECT_NE(second.out.find("in use"), std::string::npos) << second.out;
  EXPECT_EQ(second.out.find("serve: kernels compiled"), std::string::npos) << second.out;

  std::string streamed;
  std::atomic<bool> first_chunk{false};
  std::thread client_thread([&] { stream_90_tokens(server.port(), first_chunk, &streamed, 0); });
  for (int i = 0; i < 2000 && !first_chunk; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(server.stop(), 0);  // SIGTERM: drain, then a clean exit
  client_thread.join();
  // The stream ended properly either way: finished, or cut with an error event; [DONE].
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << streamed;
  const std::string log = read_file(root_ + "/drain.log");
  EXPECT_NE(log.find("draining"), std::string::npos) << log;
}

// The first SIGINT drains (here for up to 10 minutes: streams are running or queued); the
// second stops the server at once, by that signal, as Ctrl-C twice does. Twelve streams
// queue behind one decode slot, so the drain still has work when the second signal
// comes (one stream alone can finish on the server before the first signal lands).
TEST_F(ServeCli, ASecondSignalStopsAtOnce) {
  ServerProcess server(checkpoint_, {"--drain-timeout", "600", "max_concurrent_decodes=1"},
                       root_ + "/twice.log");
  ASSERT_GT(server.port(), 0);
  std::atomic<bool> first_chunk{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 12; ++c)  // slow readers: 50 ms per chunk
    clients.emplace_back([&] { stream_90_tokens(server.port(), first_chunk, nullptr, 50); });
  for (int i = 0; i < 2000 && !first_chunk; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server.signal(SIGINT);
  const std::string log_path = root_ + "/twice.log";
  for (int i = 0; i < 2000 && read_file(log_path).find("draining") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server.signal(SIGINT);
  const int status = server.wait();
  for (std::thread& t : clients) t.join();
  ASSERT_TRUE(WIFSIGNALED(status)) << status << "\n" << read_file(log_path);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_NE(read_file(log_path).find("second signal"), std::string::npos) << read_file(log_path);
}

TEST_F(ServeCli, BenchDecodeReportsTheBound) {
  const Result r = run("bench decode " + checkpoint_ +
                       " --batch 3 --context-min 8 --context-max 20 --steps 4 --bandwidth-gbps 10"
                       " kv_dtype=int8 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["batch"], 3);
  EXPECT_EQ(j["kv_dtype"], "int8");
  EXPECT_EQ(j["read_gbps"], 10.0);
  for (const char* k : {"step_ms", "tokens_per_s", "step_bytes", "bandwidth_bound_tokens_per_s",
                        "fraction_of_bound", "mean_context", "step_ms_p50", "step_ms_max"})
    EXPECT_GT(j[k].get<double>(), 0) << k;
  // The median and the slowest of the timed steps bracket what the mean mixes.
  EXPECT_LE(j["step_ms_p50"].get<double>(), j["step_ms_max"].get<double>());
  EXPECT_LE(j["step_ms"].get<double>(), j["step_ms_max"].get<double>() * (1 + 1e-9));
  EXPECT_NE(run("bench decode " + checkpoint_ + " --batch 2 --context-min 90", true).code, 0);
}

TEST_F(ServeCli, BadSettingsNameTheKey) {
  const Result r = run("serve " + checkpoint_ + " kv_dtype=int4", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("kv_dtype"), std::string::npos) << r.out;
  const Result missing = run("serve", true);
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("CHECKPOINT"), std::string::npos) << missing.out;
  const Result nobody =
      run("bench serve --url http://127.0.0.1:1 --vocab-size 100 --num-prompts 2 --json");
  EXPECT_NE(nobody.code, 0);
}

}  // namespace
