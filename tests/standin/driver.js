// The stand-in's node driver: what hluk's node image does inside the micro-VM.
//
// hyperlight-unikraft's drivers/node/hl_nodedriver.c starts one Node.js process at boot on a
// bootstrap (the C string of its write_bootstrap(), /tmp/hl_bootstrap.js) and hands it each
// call's code down a pipe (drivers/hl_child.h). The bootstrap, reproduced here and nothing
// kinder:
// - `require`, `module`, `__dirname` (/tmp) and `__filename` (/tmp/hl_bootstrap.js) are the
//   bootstrap's, made global; `exports` is not; process.argv stays the bootstrap's;
// - the environment is set by `process.env[K] = V` lines, then the code runs as an indirect
//   eval, `(0, eval)(code)`: a sloppy script at global scope, no top-level await;
// - process.exit is replaced by a function that throws (HlExit) to end the call; an error
//   nothing caught and a rejection nothing handled end it with status 1, their stack printed
//   with console.error (not Node's own banner); a returned promise's rejection likewise;
// - the call ends once the event loop drains ('beforeExit'), with process.exitCode (or 0);
// - the warm-exec is a call of its own, before the code's, in the same process; a call that
//   fails prints `hl_driver: dispatch callback failed` (drivers/hl_driver.h) and its status,
//   & 0xff, is hluk's.
// The image holds node:22-alpine's binary alone (drivers/node/Dockerfile): no npm, no
// node_modules, no /bin/sh; the stand-in binds the host's node and its libraries only.
// The stand-in passes its configuration as argv[2] and a descriptor for the status, as
// tests/standin/driver.py has it.
"use strict";
const fs = require("fs");

const config = JSON.parse(process.argv[2]);
process.argv.splice(2);
const statusFd = config.status_fd;
const CALL_FAILED = "hl_driver: dispatch callback failed\n";

globalThis.require = require;
globalThis.module = module;
globalThis.__dirname = __dirname;
globalThis.__filename = __filename;

class HlExit extends Error {
  constructor(code) {
    super("process.exit");
    this.code = code;
  }
}
process.exit = (code) => {
  throw new HlExit(code === undefined ? process.exitCode ?? 0 : code);
};

let onEnd = null;
function end(status) {
  const then = onEnd;
  onEnd = null;
  if (then !== null) then(Number(status) & 0xff);
}
function exited(error) {
  if (error instanceof HlExit) {
    end(error.code);
    return;
  }
  console.error((error && error.stack) || error);
  end(1);
}
process.on("uncaughtException", exited);
process.on("unhandledRejection", exited);

// One call: its environment, its code, and its end once the loop drains.
function call(code, then) {
  onEnd = then;
  process.once("beforeExit", function drained() {
    if (onEnd === then) end(process.exitCode ?? 0);
  });
  try {
    const env = Object.entries(config.environ)
      .map(([key, value]) => `process.env[${JSON.stringify(key)}]=${JSON.stringify(value)};`)
      .join("\n");
    (0, eval)(env);
    const result = (0, eval)(code);
    if (result && typeof result.then === "function") result.then(undefined, exited);
  } catch (error) {
    exited(error);
  }
}

function finish(status) {
  process.exitCode = undefined;
  if (status !== 0) {
    try {
      fs.writeSync(2, CALL_FAILED);
    } catch (_) {
      // the console is gone
    }
  }
  fs.writeSync(statusFd, `${status}\n`);
  process.reallyExit(status);
}

for (const key of Object.keys(process.env)) delete process.env[key];
if (config.warm_exec !== null) {
  // The next call comes down the driver's pipe, read as any input is: from the event loop.
  call(config.warm_exec, (status) => {
    process.exitCode = undefined;
    if (status !== 0) finish(status);
    else setImmediate(() => call(config.code, finish));
  });
} else {
  call(config.code, finish);
}
