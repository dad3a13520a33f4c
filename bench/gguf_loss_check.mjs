#!/usr/bin/env node
// Compares llama.cpp's loss on a hyperion checkpoint's GGUF export with `hyperion eval`, on
// the same token ids: no tokenizer on either side (a `hyperion data prepare` shard holds
// the ids), so it works for any family whatever its tokenizer.
//
//   1. `hyperion convert --to gguf --type f32` writes the GGUF,
//   2. `hyperion eval --shard SHARD --seq-len N --json` gives hyperion's mean loss over the
//      first --max-tokens ids of the shard,
//   3. llama.cpp (node-llama-cpp's prebuilt CPU build, f32 KV cache, no flash attention)
//      computes the same mean next-token loss, window by window (llamacpp_util.streamLoss).
//
// Exit code 0 when the two losses agree within --tol (relative; default 1e-3, f32 on both
// sides). Needs node >= 18 and, in --llamacpp-dir (default $HYPERION_LLAMACPP_DIR or
// /tmp/llamacpp), node-llama-cpp@3.22.1 and @node-llama-cpp/linux-x64@3.22.1 installed with
//   npm install --ignore-scripts --omit=optional node-llama-cpp@3.22.1 \
//       @node-llama-cpp/linux-x64@3.22.1
//
// Usage:
//   node bench/gguf_loss_check.mjs --checkpoint DIR --shard FILE [--seq-len 256]
//       [--max-tokens 2048] [--tol 1e-3] [--hyperion PATH] [--workdir DIR]
//       [--llamacpp-dir DIR] [--json]

import {execFileSync} from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

import {streamLoss, writeTokenShard} from "./llamacpp_util.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const a = {
    checkpoint: "",
    shard: "",
    seqLen: 256,
    maxTokens: 2048,
    tol: 1e-3,
    hyperion: path.join(here, "..", "build", "release", "hyperion"),
    workdir: "",
    llamacppDir: process.env.HYPERION_LLAMACPP_DIR || "/tmp/llamacpp",
    json: false,
  };
  for (let i = 0; i < argv.length; ++i) {
    const k = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${k} needs a value`);
      return argv[++i];
    };
    if (k === "--checkpoint") a.checkpoint = val();
    else if (k === "--shard") a.shard = val();
    else if (k === "--seq-len") a.seqLen = Number.parseInt(val(), 10);
    else if (k === "--max-tokens") a.maxTokens = Number.parseInt(val(), 10);
    else if (k === "--tol") a.tol = Number.parseFloat(val());
    else if (k === "--hyperion") a.hyperion = val();
    else if (k === "--workdir") a.workdir = val();
    else if (k === "--llamacpp-dir") a.llamacppDir = val();
    else if (k === "--json") a.json = true;
    else if (k === "--help" || k === "-h") {
      console.log(fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n")
                      .filter((l) => l.startsWith("//")).map((l) => l.slice(3)).join("\n"));
      process.exit(0);
    } else throw new Error(`unknown argument ${k} (see --help)`);
  }
  if (!a.checkpoint || !a.shard) throw new Error("--checkpoint and --shard are required");
  if (!(a.seqLen > 0) || !(a.maxTokens > 1)) throw new Error("--seq-len and --max-tokens must be > 0");
  return a;
}

// The ids of a hyperion token shard (the header writeTokenShard writes).
function readShard(file) {
  const b = fs.readFileSync(file);
  if (b.toString("latin1", 0, 8) !== "HYPTOKS1") throw new Error(`${file}: not a hyperion token shard`);
  const width = b.readUInt32LE(12), count = Number(b.readBigUInt64LE(16)), vocab = b.readUInt32LE(24);
  const ids = [];
  for (let i = 0; i < count; ++i) ids.push(width === 4 ? b.readUInt32LE(32 + 4 * i) : b.readUInt16LE(32 + 2 * i));
  return {ids, vocab};
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const work = a.workdir ? path.resolve(a.workdir) : fs.mkdtempSync(path.join(os.tmpdir(), "gguf-loss-"));
  fs.mkdirSync(work, {recursive: true});
  const gguf = path.join(work, "model-f32.gguf");
  execFileSync(a.hyperion, ["convert", "--checkpoint", a.checkpoint, "--to", "gguf", "--type", "f32",
                            "--output", gguf], {stdio: ["ignore", "ignore", 2]});
  const {ids, vocab} = readShard(a.shard);
  const tokens = ids.slice(0, a.maxTokens);
  const shard = path.join(work, "tokens.bin");
  writeTokenShard(shard, tokens, vocab);
  const hyp = JSON.parse(execFileSync(a.hyperion, ["eval", "--checkpoint", a.checkpoint, "--shard", shard,
                                                   "--seq-len", String(a.seqLen), "--json"],
                                      {encoding: "utf8", stdio: ["ignore", "pipe", 2]}));

  const entry = (name, rel) => pathToFileURL(path.join(a.llamacppDir, "node_modules", name, rel)).href;
  const nlc = await import(entry("node-llama-cpp", "dist/index.js"));
  const llama = await nlc.getLlama({gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.warn});
  const model = await llama.loadModel({modelPath: gguf, gpuLayers: 0});
  const context = await model.createContext({
    contextSize: a.seqLen + 1,
    batchSize: a.seqLen + 1,
    threads: Math.min(2, os.cpus().length),
    flashAttention: false,
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
  });
  const seq = context.getSequence();
  const ll = await streamLoss(seq, tokens, a.seqLen);
  seq.dispose();
  await context.dispose();
  await model.dispose();
  await llama.dispose();

  const rel = Math.abs(ll.loss - hyp.loss) / Math.abs(hyp.loss);
  const result = {
    checkpoint: a.checkpoint,
    architecture: JSON.parse(fs.readFileSync(path.join(a.checkpoint, "config.json"), "utf8")).model_type,
    seq_len: a.seqLen,
    tokens: ll.tokens,
    hyperion_loss: hyp.loss,
    hyperion_tokens: hyp.tokens,
    llamacpp_loss: ll.loss,
    relative_difference: rel,
    tolerance: a.tol,
    ok: rel <= a.tol && ll.tokens === hyp.tokens,
  };
  if (a.json) console.log(JSON.stringify(result, null, 2));
  else
    console.log(`${result.architecture}: hyperion ${hyp.loss.toFixed(6)} (${hyp.tokens} tokens), ` +
                `llama.cpp ${ll.loss.toFixed(6)} (${ll.tokens} tokens), relative difference ` +
                `${rel.toExponential(2)} (tolerance ${a.tol}) ${result.ok ? "ok" : "FAIL"}`);
  process.exit(result.ok ? 0 : 1);
}

main().catch((e) => {
  console.error(`gguf_loss_check: ${e.message}`);
  process.exit(2);
});
