// `beluga` child processes for the Node end-to-end tests: `beluga SUBCOMMAND --port PORT ARGS...`
// on a free loopback port, ready once a path (/health) answers 200, its stdout on the test's own and
// its stderr kept for failure messages; stopped with SIGTERM (SIGKILL when that does not end it).
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

// The binary under test: the script's first argument, else $BELUGA_BINARY, else build/beluga.
export function belugaBinary() {
  return path.resolve(process.argv[2] || process.env.BELUGA_BINARY || path.join(root, 'build/beluga'));
}

// A loopback port that was free a moment ago.
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
    s.on('error', reject);
  });
}

// Starts `bin args[0] --port P args[1..]`; resolves to { proc, base, port, stderr() } once
// `healthPath` answers 200, and rejects (with its stderr) when it exits first or `timeoutMs` passes.
// proc.exited resolves to its { code, sig }.
export async function startBeluga(bin, args, { healthPath = '/health', timeoutMs = 120000 } = {}) {
  const port = await freePort();
  const proc = spawn(bin, [args[0], '--port', String(port), ...args.slice(1)], { stdio: ['ignore', 'inherit', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  proc.exited = new Promise((r) => proc.on('exit', (code, sig) => r({ code, sig })));
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`beluga ${args[0]} exited early (${proc.exitCode}):\n${stderr}`);
    try {
      if ((await fetch(base + healthPath)).status === 200) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`beluga ${args[0]} did not become healthy:\n${stderr}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { proc, base, port, stderr: () => stderr };
}

// SIGTERM (unless it already exited), then its { code, sig }; { code: 'timeout' } when it had not
// exited within `timeoutMs` (it is SIGKILLed then).
export async function stopBeluga(s, timeoutMs = 20000) {
  if (s.proc.exitCode === null) s.proc.kill('SIGTERM');
  const end = await Promise.race([s.proc.exited, new Promise((r) => setTimeout(() => r({ code: 'timeout' }), timeoutMs))]);
  if (end.code === 'timeout') s.proc.kill('SIGKILL');
  return end;
}
