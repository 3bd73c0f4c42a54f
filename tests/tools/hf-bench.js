#!/usr/bin/env node
// Times Hugging Face `tokenizers` (the judge) on a JSONL file of strings, one encode call per line, one
// at a time; prints {"seconds","tokens","checksum"} for `beluga bench tokenizer`. Best of --repeat.
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

function arg(name, def) {
  const i = process.argv.indexOf('--' + name);
  return i >= 0 ? process.argv[i + 1] : def;
}

async function main() {
  const tok = Tokenizer.fromFile(arg('tokenizer'));
  const texts = fs.readFileSync(arg('input'), 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const repeat = Number(arg('repeat', '3'));
  let best = null;
  for (let r = 0; r < repeat; r++) {
    let tokens = 0;
    let h = 2166136261 >>> 0;
    const t0 = process.hrtime.bigint();
    for (const t of texts) {
      const ids = (await tok.encode(t, null, { addSpecialTokens: false })).getIds();
      tokens += ids.length;
      for (const id of ids) h = Math.imul((h ^ id) >>> 0, 16777619) >>> 0;
    }
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    if (!best || seconds < best.seconds) best = { seconds, tokens, checksum: h };
  }
  process.stdout.write(JSON.stringify(best) + '\n');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
