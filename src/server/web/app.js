// Beluga's web chat page: talks to this server's OpenAI API (/v1/chat/completions, streamed as
// server-sent events read with fetch + ReadableStream). No framework, no network beyond the server.
'use strict';

const KEY_STORAGE = 'beluga.apiKey';
const $ = (id) => document.getElementById(id);

const state = {
  apiKey: localStorage.getItem(KEY_STORAGE) || '',
  model: null,     // the served model id (from /v1/models)
  history: [],     // {role: 'user', content} | {role: 'assistant', content, toolCalls: [{id, name, arguments, resultEl}]}
  controller: null // the AbortController of the request in flight
};

// ------------------------------------------------------------------ API key

function authHeaders() {
  return state.apiKey ? { Authorization: `Bearer ${state.apiKey}` } : {};
}

function setKey(key, remember) {
  state.apiKey = key;
  $('api-key').value = key;
  if (remember) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
  $('remember-key').checked = remember;
}

// Asks for the key (a modal dialog); resolves once one was entered.
function askForKey(reason) {
  const dlg = $('key-dialog');
  if (reason) $('key-reason').textContent = reason;
  $('key-input').value = state.apiKey;
  $('key-remember').checked = !!localStorage.getItem(KEY_STORAGE);
  return new Promise((resolve) => {
    dlg.addEventListener('close', () => {
      setKey($('key-input').value.trim(), $('key-remember').checked);
      resolve();
    }, { once: true });
    if (!dlg.open) dlg.showModal();
    $('key-input').focus();
  });
}

// ------------------------------------------------------------------ server facts

async function loadModel() {
  for (;;) {
    let res;
    try {
      res = await fetch('v1/models', { headers: authHeaders() });
    } catch (e) {
      $('model').textContent = 'server unreachable';
      return;
    }
    if (res.status === 401) {
      $('model').textContent = 'API key required';
      await askForKey(state.apiKey ? 'The server did not accept this key. Enter the right one.' : null);
      continue;
    }
    if (res.status === 503) {  // still loading the model
      $('model').textContent = 'loading the model…';
      await new Promise((r) => setTimeout(r, 1000));
      continue;
    }
    const body = await res.json().catch(() => null);
    const m = body && body.data && body.data[0];
    if (m) {
      state.model = m.id;
      $('model').textContent = `${m.id} · context ${m.max_model_len} tokens`;
    }
    return;
  }
}

