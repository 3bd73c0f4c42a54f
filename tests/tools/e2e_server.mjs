// End-to-end test of `beluga serve` with the official `openai` and `@anthropic-ai/sdk` clients.
// Starts the server on free ports with the built-in demo model and checks: chat / completions /
// responses / messages, streamed and not; Anthropic's countTokens; stored responses (previous_response_id, retrieve,
// delete); tool-call history round trips; n=2; a seeded request
// repeated under concurrent load gives identical tokens; error statuses and shapes; queue full
// -> 429; 200 clients that disconnect mid-stream leave no KV blocks in use and the server keeps
// serving; chat logprobs (top_logprobs) through the SDK; prompt logprobs (completions echo +
// logprobs, vLLM's prompt_logprobs); greedy parity: 32 concurrent token-id
// completions equal each prompt served alone and `beluga generate` + `beluga detokenize`.
// Usage: node tests/tools/e2e_server.mjs [path/to/beluga]   (exit code 0 = pass)
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { belugaBinary, startBeluga, stopBeluga } from './server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const BIN = belugaBinary();
const MODEL = 'beluga-demo-coder-mtp';
const KEY = 'e2e-secret';
const T0 = Date.now();
// The CPU backend's OpenMP threads spin while waiting by default; on a small machine shared with
// other jobs that makes a one-sequence decode step take up to ~250 ms (and a 16-token request ~4 s).
// Passive waiting changes no result, only the speed, for the server and the CLI runs alike.
process.env.OMP_WAIT_POLICY ??= 'PASSIVE';

