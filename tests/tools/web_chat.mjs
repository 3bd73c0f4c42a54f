// Browser test of the web chat page `beluga serve` answers at `/`: Debian's headless Chromium
// (/usr/bin/chromium, driven by puppeteer-core; no browser download) against real servers with the
// built-in demo model. Checks:
//  - the page loads from the server alone (every request it makes goes to the server);
//  - a typed question streams an answer (seen growing), equal to the server's own greedy answer for
//    the same conversation; the request carries the system prompt and the sampling settings, and a
//    second question sends the first turn back as history; token counts and speed are shown;
//  - Stop aborts a long generation mid-way: the page says stopped, the server counts a client
//    disconnect and has no request in flight or running afterwards;
//  - the OpenAI delta shapes for reasoning and tool calls are shown apart from the answer (a canned
//    stream answered by the browser's request interception), and a tool call's result goes back;
//  - with --api-key: the page asks for the key, re-asks on a wrong one, then chats with
//    `Authorization: Bearer KEY`; a remembered key survives a reload; reasoning from a real server
//    (--chat-format deepseek-r1 makes the demo model's output reasoning) is shown apart.
// Usage: node tests/tools/web_chat.mjs [path/to/beluga] [screenshot.png]   (exit code 0 = pass)
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import { belugaBinary, startBeluga, stopBeluga } from './server.mjs';

const BIN = belugaBinary();
const SCREENSHOT = process.argv[3] || path.join(os.tmpdir(), `beluga-web-chat-${process.pid}.png`);
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const KEY = 'web-secret';
const T0 = Date.now();
process.env.OMP_WAIT_POLICY ??= 'PASSIVE';  // see e2e_server.mjs: spinning OpenMP threads slow a shared machine

let failures = 0;
function check(cond, what, extra) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}` + (extra !== undefined ? ` -- ${typeof extra === 'string' ? extra : JSON.stringify(extra)}` : ''));
  }
  return cond;
}
function log(s) { console.log(`[${((Date.now() - T0) / 1000).toFixed(1)}s] ${s}`); }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const startServer = (extra) => startBeluga(BIN, ['serve', ...extra]);

async function stopServer(s) {
  const { code } = await stopBeluga(s);
  check(code === 0, `server exits cleanly (code ${code})`, s.stderr().slice(-2000));
}

async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  return (name) => {
    const m = text.match(new RegExp(`^${name}(?:\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
}

