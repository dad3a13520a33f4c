// Tool calls through the official OpenAI Node SDK, one server per tool-call format
// (serve/tool_calls.h), each a tiny random Llama written here as a Hugging Face directory
// (config.json, model.safetensors) with a real tokenizer and a chat template of the family:
//   llama3_json  Llama 3.1's tokenizer (<|python_tag|>, <|eom_id|> in their places) and its
//                tool template (the copy tests/text/jinja/chat_templates_test.cc carries);
//   hermes       Qwen3's tokenizer and its own template (<tool_call>);
//   mistral      Llama 2's vocabulary with Mistral v0.3's control tokens added and a template
//                in its form ([AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS]; call ids of 9
//                characters or it refuses);
//   gemma        Gemma 3's tokenizer and a template that teaches Google's JSON call.
// For each: tool_choice "required" (the random model is forced into a call by the grammar):
// the reply is message.tool_calls with a declared name and arguments that JSON.parse and
// match the function's schema, finish_reason "tool_calls"; the same request streamed gives
// the same call through tool_calls deltas (a header with arguments "", then pieces) and a
// last chunk with finish_reason "tool_calls"; a named tool_choice calls that function; the
// conversation goes back with the assistant's tool_calls and a role "tool" message, and the
// prompt the server renders (/tokenize, /detokenize) holds the call and the tool's result,
// and a follow-up chat is served; with tool_choice "none" the template still sees the
// tools. Then the 400s a client sees for bad tools and tool_choice.
//
// Usage: node tests/js/openai_tools.mjs --hyperion BIN --source-dir DIR
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { writeTokenizerFiles } from './tokenizer_files.mjs';

const args = process.argv.slice(2);
const flag = (n) => (args.indexOf(n) >= 0 ? args[args.indexOf(n) + 1] : undefined);
const hyperion = flag('--hyperion');
const source = flag('--source-dir');
if (!hyperion || !source) {
  console.error('usage: node openai_tools.mjs --hyperion BIN --source-dir DIR');
  process.exit(2);
}
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'hyperion-oaitools-'));
let failures = 0;
const check = (ok, what) => {
  if (!ok) {
    ++failures;
    console.log(`FAIL ${what}`);
  }
};

// ---- A tiny random Llama as a Hugging Face directory ----

function writeSafetensors(file, tensors) {
  const header = {};
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let text = JSON.stringify(header);
  text += ' '.repeat((8 - (text.length % 8)) % 8);
  const buf = Buffer.alloc(8 + text.length + offset);
  buf.writeBigUInt64LE(BigInt(text.length), 0);
  buf.write(text, 8, 'utf8');
  let at = 8 + text.length;
  for (const t of tensors) {
    Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength).copy(buf, at);
    at += t.data.byteLength;
  }
  fs.writeFileSync(file, buf);
}

function writeModel(dir, vocab) {
  const D = 32, F = 64, H = 2, KV = 1, HD = 16;
  let seed = 12345;
  const rand = () => {  // mulberry32
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const random = (shape, scale) => {
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; ++i) data[i] = (rand() * 2 - 1) * scale;
    return data;
  };
  const ones = (n) => new Float32Array(n).fill(1);
  const p = 'model.layers.0.';
  writeSafetensors(path.join(dir, 'model.safetensors'), [
    { name: 'model.embed_tokens.weight', shape: [vocab, D], data: random([vocab, D], 0.5) },
    { name: `${p}input_layernorm.weight`, shape: [D], data: ones(D) },
    { name: `${p}self_attn.q_proj.weight`, shape: [H * HD, D], data: random([H * HD, D], 0.2) },
    { name: `${p}self_attn.k_proj.weight`, shape: [KV * HD, D], data: random([KV * HD, D], 0.2) },
    { name: `${p}self_attn.v_proj.weight`, shape: [KV * HD, D], data: random([KV * HD, D], 0.2) },
    { name: `${p}self_attn.o_proj.weight`, shape: [D, H * HD], data: random([D, H * HD], 0.2) },
    { name: `${p}post_attention_layernorm.weight`, shape: [D], data: ones(D) },
    { name: `${p}mlp.gate_proj.weight`, shape: [F, D], data: random([F, D], 0.2) },
    { name: `${p}mlp.up_proj.weight`, shape: [F, D], data: random([F, D], 0.2) },
    { name: `${p}mlp.down_proj.weight`, shape: [D, F], data: random([D, F], 0.2) },
    { name: 'model.norm.weight', shape: [D], data: ones(D) },
  ]);
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: vocab, hidden_size: D,
    intermediate_size: F, num_hidden_layers: 1, num_attention_heads: H, num_key_value_heads: KV,
    head_dim: HD, max_position_embeddings: 2048, rms_norm_eps: 1e-5, rope_theta: 10000.0,
    tie_word_embeddings: true, torch_dtype: 'float32',
  }, null, 2));
}

