#!/usr/bin/env node
// Assembles the tokenizer parity corpus from this machine's files plus generated hard cases, and
// writes it as JSONL (one JSON string per document) to --out. Deterministic for a given machine:
// files are taken in sorted order up to a byte budget per category, generation uses a seeded PRNG.
// Usage: node tokenizer-corpus.js --out FILE [--scale 1.0]
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

function arg(name, def) {
  const i = process.argv.indexOf('--' + name);
  return i >= 0 ? process.argv[i + 1] : def;
}
const scale = Number(arg('scale', '1'));
const MAX_DOC = 16384; // documents are cut at line ends around this size (prompt-sized)

// ---- files ---------------------------------------------------------------------------------

function walk(dir, accept, out, depth = 0) {
  let entries;
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return out;
  }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory() && depth < 12) walk(p, accept, out, depth + 1);
    else if (e.isFile() && accept(p)) out.push(p);
  }
  return out;
}

function readText(p) {
  let buf;
  try {
    buf = fs.readFileSync(p);
    if (p.endsWith('.gz')) buf = zlib.gunzipSync(buf);
  } catch {
    return null;
  }
  if (buf.length === 0 || buf.includes(0)) return null; // binary
  return buf.toString('utf8'); // invalid bytes become U+FFFD, as any JS peer would see them
}

function splitDocs(text, docs) {
  let start = 0;
  while (start < text.length) {
    let end = Math.min(text.length, start + MAX_DOC);
    if (end < text.length) {
      const nl = text.indexOf('\n', end);
      end = nl < 0 ? text.length : nl + 1;
    }
    // Never cut a surrogate pair (JS strings are UTF-16).
    const c = text.charCodeAt(end - 1);
    if (c >= 0xd800 && c <= 0xdbff && end < text.length) end++;
    docs.push(text.slice(start, end));
    start = end;
  }
}

// Takes files (sorted) until `budget` UTF-16 units of text are collected; a file is capped at `perFile`.
function category(docs, roots, accept, budget, perFile = 65536) {
  budget = Math.floor(budget * scale);
  let got = 0;
  for (const root of roots) {
    for (const f of walk(root, accept, [])) {
      if (got >= budget) return got;
      let t = readText(f);
      if (!t) continue;
      t = t.slice(0, Math.min(perFile, budget - got));
      splitDocs(t, docs);
      got += t.length;
    }
  }
  return got;
}

const ext = (...xs) => (p) => xs.some((x) => p.endsWith(x));

// ---- generated hard cases -------------------------------------------------------------------

let seed = 0x9e3779b9;
function rnd() {
  // xorshift32
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const range = (lo, hi) => Array.from({ length: hi - lo + 1 }, (_, i) => String.fromCodePoint(lo + i));

const SCRIPTS = {
  latin: range(0x61, 0x7a).concat(range(0x41, 0x5a), range(0xe0, 0xff)),
  cyrillic: range(0x430, 0x44f).concat(range(0x410, 0x42f)),
  greek: range(0x3b1, 0x3c9),
  arabic: range(0x627, 0x64a),
  hebrew: range(0x5d0, 0x5ea),
  devanagari: range(0x905, 0x939).concat(['\u093e', '\u093f', '\u0940', '\u094d']),
  thai: range(0xe01, 0xe2e),
  hangul: range(0xac00, 0xac00 + 400),
  cjk: range(0x4e00, 0x4e00 + 2000),
  kana: range(0x3041, 0x3096).concat(range(0x30a1, 0x30fa)),
  cjkext: range(0x9fa6, 0x9fb5).concat(range(0x3400, 0x3420)), // outside DeepSeek's [一-龥] class
};
const COMBINING = range(0x300, 0x36f).concat(range(0x1ab0, 0x1abd), range(0x20d0, 0x20dc), ['\u3099', '\u309a']);
const EMOJI = range(0x1f600, 0x1f64f).concat(range(0x1f300, 0x1f320), range(0x1f680, 0x1f6a0), ['\u2764\ufe0f', '\u2615']);
const ZWJ_SEQS = ['\u{1f468}\u200d\u{1f469}\u200d\u{1f467}\u200d\u{1f466}', '\u{1f3f3}\ufe0f\u200d\u{1f308}',
  '\u{1f9d1}\u{1f3fd}\u200d\u{1f4bb}', '\u{1f1ef}\u{1f1f5}', '\u{1f1fa}\u{1f1f8}', '1\ufe0f\u20e3', '\u{1f44d}\u{1f3ff}'];
const DIGITS = [range(0x30, 0x39), range(0x660, 0x669), range(0x966, 0x96f), range(0xff10, 0xff19),
  ['\u00b2', '\u00b3', '\u00b9', '\u00bd', '\u2155'], range(0x2160, 0x216b), range(0x2460, 0x2473)];
const SPACES = [' ', ' ', ' ', '\t', '\n', '\r\n', '\r', '\u00a0', '\u3000', '\u0085', '\u2028', '\u2029',
  '\u2003', '\u200b', '\u000b', '\u000c', '\u202f', '\u1680'];
const PUNCT = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~'.split('').concat(['\u3002', '\u3001', '\uff01', '\u201c',
  '\u201d', '\u2014', '\u2026', '\u00bf', '\u00a1', '\u00ab', '\u00bb', '\u20ac', '\u00a9', '\u2192', '\u221e']);
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", '\u2019s',
  "'\u017f"];
