#!/usr/bin/env node
// Encodes every document of a JSONL file (one JSON string per line) with Hugging Face `tokenizers`,
// the judge for Beluga's tokenizer, and writes one JSON array of ids per line to --output.
// --strip-added removes the added tokens first: the reference for encode(text, allow_special=false).
// --cache-dir DIR reuses an earlier result for byte-identical inputs (keyed by their SHA-256).
// Usage: node hf-encode.js --tokenizer tokenizer.json --input docs.jsonl --output ids.jsonl [--strip-added]
//        [--cache-dir DIR]
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

function arg(name, def) {
  const i = process.argv.indexOf('--' + name);
  return i >= 0 ? process.argv[i + 1] : def;
}

async function main() {
  let json = fs.readFileSync(arg('tokenizer'), 'utf8');
  if (process.argv.includes('--strip-added')) {
    const j = JSON.parse(json);
    j.added_tokens = [];
    json = JSON.stringify(j);
  }
  const input = fs.readFileSync(arg('input'), 'utf8');
  const cacheDir = arg('cache-dir');
  let cached = null;
  if (cacheDir) {
    const version = require('tokenizers/package.json').version;
    const h = crypto.createHash('sha256');
    for (const part of [version, fs.readFileSync(__filename, 'utf8'), json, input]) h.update(part).update('\0');
    cached = path.join(cacheDir, h.digest('hex') + '.jsonl');
    if (fs.existsSync(cached)) {
      fs.copyFileSync(cached, arg('output'));
      return;
    }
  }
  const tok = Tokenizer.fromString(json);
  const docs = input.split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const out = [];
  const BATCH = 64;
  for (let i = 0; i < docs.length; i += BATCH) {
    const encs = await tok.encodeBatch(docs.slice(i, i + BATCH), { addSpecialTokens: false });
    for (const e of encs) out.push(JSON.stringify(e.getIds()));
  }
  const text = out.join('\n') + '\n';
  fs.writeFileSync(arg('output'), text);
  if (cached) {
    fs.mkdirSync(cacheDir, { recursive: true });
    const tmp = cached + '.' + process.pid + '.tmp';
    fs.writeFileSync(tmp, text);
    fs.renameSync(tmp, cached);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
