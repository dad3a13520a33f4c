#!/usr/bin/env node
// Checks that the GGUF files `hyperion convert --to gguf` writes load and run in llama.cpp.
//
// For each output type (f32, f16, bf16, q8_0) it
//   1. converts the checkpoint with hyperion,
//   2. parses the file with @huggingface/gguf (an independent GGUF reader) and checks the
//      structure: key types as llama.cpp reads them, tensor names/types/shapes, alignment,
//      data offsets and the file size; for a Mixtral checkpoint (config.json model_type
//      "mixtral") also llama.expert_count / llama.expert_used_count and, per layer, the
//      router ffn_gate_inp (f32, ggml shape [D, E]) and the stacked experts
//      ffn_{gate,up}_exps [D, F, E] and ffn_down_exps [F, D, E] in place of the dense MLP,
//   3. loads it in llama.cpp (node-llama-cpp's prebuilt CPU build; f32 KV cache, no flash
//      attention, so the f32 file is compared in full f32),
//   4. checks llama.cpp's tokenization against SentencePiece (spm_encode) on sample texts and
//      the first --tokenizer-lines lines of --tokenizer-text (default: the bundled corpus),
//   5. greedy-decodes N tokens from BOS (+ each prompt) in llama.cpp and compares the ids
//      with `hyperion generate --temperature 0 --ignore-eos --json`; it also feeds
//      hyperion's tokens to llama.cpp (teacher forcing) and reports, at every step, how far
//      hyperion's pick is below llama.cpp's best logit. A divergence counts as a near-tie
//      when that gap is within the type's tolerance.
//   6. compares the mean next-token loss of llama.cpp (teacher-forced, full softmax at every
//      position) with `hyperion eval --shard --json` on the same token stream, the first
//      --loss-lines lines of --tokenizer-text each as BOS + SentencePiece ids + EOS (written
//      as a token shard, so that both sides see identical ids), in the same windows of
//      --loss-seq-len tokens. Unlike greedy ids, this sees every logit, so it also catches
//      small errors in a barely trained model (e.g. one expert mixed up: a MoE model whose
//      greedy output is a repeated token can still agree on every argmax).
//
// Exit code 0 when every type loads, tokenization matches, decoding agrees (f32: token
// ids equal, or a divergence that is a near-tie; f16/bf16/q8_0: every teacher-forced gap within
// that type's tolerance) and the losses agree within the type's LOSS_TOL. Needs node >= 18
// and, in --llamacpp-dir (default $HYPERION_LLAMACPP_DIR or /tmp/llamacpp), the npm packages
// node-llama-cpp@3.22.1, @node-llama-cpp/linux-x64@3.22.1 and @huggingface/gguf@0.4.6;
// `--install` installs them there with
//   npm install --ignore-scripts --omit=optional node-llama-cpp@3.22.1 \
//       @node-llama-cpp/linux-x64@3.22.1 @huggingface/gguf@0.4.6
// (--ignore-scripts: the postinstall would try to fetch/build llama.cpp; the prebuilt binaries
// package is enough). spm_encode comes from Debian's `sentencepiece` package.
//
// Usage:
//   node bench/gguf_llamacpp_check.mjs --checkpoint DIR [--types f32,f16,bf16,q8_0]
//       [--tokens 16] [--prompt TEXT]... [--hyperion PATH] [--workdir DIR]
//       [--llamacpp-dir DIR] [--tokenizer-text FILE] [--tokenizer-lines N]
//       [--loss-lines N] [--loss-seq-len N] [--install]
//       [--json] [--verbose]