let failures = 0;
function check(cond, what, extra) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}` + (extra !== undefined ? ` -- ${typeof extra === 'string' ? extra : JSON.stringify(extra)}` : ''));
  }
}
function log(s) { console.log(`[${((Date.now() - T0) / 1000).toFixed(1)}s] ${s}`); }

const startServer = (extra) => startBeluga(BIN, ['serve', ...extra]);

async function stopServer(s) {
  const { code, sig } = await stopBeluga(s);
  if (code === 'timeout') check(false, 'server shuts down on SIGTERM within 20 s');
  else check(code === 0, `server exits cleanly (code ${code}, signal ${sig})`, s.stderr().slice(-2000));
}

async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const get = (name) => {
    const m = text.match(new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text, get };
}

function checkOpenAIUsage(u, what) {
  check(u && Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `${what}: usage.prompt_tokens`, u);
  check(u && Number.isInteger(u.completion_tokens), `${what}: usage.completion_tokens`, u);
  check(u && u.total_tokens === u.prompt_tokens + u.completion_tokens, `${what}: usage.total_tokens`, u);
  check(u && Number.isInteger(u.prompt_cache_hit_tokens) && Number.isInteger(u.prompt_cache_miss_tokens) &&
        u.prompt_cache_hit_tokens + u.prompt_cache_miss_tokens === u.prompt_tokens, `${what}: prompt cache hit/miss`, u);
  check(u && u.prompt_tokens_details && u.prompt_tokens_details.cached_tokens === u.prompt_cache_hit_tokens,
        `${what}: prompt_tokens_details.cached_tokens`, u);
}

const USER = 'Write a Python function `read_json(path)`: Load a JSON file and return its contents.';
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

async function testChat(openai) {
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: USER }], max_tokens: 16, temperature: 0 });
  check(r.object === 'chat.completion', 'chat: object');
  check(r.choices.length === 1 && typeof r.choices[0].message.content === 'string' && r.choices[0].message.content.length > 0, 'chat: content', r);
  check(['stop', 'length'].includes(r.choices[0].finish_reason), 'chat: finish_reason', r.choices[0].finish_reason);
  checkOpenAIUsage(r.usage, 'chat');

  // Streamed: same greedy text, usage chunk at the end.
  const stream = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: USER }], max_tokens: 16,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, role = null;
  for await (const chunk of stream) {
    check(chunk.object === 'chat.completion.chunk', 'chat stream: chunk object');
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(role === 'assistant', 'chat stream: role delta');
  check(text === r.choices[0].message.content, 'chat stream: same greedy text as non-streamed', { text, want: r.choices[0].message.content });
  check(finish === r.choices[0].finish_reason, 'chat stream: finish_reason');
  checkOpenAIUsage(usage, 'chat stream');
  check(usage && usage.completion_tokens === r.usage.completion_tokens, 'chat stream: completion tokens match');

  // Stop string: ends early with finish_reason stop and the stop text excluded.
  const full = r.choices[0].message.content;
  if (full.length > 6) {
    const stop = full.slice(3, 6);
    const s = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: USER }], max_tokens: 16, temperature: 0, stop: [stop] });
    check(s.choices[0].finish_reason === 'stop' && !s.choices[0].message.content.includes(stop) &&
          full.startsWith(s.choices[0].message.content), 'chat: stop string', { stop, got: s.choices[0].message.content });
  }

  // The same prompt again (longer than a 64-token block): the second reports cache hits.
  const long = USER + ' ' + 'Use the json module and handle missing files by raising FileNotFoundError. '.repeat(12);
  const a = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: long }], max_tokens: 2, temperature: 0 });
  const b = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: long }], max_tokens: 2, temperature: 0 });
  const full_blocks = Math.floor((b.usage.prompt_tokens - 1) / 64) * 64;
  check(b.usage.prompt_cache_hit_tokens >= full_blocks && full_blocks > 0, 'chat: repeated prompt hits the prefix cache',
        { first: a.usage, second: b.usage });
}

async function testN2(openai) {
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: USER }], max_tokens: 8,
    temperature: 1.0, seed: 7, n: 2 });
  check(r.choices.length === 2 && r.choices[0].index === 0 && r.choices[1].index === 1, 'n=2: two choices', r.choices);
  const s = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: USER }], max_tokens: 8,
    temperature: 1.0, seed: 7, n: 2, stream: true });
  const texts = ['', ''];
  const finishes = [null, null];
  for await (const chunk of s) for (const c of chunk.choices) {
    if (c.delta.content) texts[c.index] += c.delta.content;
    if (c.finish_reason) finishes[c.index] = c.finish_reason;
  }
  check(finishes[0] && finishes[1], 'n=2 stream: both choices finish', finishes);
  check(texts[0] === r.choices[0].message.content && texts[1] === r.choices[1].message.content,
        'n=2: seeded streamed choices equal the non-streamed ones', { texts, want: r.choices.map((c) => c.message.content) });
  const c = await openai.completions.create({ model: MODEL, prompt: 'def add(a, b):', max_tokens: 6, n: 2, temperature: 1.0, seed: 3 });
  check(c.choices.length === 2, 'completions n=2');
}

async function testCompletions(openai) {
  const r = await openai.completions.create({ model: MODEL, prompt: 'def read_json(path):', max_tokens: 12, temperature: 0 });
  check(r.object === 'text_completion' && typeof r.choices[0].text === 'string' && r.choices[0].text.length > 0, 'completions: text', r);
  checkOpenAIUsage(r.usage, 'completions');
  const s = await openai.completions.create({ model: MODEL, prompt: 'def read_json(path):', max_tokens: 12, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null;
  for await (const chunk of s) {
    for (const c of chunk.choices) { text += c.text; if (c.finish_reason) finish = c.finish_reason; }
    if (chunk.usage) usage = chunk.usage;
  }
  check(text === r.choices[0].text, 'completions stream: same greedy text', { text, want: r.choices[0].text });
  check(finish === r.choices[0].finish_reason, 'completions stream: finish_reason');
  checkOpenAIUsage(usage, 'completions stream');
  // Token-id prompt.
  const ids = await openai.completions.create({ model: MODEL, prompt: [0, 1000, 1001], max_tokens: 3, temperature: 0 });
  check(ids.choices.length === 1 && ids.usage.prompt_tokens === 3, 'completions: token-id prompt', ids.usage);
}

async function testResponses(openai) {
  const r = await openai.responses.create({ model: MODEL, input: USER, max_output_tokens: 16, temperature: 0 });
  check(r.object === 'response' && ['completed', 'incomplete'].includes(r.status), 'responses: status', r.status);
  check(typeof r.output_text === 'string' && r.output_text.length > 0, 'responses: output_text', r.output);
  check(r.usage && r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.input_tokens_details &&
        Number.isInteger(r.usage.input_tokens_details.cached_tokens), 'responses: usage', r.usage);

  const s = await openai.responses.create({ model: MODEL, input: [{ role: 'user', content: USER }], max_output_tokens: 16,
    temperature: 0, stream: true });
  let seq = -1, monotonic = true, text = '', types = [], final = null;
  for await (const ev of s) {
    types.push(ev.type);
    if (!(ev.sequence_number > seq)) monotonic = false;
    seq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  check(monotonic, 'responses stream: sequence_number increases');
  check(types[0] === 'response.created' && types[1] === 'response.in_progress', 'responses stream: created, in_progress first', types.slice(0, 3));
  check(types.includes('response.output_item.added') && types.includes('response.content_part.added') &&
        types.includes('response.output_text.done') && types.includes('response.output_item.done'), 'responses stream: item events', types);
  check(final && text === r.output_text, 'responses stream: same greedy text', { text, want: r.output_text });
  check(final && final.usage && final.usage.output_tokens > 0, 'responses stream: final usage');
}

// Stored responses (store defaults to true): previous_response_id continues a conversation (the
// follow-up's prompt holds the first turn: more input tokens, and the same prompt and greedy answer as
// the whole conversation sent explicitly); retrieve returns the stored response, streamed ones too;
// delete removes it; store: false keeps nothing.
async function testResponsesStore(openai) {
  const NEXT = 'Now add type hints.';
  const r = await openai.responses.create({ model: MODEL, input: USER, max_output_tokens: 8, temperature: 0 });
  check(r.store === true && r.previous_response_id === null, 'responses store: store true by default',
        { store: r.store, previous_response_id: r.previous_response_id });
  const f = await openai.responses.create({ model: MODEL, previous_response_id: r.id, input: NEXT, max_output_tokens: 8, temperature: 0 });
  check(f.previous_response_id === r.id, 'responses store: previous_response_id reported', f.previous_response_id);
  check(f.usage.input_tokens > r.usage.input_tokens, 'responses store: the follow-up prompt holds the first turn',
        { first: r.usage.input_tokens, follow_up: f.usage.input_tokens });
  const e = await openai.responses.create({ model: MODEL, input: [{ role: 'user', content: USER }, ...r.output, { role: 'user', content: NEXT }],
    max_output_tokens: 8, temperature: 0, store: false });
  check(e.usage.input_tokens === f.usage.input_tokens && e.output_text === f.output_text,
        'responses store: continuing equals sending the whole conversation',
        { chained: [f.usage.input_tokens, f.output_text], explicit: [e.usage.input_tokens, e.output_text] });

  const got = await openai.responses.retrieve(r.id);
  check(got.id === r.id && got.status === r.status && JSON.stringify(got.output) === JSON.stringify(r.output) &&
        JSON.stringify(got.usage) === JSON.stringify(r.usage), 'responses store: retrieve returns the response as created', { got, want: r });
  const deleted = await openai.responses.delete(r.id);
  check(deleted && deleted.id === r.id && deleted.deleted === true, 'responses store: delete', deleted);
  try {
    await openai.responses.retrieve(r.id);
    check(false, 'responses store: retrieve after delete -> 404');
  } catch (err) { check(err instanceof OpenAI.NotFoundError, 'responses store: retrieve after delete -> 404', String(err)); }
  try {
    await openai.responses.create({ model: MODEL, previous_response_id: r.id, input: NEXT, max_output_tokens: 2 });
    check(false, 'responses store: unknown previous_response_id -> 404');
  } catch (err) {
    check(err instanceof OpenAI.NotFoundError && err.error && err.error.param === 'previous_response_id',
          'responses store: unknown previous_response_id -> 404 naming the param', String(err));
  }
  // The chained response outlives the one it continued.
  check((await openai.responses.retrieve(f.id)).previous_response_id === r.id, 'responses store: the follow-up is still stored');

  const n = await openai.responses.create({ model: MODEL, input: 'hi', max_output_tokens: 2, store: false });
  check(n.store === false, 'responses store: store false reported', n.store);
  try {
    await openai.responses.retrieve(n.id);
    check(false, 'responses store: store false is not retrievable');
  } catch (err) { check(err instanceof OpenAI.NotFoundError, 'responses store: store false is not retrievable', String(err)); }

  const s = await openai.responses.create({ model: MODEL, input: USER, max_output_tokens: 8, temperature: 0, stream: true });
  let final = null;
  for await (const ev of s) if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  const sg = final && await openai.responses.retrieve(final.id);
  check(sg && sg.store === true && JSON.stringify(sg.output) === JSON.stringify(final.output),
        'responses store: a streamed response is stored as its last event', { got: sg, want: final });
}

async function testMessages(anthropic) {
  const r = await anthropic.messages.create({ model: MODEL, max_tokens: 16, temperature: 0, messages: [{ role: 'user', content: USER }] });
  check(r.type === 'message' && r.role === 'assistant' && r.content[0].type === 'text' && r.content[0].text.length > 0, 'messages: text', r);
  check(['end_turn', 'max_tokens'].includes(r.stop_reason), 'messages: stop_reason', r.stop_reason);
  check(r.usage.input_tokens + (r.usage.cache_read_input_tokens || 0) > 0 && r.usage.output_tokens > 0, 'messages: usage', r.usage);

  const stream = anthropic.messages.stream({ model: MODEL, max_tokens: 16, temperature: 0, messages: [{ role: 'user', content: USER }] });
  const types = [];
  stream.on('streamEvent', (ev) => types.push(ev.type));
  const m = await stream.finalMessage();
  check(types[0] === 'message_start' && types.at(-1) === 'message_stop' && types.includes('content_block_start') &&
        types.includes('content_block_delta') && types.includes('content_block_stop') && types.includes('message_delta'),
        'messages stream: event sequence', types);
  check(m.content[0].text === r.content[0].text, 'messages stream: same greedy text', { got: m.content[0].text, want: r.content[0].text });
  check(m.stop_reason === r.stop_reason && m.usage.output_tokens === r.usage.output_tokens, 'messages stream: stop_reason and usage', m);

  const stop = await anthropic.messages.create({ model: MODEL, max_tokens: 16, temperature: 0, stop_sequences: [r.content[0].text.slice(2, 4)],
    messages: [{ role: 'user', content: USER }] });
  if (r.content[0].text.length > 4)
    check(stop.stop_reason === 'stop_sequence' && stop.stop_sequence === r.content[0].text.slice(2, 4), 'messages: stop_sequence', stop);
}

// Anthropic's messages.countTokens (POST /v1/messages/count_tokens): the prompt tokens the same
// request is billed for when it runs (cached or not).
async function testCountTokens(anthropic) {
  const req = { model: MODEL, system: 'You write Python.', messages: [{ role: 'user', content: USER }] };
  const c = await anthropic.messages.countTokens(req);
  const r = await anthropic.messages.create({ ...req, max_tokens: 2, temperature: 0 });
  const billed = r.usage.input_tokens + (r.usage.cache_read_input_tokens || 0) + (r.usage.cache_creation_input_tokens || 0);
  check(Number.isInteger(c.input_tokens) && c.input_tokens === billed, 'countTokens: equals the request\'s prompt tokens',
        { count: c, usage: r.usage });
}

// A tool call and its result sent back, in each API's own shape: the server encodes the history
// and answers; the model's answer comes back as text or a new call.
async function testToolRoundTrip(openai, anthropic) {
  const r = await openai.chat.completions.create({ model: MODEL, max_tokens: 8, temperature: 0, tools: TOOLS, messages: [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
  ] });
  check(r.choices[0].message.content !== undefined || r.choices[0].message.tool_calls, 'tool round trip (chat)', r);
  check(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason), 'tool round trip (chat): finish_reason');
  const s = await openai.responses.create({ model: MODEL, max_output_tokens: 8, temperature: 0,
    tools: [{ type: 'function', name: 'get_weather', parameters: TOOLS[0].function.parameters }], input: [
      { role: 'user', content: 'What is the weather in Paris?' },
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city": "Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '{"temp_c": 21}' },
    ] });
  check(s.object === 'response' && s.output.length > 0, 'tool round trip (responses)', s);
  const m = await anthropic.messages.create({ model: MODEL, max_tokens: 8, temperature: 0,
    tools: [{ name: 'get_weather', description: 'Weather of a city', input_schema: TOOLS[0].function.parameters }], messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '{"temp_c": 21}' }] },
    ] });
  check(m.type === 'message' && m.content.length > 0, 'tool round trip (messages)', m);
}

async function testSeededUnderLoad(openai) {
  const req = { model: MODEL, messages: [{ role: 'user', content: 'def parse_args(argv):' }], max_tokens: 12, temperature: 1.0, top_p: 0.95, seed: 1234 };
  const alone = (await openai.chat.completions.create(req)).choices[0].message.content;
  const noise = [];
  for (let i = 0; i < 12; i++)
    noise.push(openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: `Write a function number ${i} ` + 'x'.repeat(i * 7) }],
      max_tokens: 4 + (i % 5) * 3, temperature: 0.8 }));
  const same = [];
  for (let i = 0; i < 6; i++) same.push(openai.chat.completions.create(req));
  const outs = (await Promise.all(same)).map((r) => r.choices[0].message.content);
  await Promise.all(noise);
  check(outs.every((o) => o === alone), 'seeded request repeated under concurrent load gives identical tokens', { alone, outs });
}

// Chat logprobs through the SDK: tokens spell the content; top_logprobs sorted, greedy = the best.
async function testLogprobs(openai) {
  const req = { model: MODEL, messages: [{ role: 'user', content: USER }], max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 };
  const r = await openai.chat.completions.create(req);
  const c = r.choices[0];
  const lp = c.logprobs && c.logprobs.content;
  check(Array.isArray(lp) && lp.length === r.usage.completion_tokens, 'logprobs: one entry per generated token',
        { n: lp && lp.length, usage: r.usage });
  if (!Array.isArray(lp)) return;
  const joined = lp.map((t) => t.token).join('');
  const joinedBytes = Buffer.concat(lp.map((t) => Buffer.from(t.bytes)));
  if (lp.some((t) => t.token.includes('\\x')))  // a token holding part of a character: compare bytes
    check(joinedBytes.equals(Buffer.from(c.message.content)), 'logprobs: token bytes joined equal the content');
  else check(joined === c.message.content, 'logprobs: tokens joined equal the content', { joined, content: c.message.content });
  lp.forEach((t, i) => {
    const top = t.top_logprobs;
    check(Array.isArray(top) && top.length === 3, `logprobs[${i}]: 3 top_logprobs`, t);
    check(top.every((a, j) => j === 0 || top[j - 1].logprob >= a.logprob), `logprobs[${i}]: top_logprobs sorted descending`, top);
    check(top[0].logprob === t.logprob && top[0].token === t.token, `logprobs[${i}]: greedy token is the first top entry`, t);
    check(t.logprob <= 0 && Buffer.from(t.bytes).length > 0, `logprobs[${i}]: logprob <= 0, bytes`, t);
  });
  // Streamed: every chunk carries the logprobs of its delta; all together equal the non-streamed ones.
  const s = await openai.chat.completions.create({ ...req, stream: true });
  const got = [];
  for await (const chunk of s) for (const ch of chunk.choices) if (ch.logprobs && ch.logprobs.content) got.push(...ch.logprobs.content);
  check(JSON.stringify(got) === JSON.stringify(lp), 'logprobs stream: same entries as non-streamed', { got: got.length, want: lp.length });
  // Validation: top_logprobs needs logprobs: true; at most 20.
  for (const [extra, what] of [[{ top_logprobs: 2 }, 'top_logprobs without logprobs'], [{ logprobs: true, top_logprobs: 21 }, 'top_logprobs 21']]) {
    try {
      await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, ...extra });
      check(false, `logprobs: ${what} -> 400`);
    } catch (e) { check(e instanceof OpenAI.BadRequestError, `logprobs: ${what} -> 400`, String(e)); }
  }
}

function runBinary(args, input) {
  return new Promise((resolve, reject) => {
    const p = execFile(BIN, args, { cwd: root, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${args[0]} failed: ${err.message}\n${stderr}`));
      else resolve(stdout);
    });
    if (input !== undefined) p.stdin.end(input);
  });
}

