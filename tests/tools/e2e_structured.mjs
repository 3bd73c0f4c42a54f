// End-to-end test of structured outputs: `beluga serve` with the built-in demo model, driven by the
// official `openai` and `@anthropic-ai/sdk` clients; every reply that finishes with `stop` is
// validated against its schema by `ajv` (code nobody here wrote). Checks: chat response_format
// json_schema for several schemas (required fields, enums, arrays, nested objects), streamed and
// not, sampled with n=2; json_object parses as an object; vLLM's structured_outputs choice and json
// (chat and completions); Responses text.format; Anthropic output_config.format and the beta's
// output_format, streamed and not; forced tool calls (tool_choice required / named, Anthropic any)
// in the model's tool-call markup with ajv-valid arguments; max_tokens cuts a reply (finish_reason length); a refused schema
// keyword is a 400 naming it. The same requests without a constraint must fail ajv (so the
// constraint, not luck, made them valid).
// Usage: node tests/tools/e2e_structured.mjs [path/to/beluga]   (exit code 0 = pass)
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import { belugaBinary, startBeluga, stopBeluga } from './server.mjs';

const BIN = belugaBinary();
const MODEL = 'beluga-demo-coder-mtp';
const T0 = Date.now();
process.env.OMP_WAIT_POLICY ??= 'PASSIVE';  // see e2e_server.mjs: no spinning on a shared machine

