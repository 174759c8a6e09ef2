// verl-hyperlight's guest runner for the node image: what `guest/runner.py` is for Python.
//
// hluk's node driver evaluates code in one long-lived Node.js process, so a case cannot be a
// `node solution.js` of its own: this runner gives the solution what that command would give
// it (a CommonJS main module at WORK_DIR/solution.js, `require` relative to it, process.argv,
// stdin from the case's input, stdout and stderr of their own, process.exit and the exit code),
// then reports the case on the console in the frames of `guest/protocol.py`. The host loads
// it with PROTOCOL, the constants of protocol.py, defined before it (guests.py), so both sides
// read the same definitions. Plain JavaScript, no build step: it runs as the driver evaluates
// it, in the image's Node.js (22), with nothing but Node's own modules.
"use strict";
(function install() {
  const fs = require("fs");
  const path = require("path");
  const Module = require("module");
  const { Readable } = require("stream");
  const util = require("util");

  const P = PROTOCOL; // eslint-disable-line no-undef
  const WORK_DIR = "/tmp/solution";
  const SOLUTION_FILE = path.join(WORK_DIR, "solution.js");
  // Node's own exit codes, as `node solution.js` exits with them.
  const UNCAUGHT_STATUS = 1;
  // How much of the input one 'data' event carries: a file stream's highWaterMark.
  const STDIN_CHUNK = 64 * 1024;

  // The real functions, taken before any solution can replace them: the report at the end of a
  // case uses nothing a solution reaches.
  const writeSync = fs.writeSync;
  const readSync = fs.readSync;
  const readFileSync = fs.readFileSync;
  const reallyExit = process.reallyExit;
  const emit = process.emit;
  const now = () => Number(process.hrtime.bigint()) / 1e9;

  function frame(nonce, kind, ...fields) {
    let data = Buffer.from("\n" + [nonce, kind, ...fields].join(" ") + "\n", "latin1");
    while (data.length > 0) {
      data = data.subarray(writeSync.call(fs, 1, data));
    }
  }

  function b64(buffer) {
    return Buffer.from(buffer).toString("base64");
  }

  // One case: its output, kept in the guest's memory as a file would keep it, its input, and
  // its end, reported once.
  class Case {
    constructor(nonce) {
      this.nonce = nonce;
      this.started = 0;
      this.outputs = { stdout: [], stderr: [] };
      this.sizes = { stdout: 0, stderr: 0 };
      this.limitHit = null;
      this.fetch = [];
      this.reported = false;
    }

    frame(kind, ...fields) {
      frame(this.nonce, kind, ...fields);
    }

    write(stream, chunk, encoding) {
      if (this.reported) return;
      const data =
        typeof chunk === "string"
          ? Buffer.from(chunk, typeof encoding === "string" ? encoding : "utf8")
          : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      this.outputs[stream].push(Buffer.from(data));
      this.sizes[stream] += data.length;
      if (this.sizes[stream] > P.OUTPUT_LIMIT) {
        // As a process past its file-size limit: stopped there, with SIGXFSZ's status.
        // The guest's Node.js process ends with it: nothing the solution catches goes on.
        this.limitHit = stream;
        this.finish(P.OUTPUT_LIMIT_STATUS, true);
        reallyExit.call(process, P.OUTPUT_LIMIT_STATUS);
      }
    }

    fetched() {
      let total = 0;
      return this.fetch.map((name) => {
        let data = null;
        let size = P.FILE_MISSING;
        try {
          const where = path.join(WORK_DIR, name);
          if (fs.statSync(where).isFile()) {
            data = readFileSync.call(fs, where);
            size = data.length;
          }
        } catch (_) {
          // missing, or not readable: FILE_MISSING
        }
        if (size >= 0 && total + size > P.FILES_OUT_LIMIT) {
          total = P.FILES_OUT_LIMIT + 1; // this one and every later one
          size = P.FILE_LEFT_OUT;
          data = null;
        }
        total += Math.max(size, 0);
        return [data, size];
      });
    }

    // Report the solution's end and copy its output out: once, whatever calls it next. `last`:
    // the guest ends once it is reported.
    finish(status, last = false) {
      if (this.reported) return;
      this.reported = true;
      const elapsed = now() - this.started;
      try {
        if (this.limitHit !== null) status = P.OUTPUT_LIMIT_STATUS;
        const kept = ["stdout", "stderr"].map((name) =>
          Buffer.concat(this.outputs[name]).subarray(0, P.OUTPUT_LIMIT)
        );
        const files = this.fetched();
        const sizes = files.map(([, size]) => String(size)).join(",") || "-";
        this.frame(
          P.END,
          String(status),
          elapsed.toFixed(6),
          this.limitHit === null ? "-" : this.limitHit,
          String(kept[0].length),
          String(kept[1].length),
          sizes
        );
        ["stdout", "stderr"].forEach((name, index) => this.copyOut(name, kept[index]));
        files.forEach(([data], index) => {
          if (data !== null) this.copyOut(P.FILE, data, String(index));
        });
        if (last) this.frame(P.DONE, P.LAST);
        else this.frame(P.DONE);
      } catch (_) {
        // The solution broke what the report needs: the guest ends, and the host answers the
        // run as its failure.
        reallyExit.call(process, P.REPORT_FAILED_STATUS);
      }
    }

    copyOut(kind, data, ...fields) {
      for (let offset = 0; offset < data.length; offset += P.CHUNK) {
        this.frame(kind, ...fields, b64(data.subarray(offset, offset + P.CHUNK)));
      }
    }
  }

  // The request's files, written where the service writes them (beside the solution); why
  // one cannot be, if so.
  function writeRequestFiles(kase, caseDir) {
    const manifestPath = path.join(caseDir, P.FILES);
    if (!fs.existsSync(manifestPath)) return null;
    const manifest = JSON.parse(readFileSync.call(fs, manifestPath, "utf8"));
    kase.fetch = manifest.fetch.map(String);
    for (const [name, index] of manifest.write) {
      try {
        const target = path.join(WORK_DIR, name);
        fs.mkdirSync(path.dirname(target), { recursive: true });
        fs.writeFileSync(target, readFileSync.call(fs, path.join(caseDir, P.FILE_PREFIX + index)));
      } catch (error) {
        return `cannot write the request's file ${JSON.stringify(name)}: ${error.message}`;
      }
    }
    return null;
  }

  function isStdin(file) {
    return file === 0 || file === "/dev/stdin" || file === "/proc/self/fd/0";
  }

  function stdoutName(file) {
    if (file === 1 || file === "/dev/stdout" || file === "/proc/self/fd/1") return "stdout";
    if (file === 2 || file === "/dev/stderr" || file === "/proc/self/fd/2") return "stderr";
    return null;
  }

  // stdin as a file of the case's input, and stdout and stderr as the case's own, by every way
  // a solution reaches them: the process streams (and so console), and fs on descriptors 0-2.
  function redirect(kase, input) {
    let offset = 0;
    const stdin = new Readable({
      highWaterMark: STDIN_CHUNK,
      read() {
        if (offset >= input.length) {
          this.push(null);
          return;
        }
        const end = Math.min(offset + STDIN_CHUNK, input.length);
        this.push(input.subarray(offset, end));
        offset = end;
      },
    });
    stdin.fd = 0;
    stdin.isTTY = false;
    Object.defineProperty(process, "stdin", { configurable: true, get: () => stdin });
    for (const name of ["stdout", "stderr"]) {
      const stream = process[name];
      stream.write = function write(chunk, encoding, callback) {
        if (typeof encoding === "function") [callback, encoding] = [encoding, undefined];
        kase.write(name, chunk, encoding);
        if (typeof callback === "function") process.nextTick(callback);
        return true;
      };
      stream.isTTY = false;
    }
    fs.writeSync = function writeSyncFor(fd, buffer, ...rest) {
      const name = stdoutName(fd);
      if (name === null) return writeSync.call(fs, fd, buffer, ...rest);
      if (typeof buffer === "string") {
        kase.write(name, buffer, typeof rest[1] === "string" ? rest[1] : rest[0]);
        return Buffer.byteLength(buffer);
      }
      const start = typeof rest[0] === "number" ? rest[0] : 0;
      const length = typeof rest[1] === "number" ? rest[1] : buffer.byteLength - start;
      const view = Buffer.from(buffer.buffer, buffer.byteOffset + start, length);
      kase.write(name, view);
      return length;
    };
    const writeFileSync = fs.writeFileSync;
    fs.writeFileSync = function writeFileSyncFor(file, data, options) {
      const name = stdoutName(file);
      if (name === null) return writeFileSync.call(fs, file, data, options);
      const encoding = typeof options === "string" ? options : options && options.encoding;
      kase.write(name, data, encoding);
      return undefined;
    };
    fs.readFileSync = function readFileSyncFor(file, options) {
      if (!isStdin(file)) return readFileSync.call(fs, file, options);
      const rest = input.subarray(offset);
      offset = input.length;
      const encoding = typeof options === "string" ? options : options && options.encoding;
      return encoding ? rest.toString(encoding) : Buffer.from(rest);
    };
    fs.readSync = function readSyncFor(fd, buffer, ...rest) {
      if (fd !== 0) return readSync.call(fs, fd, buffer, ...rest);
      let start = 0;
      let length = buffer.byteLength;
      if (rest.length > 0 && typeof rest[0] === "object" && rest[0] !== null) {
        start = rest[0].offset || 0;
        length = rest[0].length === undefined ? buffer.byteLength - start : rest[0].length;
      } else if (rest.length > 0) {
        start = rest[0] || 0;
        length = rest[1] === undefined ? buffer.byteLength - start : rest[1];
      }
      const count = Math.max(0, Math.min(length, input.length - offset));
      Buffer.from(buffer.buffer, buffer.byteOffset, buffer.byteLength).set(
        input.subarray(offset, offset + count),
        start
      );
      offset += count;
      return count;
    };
  }

  // What `node solution.js` prints of an error nothing caught, and its status.
  function printUncaught(kase, error) {
    let text;
    try {
      text = error instanceof Error ? util.inspect(error) : "Uncaught " + util.inspect(error);
    } catch (_) {
      text = String(error);
    }
    // The stack's frames below the solution's module are the runner's and the driver's, where
    // Node.js has its own loader's.
    text = text
      .split("\n")
      .filter((line) => !/\(eval at |hl_bootstrap\.js|^\s+at eval \(<anonymous>\)$/.test(line))
      .join("\n");
    const decorated = String(error && error.stack).startsWith(SOLUTION_FILE + ":");
    const where = error instanceof Error && !decorated && arrowOf(error);
    kase.write("stderr", (where ? where + "\n" : "") + text + "\n\nNode.js " + process.version + "\n");
  }

  // Where Node.js says an uncaught error was thrown, above it: the top frame of its stack when
  // that is the solution's, its source line and a caret under the column. (An error thrown in
  // Node's own modules has its internal line there, which the runner cannot read: none.)
  function arrowOf(error) {
    const stack = String(error.stack || "");
    const top = /\n\s+at (?:.*?\()?(.*?):(\d+):(\d+)\)?\n?/.exec(stack);
    if (top === null || top[1] !== SOLUTION_FILE) return null;
    try {
      const line = readFileSync.call(fs, SOLUTION_FILE, "utf8").split("\n")[top[2] - 1];
      let column = Number(top[3]);
      // Node.js points at the throw, the stack at the error's making: `throw new E()` is both.
      const thrown = /throw\s+$/.exec(line.slice(0, column - 1));
      if (thrown !== null) column = thrown.index + 1;
      return `${SOLUTION_FILE}:${top[2]}\n${line}\n${" ".repeat(column - 1)}^\n`;
    } catch (_) {
      return null;
    }
  }

  function run(kase, caseDir) {
    fs.mkdirSync(WORK_DIR, { recursive: true });
    const refusal = writeRequestFiles(kase, caseDir);
    if (refusal !== null) {
      kase.frame(P.REFUSED, b64(Buffer.from(refusal)));
      return;
    }
    // After the request's files: one of them named as the solution does not replace it.
    const source = readFileSync.call(fs, path.join(caseDir, P.SOLUTION), "utf8");
    fs.writeFileSync(SOLUTION_FILE, source);
    const input = readFileSync.call(fs, path.join(caseDir, P.STDIN));
    redirect(kase, input);
    process.chdir(WORK_DIR);
    process.argv = [process.execPath, SOLUTION_FILE];
    process.exitCode = undefined;

    endings(kase);

    const main = new Module(SOLUTION_FILE, null);
    main.filename = SOLUTION_FILE;
    main.id = ".";
    main.paths = Module._nodeModulePaths(WORK_DIR);
    Module._cache[SOLUTION_FILE] = main;
    process.mainModule = main;
    kase.frame(P.START);
    kase.started = now();
    try {
      main._compile(source, SOLUTION_FILE);
      main.loaded = true;
    } catch (error) {
      process.emit("uncaughtException", error, "uncaughtException");
    }
  }

  // How the case ends, as `node solution.js` ends: at process.exit, at an error nothing caught,
  // or once its event loop has drained, every 'exit' listener having run. hluk's node driver
  // runs the code as one call of a long-lived process: its process.exit throws to end the call,
  // its listeners of uncaught errors end the call with status 1, and the call ends when
  // 'beforeExit' comes; the runner's own come first, and report the case.
  function endings(kase) {
    const driverExit = process.exit;
    const driverListeners = new Set([
      ...process.listeners("uncaughtException"),
      ...process.listeners("unhandledRejection"),
    ]);
    let exiting = false;
    const statusOf = (code) => (code === undefined || code === null ? 0 : Number(code) & 0xff);
    const exitNow = () => {
      if (kase.reported) return;
      const status = statusOf(process.exitCode);
      if (!exiting) {
        exiting = true;
        try {
          emit.call(process, "exit", status);
        } catch (error) {
          printUncaught(kase, error);
          kase.finish(UNCAUGHT_STATUS);
          return;
        }
      }
      kase.finish(statusOf(process.exitCode));
    };
    process.exit = function exit(code) {
      if (code !== undefined) process.exitCode = code;
      exitNow();
      driverExit.call(process, statusOf(process.exitCode));
    };
    process.prependListener("beforeExit", exitNow);
    const uncaught = (error) => {
      if (kase.reported) return; // the driver's exit, thrown after the report
      const own = process
        .listeners("uncaughtException")
        .filter((listener) => listener !== uncaught && !driverListeners.has(listener));
      if (own.length > 0) return; // the solution's listeners handle it, as Node.js lets them
      printUncaught(kase, error);
      process.exitCode = UNCAUGHT_STATUS;
      kase.finish(UNCAUGHT_STATUS);
    };
    process.prependListener("uncaughtException", uncaught);
    process.prependListener("unhandledRejection", uncaught);
  }

  const api = {
    // Run the case mounted at `caseDir` and report it under `nonce`.
    main(caseDir, nonce) {
      run(new Case(nonce), caseDir);
    },
    // A ready guest's workload: wait for the host's GO line on the console's input, then run
    // the case as `main` does; input that ends before it ends the guest with no report.
    awaitCase(caseDir, nonce) {
      let pending = Buffer.alloc(0);
      const buffer = Buffer.alloc(4096);
      const pause = new Int32Array(new SharedArrayBuffer(4));
      while (!pending.includes(10)) {
        let count;
        try {
          count = readSync.call(fs, 0, buffer, 0, buffer.length, null);
        } catch (error) {
          // A console made non-blocking: wait a millisecond (the vCPU halts), and read again.
          if (error.code !== "EAGAIN") throw error;
          Atomics.wait(pause, 0, 0, 1);
          continue;
        }
        if (count === 0) return;
        pending = Buffer.concat([pending, buffer.subarray(0, count)]);
      }
      const line = pending.subarray(0, pending.indexOf(10)).toString("latin1").trim();
      if (line !== P.GO) return;
      api.main(caseDir, nonce);
    },
    // The warm-up's workload: report an empty case.
    probe(nonce) {
      frame(nonce, P.START);
      frame(nonce, P.END, "0", "0.000000", "-", "0", "0", "-");
      frame(nonce, P.DONE);
    },
  };
  globalThis[P.RUNNER_GLOBAL] = api;
})();