// What the page shows for a text: ``` fences become code blocks (fence lines and language names are
// not text of the page).
function shownText(s) {
  return s.split('```').map((part, i) => {
    if (i % 2 === 0) return part;
    const nl = part.indexOf('\n');
    const lang = nl > 0 ? part.slice(0, nl).trim() : '';
    return /^[\w+#.-]*$/.test(lang) && nl >= 0 ? part.slice(nl + 1) : part;
  }).join('');
}

async function setField(page, id, value) {
  await page.$eval(`#${id}`, (e, v) => { e.value = v; e.dispatchEvent(new Event('change')); }, value);
}

// Types a question, sends it with Enter; returns the chat request body the page sent.
async function ask(page, text) {
  const sent = new Promise((resolve) => {
    const on = (req) => {
      if (req.url().endsWith('/v1/chat/completions') && req.method() === 'POST') {
        page.off('request', on);
        resolve({ body: JSON.parse(req.postData()), headers: req.headers() });
      }
    };
    page.on('request', on);
  });
  await page.click('#input');
  await page.type('#input', text);
  await page.keyboard.press('Enter');
  return sent;
}

const lastAssistant = (page, sel) =>
  page.$$eval(`.msg.assistant ${sel}`, (els) => (els.length ? els[els.length - 1].textContent : null));
const waitIdle = (page, ms = 120000) =>
  page.waitForFunction(() => document.body.dataset.state === 'idle', { timeout: ms, polling: 50 });

async function newPage(browser, base, requests) {
  const ctx = await browser.createBrowserContext();  // fresh storage (no remembered key)
  const page = await ctx.newPage();
  await page.setViewport({ width: 1280, height: 820 });
  page.on('pageerror', (e) => check(false, 'no script error on the page', e.message));
  page.on('request', (r) => requests.push(r.url()));
  page.on('dialog', (d) => { check(false, 'no alert', d.message()); d.dismiss(); });
  await page.goto(`${base}/`, { waitUntil: 'load' });
  return page;
}

async function chatTests(browser) {
  const s = await startServer([]);
  log(`server without key at ${s.base}`);
  const requests = [];
  const page = await newPage(browser, s.base, requests);
  try {
    await page.waitForFunction(() => document.getElementById('model').textContent.includes('beluga-demo-coder-mtp'),
                               { timeout: 30000 });
    check(await page.$eval('title', (e) => e.textContent) === 'Beluga chat', 'the page has its title');

    // 1. Stop aborts a long generation mid-way.
    const before = await metrics(s.base);
    await setField(page, 'system', 'You write Python.');
    await setField(page, 'max_tokens', '1500');
    await setField(page, 'temperature', '1');
    await setField(page, 'extra', '{"ignore_eos": true}');
    // The demo model is fast enough to write 1500 tokens in about a second: Stop is clicked from inside
    // the page as soon as the answer has begun, so the generation is surely still running.
    const clicked = page.evaluate(() => new Promise((resolve) => {
      const obs = new MutationObserver(() => {
        const c = document.querySelectorAll('.msg.assistant .content');
        if (c.length && c[c.length - 1].textContent.length > 0) {
          obs.disconnect();
          window.stopEnabled = !document.getElementById('stop').disabled;
          document.getElementById('stop').click();
          resolve();
        }
      });
      obs.observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
    }));
    const { body: b3 } = await ask(page, 'Write a long Python module.');
    await clicked;
    check(b3.ignore_eos === true && b3.max_tokens === 1500 && b3.messages.length === 2,
          'the extra fields are merged into the request', b3);
    check(await page.evaluate(() => window.stopEnabled), 'Stop is enabled while streaming');
    await waitIdle(page, 10000);
    const stopped = await lastAssistant(page, '.stats');
    check(stopped.includes('stopped'), 'the page says the generation stopped', stopped);
    const shown = (await lastAssistant(page, '.content')).length;
    let m;
    for (let i = 0; i < 100; i++) {  // the server sees the connection close within moments
      m = await metrics(s.base);
      if (m('beluga_client_disconnects_total') > before('beluga_client_disconnects_total') &&
          m('beluga_requests_in_flight') === 0 && m('beluga_num_requests_running') === 0) break;
      await sleep(100);
    }
    check(m('beluga_client_disconnects_total') === before('beluga_client_disconnects_total') + 1,
          'the server saw the request end by the client (one disconnect)', m('beluga_client_disconnects_total'));
    check(m('beluga_requests_in_flight') === 0 && m('beluga_num_requests_running') === 0 &&
          m('beluga_num_requests_waiting') === 0, 'no request in flight or in the engine after Stop');
    const generated = m('beluga_engine_generation_tokens_total') - before('beluga_engine_generation_tokens_total');
    check(generated < 1500, 'the engine stopped well before max_tokens', generated);
    await sleep(300);
    check((await lastAssistant(page, '.content')).length === shown, 'nothing is added after Stop');
    log(`stopped after ${generated} generated tokens`);

    // New chat in the middle of a stream ends it, and the new conversation starts empty (checked with
    // the next question's messages below).
    const renewed = page.evaluate(() => new Promise((resolve) => {
      const obs = new MutationObserver(() => {
        const c = document.querySelectorAll('.msg.assistant .content');
        if (c.length && c[c.length - 1].textContent.length > 0) {
          obs.disconnect();
          document.getElementById('new-chat').click();
          resolve();
        }
      });
      obs.observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
    }));
    await ask(page, 'Write another long Python module.');
    await renewed;
    await waitIdle(page, 10000);
    check(await page.$$eval('.msg', (e) => e.length) === 0, 'New chat clears the conversation on screen');

    // 2. A question streams an answer.
    // ignore_eos: an answer long enough to arrive in several network reads, even from this fast model.
    await setField(page, 'extra', '{"ignore_eos": true}');
    await setField(page, 'temperature', '0');
    await setField(page, 'max_tokens', '120');
    const q1 = 'Write a Python function `read_json(path)`: Load a JSON file and return its contents.';
    // Every length the answer shows on its way (recorded in the page as the DOM changes).
    await page.evaluate(() => {
      window.seenLengths = [];
      new MutationObserver(() => {
        const c = document.querySelectorAll('.msg.assistant .content');
        if (c.length) window.seenLengths.push(c[c.length - 1].textContent.length);
      }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
    });
    const { body: b1 } = await ask(page, q1);
    check(b1.stream === true && b1.stream_options?.include_usage === true, 'the page streams with usage', b1);
    check(b1.temperature === 0 && b1.max_tokens === 120 && b1.ignore_eos === true && b1.top_p === 1, 'the sampling settings are sent', b1);
    check(JSON.stringify(b1.messages) === JSON.stringify([{ role: 'system', content: 'You write Python.' },
                                                          { role: 'user', content: q1 }]),
          'the system prompt and the question are sent (New chat dropped the earlier turns)', b1.messages);
    check(b1.model === 'beluga-demo-coder-mtp', 'the page names the served model', b1.model);
    await waitIdle(page);
    const lengths = new Set((await page.evaluate(() => window.seenLengths)).filter((n) => n > 0));
    check(lengths.size >= 2, 'the answer appears while it streams (seen at several lengths)', [...lengths]);
    const a1 = await lastAssistant(page, '.content');
    const ref = await (await fetch(`${s.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: b1.messages, temperature: 0, max_tokens: 120, ignore_eos: true })
    })).json();
    const refText = ref.choices[0].message.content;
    check(a1 === shownText(refText), 'the streamed answer equals the server\'s greedy answer', { page: a1, api: refText });
    const stats1 = await lastAssistant(page, '.stats');
    check(stats1.includes(`${ref.usage.prompt_tokens} prompt`) && stats1.includes(`${ref.usage.completion_tokens} completion tokens`),
          'the token counts are shown', { stats1, usage: ref.usage });
    check(/[0-9.]+ tokens\/s/.test(stats1) && /first token [0-9.]+ s/.test(stats1), 'speed and time to first token are shown', stats1);

    // 3. The next question sends the conversation so far.
    await setField(page, 'extra', '');  // this answer ends where the model ends it
    await setField(page, 'max_tokens', '48');
    const q2 = 'Now write `write_json(path, obj)`.';
    const { body: b2 } = await ask(page, q2);
    check(b2.messages.length === 4 && b2.messages[2].role === 'assistant' && b2.messages[2].content === refText &&
          b2.messages[3].content === q2, 'the history goes back with the next question', b2.messages);
    await waitIdle(page);

    // 4. Reasoning and tool calls as the OpenAI stream carries them (a canned stream).
    await setField(page, 'tools', JSON.stringify([{ type: 'function', function: {
      name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }]));
    const chunk = (delta, finish = null) => `data: ${JSON.stringify({ object: 'chat.completion.chunk',
      choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    const canned = chunk({ role: 'assistant', content: '' }) +
      chunk({ reasoning_content: 'The user asks about the weather, ' }) + chunk({ reasoning_content: 'so I call the tool.' }) +
      chunk({ content: 'Let me check ' }) + chunk({ content: 'the weather in Paris.' }) +
      chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '' } }] }) +
      chunk({ tool_calls: [{ index: 0, function: { arguments: '{"city": ' } }] }) +
      chunk({ tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] }) + chunk({}, 'tool_calls') +
      `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 31, completion_tokens: 22, total_tokens: 53 } })}\n\n` +
      'data: [DONE]\n\n';
    await page.setRequestInterception(true);
    const intercept = (req) => {
      if (req.url().endsWith('/v1/chat/completions'))
        req.respond({ status: 200, contentType: 'text/event-stream', body: canned });
      else req.continue();
    };
    page.on('request', intercept);
    const { body: b4 } = await ask(page, 'What is the weather in Paris?');
    await waitIdle(page, 10000);
    check(b4.tools?.[0]?.function?.name === 'get_weather', 'the tools are sent', b4.tools);
    check(await lastAssistant(page, '.reasoning-text') === 'The user asks about the weather, so I call the tool.',
          'reasoning is shown', await lastAssistant(page, '.reasoning-text'));
    check(await lastAssistant(page, '.content') === 'Let me check the weather in Paris.', 'the answer is shown apart from the reasoning');
    check(await lastAssistant(page, '.tool-name') === 'get_weather', 'the tool call\'s name is shown');
    check(JSON.parse(await lastAssistant(page, '.tool-args')).city === 'Paris', 'the tool call\'s arguments are shown');
    check((await lastAssistant(page, '.stats')).includes('31 prompt · 22 completion tokens'), 'usage of the canned stream is shown');
    check((await lastAssistant(page, '.stats')).includes('finish: tool_calls'), 'the finish reason is shown');
    check(!(await lastAssistant(page, '.stats')).includes('tokens/s'), 'no speed is claimed for a burst of chunks');
    // The screenshot: the real answers above, the canned turn with reasoning and a tool call below.
    await page.evaluate(() => {
      [...document.querySelectorAll('.reasoning')].pop().open = true;
      const m = document.getElementById('messages');
      m.scrollTop = m.scrollHeight;
    });
    await page.screenshot({ path: SCREENSHOT });
    log(`screenshot: ${SCREENSHOT}`);
    await page.type('.msg.assistant .tool-result', '{"temp_c": 18}');
    const { body: b5 } = await ask(page, 'Thanks.');
    await waitIdle(page, 10000);
    const toolMsg = b5.messages.find((x) => x.role === 'tool');
    const asst = b5.messages.find((x) => x.tool_calls);
    check(asst?.tool_calls?.[0]?.id === 'call_1' && asst.tool_calls[0].function.arguments === '{"city": "Paris"}',
          'the tool call goes back in the history', asst);
    check(toolMsg?.tool_call_id === 'call_1' && toolMsg.content === '{"temp_c": 18}', 'the tool result goes back', toolMsg);
    page.off('request', intercept);
    await page.setRequestInterception(false);

    const foreign = requests.filter((u) => !u.startsWith(s.base + '/'));
    check(foreign.length === 0, 'the page makes no request beyond the server', foreign);
    check(requests.includes(`${s.base}/app.js`) && requests.includes(`${s.base}/app.css`), 'the page loads its script and style');
  } finally {
    await page.browserContext().close();
    await stopServer(s);
  }
}

async function apiKeyTests(browser) {
  const s = await startServer(['--api-key', KEY, '--chat-format', 'deepseek-r1']);
  log(`server with --api-key at ${s.base}`);
  const requests = [];
  const page = await newPage(browser, s.base, requests);
  const ctx = page.browserContext();
  try {
    await page.waitForSelector('#key-dialog[open]', { timeout: 10000 });
    await page.type('#key-input', 'wrong-key');
    await page.click('#key-ok');
    await page.waitForFunction(() => document.getElementById('key-dialog').open &&
      document.getElementById('key-reason').textContent.includes('did not accept'), { timeout: 10000 });
    await page.$eval('#key-input', (e) => { e.value = ''; });
    await page.type('#key-input', KEY);
    await page.click('#key-remember');
    await page.click('#key-ok');
    await page.waitForFunction(() => document.getElementById('model').textContent.includes('beluga-demo-coder-mtp'),
                               { timeout: 10000 });
    await setField(page, 'max_tokens', '24');
    const { headers } = await ask(page, 'Write a function add(a, b).');
    check(headers.authorization === `Bearer ${KEY}`, 'the page sends the key as a bearer token', headers.authorization);
    await waitIdle(page);
    const err = await page.$$eval('.error-text', (e) => e.map((x) => x.textContent));
    check(err.length === 0, 'the chat works with the key', err);
    const reasoning = await lastAssistant(page, '.reasoning-text');
    check(reasoning && reasoning.length > 0 && await page.$eval('.msg.assistant .reasoning', (e) => !e.hidden),
          'the server\'s reasoning_content is shown apart (deepseek-r1 format)', reasoning);
    check(/\d+ completion tokens/.test(await lastAssistant(page, '.stats')), 'usage is shown with the key');

    // A remembered key survives a reload (no dialog).
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction(() => document.getElementById('model').textContent.includes('beluga-demo-coder-mtp'),
                               { timeout: 10000 });
    check(!(await page.$eval('#key-dialog', (e) => e.open)), 'a remembered key is not asked for again');
    const st = await (await fetch(`${s.base}/v1/models`)).status;
    check(st === 401, 'the server itself still wants the key', st);
  } finally {
    await ctx.close();
    await stopServer(s);
  }
}

async function main() {
  if (!fs.existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} not found (apt-get install chromium)`);
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'beluga-chromium-'));
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: profile,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync',
           '--disable-dev-shm-usage']
  });
  try {
    await chatTests(browser);
    await apiKeyTests(browser);
  } finally {
    await browser.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().then(() => {
  if (failures) { console.error(`${failures} check(s) failed`); process.exit(1); }
  log('web chat: all checks passed');
}, (e) => { console.error(e); process.exit(1); });