// ------------------------------------------------------------------ rendering

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// Plain text with ``` fences shown as code blocks (text only: nothing the model writes becomes HTML).
function renderText(target, text) {
  target.replaceChildren();
  const parts = text.split('```');
  parts.forEach((part, i) => {
    if (i % 2 === 0) {
      if (part) target.append(el('span', null, part));
    } else {
      const nl = part.indexOf('\n');
      const lang = nl > 0 ? part.slice(0, nl).trim() : '';
      const code = /^[\w+#.-]*$/.test(lang) && nl >= 0 ? part.slice(nl + 1) : part;
      const pre = el('pre', 'code');
      pre.append(el('code', null, code));
      target.append(pre);
    }
  });
}

function addMessage(role) {
  $('empty')?.remove();
  const box = el('div', `msg ${role}`);
  box.append(el('div', 'role', role === 'user' ? 'You' : 'Assistant'));
  $('messages').append(box);
  return box;
}

function scrollDown() {
  const m = $('messages');
  m.scrollTop = m.scrollHeight;
}

// One assistant turn on screen: reasoning (apart, folded once the answer starts), answer, tool calls
// and the stats line.
class AssistantView {
  constructor() {
    this.box = addMessage('assistant');
    this.reasoningBox = el('details', 'reasoning');
    this.reasoningBox.open = true;
    this.reasoningBox.append(el('summary', null, 'Reasoning'));
    this.reasoningText = el('div', 'reasoning-text');
    this.reasoningBox.append(this.reasoningText);
    this.reasoningBox.hidden = true;
    this.content = el('div', 'content');
    this.tools = el('div', 'tool-calls');
    this.stats = el('div', 'stats');
    this.box.append(this.reasoningBox, this.content, this.tools, this.stats);
    this.content.classList.add('pending');
    this.toolEls = [];
  }

  update(turn) {
    if (turn.reasoning) {
      this.reasoningBox.hidden = false;
      this.reasoningText.textContent = turn.reasoning;
    }
    if (turn.content) {
      this.content.classList.remove('pending');
      renderText(this.content, turn.content);
      if (turn.reasoning && !this.folded) {  // the answer started: fold the reasoning away
        this.reasoningBox.open = false;
        this.folded = true;
      }
    }
    turn.toolCalls.forEach((tc, i) => {
      if (!this.toolEls[i]) {
        const box = el('div', 'tool-call');
        const head = el('div', 'tool-head');
        head.append(el('span', 'tag', 'tool call'), el('span', 'tool-name'));
        const args = el('pre', 'tool-args');
        const result = el('textarea', 'tool-result');
        result.rows = 2;
        result.placeholder = 'Tool result (sent with your next message)';
        box.append(head, args, result);
        this.tools.append(box);
        this.toolEls[i] = { box, name: head.querySelector('.tool-name'), args, result };
        tc.resultEl = result;
      }
      this.toolEls[i].name.textContent = tc.name;
      this.toolEls[i].args.textContent = prettyArgs(tc.arguments);
    });
  }

  setStats(text, cls) {
    this.stats.textContent = text;
    if (cls) this.box.classList.add(cls);
  }

  error(message) {
    this.content.classList.remove('pending');
    this.box.classList.add('error');
    this.box.append(el('div', 'error-text', message));
  }
}

function prettyArgs(s) {
  try { return JSON.stringify(JSON.parse(s), null, 2); } catch { return s; }
}

function statsText(t) {
  const parts = [];
  if (t.usage) {
    parts.push(`${t.usage.prompt_tokens} prompt`);
    parts.push(`${t.usage.completion_tokens} completion tokens`);
  } else {
    parts.push(`~${t.chunks} tokens`);
  }
  const n = t.usage ? t.usage.completion_tokens : t.chunks;
  // Decode speed after the first token; tokens that all came in one network read measure nothing.
  if (t.firstAt && n > 1 && t.lastRead > t.firstRead) {
    const s = ((t.lastAt || performance.now()) - t.firstAt) / 1000;
    if (s > 0) parts.push(`${((n - 1) / s).toFixed(1)} tokens/s`);
  }
  if (t.firstAt) parts.push(`first token ${((t.firstAt - t.startAt) / 1000).toFixed(2)} s`);
  if (t.finish) parts.push(t.finish === 'stopped' ? 'stopped' : `finish: ${t.finish}`);
  return parts.join(' · ');
}

// ------------------------------------------------------------------ requests

function numberSetting(id) {
  const v = $(id).value.trim();
  if (v === '') return undefined;
  const x = Number(v);
  if (!Number.isFinite(x)) throw new Error(`${id} must be a number`);
  return x;
}

function toolsSetting() {
  const v = $('tools').value.trim();
  if (!v) return undefined;
  let tools;
  try { tools = JSON.parse(v); } catch (e) { throw new Error(`Tools: not valid JSON (${e.message})`); }
  if (!Array.isArray(tools)) throw new Error('Tools: expected a JSON array');
  return tools;
}

function extraSetting() {
  const v = $('extra').value.trim();
  if (!v) return {};
  let extra;
  try { extra = JSON.parse(v); } catch (e) { throw new Error(`Extra request fields: not valid JSON (${e.message})`); }
  if (!extra || typeof extra !== 'object' || Array.isArray(extra))
    throw new Error('Extra request fields: expected a JSON object');
  return extra;
}

// The conversation as OpenAI messages: the system prompt, the turns, each tool call's result.
function apiMessages() {
  const out = [];
  const system = $('system').value.trim();
  if (system) out.push({ role: 'system', content: system });
  for (const m of state.history) {
    if (m.role === 'user') {
      out.push({ role: 'user', content: m.content });
      continue;
    }
    const a = { role: 'assistant', content: m.content };
    if (m.toolCalls.length) {
      a.tool_calls = m.toolCalls.map((tc) => ({
        id: tc.id, type: 'function', function: { name: tc.name, arguments: tc.arguments }
      }));
    }
    out.push(a);
    for (const tc of m.toolCalls)
      out.push({ role: 'tool', tool_call_id: tc.id, content: tc.resultEl ? tc.resultEl.value : '' });
  }
  return out;
}

// Reads an SSE body: calls onEvent(parsed JSON, number of the network read it came in) per `data:`
// event until `[DONE]`.
async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (let reads = 1; ; reads++) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
      const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (!data) continue;
      if (data === '[DONE]') return;
      onEvent(JSON.parse(data), reads);
    }
  }
}