// Spellings of control tokens of the judged tokenizers: matched as added tokens with specials allowed.
const SPECIALS = ['<\uff5cUser\uff5c>', '<\uff5cAssistant\uff5c>', '<\uff5cbegin\u2581of\u2581sentence\uff5c>',
  '<\uff5cend\u2581of\u2581sentence\uff5c>', '<think>', '</think>', '<\uff5ctool\u2581calls\u2581begin\uff5c>',
  '<|begin_of_text|>', '<|eot_id|>', '<|im_start|>', '<|im_end|>', '<tool_call>', '<|endoftext|>',
  '<\uff5cfim\u2581hole\uff5c>', '<|reserved_special_token_5|>', '<\uff5cplace\u2581holder\u2581no\u258142\uff5c>',
  '<\uff5cUser', '<|im_start', '<thin'];

function word(script, min = 1, max = 9) {
  const n = min + Math.floor(rnd() * (max - min + 1));
  let w = '';
  for (let i = 0; i < n; i++) w += pick(SCRIPTS[script]);
  return w;
}

function generated() {
  const docs = [];
  const scripts = Object.keys(SCRIPTS);
  const N = Math.max(1, Math.floor(40 * scale));
  for (let d = 0; d < N; d++) {
    let s = '';
    while (s.length < 8000) {
      const r = rnd();
      if (r < 0.3) s += word(pick(scripts));
      else if (r < 0.36) s += pick(SCRIPTS.latin) + pick(COMBINING) + (rnd() < 0.5 ? pick(COMBINING) : '');
      else if (r < 0.40) s += 'e\u0301 A\u030a n\u0303 \u1100\u1161\u11a8 \u1112\u1161 \u0041\u0323\u0302 \u212b \ufb01 \u2460';
      else if (r < 0.46) s += pick(EMOJI) + (rnd() < 0.3 ? pick(['\u{1f3fb}', '\u{1f3fd}', '\ufe0f']) : '');
      else if (r < 0.49) s += pick(ZWJ_SEQS);
      else if (r < 0.56) {
        const set = pick(DIGITS);
        const n = 1 + Math.floor(rnd() * 12);
        for (let i = 0; i < n; i++) s += pick(set);
      } else if (r < 0.66) {
        const n = 1 + Math.floor(rnd() * 6);
        for (let i = 0; i < n; i++) s += pick(SPACES);
      } else if (r < 0.74) s += pick(PUNCT) + (rnd() < 0.4 ? pick(PUNCT) : '') + (rnd() < 0.3 ? word('latin') : '');
      else if (r < 0.78) s += word('latin', 1, 5) + pick(CONTRACTIONS);
      else if (r < 0.80) s += pick(SPECIALS);
      else if (r < 0.83) s += word('latin', 1, 3) + word(pick(scripts), 1, 3) + pick(PUNCT) + word('cjk', 1, 3);
      else if (r < 0.86) s += word('latin', 1, 4).toUpperCase() + word('latin', 1, 4);
      else if (r < 0.88) s += '\t' + word('latin') + '();\n    ';
      s += rnd() < 0.7 ? ' ' : '';
    }
    docs.push(s);
  }
  // Long runs: one pre-token of thousands of bytes exercises the BPE heap and regex stacks.
  docs.push(' '.repeat(20000) + 'x');
  docs.push('\n'.repeat(3000) + ' \t'.repeat(2000));
  docs.push('7'.repeat(5001) + ' ' + '\u0663'.repeat(777));
  docs.push(word('cjk', 20000, 20000));
  docs.push(word('kana', 5000, 5000) + word('hangul', 3000, 3000));
  docs.push('a'.repeat(10000) + 'b'.repeat(3) + '!!!'.repeat(1000));
  docs.push('\u0300'.repeat(500) + 'e' + '\u0301\u0323'.repeat(200));
  docs.push('\u{1f600}'.repeat(2000));
  docs.push('=' .repeat(4000) + '-'.repeat(4000) + '\n' + '#'.repeat(1000));
  docs.push(SPECIALS.join('') + SPECIALS.join(' ') + ' ' + SPECIALS.map((t) => 'x' + t + 'y').join('\n'));
  return docs;
}

