// The official OpenAI Node SDK against `hyperion serve` with a model that carries a real
// Hugging Face tokenizer and chat template (Qwen3's: tokenizer.json, tokenizer_config.json
// with its Jinja template, <|im_end|> ending the turn) and Qwen3's architecture (q/k
// norms). A tiny model is trained two steps on that vocabulary; then:
//   - chat.completions.create: the prompt the server tokenized is exactly as long as the
//     reference's (the template rendered by Python jinja2 as transformers renders it,
//     tests/js/hf_chat_template.py, encoded by transformers.js): usage.prompt_tokens; the
//     reply has the OpenAI shape;
//   - the same request streamed: the deltas join to the same text (greedy decoding), so no
//     character split over tokens is lost or doubled;
//   - chat_template_kwargs reach the template (enable_thinking=false adds the empty
//     <think></think> block: one more prompt token count to match);
//   - a conversation the template cannot render (a user message with null content: Qwen3's
//     template concatenates it) is a 400 naming messages, not a 5xx;
//   - completions.create: the prompt is encoded as the reference encodes it;
//   - /tokenize (text and chat) and /detokenize agree with the reference and the chat run.
//
// Usage: node tests/js/openai_chat.mjs --hyperion BIN --source-dir DIR
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { writeTokenizerFiles } from './tokenizer_files.mjs';

const args = process.argv.slice(2);
const flag = (n) => (args.indexOf(n) >= 0 ? args[args.indexOf(n) + 1] : undefined);
const hyperion = flag('--hyperion');
const source = flag('--source-dir');
if (!hyperion || !source) {
  console.error('usage: node openai_chat.mjs --hyperion BIN --source-dir DIR');
  process.exit(2);
}
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'hyperion-oaichat-'));
let failures = 0;
const check = (ok, what) => {
  if (!ok) {
    ++failures;
    console.log(`FAIL ${what}`);
  }
};
const run = (...argv) => execFileSync(hyperion, ['--threads', '1', ...argv],
  { encoding: 'utf8', maxBuffer: 1 << 28, stdio: ['ignore', 'pipe', 'pipe'] });