async function mapLimit(items, limit, fn) {
  const out = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < items.length) { const i = next++; out[i] = await fn(items[i], i); }
  }));
  return out;
}

// Greedy parity: 32 token-id prompts of mixed lengths (5..300, a fixed pseudo-random sequence over
// ids 2..8000) give the same completion batched together as alone, and as `beluga generate`
// (detokenized by `beluga detokenize`). EOS: ignore_eos on the server and no stop ids in
// `generate`, so both sides produce exactly max_tokens tokens (an EOS, if sampled, is text on both).
// Prompt logprobs: completions with echo and logprobs cover the prompt's tokens (the first with null
// token_logprobs / top_logprobs) and then the completion's, as OpenAI's legacy format has it, streamed
// and not; vLLM's prompt_logprobs field (the SDK passes it through) agrees with them.
async function testPromptLogprobs(openai) {
  const prompt = 'def read_json(path):';
  const req = { model: MODEL, prompt, echo: true, logprobs: 2, max_tokens: 3, temperature: 0 };
  const r = await openai.completions.create(req);
  const c = r.choices[0];
  const lp = c.logprobs;
  const P = r.usage.prompt_tokens, G = r.usage.completion_tokens, N = P + G;
  check(c.text.startsWith(prompt), 'echo logprobs: the text starts with the prompt', c.text);
  check(lp && ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'].every((k) => Array.isArray(lp[k]) && lp[k].length === N),
        'echo logprobs: one entry per prompt and completion token', { lp, usage: r.usage });
  if (!lp || !Array.isArray(lp.tokens) || lp.tokens.length !== N) return;
  check(lp.token_logprobs[0] === null && lp.top_logprobs[0] === null, 'echo logprobs: null for the first prompt token', lp);
  for (let i = 1; i < N; i++) {
    const v = lp.token_logprobs[i], top = lp.top_logprobs[i];
    check(typeof v === 'number' && v <= 0, `echo logprobs[${i}]: a logprob <= 0`, v);
    const alts = top ? Object.values(top) : [];
    check(alts.length >= 1 && alts.length <= 2 && alts.every((a) => a <= 0), `echo logprobs[${i}]: up to 2 top_logprobs`, top);
    check(Math.max(...alts) >= v - 1e-5, `echo logprobs[${i}]: the best alternative is at least as likely`, { v, top });
    if (i >= P) check(Math.abs(Math.max(...alts) - v) < 1e-5, `echo logprobs[${i}]: the greedy token is the best`, { v, top });
    check(lp.text_offset[i] >= lp.text_offset[i - 1], `echo logprobs[${i}]: text_offset non-decreasing`, lp.text_offset);
  }
  check(lp.text_offset[P] === prompt.length, 'echo logprobs: the completion starts after the prompt', lp.text_offset);
  // The completion's entries are those of the same request without echo.
  const plain = (await openai.completions.create({ ...req, echo: false })).choices[0].logprobs;
  check(plain.token_logprobs.length === G && plain.token_logprobs.every((v, i) => Math.abs(v - lp.token_logprobs[P + i]) < 1e-4) &&
        JSON.stringify(plain.tokens) === JSON.stringify(lp.tokens.slice(P)),
        'echo logprobs: completion entries equal the request without echo', { plain, lp });
  // Streamed: the first chunk is the echoed prompt with its logprobs; all chunks equal the non-streamed.
  const s = await openai.completions.create({ ...req, stream: true });
  const all = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let first = null;
  for await (const chunk of s) for (const ch of chunk.choices) {
    if (first === null) first = ch;
    if (ch.logprobs) for (const k of Object.keys(all)) all[k].push(...ch.logprobs[k]);
  }
  check(first && first.text === prompt && first.logprobs && first.logprobs.tokens.length === P,
        'echo logprobs stream: the first chunk is the prompt with its logprobs', first);
  check(JSON.stringify(all.tokens) === JSON.stringify(lp.tokens) && all.token_logprobs[0] === null &&
        all.token_logprobs.every((v, i) => i === 0 || Math.abs(v - lp.token_logprobs[i]) < 1e-4),
        'echo logprobs stream: same entries as non-streamed', { all, lp });
  // vLLM's prompt_logprobs: [null, {id: {logprob, rank, decoded_token}}...], the same values.
  const v = await openai.completions.create({ model: MODEL, prompt, max_tokens: 1, temperature: 0, prompt_logprobs: 1 });
  const pl = v.choices[0].prompt_logprobs;
  check(Array.isArray(pl) && pl.length === P && pl[0] === null, 'prompt_logprobs: one entry per prompt token, null first', pl);
  if (Array.isArray(pl) && pl.length === P)
    for (let i = 1; i < P; i++) {
      const es = pl[i] ? Object.values(pl[i]) : [];
      check(es.length >= 1 && es.length <= 2 && es.every((e) => e.logprob <= 0 && Number.isInteger(e.rank) && e.rank >= 1 &&
            typeof e.decoded_token === 'string') && es.some((e) => e.rank === 1),
            `prompt_logprobs[${i}]: the token and the best, with rank and decoded_token`, pl[i]);
      check(es.some((e) => Math.abs(e.logprob - lp.token_logprobs[i]) < 1e-4 && e.decoded_token === lp.tokens[i]),
            `prompt_logprobs[${i}]: the prompt token's logprob equals the echo's`, { pl: pl[i], echo: lp.token_logprobs[i] });
    }
  try {
    await openai.completions.create({ model: MODEL, prompt, max_tokens: 1, prompt_logprobs: 21 });
    check(false, 'prompt_logprobs 21 -> 400');
  } catch (e) { check(e instanceof OpenAI.BadRequestError, 'prompt_logprobs 21 -> 400', String(e)); }
}