// The tokenizer files of `name`, patched by `edit(tokenizerJson, config)`, with `template`.
async function writeFamily(family, name, template, edit = () => {}) {
  const root = path.join(work, family);
  const { dir } = await writeTokenizerFiles(name, root);
  const tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  edit(tj, cfg);
  if (template !== null) cfg.chat_template = template;
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg, null, 2));
  let top = Object.keys(tj.model.vocab).length;
  for (const t of tj.added_tokens) top = Math.max(top, t.id + 1);
  writeModel(dir, Math.ceil(top / 64) * 64);
  const model = path.join(root, family);
  fs.renameSync(dir, model);
  return model;
}

const renameToken = (tj, cfg, id, content) => {
  for (const t of tj.added_tokens) if (t.id === id) t.content = content;
  if (cfg.added_tokens_decoder?.[String(id)]) cfg.added_tokens_decoder[String(id)].content = content;
};
const addSpecial = (tj, cfg, contents) => {
  let id = Math.max(Object.keys(tj.model.vocab).length, ...tj.added_tokens.map((t) => t.id + 1));
  for (const content of contents) {
    const t = { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
    tj.added_tokens.push(t);
    if (cfg.added_tokens_decoder) cfg.added_tokens_decoder[String(id)] = { ...t };
    ++id;
  }
};

const llama31Template = (() => {
  const test = fs.readFileSync(path.join(source, 'tests/text/jinja/chat_templates_test.cc'), 'utf8');
  const m = test.match(/const char\* const kLlama31 = R"TPL\(([\s\S]*?)\)TPL";/);
  if (!m) throw new Error('kLlama31 not found in chat_templates_test.cc');
  return m[1];
})();

// Mistral v0.3's shape, written for this test: tools before the first [INST], calls as
// [TOOL_CALLS] [{"name", "arguments", "id"}], results as [TOOL_RESULTS] {...}[/TOOL_RESULTS].
const mistralTemplate = [
  '{{- bos_token -}}',
  '{%- for message in messages -%}',
  '{%- if message.role == "user" -%}',
  '{%- if loop.first and tools -%}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif -%}',
  '[INST] {{ message.content }}[/INST]',
  '{%- elif message.role == "assistant" and message.tool_calls -%}',
  '[TOOL_CALLS] [',
  '{%- for tc in message.tool_calls -%}',
  '{%- if tc.id is not defined or tc.id | length != 9 -%}',
  '{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") -}}',
  '{%- endif -%}',
  '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}, "id": "{{ tc.id }}"}',
  '{%- if not loop.last -%}, {% endif -%}',
  '{%- endfor -%}',
  ']{{ eos_token }}',
  '{%- elif message.role == "assistant" -%}',
  '{{ message.content }}{{ eos_token }}',
  '{%- elif message.role == "tool" -%}',
  '[TOOL_RESULTS] {"content": {{ message.content | tojson }}, "call_id": "{{ message.tool_call_id }}"}[/TOOL_RESULTS]',
  '{%- endif -%}',
  '{%- endfor -%}',
].join('\n');

// Gemma has no tool tokens; this template teaches the JSON reply Google's guide describes.
const gemmaTemplate = [
  '{{ bos_token }}',
  '{%- for message in messages -%}',
  '{%- if message.role == "assistant" -%}',
  '{{ "<start_of_turn>model\\n" }}',
  '{%- if message.tool_calls -%}',
  '{%- for tc in message.tool_calls -%}',
  '{{ \'{"name": "\' + tc.function.name + \'", "parameters": \' }}{{ tc.function.arguments | tojson }}{{ "}" }}',
  '{%- if not loop.last -%}{{ "\\n" }}{%- endif -%}',
  '{%- endfor -%}',
  '{%- else -%}{{ message.content | trim }}{%- endif -%}',
  '{{ "<end_of_turn>\\n" }}',
  '{%- elif message.role == "tool" -%}',
  '{{ "<start_of_turn>user\\nThe function returned: " + message.content + "<end_of_turn>\\n" }}',
  '{%- else -%}',
  '{{ "<start_of_turn>user\\n" }}',
  '{%- if loop.first and tools -%}',
  '{{ \'You may call these functions. To call one, reply with {"name": <function name>, "parameters": <arguments as an object>} and nothing else.\\n\' }}',
  '{{ tools | tojson }}{{ "\\n\\n" }}',
  '{%- endif -%}',
  '{{ message.content | trim }}{{ "<end_of_turn>\\n" }}',
  '{%- endif -%}',
  '{%- endfor -%}',
  '{%- if add_generation_prompt -%}{{ "<start_of_turn>model\\n" }}{%- endif -%}',
].join('\n');

// ---- The tools and a check of their arguments ----

const tools = [
  { type: 'function', function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: {
      city: { type: 'string', enum: ['Paris', 'Oslo', 'Lima'] },
      days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city'], additionalProperties: false } } },
  { type: 'function', function: {
    name: 'get_time', description: 'The time in a zone',
    parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 6 } },
      required: ['zone'], additionalProperties: false } } },
];
const valid = (name, a) => {
  if (typeof a !== 'object' || a === null || Array.isArray(a)) return false;
  if (name === 'get_weather') {
    return ['Paris', 'Oslo', 'Lima'].includes(a.city) &&
      (a.days === undefined || (Number.isInteger(a.days) && a.days >= 1 && a.days <= 7)) &&
      Object.keys(a).every((k) => k === 'city' || k === 'days');
  }
  if (name === 'get_time') {
    return typeof a.zone === 'string' && [...a.zone].length <= 6 && Object.keys(a).length === 1;
  }
  return false;
};
const parseArgs = (s) => {
  try {
    return JSON.parse(s);
  } catch {
    return undefined;
  }
};

