// Helpers the llama.cpp comparison scripts share (bench/gguf_llamacpp_check.mjs,
// bench/gguf_bpe_vocab_check.mjs).
import fs from "node:fs";

// A hyperion token shard (`hyperion data prepare`'s .bin): "HYPTOKS1", version, bytes per
// token, count, vocabulary size, then the ids.
export function writeTokenShard(file, tokens, vocabSize) {
  const wide = vocabSize > 65536;
  const buf = Buffer.alloc(32 + tokens.length * (wide ? 4 : 2));
  buf.write("HYPTOKS1", 0, "latin1");
  buf.writeUInt32LE(1, 8);
  buf.writeUInt32LE(wide ? 4 : 2, 12);
  buf.writeBigUInt64LE(BigInt(tokens.length), 16);
  buf.writeUInt32LE(vocabSize, 24);
  tokens.forEach((t, i) => (wide ? buf.writeUInt32LE(t, 32 + 4 * i) : buf.writeUInt16LE(t, 32 + 2 * i)));
  fs.writeFileSync(file, buf);
}

// Mean next-token cross-entropy (nats) of `tokens` as `hyperion eval` computes it: windows of
// seqLen + 1 tokens with stride seqLen, each evaluated from an empty context, every token
// after the first predicted once.
export async function streamLoss(seq, tokens, seqLen) {
  let nll = 0, count = 0;
  for (let s = 0; s + 1 < tokens.length; s += seqLen) {
    const win = tokens.slice(s, Math.min(s + seqLen + 1, tokens.length));
    await seq.clearHistory();
    const res = await seq.controlledEvaluate(
        win.slice(0, -1).map((t) => [t, {generateNext: {logits: true}}]));
    for (let i = 0; i + 1 < win.length; ++i) {
      const logits = res[i].next.logits;
      let m = -Infinity, z = 0;
      for (const v of logits.values()) m = Math.max(m, v);
      for (const v of logits.values()) z += Math.exp(v - m);
      nll += m + Math.log(z) - logits.get(win[i + 1]);
      ++count;
    }
  }
  return {loss: nll / count, tokens: count};
}
