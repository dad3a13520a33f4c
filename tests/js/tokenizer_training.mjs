// Training and generation with a real Hugging Face vocabulary: `data prepare --tokenizer`
// tokenizes the bundled corpus with Llama 3's tokenizer.json (128,256 ids) and with
// Qwen3's (no BOS), a tiny model of each family (Llama 3.1 RoPE scaling, Qwen3 q/k norms)
// trains two steps on each and is fine-tuned one more from its checkpoint
// (load_parameters_path), its checkpoint carries
// tokenizer.json and tokenizer_config.json as Hugging Face lays them out, and generate and
// tokenize read the tokenizer back from the run. The prepared ids are checked against the
// reference encoder (transformers.js) document by document.
//
// Usage: node tests/js/tokenizer_training.mjs --hyperion BIN --source-dir DIR
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { writeTokenizerFiles } from './tokenizer_files.mjs';

const args = process.argv.slice(2);
const flag = (n) => (args.indexOf(n) >= 0 ? args[args.indexOf(n) + 1] : undefined);
const hyperion = flag('--hyperion');
const source = flag('--source-dir');
if (!hyperion || !source) {
  console.error('usage: node tokenizer_training.mjs --hyperion BIN --source-dir DIR');
  process.exit(2);
}
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'hyperion-toktrain-'));
const run = (...argv) => execFileSync(hyperion, ['--threads', '1', ...argv],
  { encoding: 'utf8', maxBuffer: 1 << 28, stdio: ['ignore', 'pipe', 'pipe'] });
let failures = 0;
const check = (ok, what) => {
  if (!ok) {
    ++failures;
    console.log(`FAIL ${what}`);
  }
};

