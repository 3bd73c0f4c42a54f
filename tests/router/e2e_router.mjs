// The official `openai` and `@anthropic-ai/sdk` clients through `beluga router` (round-robin and
// cache-aware) in front of two `beluga serve` replicas of the demo model (with an API key): chat,
// completions, responses and messages, streamed and not, give the same greedy text through the
// router as from a replica directly, and so does a disaggregated pair (a prefill and a decode engine
// behind `beluga router --prefill --decode`); streams arrive chunk by chunk (the first event long before the
// last); Responses continued with previous_response_id reach the replica that stored them (and
// retrieve / delete do too); models, count_tokens, /tokenize, /detokenize, /version; a wrong key is
// the replica's 401; x-traffic-class is forwarded (an unknown class is the replica's 400).
// Usage: node tests/router/e2e_router.mjs [path/to/beluga]   (exit code 0 = pass)
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { belugaBinary, startBeluga, stopBeluga } from '../tools/server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const require = createRequire(path.join(root, 'tests/tools/package.json'));
const openaiMod = require('openai');
const anthropicMod = require('@anthropic-ai/sdk');
const OpenAI = openaiMod.OpenAI ?? openaiMod.default;
const Anthropic = anthropicMod.Anthropic ?? anthropicMod.default;

const BIN = belugaBinary();
const MODEL = 'beluga-demo-coder-mtp';
const KEY = 'router-e2e-secret';
const T0 = Date.now();
process.env.OMP_WAIT_POLICY ??= 'PASSIVE';

