// pvisor's JavaScript driver: one persistent `vm` context per code-interpreter
// context, speaking the agent's protocol (../PROTOCOL.md): JSON lines in on
// fd 3 (`{"op":"exec","code"}`), out on fd 4 (`ready`, `result`, `error`,
// `done`). Written for pvisor; shipped inside the agent.
//
// - The cell's completion value (the value of its last expression statement)
//   is the result, as `util.inspect` text; `undefined` gives none.
// - Top-level `await`: a cell that does not compile as a script because of
//   `await` runs as an async function; its top-level `let`/`const`/`var`
//   declarations at the start of a line become properties of the context's
//   global object, so they persist, and its last line, when it is an
//   expression, is the result.
// - `console.log` writes to stdout (fd 1), `console.error` to stderr.
// - Errors: name, message, and the stack lines of the user's cells only.
// - SIGINT interrupts a running cell (sync code through `breakOnSigint`,
//   awaiting code by rejecting the cell); idle, it is ignored.
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');

// Reopen the control pipes close-on-exec (node opens files with O_CLOEXEC)
// so children of user code do not inherit them; keep fds 3/4 if /proc is
// missing.
function reopen(fd, flags) {
  try {
    const n = fs.openSync('/proc/self/fd/' + fd, flags);
    fs.closeSync(fd);
    return n;
  } catch (_) {
    return fd;
  }
}
const ctlIn = reopen(3, 'r');
const ctlOut = reopen(4, 'w');

function send(msg) {
  // stdout/stderr are pipes, written synchronously by node on Linux: what the
  // cell printed is already in them when this message is written.
  const line = Buffer.from(JSON.stringify(msg) + '\n');
  let off = 0;
  while (off < line.length) {
    try {
      off += fs.writeSync(ctlOut, line, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

// The cells' console writes with fs.writeSync: an interrupt (which
// terminates the script wherever it is) then cannot leave a half-done
// stream write behind, which would hold back all later output.
const { EventEmitter } = require('events');
function syncStream(fd) {
  const s = new EventEmitter();
  s.write = (chunk) => {
    const b = Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk));
    let off = 0;
    while (off < b.length) {
      try {
        off += fs.writeSync(fd, b, off);
      } catch (e) {
        if (e.code !== 'EAGAIN') return false;
      }
    }
    return true;
  };
  s.isTTY = false;
  return s;
}
const cellConsole = new console.Console({ stdout: syncStream(1), stderr: syncStream(2) });

const sandbox = {
  console: cellConsole, process, require, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, structuredClone, AbortController, AbortSignal, fetch: globalThis.fetch,
  module, exports: module.exports, __filename: '[pvisor]', __dirname: process.cwd(),
};
const context = vm.createContext(sandbox);
let count = 0;
let interruptCurrent = null;

process.on('SIGINT', () => {
  if (interruptCurrent) interruptCurrent();
});

class Interrupted extends Error {}

function isSyntaxErrorAboutAwait(e) {
  return e && e.name === 'SyntaxError' && /await/.test(String(e.message));
}

// The async form of a cell: declarations hoisted to the global object and
// the last line returned when it is an expression.
function asyncSource(code) {
  const body = code.replace(/^(?:let|const|var)\s+([A-Za-z_$][\w$]*)\s*=/gm, 'globalThis.$1 =');
  const lines = body.replace(/\s+$/, '').split('\n');
  const last = lines.pop() || '';
  const head = lines.join('\n');
  const withReturn = `(async () => {\n${head}\nreturn (${last.replace(/;\s*$/, '')}\n);\n})()`;
  try {
    new vm.Script(withReturn);
    return withReturn;
  } catch (_) {
    return `(async () => {\n${body}\n})()`;
  }
}

function userStack(e, name) {
  const stack = (e && typeof e.stack === 'string') ? e.stack.split('\n') : [];
  const frames = stack.slice(1).filter((l) => l.includes('<cell-'));
  return [`${name}: ${e && e.message !== undefined ? e.message : String(e)}`].concat(frames);
}

function errorMessage(e) {
  if (e instanceof Interrupted) {
    return { t: 'error', ename: 'KeyboardInterrupt', evalue: 'interrupted', traceback: ['KeyboardInterrupt'] };
  }
  const isObj = e !== null && (typeof e === 'object' || typeof e === 'function');
  const name = isObj && typeof e.name === 'string' ? e.name : 'Error';
  let evalue;
  if (isObj && 'message' in e) evalue = String(e.message);
  else evalue = util.inspect(e);
  if (isObj && (e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED' || /interrupted by .?SIGINT/.test(evalue))) {
    return { t: 'error', ename: 'KeyboardInterrupt', evalue: 'interrupted', traceback: ['KeyboardInterrupt'] };
  }
  return { t: 'error', ename: name, evalue, traceback: isObj ? userStack(e, name) : [name + ': ' + evalue] };
}

function sendResult(value) {
  if (value === undefined) return;
  send({ t: 'result', data: { 'text/plain': util.inspect(value) }, main: true });
}

// node can keep a SIGINT that reached a script's interrupt watchdog just
// as the script returned, and throw it at the next script run with
// `breakOnSigint`. An empty run before each cell takes it (the agent
// repeats its SIGINTs while the cell it interrupts is still running).
const absorber = new vm.Script('undefined');
function absorbStaleInterrupt() {
  try {
    absorber.runInContext(context, { breakOnSigint: true });
  } catch (_) {
    // the stale interrupt: dropped
  }
}

async function exec(code) {
  absorbStaleInterrupt();
  count += 1;
  const filename = `<cell-${count}>`;
  let failure = null;
  try {
    let script;
    let isAsync = false;
    try {
      script = new vm.Script(code, { filename });
    } catch (e) {
      if (!isSyntaxErrorAboutAwait(e)) throw e;
      script = new vm.Script(asyncSource(code), { filename });
      isAsync = true;
    }
    let value = script.runInContext(context, { breakOnSigint: true, displayErrors: false });
    if (isAsync) {
      value = await new Promise((resolve, reject) => {
        interruptCurrent = () => reject(new Interrupted());
        Promise.resolve(value).then(resolve, reject);
      });
    }
    sendResult(value);
  } catch (e) {
    failure = e;
  } finally {
    interruptCurrent = null;
  }
  if (failure !== null) send(errorMessage(failure));
  send({ t: 'done', count });
}

// Control input: whole lines, one cell at a time.
const net = require('net');
const input = new net.Socket({ fd: ctlIn, readable: true, writable: false });
let pending = '';
let queue = Promise.resolve();
input.setEncoding('utf8');
input.on('data', (chunk) => {
  pending += chunk;
  let nl;
  while ((nl = pending.indexOf('\n')) >= 0) {
    const line = pending.slice(0, nl);
    pending = pending.slice(nl + 1);
    if (!line.trim()) continue;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (_) {
      continue;
    }
    if (msg.op === 'exec') queue = queue.then(() => exec(String(msg.code)));
  }
});
input.on('end', () => process.exit(0));
input.on('error', () => process.exit(0));

send({ t: 'ready', version: process.version });