let failures = 0;
function check(cond, what, extra) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}` + (extra !== undefined ? ` -- ${typeof extra === 'string' ? extra : JSON.stringify(extra)}` : ''));
  }
}
function log(s) { console.log(`[${((Date.now() - T0) / 1000).toFixed(1)}s] ${s}`); }

const ajv = new Ajv({ strict: false, allErrors: true });

// Schemas a user would send: bounded strings and arrays so the small model can finish within budget.
const SCHEMAS = {
  person: {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'], additionalProperties: false,
  },
  sentiment: {
    type: 'object',
    properties: { label: { enum: ['positive', 'negative', 'neutral'] }, score: { type: 'number' } },
    required: ['label'], additionalProperties: false,
  },
  tags: {
    type: 'object',
    properties: { tags: { type: 'array', items: { type: 'string', maxLength: 8 }, minItems: 1, maxItems: 3 } },
    required: ['tags'], additionalProperties: false,
  },
  nested: {
    type: 'object',
    properties: {
      user: { type: 'object', properties: { id: { type: 'integer' }, admin: { type: 'boolean' } },
              required: ['id', 'admin'], additionalProperties: false },
      items: { type: 'array', maxItems: 2, items: { type: 'object', properties: { sku: { type: 'string', maxLength: 6 },
               qty: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['sku', 'qty'], additionalProperties: false } },
    },
    required: ['user', 'items'], additionalProperties: false,
  },
};
const PROMPT = 'Reply with a JSON value that fits the schema.';
const MAX = 160;

// ajv on a reply that finished with `stop`: must parse and validate. Counts how many did.
let validated = 0;
function validate(schemaName, text, finish, what) {
  check(finish === 'stop' || finish === 'length', `${what}: finish_reason stop or length`, finish);
  if (finish !== 'stop') return;
  let v;
  try { v = JSON.parse(text); } catch (e) { check(false, `${what}: reply parses as JSON`, text); return; }
  const ok = ajv.validate(SCHEMAS[schemaName], v);
  check(ok, `${what}: ajv validates the reply against ${schemaName}`, { text, errors: ajv.errors });
  if (ok) validated++;
}
function rf(name) { return { type: 'json_schema', json_schema: { name, schema: SCHEMAS[name], strict: true } }; }
function msgs(text = PROMPT) { return [{ role: 'user', content: text }]; }

async function testChatSchemas(openai) {
  for (const [i, name] of Object.keys(SCHEMAS).entries()) {
    // Sampled (temperature 1, n = 2) so the grammar, not one lucky greedy path, keeps it valid.
    const r = await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: MAX, temperature: 1,
      seed: 11 + i, n: 2, response_format: rf(name) });
    check(r.choices.length === 2, `chat ${name}: two choices`);
    for (const c of r.choices) validate(name, c.message.content, c.finish_reason, `chat ${name} choice ${c.index}`);

    const s = await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: MAX, temperature: 1,
      seed: 11 + i, n: 2, response_format: rf(name), stream: true });
    const texts = ['', ''], fin = [null, null];
    for await (const chunk of s) for (const c of chunk.choices) {
      if (c.delta.content) texts[c.index] += c.delta.content;
      if (c.finish_reason) fin[c.index] = c.finish_reason;
    }
    for (const k of [0, 1]) {
      validate(name, texts[k], fin[k], `chat stream ${name} choice ${k}`);
      check(texts[k] === r.choices[k].message.content, `chat stream ${name}: seeded stream equals non-streamed`,
            { stream: texts[k], plain: r.choices[k].message.content });
    }
  }
  // Control: the same request unconstrained does not produce valid instances.
  const u = await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: 40, temperature: 1, seed: 11, n: 2 });
  const valid = u.choices.filter((c) => { try { return ajv.validate(SCHEMAS.person, JSON.parse(c.message.content)); } catch { return false; } });
  check(valid.length === 0, 'control: unconstrained replies do not fit the schema', u.choices.map((c) => c.message.content));
}

async function testJsonObjectAndChoice(openai) {
  const r = await openai.chat.completions.create({ model: MODEL, messages: msgs('Reply with a JSON object.'), max_tokens: MAX,
    temperature: 1, seed: 5, n: 2, response_format: { type: 'json_object' } });
  for (const c of r.choices) {
    if (c.finish_reason !== 'stop') continue;
    let v = null;
    try { v = JSON.parse(c.message.content); } catch {}
    check(v !== null && typeof v === 'object' && !Array.isArray(v), 'json_object: reply is a JSON object', c.message.content);
    if (v) validated++;
  }
  const choices = ['red', 'green', 'blue', 'greenish'];
  for (const stream of [false, true]) {
    const req = { model: MODEL, messages: msgs('Pick a colour.'), max_tokens: 16, temperature: 1, seed: 3, n: 3,
      structured_outputs: { choice: choices } };
    let got = [];
    if (!stream) {
      const c = await openai.chat.completions.create(req);
      got = c.choices.map((x) => [x.message.content, x.finish_reason]);
    } else {
      const s = await openai.chat.completions.create({ ...req, stream: true });
      const t = ['', '', ''], f = [null, null, null];
      for await (const chunk of s) for (const x of chunk.choices) {
        if (x.delta.content) t[x.index] += x.delta.content;
        if (x.finish_reason) f[x.index] = x.finish_reason;
      }
      got = t.map((x, k) => [x, f[k]]);
    }
    for (const [text, fin] of got)
      check(fin === 'stop' && choices.includes(text), `choice${stream ? ' stream' : ''}: reply is one of the choices`, { text, fin });
  }
  // Completions: vLLM's structured_outputs and response_format.
  const c = await openai.completions.create({ model: MODEL, prompt: 'The colour is', max_tokens: 16, temperature: 1, seed: 2,
    structured_outputs: { choice: choices } });
  check(c.choices[0].finish_reason === 'stop' && choices.includes(c.choices[0].text), 'completions choice', c.choices[0]);
  const cj = await openai.completions.create({ model: MODEL, prompt: 'JSON:', max_tokens: MAX, temperature: 1, seed: 4,
    structured_outputs: { json: SCHEMAS.person } });
  validate('person', cj.choices[0].text, cj.choices[0].finish_reason, 'completions structured_outputs.json');
  const cr = await openai.completions.create({ model: MODEL, prompt: 'JSON:', max_tokens: MAX, temperature: 1, seed: 6,
    response_format: rf('sentiment') });
  validate('sentiment', cr.choices[0].text, cr.choices[0].finish_reason, 'completions response_format');
}

async function testResponses(openai) {
  const format = { type: 'json_schema', name: 'tags', schema: SCHEMAS.tags, strict: true };
  const r = await openai.responses.create({ model: MODEL, input: PROMPT, max_output_tokens: MAX, temperature: 1,
    text: { format } });
  validate('tags', r.output_text, r.status === 'completed' ? 'stop' : 'length', 'responses text.format');
  const s = await openai.responses.create({ model: MODEL, input: PROMPT, max_output_tokens: MAX, temperature: 1,
    text: { format: { ...format, name: 'nested', schema: SCHEMAS.nested } }, stream: true });
  let text = '', status = null;
  for await (const ev of s) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') status = ev.response.status;
  }
  validate('nested', text, status === 'completed' ? 'stop' : 'length', 'responses stream text.format');
}

async function testAnthropic(anthropic) {
  const r = await anthropic.messages.create({ model: MODEL, max_tokens: MAX, messages: msgs(), temperature: 1,
    output_config: { format: { type: 'json_schema', schema: SCHEMAS.person } } });
  const text = r.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  validate('person', text, r.stop_reason === 'end_turn' ? 'stop' : 'length', 'messages output_config.format');
  // The structured-outputs beta's spelling, streamed.
  const s = anthropic.messages.stream({ model: MODEL, max_tokens: MAX, messages: msgs(), temperature: 1,
    output_format: { type: 'json_schema', schema: SCHEMAS.sentiment } });
  let streamed = '';
  s.on('text', (t) => { streamed += t; });
  const final = await s.finalMessage();
  validate('sentiment', streamed, final.stop_reason === 'end_turn' ? 'stop' : 'length', 'messages stream output_format');
  try {
    await anthropic.messages.create({ model: MODEL, max_tokens: 8, messages: msgs(),
      output_config: { format: { type: 'json_schema', schema: { type: 'string', not: { pattern: '^a' } } } } });
    check(false, 'messages: refused keyword is an error');
  } catch (e) {
    check(e.status === 400 && /'not'/.test(e.message), 'messages: refused keyword is a 400 naming it', e.message);
  }
}

const WEATHER = { type: 'object', properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['c', 'f'] } },
  required: ['city', 'unit'], additionalProperties: false };
const CLOCK = { type: 'object', properties: { tz: { type: 'string', maxLength: 8 } }, required: ['tz'], additionalProperties: false };
const TOOLS = [{ type: 'function', function: { name: 'get_weather', parameters: WEATHER } },
  { type: 'function', function: { name: 'clock', parameters: CLOCK } }];
const BY_NAME = { get_weather: WEATHER, clock: CLOCK };

// A forced tool call (required / named) comes back as tool calls whose arguments fit the schema.
function validateCalls(calls, finish, what, only) {
  check(finish === 'tool_calls' || finish === 'length', `${what}: finish_reason tool_calls or length`, finish);
  // Cut by max_tokens (required allows any number of calls): every call but the last is complete.
  const done = finish === 'tool_calls' ? calls || [] : (calls || []).slice(0, -1);
  if (finish === 'tool_calls') check(calls && calls.length >= 1, `${what}: at least one tool call`, calls);
  for (const c of done) {
    check(BY_NAME[c.function.name] && (!only || c.function.name === only), `${what}: a called tool is offered`, c.function.name);
    let args;
    try { args = JSON.parse(c.function.arguments); } catch { check(false, `${what}: arguments parse`, c.function.arguments); continue; }
    const ok = BY_NAME[c.function.name] && ajv.validate(BY_NAME[c.function.name], args);
    check(ok, `${what}: ajv validates ${c.function.name}'s arguments`, { args, errors: ajv.errors });
    if (ok) toolsValidated++;
  }
}