async function testGreedyParity(openai) {
  let x = 20240607;
  const rand = () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x >>> 8; };
  const prompts = [];
  for (let i = 0; i < 32; i++) {
    const len = 5 + (rand() % 296);
    prompts.push(Array.from({ length: len }, () => 2 + (rand() % 7999)));
  }
  const MAXT = 16;
  const complete = async (prompt) => {
    const r = await openai.completions.create({ model: MODEL, prompt, max_tokens: MAXT, temperature: 0, ignore_eos: true });
    check(r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === MAXT && r.usage.prompt_tokens === prompt.length,
          'parity: 16 tokens, finish length', { finish: r.choices[0].finish_reason, usage: r.usage });
    return r.choices[0].text;
  };
  const alone = [];
  for (const p of prompts) alone.push(await complete(p));
  log('  parity: served alone');
  const together = await Promise.all(prompts.map(complete));
  log('  parity: served together');
  // The reference: generate + detokenize, one process at a time (the server is idle by now; CPU
  // thread pools running side by side on a small machine slow each other down badly).
  const ref = await mapLimit(prompts, 1, async (p) => {
    const gen = JSON.parse(await runBinary(['generate', '--model', 'models/beluga-demo-coder-mtp', '--prompt-ids', p.join(','),
      '--max-tokens', String(MAXT), '--temperature', '0', '--format', 'json']));
    check(gen.output_tokens.length === MAXT, 'parity: generate gives 16 tokens', gen.output_tokens);
    return runBinary(['detokenize', '--tokenizer', 'models/beluga-demo-coder-mtp/tokenizer.json'], JSON.stringify(gen.output_tokens));
  });
  log('  parity: generate + detokenize');
  let bad = 0;
  for (let i = 0; i < prompts.length; i++) {
    if (together[i] !== alone[i] || alone[i] !== ref[i]) {
      if (bad++ < 4) check(false, `parity: prompt ${i} (${prompts[i].length} tokens): batched = alone = generate`,
                           { together: together[i], alone: alone[i], generate: ref[i] });
    }
  }
  check(bad === 0, `parity: ${bad} of ${prompts.length} prompts differ`);
}