async function startServer(dir, log) {
  const server = spawn(hyperion, ['--threads', '1', 'serve', dir, '--port', '0', 'max_concurrent_decodes=2',
                                  'weights=float32', 'max_seq_len=2048'],
                       { stdio: ['ignore', 'pipe', 'pipe'] });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not start:\n${log.text}`)), 180000);
    const onData = (d) => {
      log.text += d.toString();
      const m = log.text.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    };
    server.stdout.on('data', onData);
    server.stderr.on('data', onData);
    server.on('exit', (code) => reject(new Error(`serve exited ${code}:\n${log.text}`)));
  });
  return { server, port };
}

async function family(name, dir, format) {
  const log = { text: '' };
  const { server, port } = await startServer(dir, log);
  try {
    check(log.text.includes(`tool calls in the ${format} format`),
          `${name}: the server did not report the ${format} format:\n${log.text.slice(-2000)}`);
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0,
                                fetch: globalThis.fetch });
    const post = async (route, body) => {
      const r = await fetch(`http://127.0.0.1:${port}${route}`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
      return { status: r.status, body: await r.json() };
    };
    const model = path.basename(dir);
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const base = { model, messages, tools, max_tokens: 300, temperature: 0 };

    // Forced, whole.
    const whole = await client.chat.completions.create({ ...base, tool_choice: 'required', parallel_tool_calls: false });
    const choice = whole.choices[0];
    const calls = choice.message.tool_calls ?? [];
    check(choice.finish_reason === 'tool_calls', `${name}: finish_reason ${choice.finish_reason} (${JSON.stringify(choice.message)})`);
    check(calls.length === 1, `${name}: ${calls.length} tool calls: ${JSON.stringify(choice.message)}`);
    check(choice.message.content === null, `${name}: content ${JSON.stringify(choice.message.content)} beside the call`);
    const call = calls[0] ?? { function: {} };
    const args = parseArgs(call.function.arguments);
    check(call.type === 'function' && typeof call.id === 'string', `${name}: the call's shape: ${JSON.stringify(call)}`);
    check(format === 'mistral' ? /^[A-Za-z0-9]{9}$/.test(call.id) : /^call_[A-Za-z0-9]{24}$/.test(call.id),
          `${name}: call id ${call.id}`);
    check(valid(call.function.name, args), `${name}: ${call.function.name}(${call.function.arguments}) does not match its schema`);

    // Forced, streamed: the same call through deltas.
    const stream = await client.chat.completions.create({ ...base, tool_choice: 'required',
                                                          parallel_tool_calls: false, stream: true });
    const got = [];
    let finish = null, headers = 0, content = '';
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      content += c.delta?.content ?? '';
      for (const d of c.delta?.tool_calls ?? []) {
        if (d.id !== undefined) {
          ++headers;
          check(d.type === 'function' && d.function.arguments === '' && typeof d.function.name === 'string',
                `${name}: a call's first delta ${JSON.stringify(d)}`);
          got[d.index] = { id: d.id, name: d.function.name, arguments: '' };
        } else if (got[d.index]) {
          got[d.index].arguments += d.function?.arguments ?? '';
        } else {
          check(false, `${name}: arguments before their call's header`);
        }
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    check(finish === 'tool_calls', `${name}: streamed finish_reason ${finish}`);
    check(headers === 1 && got.length === 1, `${name}: streamed ${headers} calls`);
    check(content === '', `${name}: streamed content ${JSON.stringify(content)} beside the call`);
    check(got[0]?.name === call.function.name && got[0]?.arguments === call.function.arguments,
          `${name}: streamed ${JSON.stringify(got[0])} != whole ${JSON.stringify(call.function)}`);

    // A named function.
    const named = await client.chat.completions.create({
      ...base, tool_choice: { type: 'function', function: { name: 'get_time' } } });
    const nc = named.choices[0].message.tool_calls ?? [];
    check(nc.length === 1 && nc[0].function.name === 'get_time' && valid('get_time', parseArgs(nc[0].function.arguments)),
          `${name}: named tool_choice gave ${JSON.stringify(named.choices[0].message)}`);

    // The conversation goes back: the assistant's calls (as the SDK returned them) and the
    // tool's result; the rendered prompt holds both.
    const result = '{"temperature": 21, "sky": "clear"}';
    const followup = [...messages, choice.message, { role: 'tool', tool_call_id: call.id, content: result }];
    const tk = await post('/tokenize', { model, messages: followup, tools, add_generation_prompt: true });
    check(tk.status === 200, `${name}: /tokenize of the conversation: ${JSON.stringify(tk.body)}`);
    if (tk.status === 200) {
      const dt = await post('/detokenize', { tokens: tk.body.tokens });
      const prompt = dt.body.prompt ?? '';
      check(prompt.includes(result) || prompt.includes(JSON.stringify(result)),
            `${name}: the rendered prompt lacks the tool's result:\n${prompt}`);
      check(prompt.includes(call.function.name ?? '<none>'), `${name}: the rendered prompt lacks the call:\n${prompt}`);
    }
    const next = await client.chat.completions.create({ model, messages: followup, tools, max_tokens: 4, temperature: 0 });
    check(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason),
          `${name}: the follow-up's finish_reason ${next.choices[0].finish_reason}`);

    // "none": the template still sees the tools (vLLM's way), nothing is parsed.
    const none = await post('/tokenize', { model, messages, tools, tool_choice: 'none', add_generation_prompt: true });
    const nonePrompt = none.status === 200 ? (await post('/detokenize', { tokens: none.body.tokens })).body.prompt : '';
    check(nonePrompt.includes('get_time'), `${name}: tool_choice none: the template did not see the tools`);

    // Auto: served, whatever the random model says.
    const auto = await client.chat.completions.create({ ...base, max_tokens: 8 });
    check(['stop', 'length', 'tool_calls'].includes(auto.choices[0].finish_reason),
          `${name}: auto's finish_reason ${auto.choices[0].finish_reason}`);

    // 400s.
    const refused = async (body, param) => {
      try {
        await client.chat.completions.create({ model, messages, max_tokens: 4, ...body });
        check(false, `${name}: ${JSON.stringify(body)} was served`);
      } catch (e) {
        const p = e.error?.param ?? e.param;
        check(e.status === 400 && p === param, `${name}: ${JSON.stringify(body).slice(0, 120)}: ${e.status} ${p} (${e.message})`);
      }
    };
    await refused({ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name');
    await refused({ tools: [{ type: 'function', function: { name: 'bad name' } }] }, 'tools[0].function.name');
    await refused({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { not: {} } } } } }],
                    tool_choice: 'required' }, 'tools[0].function.parameters');
    await refused({ tools, tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice');
    await refused({ tool_choice: 'required' }, 'tool_choice');
    console.log(`${name}: ${call.function.name}(${call.function.arguments}) streamed and whole`);
  } finally {
    server.kill('SIGKILL');
  }
}