function setBusy(busy) {
  document.body.dataset.state = busy ? 'streaming' : 'idle';
  $('send').disabled = busy;
  $('stop').disabled = !busy;
}

async function send(text) {
  let body;
  try {
    body = {
      messages: null,
      stream: true,
      stream_options: { include_usage: true },
      temperature: numberSetting('temperature'),
      top_p: numberSetting('top_p'),
      max_tokens: numberSetting('max_tokens'),
      tools: toolsSetting(),
      ...extraSetting()
    };
  } catch (e) {
    alert(e.message);
    return;
  }
  if (state.model) body.model = state.model;
  // The conversation this turn belongs to (New chat during the stream starts another one).
  const history = state.history;
  history.push({ role: 'user', content: text });
  renderText(addMessage('user').appendChild(el('div', 'content')), text);
  body.messages = apiMessages();

  const turn = { role: 'assistant', content: '', reasoning: '', toolCalls: [], chunks: 0,
                 startAt: performance.now(), firstAt: 0, lastAt: 0, usage: null, finish: '' };
  const view = new AssistantView();
  scrollDown();
  state.controller = new AbortController();
  setBusy(true);
  let frame = 0;
  const repaint = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      view.update(turn);
      view.setStats(statsText(turn));
      scrollDown();
    });
  };
  try {
    for (;;) {
      const res = await fetch('v1/chat/completions', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', ...authHeaders() },
        body: JSON.stringify(body),
        signal: state.controller.signal
      });
      if (res.status === 401) {
        await askForKey(state.apiKey ? 'The server did not accept this key. Enter the right one.' : null);
        continue;
      }
      if (!res.ok) {
        const err = await res.json().catch(() => null);
        throw new Error((err && err.error && err.error.message) || `HTTP ${res.status}`);
      }
      await readEvents(res.body, (ev, read) => {
        if (ev.error) throw new Error(ev.error.message || 'the server reported an error');
        if (ev.usage) turn.usage = ev.usage;
        const c = ev.choices && ev.choices[0];
        if (!c) return;
        const d = c.delta || {};
        const reasoning = d.reasoning_content ?? d.reasoning;
        if (reasoning || d.content || d.tool_calls) {
          turn.lastAt = performance.now();
          if (!turn.firstAt) {
            turn.firstAt = turn.lastAt;
            turn.firstRead = read;
          }
          turn.lastRead = read;
          turn.chunks++;
        }
        if (reasoning) turn.reasoning += reasoning;
        if (d.content) turn.content += d.content;
        for (const t of d.tool_calls || []) {
          const i = t.index ?? turn.toolCalls.length;
          const tc = turn.toolCalls[i] || (turn.toolCalls[i] = { id: '', name: '', arguments: '' });
          if (t.id) tc.id = t.id;
          if (t.function && t.function.name) tc.name += t.function.name;
          if (t.function && t.function.arguments) tc.arguments += t.function.arguments;
        }
        if (c.finish_reason) turn.finish = c.finish_reason;
        repaint();
      });
      break;
    }
  } catch (e) {
    if (e.name === 'AbortError') {
      turn.finish = 'stopped';
    } else {
      view.error(e.message);
      turn.failed = true;
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    frame = 0;
    state.controller = null;
    setBusy(false);
  }
  view.update(turn);
  view.setStats(statsText(turn), turn.finish === 'stopped' ? 'stopped' : 'done');
  // A failed turn stays on screen but is not sent back; a stopped one is, with what it said so far.
  if (!turn.failed && (turn.content || turn.toolCalls.length)) history.push(turn);
  scrollDown();
}

// ------------------------------------------------------------------ wiring

$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('input').value.trim();
  if (!text || state.controller) return;
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
});
$('stop').addEventListener('click', () => state.controller && state.controller.abort());
$('new-chat').addEventListener('click', () => {
  if (state.controller) state.controller.abort();
  state.history = [];
  $('messages').replaceChildren(el('p', 'muted', 'Type a message below to start.'));
  $('messages').firstChild.id = 'empty';
  $('input').focus();
});
$('api-key').addEventListener('change', () => setKey($('api-key').value.trim(), $('remember-key').checked));
$('remember-key').addEventListener('change', () => setKey($('api-key').value.trim(), $('remember-key').checked));

$('api-key').value = state.apiKey;
$('remember-key').checked = !!localStorage.getItem(KEY_STORAGE);
loadModel();
$('input').focus();