async function rawPost(base, p, body, headers = {}) {
  const r = await fetch(base + p, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, ...headers }, body });
  let json = null;
  const text = await r.text();
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, json, text };
}

async function testErrors(base, openai, anthropic) {
  const openaiShape = (j) => j && j.error && typeof j.error.message === 'string' && typeof j.error.type === 'string';
  const anthropicShape = (j) => j && j.type === 'error' && j.error && typeof j.error.type === 'string' && typeof j.error.message === 'string';
  const cases = [
    ['/v1/chat/completions', '{"model": "beluga-demo-coder-mtp", "messages": [', 400, openaiShape, 'malformed JSON (chat)'],
    ['/v1/messages', '{"model": ', 400, anthropicShape, 'malformed JSON (messages)'],
    ['/v1/responses', '[1,2', 400, openaiShape, 'malformed JSON (responses)'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: 'hello' }), 400, openaiShape, 'wrong type (messages)'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], temperature: 'hot' }), 400, openaiShape, 'wrong type (temperature)'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [] }), 400, openaiShape, 'empty messages'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL }), 400, openaiShape, 'missing messages'],
    ['/v1/messages', JSON.stringify({ model: MODEL, max_tokens: 5, messages: [] }), 400, anthropicShape, 'empty messages (messages)'],
    ['/v1/chat/completions', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: -1 }), 400, openaiShape, 'negative max_tokens'],
    ['/v1/completions', JSON.stringify({ model: MODEL, prompt: 'hi', max_tokens: -5 }), 400, openaiShape, 'negative max_tokens (completions)'],
    ['/v1/messages', JSON.stringify({ model: MODEL, max_tokens: -5, messages: [{ role: 'user', content: 'hi' }] }), 400, anthropicShape, 'negative max_tokens (messages)'],
    ['/v1/chat/completions', JSON.stringify({ model: 'gpt-nope', messages: [{ role: 'user', content: 'hi' }] }), 404, openaiShape, 'unknown model'],
    ['/v1/messages', JSON.stringify({ model: 'claude-nope', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }), 404, anthropicShape, 'unknown model (messages)'],
  ];
  for (const [p, body, status, shape, what] of cases) {
    const r = await rawPost(base, p, body);
    check(r.status === status && shape(r.json), `${what} -> ${status}`, { status: r.status, body: r.text.slice(0, 300) });
  }
  // Invalid UTF-8 in the body.
  const bad = Buffer.concat([Buffer.from('{"model":"beluga-demo-coder-mtp","messages":[{"role":"user","content":"a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]);
  const u = await rawPost(base, '/v1/chat/completions', bad);
  check(u.status === 400 && openaiShape(u.json), 'invalid UTF-8 -> 400', u.text);
  // Oversize body (the server runs with --max-body-bytes 262144).
  const big = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(400000) }] });
  const o = await rawPost(base, '/v1/chat/completions', big);
  check(o.status === 413 && openaiShape(o.json), 'oversize body -> 413', { status: o.status, body: o.text.slice(0, 200) });
  const om = await rawPost(base, '/v1/messages', big);
  check(om.status === 413 && anthropicShape(om.json), 'oversize body (messages) -> 413', { status: om.status, body: om.text.slice(0, 200) });
  // API key: missing or wrong -> 401 (Bearer and x-api-key); right key via x-api-key works.
  const ok = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
  const noKey = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: ok });
  check(noKey.status === 401 && openaiShape(await noKey.json()), 'missing API key -> 401');
  const wrong = await rawPost(base, '/v1/chat/completions', ok, { authorization: 'Bearer wrong' });
  check(wrong.status === 401, 'wrong Bearer key -> 401', wrong.status);
  const wrongX = await fetch(base + '/v1/messages', { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'wrong' },
    body: JSON.stringify({ model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }) });
  check(wrongX.status === 401 && anthropicShape(await wrongX.json()), 'wrong x-api-key -> 401 (anthropic shape)');
  const rightX = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY }, body: ok });
  check(rightX.status === 200, 'x-api-key accepted', rightX.status);
  // The SDKs raise their typed errors.
  try {
    await openai.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'hi' }] });
    check(false, 'openai SDK: unknown model raises');
  } catch (e) { check(e instanceof OpenAI.NotFoundError, 'openai SDK: NotFoundError', String(e)); }
  try {
    await anthropic.messages.create({ model: MODEL, max_tokens: 5, messages: [] });
    check(false, 'anthropic SDK: empty messages raises');
  } catch (e) { check(e instanceof Anthropic.BadRequestError, 'anthropic SDK: BadRequestError', String(e)); }
  const badOpenAI = new OpenAI({ baseURL: base + '/v1', apiKey: 'wrong', maxRetries: 0 });
  try {
    await badOpenAI.models.list();
    check(false, 'openai SDK: wrong key raises');
  } catch (e) { check(e instanceof OpenAI.AuthenticationError, 'openai SDK: AuthenticationError', String(e)); }
  const models = await openai.models.list();
  check(models.data.length === 1 && models.data[0].id === MODEL, '/v1/models lists the served model', models.data);
  const nf = await fetch(base + '/v1/nope', { headers: { authorization: `Bearer ${KEY}` } });
  check(nf.status === 404, 'unknown route -> 404');
}