let failures = 0;
function check(cond, what, extra) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}` + (extra !== undefined ? ` -- ${typeof extra === 'string' ? extra : JSON.stringify(extra)}` : ''));
  }
}
function log(s) { console.log(`[${((Date.now() - T0) / 1000).toFixed(1)}s] ${s}`); }

const start = (args) => startBeluga(BIN, args, { timeoutMs: 90000 });

async function stop(s, what) {
  const { code } = await stopBeluga(s);
  if (code === 'timeout') check(false, `${what} stops on SIGTERM`);
  else check(code === 0, `${what} exits cleanly (code ${code})`, s.stderr().slice(-1500));
}

const USER = 'Write a Python function `read_json(path)`: Load a JSON file and return its contents.';

async function suite(label, routerBase, directBase) {
  const viaRouter = new OpenAI({ apiKey: KEY, baseURL: `${routerBase}/v1`, maxRetries: 0 });
  const direct = new OpenAI({ apiKey: KEY, baseURL: `${directBase}/v1`, maxRetries: 0 });
  const anthropic = new Anthropic({ apiKey: KEY, baseURL: routerBase, maxRetries: 0 });
  const what = (s) => `${label}: ${s}`;

  // Chat, non-streamed and streamed: the router changes nothing in the answer.
  const req = { model: MODEL, messages: [{ role: 'user', content: USER }], max_tokens: 12, temperature: 0 };
  const want = await direct.chat.completions.create(req);
  const got = await viaRouter.chat.completions.create(req);
  check(got.choices[0].message.content === want.choices[0].message.content && got.usage.completion_tokens === want.usage.completion_tokens,
        what('chat: same greedy answer as the replica'), { got: got.choices[0].message, want: want.choices[0].message });
  let text = '', usage = null;
  const stream = await viaRouter.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    for (const c of chunk.choices) if (c.delta.content) text += c.delta.content;
    if (chunk.usage) usage = chunk.usage;
  }
  check(text === want.choices[0].message.content, what('chat stream: same text'), { text, want: want.choices[0].message.content });
  check(usage && usage.prompt_tokens === want.usage.prompt_tokens, what('chat stream: usage'), usage);

  // Chunk by chunk: a long stream's first event arrives well before its last.
  const t0 = Date.now();
  let first = 0, last = 0, events = 0;
  const long = await viaRouter.chat.completions.create({ ...req, max_tokens: 96, stream: true, ignore_eos: true });
  for await (const chunk of long) {
    const t = Date.now() - t0;
    if (!first) first = t;
    last = t;
    events++;
  }
  check(events >= 20 && first < 0.6 * last, what('stream is relayed as it is produced'), { first, last, events });

  // Completions.
  const c = await viaRouter.completions.create({ model: MODEL, prompt: 'def read_json(path):', max_tokens: 8, temperature: 0 });
  const cd = await direct.completions.create({ model: MODEL, prompt: 'def read_json(path):', max_tokens: 8, temperature: 0 });
  check(c.choices[0].text === cd.choices[0].text, what('completions: same text'), { got: c.choices[0].text, want: cd.choices[0].text });
  let ctext = '';
  for await (const ch of await viaRouter.completions.create({ model: MODEL, prompt: 'def read_json(path):', max_tokens: 8, temperature: 0, stream: true }))
    for (const x of ch.choices) ctext += x.text;
  check(ctext === cd.choices[0].text, what('completions stream: same text'), { ctext });

  // Responses, streamed and stored: continuing and retrieving reach the replica that stored it.
  const r1 = await viaRouter.responses.create({ model: MODEL, input: USER, max_output_tokens: 8, temperature: 0 });
  check(r1.object === 'response' && r1.output_text.length > 0, what('responses: output'), r1.output);
  for (let i = 0; i < 4; i++) {
    const r2 = await viaRouter.responses.create({ model: MODEL, input: 'And a test for it.', previous_response_id: r1.id, max_output_tokens: 4, temperature: 0 });
    check(r2.status !== 'failed' && r2.usage.input_tokens > r1.usage.input_tokens,
          what(`responses: previous_response_id continues the stored conversation (${i})`), r2.usage);
    const again = await viaRouter.responses.retrieve(r1.id);
    check(again.id === r1.id, what(`responses: retrieve through the router (${i})`));
  }
  let rtext = '', created = null;
  for await (const ev of await viaRouter.responses.create({ model: MODEL, input: USER, max_output_tokens: 8, temperature: 0, stream: true })) {
    if (ev.type === 'response.created') created = ev.response.id;
    if (ev.type === 'response.output_text.delta') rtext += ev.delta;
  }
  check(rtext === r1.output_text, what('responses stream: same text'), { rtext, want: r1.output_text });
  const r3 = await viaRouter.responses.create({ model: MODEL, input: 'Shorter please.', previous_response_id: created, max_output_tokens: 4, temperature: 0 });
  check(r3.status !== 'failed', what('responses: a streamed response continues too'));
  const del = await viaRouter.responses.delete(r1.id).then(() => true, (e) => e);
  check(del === true, what('responses: delete through the router'), String(del));

  // Anthropic Messages.
  const m = await anthropic.messages.create({ model: MODEL, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: USER }] });
  check(m.type === 'message' && m.content[0].type === 'text' && m.content[0].text.length > 0, what('messages: text'), m.content);
  let mtext = '', stopReason = null;
  const ms = anthropic.messages.stream({ model: MODEL, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: USER }] });
  for await (const ev of ms) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') mtext += ev.delta.text;
    if (ev.type === 'message_delta') stopReason = ev.delta.stop_reason;
  }
  check(mtext === m.content[0].text && stopReason === m.stop_reason, what('messages stream: same text'), { mtext, want: m.content[0].text });
  const n = await anthropic.messages.countTokens({ model: MODEL, messages: [{ role: 'user', content: USER }] });
  check(Number.isInteger(n.input_tokens) && n.input_tokens === m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0),
        what('messages count_tokens'), { n, usage: m.usage });

  // Models and the utility routes.
  const models = await viaRouter.models.list();
  check(models.data.length === 1 && models.data[0].id === MODEL, what('models list'), models.data);
  const auth = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
  const tk = await (await fetch(`${routerBase}/tokenize`, { method: 'POST', headers: auth, body: JSON.stringify({ model: MODEL, prompt: 'def f():' }) })).json();
  check(Array.isArray(tk.tokens) && tk.tokens.length > 0, what('/tokenize'), tk);
  const dk = await (await fetch(`${routerBase}/detokenize`, { method: 'POST', headers: auth, body: JSON.stringify({ model: MODEL, tokens: tk.tokens }) })).json();
  check(typeof dk.prompt === 'string' && dk.prompt.includes('def f'), what('/detokenize'), dk);
  const v = await fetch(`${routerBase}/version`, { headers: auth });
  check(v.status === 200, what('/version'));

  // Auth is the replica's: a wrong key is its 401, through the SDK.
  const bad = new OpenAI({ apiKey: 'wrong', baseURL: `${routerBase}/v1`, maxRetries: 0 });
  const e = await bad.chat.completions.create(req).then(() => null, (err) => err);
  check(e && e.status === 401, what('wrong API key: 401 from the replica'), e && e.status);
  const ea = await new Anthropic({ apiKey: 'wrong', baseURL: routerBase, maxRetries: 0 }).messages
    .create({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }).then(() => null, (err) => err);
  check(ea && ea.status === 401, what('wrong x-api-key: 401 from the replica'), ea && ea.status);

  // x-traffic-class reaches the replica: a class it knows is served, one it does not is its 400.
  const tc = async (cls) => (await fetch(`${routerBase}/v1/chat/completions`, {
    method: 'POST', headers: { ...auth, 'x-traffic-class': cls }, body: JSON.stringify({ ...req, max_tokens: 2 }) })).status;
  check(await tc('agent') === 200, what('x-traffic-class agent: 200'));
  check(await tc('no-such-class') === 400, what('x-traffic-class unknown: the replica\'s 400'));
}

async function main() {
  const replicas = [];
  for (let i = 0; i < 2; i++)
    replicas.push(await start(['serve', '--threads', '1', '--kv-cache-mb', '64', '--api-key', KEY, '--no-access-log']));
  log('replicas up');
  const urls = replicas.flatMap((r) => ['--replica', r.base]);
  for (const policy of ['round-robin', 'cache-aware']) {
    const router = await start(['router', ...urls, '--policy', policy]);
    log(`router (${policy}) up`);
    try {
      await suite(policy, router.base, replicas[0].base);
      const metrics = await (await fetch(`${router.base}/metrics`)).text();
      for (const r of replicas) {
        const m = metrics.match(new RegExp(`^beluga_router_replica_requests_total\\{replica="${r.base}"\\} (\\d+)$`, 'm'));
        check(m && Number(m[1]) > 0, `${policy}: replica ${r.base} received requests`, m && m[0]);
      }
    } catch (err) {
      check(false, `${policy}: suite threw`, String(err && err.stack || err));
    }
    await stop(router, `router (${policy})`);
  }
  // Disaggregated: a prefill and a decode engine behind the router give the same answers as the
  // colocated replica, through every SDK call above (the prefill leg, the KV transfer, the decode leg).
  const prefill = await start(['serve', '--threads', '1', '--kv-cache-mb', '64', '--api-key', KEY, '--no-access-log',
                               '--role', 'prefill', '--kv-host-gb', '0.25']);
  const decode = await start(['serve', '--threads', '1', '--kv-cache-mb', '64', '--api-key', KEY, '--no-access-log',
                              '--role', 'decode', '--kv-host-gb', '0.25']);
  const pd = await start(['router', '--prefill', prefill.base, '--decode', decode.base, '--health-interval-ms', '100']);
  for (let i = 0; i < 100; i++) {  // the decode engine's KV address learned
    const h = await (await fetch(`${pd.base}/health`)).json();
    if (h.decode_kv_known === 1) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  log('disaggregated router up');
  try {
    await suite('disaggregated', pd.base, replicas[0].base);
    const metrics = await (await fetch(`${pd.base}/metrics`)).text();
    const ok = metrics.match(/^beluga_router_prefills_total\{result="ok"\} (\d+)$/m);
    check(ok && Number(ok[1]) >= 6, 'disaggregated: the prefill legs ran and sent their KV', ok && ok[0]);
  } catch (err) {
    check(false, `disaggregated: suite threw`, String(err && err.stack || err));
  }
  await stop(pd, 'router (disaggregated)');
  await stop(decode, 'decode engine');
  await stop(prefill, 'prefill engine');
  for (const r of replicas) await stop(r, 'replica');
  log(failures ? `${failures} failure(s)` : 'all router SDK checks passed');
  process.exit(failures ? 1 : 0);
}

main().catch((e) => { console.error(e); process.exit(1); });