try {
  const families = [
    ['llama3_json', await writeFamily('llama3_json', 'llama3_1', llama31Template, (tj, cfg) => {
      renameToken(tj, cfg, 128008, '<|eom_id|>');
      renameToken(tj, cfg, 128010, '<|python_tag|>');
    }), 'llama3_json'],
    ['hermes', await writeFamily('hermes', 'qwen3', null), 'hermes'],
    ['mistral', await writeFamily('mistral', 'llama2', mistralTemplate, (tj, cfg) => {
      addSpecial(tj, cfg, ['[INST]', '[/INST]', '[TOOL_CALLS]', '[AVAILABLE_TOOLS]', '[/AVAILABLE_TOOLS]',
                           '[TOOL_RESULTS]', '[/TOOL_RESULTS]']);
    }), 'mistral'],
    ['gemma', await writeFamily('gemma', 'gemma3', gemmaTemplate), 'gemma'],
  ];
  const only = flag('--family');
  for (const [name, dir, format] of families) {
    if (only && only !== name) continue;
    try {
      await family(name, dir, format);
    } catch (e) {
      ++failures;
      console.log(`FAIL ${name}: ${e.stack ?? e}`);
    }
  }
} catch (e) {
  ++failures;
  console.log(`FAIL ${e.stack ?? e}`);
} finally {
  fs.rmSync(work, { recursive: true, force: true });
}
console.log(failures ? `${failures} failures` : 'all passed');
process.exit(failures ? 1 : 0);