// 200 streaming clients that go away mid-stream: their requests are aborted and no KV block stays in use.
async function testDisconnects(base, openai) {
  const N = 200;
  const body = (i) => JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: `Write function ${i}: ` + 'y'.repeat(i % 50) }],
    max_tokens: 200, temperature: 0.7, stream: true });
  const tasks = [];
  for (let i = 0; i < N; i++) {
    tasks.push((async () => {
      const ac = new AbortController();
      try {
        const r = await fetch(base + '/v1/chat/completions', { method: 'POST', signal: ac.signal,
          headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` }, body: body(i) });
        const reader = r.body.getReader();
        if (i % 2 === 0) await reader.read();  // half wait for a first chunk, half leave right away
        ac.abort();
      } catch {}
    })());
  }
  await Promise.all(tasks);
  let m, used = NaN, running = NaN, waiting = NaN, inflight = NaN;
  const deadline = Date.now() + 60000;
  while (Date.now() < deadline) {
    m = await metrics(base);
    used = m.get('beluga_kv_blocks_used'); running = m.get('beluga_num_requests_running');
    waiting = m.get('beluga_num_requests_waiting'); inflight = m.get('beluga_requests_in_flight');
    if (used === 0 && running === 0 && waiting === 0 && inflight === 0) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  check(used === 0 && running === 0 && waiting === 0, 'after 200 disconnects no KV blocks are in use', { used, running, waiting, inflight });
  check(m.get('beluga_client_disconnects_total') >= N / 2, 'disconnects are counted', m.get('beluga_client_disconnects_total'));
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0 });
  check(r.choices[0].message.content.length > 0, 'the server keeps serving after the disconnects');
}

async function testQueueFull() {
  const s = await startServer(['--max-num-seqs', '1', '--max-queue-len', '1']);
  try {
    const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 24, temperature: 0, ignore_eos: true });
    const rs = await Promise.all(Array.from({ length: 8 }, () => rawPost(s.base, '/v1/chat/completions', body)));
    const statuses = rs.map((r) => r.status);
    check(statuses.includes(429) && statuses.includes(200), 'queue full -> 429 (others 200)', statuses);
    const e = rs.find((r) => r.status === 429);
    check(e && e.json && e.json.error && e.json.error.type, '429 body has the OpenAI error shape', e && e.text);
  } finally {
    await stopServer(s);
  }
}

async function main() {
  log(`binary ${BIN}`);
  const s = await startServer(['--api-key', KEY, '--max-body-bytes', '262144']);
  const openai = new OpenAI({ baseURL: s.base + '/v1', apiKey: KEY, maxRetries: 0, timeout: 120000 });
  const anthropic = new Anthropic({ baseURL: s.base, apiKey: KEY, maxRetries: 0, timeout: 120000 });
  const steps = [
    ['chat', () => testChat(openai)],
    ['completions', () => testCompletions(openai)],
    ['responses', () => testResponses(openai)],
    ['responses store', () => testResponsesStore(openai)],
    ['messages', () => testMessages(anthropic)],
    ['count tokens', () => testCountTokens(anthropic)],
    ['tool round trip', () => testToolRoundTrip(openai, anthropic)],
    ['n=2', () => testN2(openai)],
    ['seeded under load', () => testSeededUnderLoad(openai)],
    ['logprobs', () => testLogprobs(openai)],
    ['prompt logprobs', () => testPromptLogprobs(openai)],
    ['greedy parity', () => testGreedyParity(openai)],
    ['errors', () => testErrors(s.base, openai, anthropic)],
    ['disconnects', () => testDisconnects(s.base, openai)],
  ];
  const only = process.env.E2E_ONLY;
  try {
    for (const [name, fn] of steps) {
      if (only && !only.split(',').includes(name)) continue;
      log(name);
      try { await fn(); } catch (e) { check(false, `${name}: threw`, e && e.stack ? e.stack : String(e)); }
    }
  } finally {
    await stopServer(s);
  }
  if (!only || only.split(',').includes('queue full')) {
    log('queue full');
    try { await testQueueFull(); } catch (e) { check(false, 'queue full: threw', String(e && e.stack)); }
  }
  log(failures ? `${failures} check(s) failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
}

main().catch((e) => { console.error(e); process.exit(1); });