let toolsValidated = 0;
async function testTools(openai, anthropic) {
  const q = msgs('What is the weather in Paris?');
  const r = await openai.chat.completions.create({ model: MODEL, messages: q, max_tokens: MAX, temperature: 1, seed: 9, n: 2,
    tools: TOOLS, tool_choice: 'required' });
  for (const c of r.choices) validateCalls(c.message.tool_calls, c.finish_reason, `tools required choice ${c.index}`);
  const s = await openai.chat.completions.create({ model: MODEL, messages: q, max_tokens: MAX, temperature: 1, seed: 10,
    tools: TOOLS, tool_choice: { type: 'function', function: { name: 'clock' } }, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of s) for (const c of chunk.choices) {
    for (const d of c.delta.tool_calls || []) {
      calls[d.index] ??= { function: { name: '', arguments: '' } };
      if (d.function?.name) calls[d.index].function.name += d.function.name;
      if (d.function?.arguments) calls[d.index].function.arguments += d.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  validateCalls(calls, finish, 'tools named, streamed', 'clock');
  check(calls.length <= 1, 'tools named: exactly one call', calls);
  const m = await anthropic.messages.create({ model: MODEL, max_tokens: MAX, messages: q, temperature: 1,
    tools: [{ name: 'get_weather', input_schema: WEATHER }], tool_choice: { type: 'any' } });
  check(['tool_use', 'max_tokens'].includes(m.stop_reason), 'messages tool_choice any: stop_reason tool_use or max_tokens', m.stop_reason);
  let uses = m.content.filter((b) => b.type === 'tool_use');
  if (m.stop_reason === 'tool_use') check(uses.length >= 1, 'messages tool_choice any: a tool_use block', m.content);
  else uses = uses.slice(0, -1);  // the last one may be cut
  check(m.content.every((b) => b.type === 'tool_use'), 'messages tool_choice any: nothing but tool_use blocks', m.content);
  for (const u of uses) {
    const ok = u.name === 'get_weather' && ajv.validate(WEATHER, u.input);
    check(ok, 'messages tool_choice any: ajv validates the input', { input: u.input, errors: ajv.errors });
    if (ok) toolsValidated++;
  }
  check(toolsValidated >= 3, `at least 3 complete tool calls validated (got ${toolsValidated})`);
}

async function testLimitsAndErrors(openai) {
  // max_tokens cuts the reply: allowed to be incomplete, reported as length.
  const r = await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: 3, temperature: 0,
    response_format: rf('nested') });
  check(r.choices[0].finish_reason === 'length', 'max_tokens: finish_reason length', r.choices[0]);
  check(r.choices[0].message.content.startsWith('{'), 'max_tokens: the cut reply is the start of an object', r.choices[0].message.content);
  try {
    await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: 8,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', not: { pattern: '^a' } } } } });
    check(false, 'chat: refused keyword is an error');
  } catch (e) {
    check(e.status === 400 && /'not'/.test(e.message) && e.param === 'response_format.json_schema.schema',
          'chat: refused keyword is a 400 naming it and the field', { status: e.status, message: e.message, param: e.param });
  }
  try {
    await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: 8, structured_outputs: { structural_tag: '{}' } });
    check(false, 'chat: unsupported structured_outputs field is an error');
  } catch (e) {
    check(e.status === 400 && e.param === 'structured_outputs.structural_tag', 'chat: structured_outputs.structural_tag is a 400', e.message);
  }
  try {
    await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: 8, structured_outputs: { regex: '(a' } });
    check(false, 'chat: a malformed regex is an error');
  } catch (e) {
    check(e.status === 400 && e.param === 'structured_outputs.regex', 'chat: a malformed structured_outputs.regex is a 400', e.message);
  }
  // regex and grammar are enforced: a finished reply matches (checked here by JavaScript's own RegExp).
  const pattern = '(yes|no|maybe), [a-z]{2,6}';
  for (const [field, value] of [['regex', pattern], ['grammar', 'root ::= ("yes" | "no" | "maybe") ", " [a-z]{2,6}']]) {
    for (const temperature of [0, 1]) {
      const r = await openai.chat.completions.create({ model: MODEL, messages: msgs(), max_tokens: 24, temperature, seed: 5,
        structured_outputs: { [field]: value } });
      const c = r.choices[0];
      if (c.finish_reason === 'stop')
        check(new RegExp(`^(?:${pattern})$`).test(c.message.content), `chat: structured_outputs.${field} reply matches (t=${temperature})`, c.message.content);
      else
        check(new RegExp(`^(?:${pattern})$`).test(c.message.content) || c.finish_reason === 'length', `chat: structured_outputs.${field} cut by length`, c);
    }
  }
}