import {execFileSync, spawnSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

import {streamLoss, writeTokenShard} from "./llamacpp_util.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));

// ---------------------------------------------------------------------------------------------
// Arguments

function parseArgs(argv) {
  const a = {
    checkpoint: null,
    types: ["f32", "f16", "bf16", "q8_0"],
    tokens: 16,
    prompts: [],
    hyperion: path.resolve(here, "../build/release/hyperion"),
    workdir: null,
    llamacppDir: process.env.HYPERION_LLAMACPP_DIR || "/tmp/llamacpp",
    tokenizerText: path.resolve(here, "../data/corpus/fortunes.txt"),
    tokenizerLines: 500,
    lossLines: 24,
    lossSeqLen: 64,
    install: false,
    json: false,
    verbose: false,
  };
  for (let i = 2; i < argv.length; ++i) {
    const k = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${k} needs a value`);
      return argv[++i];
    };
    if (k === "--checkpoint") a.checkpoint = val();
    else if (k === "--types") a.types = val().split(",").filter(Boolean);
    else if (k === "--tokens") a.tokens = Number.parseInt(val(), 10);
    else if (k === "--prompt") a.prompts.push(val());
    else if (k === "--hyperion") a.hyperion = val();
    else if (k === "--workdir") a.workdir = val();
    else if (k === "--llamacpp-dir") a.llamacppDir = val();
    else if (k === "--tokenizer-text") a.tokenizerText = val();
    else if (k === "--tokenizer-lines") a.tokenizerLines = Number.parseInt(val(), 10);
    else if (k === "--loss-lines") a.lossLines = Number.parseInt(val(), 10);
    else if (k === "--loss-seq-len") a.lossSeqLen = Number.parseInt(val(), 10);
    else if (k === "--install") a.install = true;
    else if (k === "--json") a.json = true;
    else if (k === "--verbose") a.verbose = true;
    else if (k === "-h" || k === "--help") {
      console.log(fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n")
                      .filter((l) => l.startsWith("//")).map((l) => l.slice(3)).join("\n"));
      process.exit(0);
    } else throw new Error(`unknown argument ${k}`);
  }
  if (!a.checkpoint) throw new Error("--checkpoint DIR is required");
  if (!(a.tokens > 0)) throw new Error("--tokens must be a positive integer");
  if (!(a.lossLines >= 0)) throw new Error("--loss-lines must be a non-negative integer");
  if (!(a.lossSeqLen > 0 && a.lossSeqLen < 256))
    throw new Error("--loss-seq-len must be in [1, 255] (the llama.cpp context holds 256)");
  for (const t of a.types)
    if (!TYPE_TOL[t]) throw new Error(`unknown type '${t}' (expected f32, f16, bf16, q8_0)`);
  if (a.prompts.length === 0) a.prompts = ["", "The meaning of life is"];
  return a;
}

// Largest allowed gap (llama.cpp's best logit minus its logit for hyperion's token) under
// teacher forcing. f32: both sides compute in f32 with different summation orders, so only
// rounding-level differences are acceptable. The others quantise the weights (hyperion runs
// the f32 checkpoint), so their gaps are larger; these bounds are for small models whose
// logits are O(10).
const TYPE_TOL = {f32: 1e-3, f16: 0.05, bf16: 0.25, q8_0: 0.25};
// Largest allowed |mean loss (llama.cpp) - mean loss (hyperion eval)| in nats, for the same
// reasons: f32 differs by summation order only; the others by their weight rounding.
const LOSS_TOL = {f32: 1e-4, f16: 2e-3, bf16: 2e-2, q8_0: 2e-2};
// llama.cpp's LLAMA_FTYPE for general.file_type and the ggml type of 2-D weights.
const FILE_TYPE = {f32: 0, f16: 1, q8_0: 7, bf16: 32};
const GGML = {F32: 0, F16: 1, Q8_0: 8, BF16: 30};
const MATRIX_GGML = {f32: GGML.F32, f16: GGML.F16, bf16: GGML.BF16, q8_0: GGML.Q8_0};
const BLOCK = {[GGML.F32]: [1, 4], [GGML.F16]: [1, 2], [GGML.BF16]: [1, 2], [GGML.Q8_0]: [32, 34]};

// Sample texts for the tokenizer check: spaces, digits (split_digits), punctuation, newlines,
// tabs, a leading space, repeated spaces and non-ASCII (byte fallback for rare characters).
const TOKENIZER_SAMPLES = [
  "The quick brown fox jumps over the lazy dog.",
  "Hello, world! 12345 + 678 = 13023",
  " leading space and  two  spaces",
  "line one\nline two\n\ttabbed",
  "Ünïcödé — “quotes” and emoji 🙂 and 日本語",
  "You will be recognized and honored as a community leader.",
];

// ---------------------------------------------------------------------------------------------
// Helpers

function run(cmd, args, what) {
  const r = spawnSync(cmd, args, {encoding: "utf8", maxBuffer: 64 << 20});
  if (r.error) throw new Error(`${what}: cannot run ${cmd}: ${r.error.message}`);
  if (r.status !== 0)
    throw new Error(`${what}: ${cmd} ${args.join(" ")} exited ${r.status}: ${
        (r.stderr || r.stdout).trim().split("\n").slice(-3).join(" | ")}`);
  return r.stdout;
}

async function loadPackages(dir, install) {
  const pkgMain = (name) => path.join(dir, "node_modules", name, "package.json");
  const missing = ["node-llama-cpp", "@node-llama-cpp/linux-x64", "@huggingface/gguf"].filter(
      (n) => !fs.existsSync(pkgMain(n)));
  if (missing.length > 0) {
    if (!install)
      throw new Error(`missing npm packages in ${dir}: ${missing.join(", ")} (rerun with --install)`);
    fs.mkdirSync(dir, {recursive: true});
    if (!fs.existsSync(path.join(dir, "package.json")))
      fs.writeFileSync(path.join(dir, "package.json"), '{"name":"llamacpp-check","private":true}\n');
    execFileSync("npm",
                 ["install", "--ignore-scripts", "--omit=optional", "--no-audit", "--no-fund",
                  "node-llama-cpp@3.22.1", "@node-llama-cpp/linux-x64@3.22.1",
                  "@huggingface/gguf@0.4.6"],
                 {cwd: dir, stdio: ["ignore", 2, 2]});  // keep stdout for --json
  }
  const entry = (name, rel) => pathToFileURL(path.join(dir, "node_modules", name, rel)).href;
  const nlc = await import(entry("node-llama-cpp", "dist/index.js"));
  const hfg = await import(entry("@huggingface/gguf", "dist/index.mjs"));
  const version = (n) => JSON.parse(fs.readFileSync(pkgMain(n), "utf8")).version;
  return {
    nlc,
    hfg,
    versions: {
      "node-llama-cpp": version("node-llama-cpp"),
      "@node-llama-cpp/linux-x64": version("@node-llama-cpp/linux-x64"),
      "@huggingface/gguf": version("@huggingface/gguf"),
    },
  };
}

function argmax(logits) {  // Map<token, logit>; ties go to the lowest id, as in hyperion
  let best = -1, bestV = -Infinity;
  for (const [t, v] of logits)
    if (v > bestV || (v === bestV && t < best)) [best, bestV] = [t, v];
  return [best, bestV];
}

function secondBest(logits, top) {
  let v2 = -Infinity;
  for (const [t, v] of logits)
    if (t !== top && v > v2) v2 = v;
  return v2;
}

// ---------------------------------------------------------------------------------------------
// 2. Structure check with @huggingface/gguf

// Key types llama.cpp's loader accepts (llama-model-loader get_key/get_arr: integers must be
// exactly this type; a u32 key written as i32 is rejected).
const V = {U32: 4, I32: 5, F32: 6, BOOL: 7, STRING: 8, ARRAY: 9};
const EXPECTED_KEYS = {
  "general.architecture": [V.STRING],
  "general.alignment": [V.U32],
  "general.file_type": [V.U32],
  "general.quantization_version": [V.U32],
  "llama.block_count": [V.U32],
  "llama.context_length": [V.U32],
  "llama.embedding_length": [V.U32],
  "llama.feed_forward_length": [V.U32],
  "llama.attention.head_count": [V.U32],
  "llama.attention.head_count_kv": [V.U32],
  "llama.rope.freq_base": [V.F32],
  "llama.attention.layer_norm_rms_epsilon": [V.F32],
  "llama.rope.dimension_count": [V.U32],
  "llama.vocab_size": [V.U32],
  "tokenizer.ggml.model": [V.STRING],
  "tokenizer.ggml.tokens": [V.ARRAY, V.STRING],
  "tokenizer.ggml.scores": [V.ARRAY, V.F32],
  "tokenizer.ggml.token_type": [V.ARRAY, V.I32],
  "tokenizer.ggml.bos_token_id": [V.U32],
  "tokenizer.ggml.eos_token_id": [V.U32],
};
// Mixtral (mixture of experts) checkpoints: llama.cpp's llama architecture with experts.
const MOE_KEYS = {
  "llama.expert_count": [V.U32],
  "llama.expert_used_count": [V.U32],
};
const OPTIONAL_KEYS = {
  "llama.attention.key_length": [V.U32],
  "llama.attention.value_length": [V.U32],
  "tokenizer.ggml.unknown_token_id": [V.U32],
  "tokenizer.ggml.padding_token_id": [V.U32],
  "tokenizer.ggml.add_bos_token": [V.BOOL],
  "tokenizer.ggml.add_eos_token": [V.BOOL],
};

function isMoe(cfg) {
  return cfg.model_type === "mixtral" ||
         (cfg.model_type === undefined && cfg.architectures?.[0] === "MixtralForCausalLM");
}

async function checkStructure(hfg, file, type, cfg) {
  const problems = [];
  const p = await hfg.gguf(file, {allowLocalFile: true, typedMetadata: true});
  const md = p.typedMetadata;
  const moe = isMoe(cfg);
  if (md.version.value !== 3) problems.push(`version ${md.version.value}, expected 3`);
  for (const [table, required] of [[EXPECTED_KEYS, true], [OPTIONAL_KEYS, false],
                                   [MOE_KEYS, moe]]) {
    for (const [k, [t, sub]] of Object.entries(table)) {
      const e = md[k];
      if (!e) {
        if (required) problems.push(`missing key ${k}`);
        continue;
      }
      if (e.type !== t || (sub !== undefined && e.subType !== sub))
        problems.push(`key ${k} has type ${e.type}/${e.subType}, llama.cpp expects ${t}/${sub}`);
    }
  }
  const val = (k) => md[k]?.value;
  const heads = cfg.num_attention_heads, kvHeads = cfg.num_key_value_heads ?? heads;
  const headDim = cfg.head_dim ?? cfg.hidden_size / heads;
  const want = {
    "general.architecture": "llama",
    "general.file_type": FILE_TYPE[type],
    "llama.block_count": cfg.num_hidden_layers,
    "llama.embedding_length": cfg.hidden_size,
    "llama.feed_forward_length": cfg.intermediate_size,
    "llama.attention.head_count": heads,
    "llama.attention.head_count_kv": kvHeads,
    "llama.rope.dimension_count": headDim,
    "llama.vocab_size": cfg.vocab_size,
    "tokenizer.ggml.bos_token_id": cfg.bos_token_id ?? 1,
    "tokenizer.ggml.eos_token_id": cfg.eos_token_id ?? 2,
  };
  if (moe) {  // MixtralConfig's defaults; feed_forward_length above is the expert's size
    want["llama.expert_count"] = cfg.num_local_experts ?? 8;
    want["llama.expert_used_count"] = cfg.num_experts_per_tok ?? 2;
  } else {
    for (const k of Object.keys(MOE_KEYS))
      if (md[k]) problems.push(`dense model has key ${k} = ${val(k)}`);
  }
  for (const [k, w] of Object.entries(want))
    if (val(k) !== w) problems.push(`key ${k} = ${val(k)}, expected ${w}`);
  // llama.cpp derives the head size as n_embd / n_head unless key_length is given.
  if (headDim * heads !== cfg.hidden_size && val("llama.attention.key_length") !== headDim)
    problems.push(`head_dim ${headDim} != hidden_size / heads but llama.attention.key_length ` +
                  `is ${val("llama.attention.key_length")}`);
  for (const k of ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"])
    if (val(k)?.length !== cfg.vocab_size)
      problems.push(`${k} has ${val(k)?.length} entries, vocab_size is ${cfg.vocab_size}`);

  // Tensors: names, shapes (ggml order: fastest dimension first), types, offsets.
  const D = cfg.hidden_size, F = cfg.intermediate_size, Vv = cfg.vocab_size;
  const expected = new Map([["token_embd.weight", [D, Vv]], ["output_norm.weight", [D]]]);
  if (!cfg.tie_word_embeddings) expected.set("output.weight", [D, Vv]);
  for (let i = 0; i < cfg.num_hidden_layers; ++i) {
    const b = `blk.${i}.`;
    expected.set(b + "attn_norm.weight", [D]);
    expected.set(b + "attn_q.weight", [D, heads * headDim]);
    expected.set(b + "attn_k.weight", [D, kvHeads * headDim]);
    expected.set(b + "attn_v.weight", [D, kvHeads * headDim]);
    expected.set(b + "attn_output.weight", [heads * headDim, D]);
    expected.set(b + "ffn_norm.weight", [D]);
    if (moe) {  // llama.cpp's create_tensor shapes, e.g. {n_embd, n_ff, n_expert} for gate/up
      const E = cfg.num_local_experts ?? 8;
      expected.set(b + "ffn_gate_inp.weight", [D, E]);
      expected.set(b + "ffn_gate_exps.weight", [D, F, E]);
      expected.set(b + "ffn_up_exps.weight", [D, F, E]);
      expected.set(b + "ffn_down_exps.weight", [F, D, E]);
    } else {
      expected.set(b + "ffn_gate.weight", [D, F]);
      expected.set(b + "ffn_up.weight", [D, F]);
      expected.set(b + "ffn_down.weight", [F, D]);
    }
  }
  const align = BigInt(val("general.alignment") ?? 32);
  if (p.tensorDataOffset % align !== 0n)
    problems.push(`tensor data starts at ${p.tensorDataOffset}, not a multiple of ${align}`);
  const seen = new Set();
  let end = 0n;
  const typeCount = {};
  for (const t of p.tensorInfos) {
    seen.add(t.name);
    const shape = t.shape.map(Number);
    const exp = expected.get(t.name);
    if (!exp) problems.push(`unexpected tensor ${t.name}`);
    else if (JSON.stringify(exp) !== JSON.stringify(shape))
      problems.push(`tensor ${t.name} has ggml shape [${shape}], expected [${exp}]`);
    // The MoE router stays f32 like the norms (convert_hf_to_gguf.py; llama-quantize skips it).
    const wantType = shape.length === 1 || t.name.endsWith(".ffn_gate_inp.weight") ? GGML.F32
                     : (MATRIX_GGML[type] === GGML.Q8_0 && shape[0] % 32 !== 0) ? GGML.F16
                     : MATRIX_GGML[type];
    if (t.dtype !== wantType) problems.push(`tensor ${t.name} has ggml type ${t.dtype}, expected ${wantType}`);
    typeCount[t.dtype] = (typeCount[t.dtype] ?? 0) + 1;
    if (t.offset % align !== 0n) problems.push(`tensor ${t.name} offset ${t.offset} not aligned`);
    const [bs, bb] = BLOCK[t.dtype] ?? [1, 0];
    const n = shape.reduce((x, y) => x * y, 1);
    const nbytes = BigInt((n / bs) * bb);
    if (t.offset < end) problems.push(`tensor ${t.name} overlaps the previous tensor`);
    end = t.offset + nbytes;
  }
  for (const name of expected.keys())
    if (!seen.has(name)) problems.push(`missing tensor ${name}`);
  const size = BigInt(fs.statSync(file).size);
  if (p.tensorDataOffset + end > size)
    problems.push(`tensor data ends at ${p.tensorDataOffset + end}, past the file size ${size}`);
  return {problems, tensors: p.tensorInfos.length, kvs: Number(md.kv_count.value), typeCount};
}

// ---------------------------------------------------------------------------------------------
// 3.-5. llama.cpp

async function withModel(nlc, llama, file, fn) {
  const model = await llama.loadModel({modelPath: file, gpuLayers: 0});
  try {
    const context = await model.createContext({
      contextSize: 256,
      batchSize: 256,
      threads: Math.min(2, os.cpus().length),
      flashAttention: false,
      experimentalKvCacheKeyType: "F32",
      experimentalKvCacheValueType: "F32",
    });
    const seq = context.getSequence();
    try {
      return await fn(model, seq);
    } finally {
      seq.dispose();
      await context.dispose();
    }
  } finally {
    await model.dispose();
  }
}

// Evaluates `prefix` and then `forced` (if given) or greedily `n` tokens; returns the tokens
// and, per step, the logit gap between llama.cpp's best and the token taken.
async function decode(seq, prefix, n, forced) {
  await seq.clearHistory();
  {
    const steps = [];
    let input = prefix;
    for (let s = 0; s < n; ++s) {
      const items = input.map((t, i) => (i === input.length - 1 ? [t, {generateNext: {logits: true}}] : t));
      const res = await seq.controlledEvaluate(items);
      const logits = res[res.length - 1].next.logits;
      const [best, bestV] = argmax(logits);
      const tok = forced ? forced[s] : best;
      const tokV = logits.get(tok);
      steps.push({token: tok, best, gap: bestV - tokV, margin: bestV - secondBest(logits, best)});
      input = [tok];
    }
    return steps;
  }
}

// SentencePiece ids of each line of `lines` (spm_encode encodes line by line, so a text
// with a newline cannot be checked whole here; each of its lines is checked instead).
function spmEncodeLines(modelFile, lines) {
  const r = spawnSync("spm_encode", [`--model=${modelFile}`, "--output_format=id"],
                      {input: lines.join("\n") + "\n", encoding: "utf8", maxBuffer: 64 << 20});
  if (r.error || r.status !== 0)
    throw new Error(`spm_encode failed (Debian package sentencepiece): ${r.error?.message ?? r.stderr}`);
  const out = r.stdout.split("\n").slice(0, -1).map((l) => (l.trim() ? l.trim().split(/\s+/).map(Number) : []));
  if (out.length !== lines.length)
    throw new Error(`spm_encode returned ${out.length} lines for ${lines.length}`);
  return out;
}

// llama.cpp's tokenization (no BOS) against SentencePiece's on the sample texts and on up to
// `corpusLines` lines of `corpus`.
function checkTokenizer(model, modelFile, corpus, corpusLines) {
  const lines = TOKENIZER_SAMPLES.flatMap((t) => t.split("\n"));
  if (corpus && fs.existsSync(corpus))
    lines.push(...fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0)
                   .slice(0, corpusLines));
  const spm = spmEncodeLines(modelFile, lines);
  const mismatches = [];
  lines.forEach((text, i) => {
    const lc = Array.from(model.tokenize(text, false));
    if (JSON.stringify(lc) !== JSON.stringify(spm[i])) mismatches.push({text, spm: spm[i], llamacpp: lc});
  });
  return {lines: lines.length, equal: lines.length - mismatches.length, mismatches: mismatches.slice(0, 10)};
}

// hyperion's token shard (src/io/token_shard.h): "HYPTOKS1", u32 version 1, u32 token bytes,
// u64 count, u32 vocab_size, u32 0, then the ids.


// ---------------------------------------------------------------------------------------------

async function main() {
  const a = parseArgs(process.argv);
  const ckpt = path.resolve(a.checkpoint);
  const cfg = JSON.parse(fs.readFileSync(path.join(ckpt, "config.json"), "utf8"));
  const tokModel = path.join(ckpt, "tokenizer.model");
  const work = a.workdir ? path.resolve(a.workdir) : fs.mkdtempSync(path.join(os.tmpdir(), "gguf-check-"));
  fs.mkdirSync(work, {recursive: true});
  const log = (...x) => { if (!a.json) console.log(...x); };

  const {nlc, hfg, versions} = await loadPackages(a.llamacppDir, a.install);
  const llamaLogs = [];
  const llama = await nlc.getLlama({
    gpu: false,
    build: "never",
    logLevel: nlc.LlamaLogLevel.warn,
    logger: (level, msg) => {
      llamaLogs.push(`${level}: ${msg.trimEnd()}`);
      if (a.verbose) process.stderr.write(`[llama.cpp ${level}] ${msg}`);
    },
  });
  log(`llama.cpp: node-llama-cpp ${versions["node-llama-cpp"]}, binaries ` +
      `${versions["@node-llama-cpp/linux-x64"]} (${JSON.stringify(llama.llamaCppRelease)}), ` +
      `@huggingface/gguf ${versions["@huggingface/gguf"]}`);
  log(`checkpoint ${ckpt}; work dir ${work}`);

  // hyperion's greedy tokens, once per prompt (it runs the f32 checkpoint).
  const reference = [];
  for (const prompt of a.prompts) {
    const out = JSON.parse(run(a.hyperion, ["generate", "--checkpoint", ckpt, "--temperature", "0",
                                            "--max-tokens", String(a.tokens), "--ignore-eos", "--json",
                                            "--dtype", "float32", "--prompt", prompt],
                               "hyperion generate"));
    if (prompt.includes("\n")) throw new Error("--prompt must be a single line (spm_encode is line based)");
    const promptIds = prompt === "" ? [] : spmEncodeLines(tokModel, [prompt])[0];
    reference.push({prompt, promptIds, tokens: out.tokens});
  }

  // hyperion's loss on the token stream of one document per line.
  let lossRef = null;
  if (a.lossLines > 0 && fs.existsSync(a.tokenizerText)) {
    const docs = fs.readFileSync(a.tokenizerText, "utf8").split("\n")
                     .filter((l) => l.trim().length > 0).slice(0, a.lossLines);
    const bos = cfg.bos_token_id ?? 1, eos = cfg.eos_token_id ?? 2;
    const stream = spmEncodeLines(tokModel, docs).flatMap((ids) => [bos, ...ids, eos]);
    const shard = path.join(work, "loss-tokens.bin");
    writeTokenShard(shard, stream, cfg.vocab_size);
    const seqLen = Math.min(a.lossSeqLen, cfg.max_position_embeddings ?? a.lossSeqLen);
    const ev = JSON.parse(run(a.hyperion, ["eval", "--checkpoint", ckpt, "--shard", shard,
                                           "--seq-len", String(seqLen), "--json",
                                           "--dtype", "float32"], "hyperion eval"));
    lossRef = {docs: docs.length, seqLen, stream, loss: ev.loss, tokens: ev.tokens};
    log(`hyperion eval: loss ${ev.loss.toFixed(6)} over ${ev.tokens} tokens (${docs.length} ` +
        `documents, seq_len ${seqLen})`);
  }

  const report = {checkpoint: ckpt, versions, llamaCppRelease: llama.llamaCppRelease, types: {},
                  moe: isMoe(cfg),
                  hyperionLoss: lossRef && {loss: lossRef.loss, tokens: lossRef.tokens,
                                            documents: lossRef.docs, seqLen: lossRef.seqLen}};
  let ok = true;
  for (const type of a.types) {
    const r = {type};
    report.types[type] = r;
    const file = path.join(work, `model-${type}.gguf`);
    try {
      run(a.hyperion, ["convert", "--checkpoint", ckpt, "--to", "gguf", "--type", type, "--output", file],
          "hyperion convert");
      r.bytes = fs.statSync(file).size;
    } catch (e) {
      r.error = e.message;
      ok = false;
      log(`[${type}] CONVERT FAILED: ${e.message}`);
      continue;
    }
    try {
      r.structure = await checkStructure(hfg, file, type, cfg);
    } catch (e) {
      r.structure = {problems: [`@huggingface/gguf could not parse the file: ${e.message}`]};
    }
    if (r.structure.problems.length > 0) ok = false;
    log(`[${type}] ${r.bytes} bytes; structure: ${r.structure.problems.length === 0 ? "ok" : "PROBLEMS"}` +
        ` (${r.structure.kvs} keys, ${r.structure.tensors} tensors, ggml types ${JSON.stringify(r.structure.typeCount)})`);
    for (const pr of r.structure.problems) log(`    ${pr}`);

    llamaLogs.length = 0;
    try {
      await withModel(nlc, llama, file, async (model, seq) => {
        r.loaded = true;
        r.tokenizer = checkTokenizer(model, tokModel, a.tokenizerText, a.tokenizerLines);
        if (r.tokenizer.equal !== r.tokenizer.lines) ok = false;
        log(`[${type}] loaded in llama.cpp; tokenizer vs SentencePiece: ${r.tokenizer.equal}/` +
            `${r.tokenizer.lines} lines tokenize identically`);
        for (const t of r.tokenizer.mismatches)
          log(`    ${JSON.stringify(t.text)}: spm ${JSON.stringify(t.spm)} llama.cpp ${JSON.stringify(t.llamacpp)}`);
        if (lossRef) {
          const lc = await streamLoss(seq, lossRef.stream, lossRef.seqLen);
          const diff = Math.abs(lc.loss - lossRef.loss);
          r.loss = {llamacpp: lc.loss, hyperion: lossRef.loss, absDiff: diff, tokens: lc.tokens,
                    tol: LOSS_TOL[type],
                    pass: lc.tokens === lossRef.tokens && diff <= LOSS_TOL[type]};
          if (!r.loss.pass) ok = false;
          log(`[${type}] loss llama.cpp ${lc.loss.toFixed(6)} vs hyperion ${lossRef.loss.toFixed(6)}` +
              ` over ${lc.tokens}/${lossRef.tokens} tokens: |diff| ${diff.toExponential(2)}` +
              ` (tol ${LOSS_TOL[type]}) -> ${r.loss.pass ? "ok" : "FAIL"}`);
        }
        r.prompts = [];
        for (const ref of reference) {
          const prefix = [model.tokens.bos, ...ref.promptIds];
          const greedy = await decode(seq, prefix, a.tokens);
          const forced = await decode(seq, prefix, a.tokens, ref.tokens);
          const lc = greedy.map((s) => s.token);
          let firstDiff = lc.findIndex((t, i) => t !== ref.tokens[i]);
          const maxGap = Math.max(...forced.map((s) => s.gap));
          const gapAt = forced.findIndex((s) => s.gap === maxGap);
          const minMargin = Math.min(...greedy.map((s) => s.margin));
          const pr = {
            prompt: ref.prompt, hyperion: ref.tokens, llamacpp: lc, equal: firstDiff < 0,
            firstDiff, maxTeacherForcedGap: maxGap, maxGapStep: gapAt, minGreedyMargin: minMargin,
            marginAtDiff: firstDiff >= 0 ? greedy[firstDiff].margin : null,
            gapAtDiff: firstDiff >= 0 ? forced[firstDiff].gap : null,
          };
          pr.pass = maxGap <= TYPE_TOL[type];
          if (!pr.pass) ok = false;
          r.prompts.push(pr);
          log(`[${type}] prompt ${JSON.stringify(ref.prompt)}: tokens ${pr.equal ? "EQUAL" : `differ from step ${firstDiff}`}` +
              `; teacher-forced max gap ${maxGap.toExponential(2)} at step ${gapAt} (tol ${TYPE_TOL[type]})` +
              (pr.equal ? `; min top1-top2 margin ${minMargin.toExponential(2)}`
                        : `; llama.cpp top1-top2 margin there ${pr.marginAtDiff.toExponential(2)}`) +
              ` -> ${pr.pass ? "ok" : "FAIL"}`);
          if (!pr.equal || a.verbose) {
            log(`    hyperion : ${JSON.stringify(ref.tokens)}`);
            log(`    llama.cpp: ${JSON.stringify(lc)}`);
          }
        }
      });
    } catch (e) {
      r.loaded = r.loaded ?? false;
      r.error = e.message;
      r.llamaLog = llamaLogs.slice(-20);
      ok = false;
      log(`[${type}] LLAMA.CPP FAILED: ${e.message}`);
      for (const l of r.llamaLog) log(`    ${l}`);
    }
  }
  report.ok = ok;
  if (a.json) console.log(JSON.stringify(report, null, 2));
  else log(ok ? "RESULT: all checks passed" : "RESULT: some checks FAILED");
  await llama.dispose();
  process.exit(ok ? 0 : 1);
}

main().catch((e) => {
  console.error(`gguf_llamacpp_check: ${e.message}`);
  process.exit(2);
});