// ---- assemble -------------------------------------------------------------------------------

function main() {
  const out = arg('out');
  if (!out) throw new Error('usage: tokenizer-corpus.js --out FILE [--scale S]');
  const docs = [];
  const sizes = {};
  const MB = 1 << 20;
  const textDoc = (p) => /(README|copyright|NEWS|\.txt|\.md|\.rst)$/i.test(p) && !p.endsWith('.gz');
  sizes.licenses = category(docs, ['/usr/share/common-licenses'], () => true, 0.5 * MB);
  sizes.docs = category(docs, ['/usr/share/doc'], textDoc, 0.9 * MB, 24000);
  sizes.man_en = category(docs, ['/usr/share/man/man1', '/usr/share/man/man3', '/usr/share/man/man7'],
    ext('.gz'), 0.5 * MB, 32768);
  sizes.c = category(docs, ['/usr/include'], ext('.h', '.hpp', '.c', '.cc'), 0.7 * MB, 24000);
  sizes.python = category(docs, ['/usr/lib/python3', '/usr/lib/python3.11', '/usr/lib/python3.12'],
    ext('.py'), 0.5 * MB, 24000);
  sizes.js = category(docs, ['/usr/lib/node_modules', '/usr/share/nodejs', path.join(__dirname, 'node_modules')],
    ext('.js', '.ts', '.mjs'), 0.3 * MB, 24000);
  sizes.perl = category(docs, ['/usr/share/perl', '/usr/share/perl5'], ext('.pm', '.pl'), 0.2 * MB, 16000);
  sizes.cmake_sh = category(docs, ['/usr/share/cmake-3.25', '/usr/share/cmake', '/usr/share/doc/git/contrib'],
    ext('.cmake', '.sh', '.go', '.rs', '.el'), 0.2 * MB, 16000);
  sizes.cjk = category(docs, ['/usr/share/man/zh_CN', '/usr/share/man/zh_TW', '/usr/share/man/ja',
    '/usr/share/man/ko'], ext('.gz'), 1.2 * MB, 24000);
  sizes.other_languages = category(docs, ['/usr/share/man/ru', '/usr/share/man/uk', '/usr/share/man/de',
    '/usr/share/man/fr', '/usr/share/man/pl', '/usr/share/man/tr', '/usr/share/man/cs'], ext('.gz'), 0.4 * MB, 16000);
  const gen = generated();
  sizes.generated = gen.reduce((a, d) => a + d.length, 0);
  docs.push(...gen);
  const lines = docs.filter((d) => d.length).map((d) => JSON.stringify(d));
  fs.writeFileSync(out, lines.join('\n') + '\n');
  const bytes = docs.reduce((a, d) => a + Buffer.byteLength(d, 'utf8'), 0);
  process.stdout.write(JSON.stringify({ docs: lines.length, bytes, sizes }) + '\n');
}

main();