try {
  // A small corpus: the first 60 fortunes of the bundled corpus ('%'-separated).
  const docs = fs.readFileSync(path.join(source, 'data/corpus/fortunes.txt'), 'utf8')
    .split(/\n%\n/).filter((d) => d.trim().length > 0).slice(0, 60);
  // As JSON Lines, so each document's text is exactly what is encoded.
  const input = path.join(work, 'small.jsonl');
  fs.writeFileSync(input, docs.map((text) => JSON.stringify({ text })).join('\n') + '\n');

  // Each tokenizer with its family's architecture: Llama 3.1's scaled RoPE, Qwen3's q/k
  // norms (head_dim 32 over a 32-wide model of 2 heads).
  const arch = {
    llama3: ['decoder_block=llama3', 'rope_max_timescale=500000', 'rope_type=llama3', 'rope_factor=8',
             'original_max_position_embeddings=16'],
    qwen3: ['decoder_block=qwen3', 'head_dim=32', 'rope_max_timescale=1000000'],
  };
  for (const [name, vocab, bos] of [['llama3', 128256, 128000], ['qwen3', 151669, null]]) {
    const { dir, tokenizer } = await writeTokenizerFiles(name, work);
    const ds = path.join(work, `ds-${name}`);
    const prep = JSON.parse(run('data', 'prepare', '--input', input, '--output', ds,
                                '--tokenizer', dir, '--val-fraction', '0', '--json'));
    check(prep.vocab_size === vocab, `${name}: prepared vocab_size ${prep.vocab_size}, want ${vocab}`);
    const meta = JSON.parse(fs.readFileSync(path.join(ds, 'meta.json'), 'utf8'));
    check(meta.tokenizer === 'tokenizer.json', `${name}: meta.json tokenizer is ${meta.tokenizer}`);
    check(fs.existsSync(path.join(ds, 'tokenizer_config.json')), `${name}: dataset lacks tokenizer_config.json`);
    check(!fs.existsSync(path.join(ds, 'tokenizer.model')), `${name}: dataset has a tokenizer.model`);

    // The shard holds, per document, [bos] + the reference's ids + [eos].
    // (src/io/token_shard.h: a 32-byte header, then uint32 ids for a vocabulary over 65,536.)
    const shard = fs.readFileSync(path.join(ds, 'train.bin'));
    const got = [];
    for (let o = 32; o < shard.length; o += 4) got.push(shard.readUInt32LE(o));
    const want = [];
    for (const text of docs) {
      if (bos !== null) want.push(bos);
      want.push(...tokenizer.encode(text, { add_special_tokens: false }));
      want.push(meta.eos_id);
    }
    check(JSON.stringify(got) === JSON.stringify(want),
          `${name}: the prepared ids (${got.length}) differ from the reference's (${want.length})`);

    const root = path.join(work, `runs-${name}`);
    run('train', `dataset_path=${ds}`, `vocab_size=${vocab}`, 'base_emb_dim=32',
        'base_num_decoder_layers=1', 'base_num_query_heads=2', 'base_num_kv_heads=1',
        'base_mlp_dim=64', 'max_target_length=32', 'per_device_batch_size=2', 'steps=2',
        'checkpoint_period=2', 'peak_tflops=1', 'sample_count=0', 'eval_batches=1',
        `base_output_directory=${root}`, 'run_name=r', ...arch[name]);
    const ckpt = path.join(root, 'r', 'checkpoints', '2');
    for (const f of ['tokenizer.json', 'tokenizer_config.json', 'config.json', 'model.safetensors'])
      check(fs.existsSync(path.join(ckpt, f)), `${name}: checkpoint lacks ${f}`);
    check(fs.readFileSync(path.join(ckpt, 'tokenizer.json')).equals(fs.readFileSync(path.join(dir, 'tokenizer.json'))),
          `${name}: the checkpoint's tokenizer.json differs from the given one`);
    const cfg = JSON.parse(fs.readFileSync(path.join(ckpt, 'config.json'), 'utf8'));
    check(cfg.vocab_size === vocab, `${name}: config.json vocab_size ${cfg.vocab_size}`);
    const family = name === 'llama3' ? ['llama', 'LlamaForCausalLM'] : ['qwen3', 'Qwen3ForCausalLM'];
    check(cfg.model_type === family[0] && cfg.architectures[0] === family[1],
          `${name}: config.json model_type ${cfg.model_type} / ${cfg.architectures}`);
    if (name === 'llama3')
      check(cfg.rope_scaling && cfg.rope_scaling.rope_type === 'llama3' && cfg.rope_scaling.factor === 8,
            `${name}: config.json rope_scaling ${JSON.stringify(cfg.rope_scaling)}`);

    // Fine-tuning from the checkpoint as from a Hugging Face directory: its config.json and
    // tokenizer, a fresh optimizer.
    run('train', `dataset_path=${ds}`, `load_parameters_path=${ckpt}`, 'max_target_length=32',
        'per_device_batch_size=2', 'steps=1', 'peak_tflops=1', 'sample_count=0', 'eval_batches=1',
        `base_output_directory=${root}`, 'run_name=ft');
    const ft = JSON.parse(fs.readFileSync(path.join(root, 'ft', 'checkpoints', '1', 'config.json'), 'utf8'));
    check(JSON.stringify(ft) === JSON.stringify(cfg), `${name}: the fine-tuned checkpoint's config.json differs`);
    check(fs.readFileSync(path.join(root, 'ft', 'checkpoints', '1', 'tokenizer.json'))
      .equals(fs.readFileSync(path.join(dir, 'tokenizer.json'))),
          `${name}: the fine-tuned checkpoint's tokenizer.json differs from the given one`);

    const gen = JSON.parse(run('generate', '--checkpoint', path.join(root, 'r'), '--prompt', 'Hello',
                               '--max-tokens', '4', '--json'));
    check(Array.isArray(gen.tokens) && gen.tokens.length >= 1, `${name}: generate gave no tokens`);
    const tok = JSON.parse(run('tokenize', '--tokenizer', path.join(root, 'r'), '--text', 'Hello, world', '--json'));
    check(JSON.stringify(tok.ids) === JSON.stringify(tokenizer.encode('Hello, world', { add_special_tokens: false })),
          `${name}: tokenize through the run directory gives ${JSON.stringify(tok.ids)}`);
    console.log(`${name}: prepared ${prep.train_tokens} tokens, trained, generated, tokenized`);
  }
  // Bad input: a tokenizer.json with an unsupported model is exit status 2 naming the file
  // and key, and data prepare writes nothing.
  const bad = path.join(work, 'bad');
  fs.mkdirSync(bad);
  fs.writeFileSync(path.join(bad, 'tokenizer.json'), JSON.stringify({ model: { type: 'Unigram', vocab: [] } }));
  const out = path.join(work, 'never');
  try {
    run('data', 'prepare', '--input', input, '--output', out, '--tokenizer', bad);
    check(false, 'a bad tokenizer.json was accepted');
  } catch (e) {
    check(e.status === 2, `a bad tokenizer.json exits ${e.status}, not 2`);
    check(/bad\/tokenizer\.json: model\.type: 'Unigram' is not supported/.test(e.stderr),
          `the error does not name the file and key: ${e.stderr}`);
  }
  check(!fs.existsSync(out), 'data prepare wrote its output directory for a bad tokenizer');
  // A document that is not UTF-8 (a Latin-1 byte) cannot be encoded by a tokenizer.json:
  // exit 2 naming the document, nothing written.
  const latin1 = path.join(work, 'latin1.txt');
  fs.writeFileSync(latin1, Buffer.concat([Buffer.from('ok\n\ncaf'), Buffer.from([0xe9]), Buffer.from('\n')]));
  try {
    run('data', 'prepare', '--input', latin1, '--output', out, '--tokenizer', path.join(work, 'qwen3'));
    check(false, 'a Latin-1 document was accepted');
  } catch (e) {
    check(e.status === 2 && /document 2 of .*latin1\.txt is not valid UTF-8/.test(e.stderr),
          `a Latin-1 document: exit ${e.status}, ${e.stderr}`);
  }
  check(!fs.existsSync(out), 'data prepare wrote its output directory for a Latin-1 document');
  // A truncated file names the file and the parser's position.
  const good = fs.readFileSync(path.join(work, 'llama3', 'tokenizer.json'), 'utf8');
  fs.writeFileSync(path.join(bad, 'tokenizer.json'), good.slice(0, good.length / 3));
  try {
    run('tokenize', '--tokenizer', bad, '--text', 'x');
    check(false, 'a truncated tokenizer.json was accepted');
  } catch (e) {
    check(e.status === 2 && /tokenizer\.json: not valid JSON/.test(e.stderr),
          `a truncated tokenizer.json: exit ${e.status}, ${e.stderr}`);
  }
} catch (e) {
  ++failures;
  console.log(`FAIL ${e.message}\n${e.stderr ?? ''}`);
} finally {
  fs.rmSync(work, { recursive: true, force: true });
}
console.log(failures ? `${failures} failures` : 'all passed');
process.exit(failures ? 1 : 0);