let server = null;
try {
  const { dir, tokenizer } = await writeTokenizerFiles('qwen3', work);
  const docs = fs.readFileSync(path.join(source, 'data/corpus/fortunes.txt'), 'utf8')
    .split(/\n%\n/).filter((d) => d.trim().length > 0).slice(0, 40);
  const input = path.join(work, 'small.jsonl');
  fs.writeFileSync(input, docs.map((text) => JSON.stringify({ text })).join('\n') + '\n');
  const ds = path.join(work, 'ds');
  run('data', 'prepare', '--input', input, '--output', ds, '--tokenizer', dir, '--val-fraction', '0');
  run('train', `dataset_path=${ds}`, 'vocab_size=151669', 'base_emb_dim=32',
      'base_num_decoder_layers=1', 'base_num_query_heads=2', 'base_num_kv_heads=1',
      'base_mlp_dim=64', 'max_target_length=256', 'per_device_batch_size=2', 'steps=2',
      'peak_tflops=1', 'sample_count=0', 'eval_batches=1', `base_output_directory=${work}/runs`,
      'run_name=r', 'decoder_block=qwen3', 'head_dim=32', 'rope_max_timescale=1000000');

  server = spawn(hyperion, ['--threads', '1', 'serve', `${work}/runs/r`, '--port', '0',
                            'max_concurrent_decodes=2', 'weights=float32'],
                 { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start:\n${log}`)), 120000);
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    };
    server.stdout.on('data', onData);
    server.stderr.on('data', onData);
    server.on('exit', (code) => reject(new Error(`serve exited ${code}:\n${log}`)));
  });
  check(/chat format .*tokenizer_config\.json:chat_template/.test(log),
        'the server did not report the checkpoint\'s chat template');

  // Node's own fetch (undici), not the SDK's node-fetch 2 fallback: Node's security
  // releases of 2026 (CVE-2026-48931's http.Agent change, in Debian 12's nodejs 18 too)
  // make node-fetch 2 report "Premature close" on complete keep-alive responses
  // (nodejs/node#63989).
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused',
                              maxRetries: 0, fetch: globalThis.fetch });
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Name a colour. 日本語で答えて 😀' },
  ];
  const here = path.dirname(fileURLToPath(import.meta.url));
  const refIds = (msgs, extra = {}) => {
    const file = path.join(work, 'request.json');
    fs.writeFileSync(file, JSON.stringify({ messages: msgs, add_generation_prompt: true, ...extra }));
    const { text } = JSON.parse(execFileSync('/usr/bin/python3',
      [path.join(here, 'hf_chat_template.py'), dir, file], { encoding: 'utf8' }));
    return tokenizer.encode(text, { add_special_tokens: false });
  };

  const whole = await client.chat.completions.create({
    model: 'r', messages, max_tokens: 12, temperature: 0,
  });
  check(whole.object === 'chat.completion', `object is ${whole.object}`);
  check(whole.choices[0].message.role === 'assistant', 'the reply is not the assistant\'s');
  check(typeof whole.choices[0].message.content === 'string', 'the reply has no text');
  check(['stop', 'length'].includes(whole.choices[0].finish_reason), `finish_reason ${whole.choices[0].finish_reason}`);
  const want = refIds(messages).length;
  check(whole.usage.prompt_tokens === want,
        `usage.prompt_tokens ${whole.usage.prompt_tokens}, the reference template gives ${want}`);

  const stream = await client.chat.completions.create({
    model: 'r', messages, max_tokens: 12, temperature: 0, stream: true,
  });
  let streamed = '';
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? '';
  check(streamed === whole.choices[0].message.content,
        `streamed ${JSON.stringify(streamed)} != whole ${JSON.stringify(whole.choices[0].message.content)}`);

  const noThink = await client.chat.completions.create({
    model: 'r', messages, max_tokens: 1, temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  });
  const wantNoThink = refIds(messages, { enable_thinking: false }).length;
  check(noThink.usage.prompt_tokens === wantNoThink && wantNoThink !== want,
        `enable_thinking=false: ${noThink.usage.prompt_tokens} prompt tokens, the reference gives ${wantNoThink}`);

  try {
    await client.chat.completions.create({
      model: 'r', messages: [{ role: 'user', content: null }], max_tokens: 2,
    });
    check(false, 'a conversation the template cannot render was served');
  } catch (e) {
    check(e.status === 400, `a conversation the template cannot render got ${e.status}`);
    check(/chat template/.test(String(e.message)) && /tokenizer_config\.json:chat_template:\d+:\d+/.test(String(e.message)),
          `the 400 does not name the template's line and column: ${e.message}`);
  }

  // A template variable the request sets itself cannot come from chat_template_kwargs.
  try {
    await client.chat.completions.create({ model: 'r', messages, max_tokens: 1,
                                           chat_template_kwargs: { messages: [] } });
    check(false, 'chat_template_kwargs overrode messages');
  } catch (e) {
    check(e.status === 400 && /'messages' is set by the request/.test(String(e.message)),
          `chat_template_kwargs.messages: ${e.status} ${e.message}`);
  }

  const text = 'Hello, world! Ünïcödé';
  const comp = await client.completions.create({ model: 'r', prompt: text, max_tokens: 3, temperature: 0 });
  const wantComp = tokenizer.encode(text, { add_special_tokens: true }).length;
  check(comp.usage.prompt_tokens === wantComp,
        `completions: ${comp.usage.prompt_tokens} prompt tokens, the reference gives ${wantComp}`);
  // vLLM's /tokenize and /detokenize helpers.
  const post = async (route, body) => {
    const r = await fetch(`http://127.0.0.1:${port}${route}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    return { status: r.status, body: await r.json() };
  };
  const tk = await post('/tokenize', { prompt: text });
  check(tk.status === 200 && JSON.stringify(tk.body.tokens) ===
        JSON.stringify(tokenizer.encode(text, { add_special_tokens: true })),
        `/tokenize gives ${JSON.stringify(tk.body)}`);
  const tkChat = await post('/tokenize', { messages, add_generation_prompt: true });
  check(tkChat.status === 200 && tkChat.body.count === want,
        `/tokenize of the chat gives ${tkChat.body.count} tokens, chat ran ${want}`);
  const dt = await post('/detokenize', { tokens: tk.body.tokens });
  check(dt.status === 200 && dt.body.prompt === text, `/detokenize gives ${JSON.stringify(dt.body)}`);
  const bad = await post('/detokenize', { tokens: [-1] });
  check(bad.status === 400 && bad.body.error.param === 'tokens', `/detokenize of id -1: ${bad.status}`);
  console.log(`chat ${whole.usage.prompt_tokens} prompt tokens, reply ${JSON.stringify(whole.choices[0].message.content)}`);
} catch (e) {
  ++failures;
  console.log(`FAIL ${e.stack ?? e}\n${e.stderr ?? ''}`);
} finally {
  if (server) server.kill('SIGKILL');
  fs.rmSync(work, { recursive: true, force: true });
}
console.log(failures ? `${failures} failures` : 'all passed');
process.exit(failures ? 1 : 0);
