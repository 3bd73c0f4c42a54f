// Structured-output overhead against a running `beluga serve` (plain Node 18+, no packages):
//  1. decode throughput with and without a constraint: `--requests` chat requests of up to
//     `--max-tokens` tokens at `--concurrency`, unconstrained (ignore_eos: every reply full length) vs
//     json_object vs a JSON Schema, in alternating rounds, streamed; completion tokens / wall seconds
//     and the inter-token latency (ITL: the decode step time a request sees; median over rounds);
//  2. the compile cache: the latency of a request (max_tokens 1) with a schema the server has not
//     seen (a fresh `title` makes the cache key new) vs the same schema again.
// Usage: node bench/structured_outputs.mjs [--url http://127.0.0.1:8000] [--requests 16]
//        [--concurrency 4] [--max-tokens 64] [--rounds 4] [--schema bench/grammar-schemas/FILE.json] [--out FILE.json]
import fs from 'node:fs';

const argv = process.argv.slice(2);
const opt = (name, def) => { const i = argv.indexOf(`--${name}`); return i >= 0 ? argv[i + 1] : def; };
const URL_ = opt('url', 'http://127.0.0.1:8000');
const N = Number(opt('requests', 16)), C = Number(opt('concurrency', 4)), MAX = Number(opt('max-tokens', 64));
const SCHEMA = opt('schema') ? JSON.parse(fs.readFileSync(opt('schema'), 'utf8')) : {
  type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' },
    tags: { type: 'array', items: { type: 'string' } },
    address: { type: 'object', properties: { city: { type: 'string' }, zip: { type: 'string' } }, required: ['city'] } },
  required: ['name', 'age', 'tags', 'address'] };

// One streamed request: its latency, completion tokens, finish reason, time to first token and the
// mean gap between later tokens (the decode step time this request saw, constraint included).
async function chat(extra) {
  const t0 = performance.now();
  const r = await fetch(`${URL_}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Describe a person as JSON.' }], temperature: 1,
      stream: true, stream_options: { include_usage: true }, ...extra }) });
  if (r.status !== 200) throw new Error(`${r.status} ${await r.text()}`);
  const times = [];
  let tokens = 0, finish = null, buf = '';
  const dec = new TextDecoder();
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage) tokens = j.usage.completion_tokens;
      for (const c of j.choices) {
        if (c.delta && c.delta.content) times.push(performance.now());
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
  }
  const ms = performance.now() - t0;
  const itl = times.length > 1 ? (times[times.length - 1] - times[0]) / (times.length - 1) : NaN;
  return { ms, tokens, finish, ttft: times.length ? times[0] - t0 : NaN, itl };
}

async function run(name, extra) {
  let next = 0;
  const res = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: C }, async () => {
    while (next < N) { next++; res.push(await chat({ max_tokens: MAX, seed: next, ...extra })); }
  }));
  const wall = (performance.now() - t0) / 1000;
  const tokens = res.reduce((a, r) => a + r.tokens, 0);
  const itls = res.map((r) => r.itl).filter((x) => x === x).sort((a, b) => a - b);
  const row = { name, requests: res.length, tokens, wall_s: +wall.toFixed(3), tok_per_s: +(tokens / wall).toFixed(1),
    itl_ms_p50: +itls[Math.floor(itls.length / 2)].toFixed(2), stop: res.filter((r) => r.finish === 'stop').length };
  console.log(JSON.stringify(row));
  return row;
}

// Rounds alternate so that a change in the machine's load hits both sides alike; medians reported.
const ROUNDS = Number(opt('rounds', 4));
const modes = [['unconstrained (ignore_eos)', { ignore_eos: true }],
  ['json_schema', { response_format: { type: 'json_schema', json_schema: { name: 'p', schema: SCHEMA } } }],
  ['json_object', { response_format: { type: 'json_object' } }]];
const rows = [];
await chat({ max_tokens: 4 });  // warm up
for (let r = 0; r < ROUNDS; r++) for (const [name, extra] of modes) rows.push(await run(name, extra));
const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const medians = Object.fromEntries(modes.map(([name]) => [name, {
  tok_per_s: med(rows.filter((x) => x.name === name).map((x) => x.tok_per_s)),
  itl_ms_p50: med(rows.filter((x) => x.name === name).map((x) => x.itl_ms_p50)) }]));
console.log(JSON.stringify({ medians }));

const cache = [];
for (let i = 0; i < 5; i++) {
  const schema = { ...SCHEMA, title: `bench-${Date.now()}-${i}` };
  const rf = { response_format: { type: 'json_schema', json_schema: { name: 'p', schema } }, max_tokens: 1 };
  const miss = (await chat(rf)).ms, hit = (await chat(rf)).ms;
  cache.push({ miss_ms: +miss.toFixed(2), hit_ms: +hit.toFixed(2) });
}
const base = []; for (let i = 0; i < 5; i++) base.push((await chat({ max_tokens: 1 })).ms);
const summary = { miss_ms_p50: +med(cache.map((c) => c.miss_ms)).toFixed(2), hit_ms_p50: +med(cache.map((c) => c.hit_ms)).toFixed(2),
  unconstrained_ms_p50: +med(base).toFixed(2) };
console.log(JSON.stringify({ compile_cache: cache, ...summary }));
if (opt('out')) fs.writeFileSync(opt('out'), JSON.stringify({ rows, medians, compile_cache: cache, ...summary }, null, 2));