async function main() {
  const srv = await startBeluga(BIN, ['serve']);
  log(`server up at ${srv.base}`);
  const openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 300000 });
  const anthropic = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 300000 });
  try {
    for (const [name, fn] of [['chat schemas', () => testChatSchemas(openai)], ['json_object, choice, completions', () => testJsonObjectAndChoice(openai)],
      ['responses', () => testResponses(openai)], ['anthropic', () => testAnthropic(anthropic)],
      ['tools', () => testTools(openai, anthropic)], ['limits and errors', () => testLimitsAndErrors(openai)]]) {
      try { await fn(); } catch (e) { check(false, `${name}: threw`, String(e && e.stack || e)); }
      log(`${name} done`);
    }
    // Most sampled replies must have finished (else the ajv checks were vacuous).
    check(validated >= 12, `at least 12 replies finished and validated (got ${validated})`);
    log(`${validated} replies and ${toolsValidated} tool calls validated by ajv`);
  } finally {
    const { code } = await stopBeluga(srv);
    check(code === 0, `server exits cleanly (code ${code})`, srv.stderr().slice(-2000));
  }
  if (failures) { console.error(`${failures} failure(s)`); process.exit(1); }
  console.log('e2e_structured: all checks passed');
}

main().catch((e) => { console.error(e); process.exit(1); });
