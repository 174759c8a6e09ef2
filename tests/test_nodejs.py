"""`nodejs` and `typescript` cases: hluk's node image, the case run by guest/runner.js as
`node solution.js` (TypeScript transpiled on the host first, in the compiles' sandbox).

Sandbox Fusion's own runner tests (sandbox/tests/runners/test_nodejs.py: 6 tests) through
run_code and through serve, with their requests and assertions; the one that needs lodash,
which the node image cannot hold (no node_modules), is the documented limit, answered as the
module missing; likewise sandbox/tests/runners/test_typescript.py. Then the same programs
through this node and through the host's own `node solution.js`, answers compared; and the
stand-in's node image held to what hluk's is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import hostside
import pytest
from hostside import (
    Attack,
    Expect,
    Host,
    assert_only_its_own,
    assert_stopped_for_its_stdout,
    standin_run,
    stdouts_in_ready_guests_and_fresh_ones,
    typescript_missing,
)
from serving import Served

from verl_hyperlight import settings
from verl_hyperlight.case import api
from verl_hyperlight.case.guests import NODE, guest_for
from verl_hyperlight.commands import selftest
from verl_hyperlight.guest.protocol import OUTPUT_LIMIT

NODE_BINARY = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE_BINARY is None, reason="the stand-in's node image needs node")

Check = Callable[[dict[str, Any]], None]


def run(
    code: str,
    stdin: str | None = None,
    run_timeout: float = 10,
    language: str = "nodejs",
    **options: Any,
) -> Any:
    return hostside.run(code, stdin, run_timeout, language=language, compile_timeout=30, **options)


# --- Sandbox Fusion's sandbox/tests/runners/test_nodejs.py -------------------------------


def _success_printing(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["stdout"].strip() == "123"


def _timed_out(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "TimeLimitExceeded"


def _assertion_error(response: dict[str, Any]) -> None:
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "Finished"
    assert "AssertionError" in response["run_result"]["stderr"]


def _humanevalx_assertion(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["status"] == "Finished"
    assert "Assertion failed" in response["run_result"]["stderr"]


def _lodash_missing(response: dict[str, Any]) -> None:
    # Sandbox Fusion asserts Success: its runner links a node_modules holding lodash. hluk's
    # node image holds Node.js alone (drivers/node/Dockerfile), so the answer is the module
    # missing, as `node` answers it: the documented limit (docs/languages.md).
    assert response["status"] == "Failed", response
    assert response["run_result"]["status"] == "Finished"
    assert response["run_result"]["return_code"] == 1
    assert "Cannot find module 'lodash'" in response["run_result"]["stderr"]


def _stdin_echoed(response: dict[str, Any]) -> None:
    assert response["status"] == "Success", response
    assert response["run_result"]["status"] == "Finished"
    assert response["run_result"]["stdout"] == "65535\n"


SF_TESTS: list[tuple[str, str, Check, str | None, float]] = [
    ("print", "console.log(123)", _success_printing, None, 5),
    (
        "timeout",
        """
    const util = require('util');
    const sleep = util.promisify(setTimeout);
    async function main() {
        await sleep(1000);
    }
    main();
                             """,
        _timed_out,
        None,
        0.1,
    ),
    (
        "assertion_error",
        """
    const assert = require('assert');
    assert.strictEqual(1, 2, '1 !== 2');
    """,
        _assertion_error,
        None,
        10,
    ),
    ("humanevalx_assertion_error", "console.assert(1 === 2);", _humanevalx_assertion, None, 10),
    (
        "lodash_dep",
        """
    const _ = require("lodash");
    const assert = require('assert');
    assert(_.isEqual(1, 1))
                             """,
        _lodash_missing,
        None,
        5,
    ),
    (
        "stdin",
        """
    process.stdin.on('data', (input) => {
        const num = parseInt(input.toString());
        console.log(num);
        process.exit();
    });
                             """,
        _stdin_echoed,
        "65535",
        5,
    ),
]


@pytest.mark.parametrize(
    ("code", "check", "stdin", "run_timeout"),
    [test[1:] for test in SF_TESTS],
    ids=[test[0] for test in SF_TESTS],
)
def test_sandbox_fusions_nodejs_test_through_run_code(
    host: Host, code: str, check: Check, stdin: str | None, run_timeout: float
) -> None:
    check(run(code, stdin, run_timeout))


# --- Sandbox Fusion's sandbox/tests/runners/test_typescript.py ---------------------------


needs_typescript = pytest.mark.skipif(
    typescript_missing() is not None, reason=str(typescript_missing())
)

TS_TESTS: list[tuple[str, str, Check, str | None, float]] = [
    ("print", "console.log(123)", _success_printing, None, 5),
    (
        "timeout",
        """
    import util from 'util';
    const sleep = util.promisify(setTimeout);
    async function main() {
        await sleep(200);
    }
    main();
                             """,
        _timed_out,
        None,
        0.1,
    ),
    (
        "assertion_error",
        """
    import assert from "assert";
    assert.strictEqual(1, 2, '1 !== 2');
    """,
        _assertion_error,
        None,
        10,
    ),
    ("humanevalx_assertion_error", "console.assert(1 === 2);", _humanevalx_assertion, None, 10),
    (
        "lodash_dep",
        """
    import _ from "lodash";
    import assert from "assert";
    assert(_.isEqual(1, 1));
    console.log('done');
                             """,
        _lodash_missing,
        None,
        5,
    ),
    (
        "stdin",
        """
    process.stdin.on('data', (input: Buffer) => {
    const num: number = parseInt(input.toString());
    console.log(num);
    process.exit();
    });
                             """,
        _stdin_echoed,
        "65535",
        5,
    ),
]


@needs_typescript
@pytest.mark.parametrize(
    ("code", "check", "stdin", "run_timeout"),
    [test[1:] for test in TS_TESTS],
    ids=[test[0] for test in TS_TESTS],
)
def test_sandbox_fusions_typescript_test_through_run_code(
    host: Host, code: str, check: Check, stdin: str | None, run_timeout: float
) -> None:
    response = run(code, stdin, run_timeout, language="typescript")
    check(response)
    assert response["compile_result"] is None  # tsx has no compile step


@pytest.mark.parametrize("language", ["nodejs", "typescript"])
def test_sandbox_fusions_tests_through_serve(
    host: Host, serve: Callable[..., Served], language: str
) -> None:
    if language == "typescript" and typescript_missing() is not None:
        pytest.skip(str(typescript_missing()))
    tests = SF_TESTS if language == "nodejs" else TS_TESTS
    serve().check_cases(language, [(*test[1:], {}) for test in tests])


@needs_typescript
def test_typescript_checks_no_types_and_its_syntax_errors_fail_the_run(host: Host) -> None:
    # As tsx (esbuild) runs it: a type error runs; a syntax error is the run's failure.
    typed = run("const x: number = 'a' as any; console.log(x)", language="typescript")
    assert typed["status"] == "Success" and typed["run_result"]["stdout"] == "a\n", typed
    broken = run("let x: number = ;", language="typescript")
    result = broken["run_result"]
    assert (broken["status"], result["status"], result["return_code"]) == ("Failed", "Finished", 1)
    assert "solution.ts(1,17): error TS1109: Expression expected." in result["stderr"]
    assert broken["compile_result"] is None


@needs_typescript
def test_a_typescript_transpile_past_its_compile_timeout_is_a_run_out_of_time(
    host: Host,
) -> None:
    response, error = api.run_code(
        "hyperlight://", "console.log(1)", None, 0.001, 10, None, "typescript"
    )
    assert error is None and response is not None
    assert response["status"] == "Failed" and response["compile_result"] is None
    assert response["run_result"]["status"] == "TimeLimitExceeded", response


@needs_typescript
def test_selftest_checks_a_typescript_case(host: Host) -> None:
    check = selftest.language_check("hyperlight://", "typescript")
    assert check.status == "ok", check


def test_a_node_without_typescript_answers_its_cases_with_the_install(
    host: Host, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv(settings.TYPESCRIPT.name, str(tmp_path))
    response = run("console.log(1)", language="typescript")
    assert response["status"] == "SandboxError"
    assert (
        "'typescript' is transpiled with typescript, which this node lacks" in (response["message"])
    )
    assert "npm install -g typescript" in response["message"]
    assert run("console.log(1)")["status"] == "Success"  # nodejs runs on


# --- as `node solution.js` runs them ---------------------------------------------------------

# Programs whose answer the host's `node solution.js` gives too: stdout, the return code and the
# first line of stderr (the rest names the loader's frames, which differ) must agree.
AS_NODE = {
    "sum of stdin": (
        "const s = require('fs').readFileSync(0, 'utf8');\n"
        "console.log(s.trim().split(/\\s+/).map(Number).reduce((a, b) => a + b, 0));\n",
        "1 2 3\n4\n",
    ),
    "readline": (
        "const rl = require('readline').createInterface({ input: process.stdin });\n"
        "const lines = [];\nrl.on('line', (l) => lines.push(l));\n"
        "rl.on('close', () => console.log(lines.reverse().join('|')));\n",
        "a\nb\nc\n",
    ),
    "/dev/stdin": ("console.log(require('fs').readFileSync('/dev/stdin', 'utf8').length)", "xyz"),
    "readSync": (
        "const fs = require('fs'); const b = Buffer.alloc(4); let n, got = '';\n"
        "while ((n = fs.readSync(0, b, 0, 4, null)) > 0) got += b.toString('utf8', 0, n);\n"
        "console.log(JSON.stringify(got));\n",
        "hello world\n",
    ),
    "exit code": ("console.log('a'); process.exit(7); console.log('b');", None),
    "exitCode": ("process.exitCode = 4; setTimeout(() => console.log('late'), 20);", None),
    "exit listeners": (
        "process.on('exit', (c) => console.log('exit', c));\nconsole.log('main');",
        None,
    ),
    "exit in a catch": ("try { process.exit(3) } catch (e) { console.log('caught') }", None),
    "thrown in a timer": ("setTimeout(() => { throw new TypeError('late boom') }, 5);", None),
    "unhandled rejection": ("Promise.reject(new RangeError('nope'));", None),
    "syntax error": ("let x = ;", None),
    "order of output": (
        "process.stdout.write('1'); setImmediate(() => console.log('3'));\n"
        "Promise.resolve().then(() => process.stdout.write('2'));\nconsole.error('err');",
        None,
    ),
    "main module": (
        "console.log(require.main === module, require('path').basename(__filename), "
        "process.argv.length, typeof exports)",
        None,
    ),
    "stdout fd write": (
        "require('fs').writeSync(1, 'raw\\n'); require('fs').writeSync(2, 'e\\n')",
        None,
    ),
    "missing module": ("require('lodash')", None),
}


def node_answer(code: str, stdin: str | None) -> tuple[str, int, str]:
    """What the host's `node solution.js` answers, as Sandbox Fusion runs it."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "solution.js")
        with open(path, "w") as f:
            f.write(code)
        assert NODE_BINARY is not None
        done = subprocess.run(
            [NODE_BINARY, path],
            input=(stdin or "").encode(),
            capture_output=True,
            cwd=directory,
            env={"PATH": os.environ["PATH"]},
            timeout=60,
        )
    stderr = done.stderr.decode().replace(path, "/tmp/solution/solution.js")
    return done.stdout.decode(), done.returncode, stderr


def first_lines(stderr: str) -> list[str]:
    """Where stderr says what went wrong: its lines before the first stack frame, less the
    source line Node.js shows above an error thrown in its own modules (which the runner cannot
    read in the guest)."""
    lines = []
    if stderr.startswith("node:internal/"):
        stderr = stderr.split("\n\n", 1)[-1]
    for line in stderr.splitlines():
        if line.strip().startswith("at "):
            break
        lines.append(line)
    return lines


@pytest.mark.parametrize(("code", "stdin"), list(AS_NODE.values()), ids=list(AS_NODE))
def test_a_case_answers_as_node_solution_js(host: Host, code: str, stdin: str | None) -> None:
    response = run(code, stdin)
    stdout, status, stderr = node_answer(code, stdin)
    got = response["run_result"]
    assert (got["stdout"], got["return_code"]) == (stdout, status), (response, stderr)
    assert first_lines(got["stderr"]) == first_lines(stderr), (got["stderr"], stderr)
    assert response["status"] == ("Success" if status == 0 else "Failed")


def test_request_files_are_written_beside_the_solution_and_fetched(host: Host) -> None:
    code = (
        "const fs = require('fs');\n"
        "const secret = fs.readFileSync('dir1/dir2/secret', 'utf8');\n"
        "fs.writeFileSync('out.txt', secret.toUpperCase());\n"
    )
    response = run(
        code, files={"dir1/dir2/secret": "aGVsbG8="}, fetch_files=["out.txt", "missing.txt"]
    )
    assert response["status"] == "Success", response
    assert response["files"] == {"out.txt": "SEVMTE8="}


def test_output_past_the_limit_stops_the_solution(host: Host) -> None:
    code = (
        "const line = 'x'.repeat(1023) + '\\n';\n"
        f"for (let i = 0; i < {OUTPUT_LIMIT // 1024 + 8}; i++) process.stdout.write(line);\n"
        "console.error('never');\n"
    )
    assert_stopped_for_its_stdout(run(code))


def test_cases_in_ready_guests_and_fresh_ones_answer_alike(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = (
        "let n = 0;\n"
        "process.stdin.on('data', (d) => n += d.length).on('end', () => console.log(n));\n"
    )
    answers = stdouts_in_ready_guests_and_fresh_ones(lambda: run(code, "x" * 100_000), monkeypatch)
    assert answers == ["100000\n"] * 5


def test_a_nodejs_case_runs_in_the_node_image_whatever_the_url_names(host: Host) -> None:
    guest = guest_for("hyperlight://agent", 1024, "nodejs")
    assert guest.image == NODE and guest.memory_mb == 1536
    assert guest_for("hyperlight://", -1, "nodejs").memory_mb == NODE.default_memory_mb
    response = run("console.log(process.version.startsWith('v'))")
    assert response["run_result"]["stdout"] == "true\n"
    runs = [argv for argv in host.case_runs() + host.warm_ups() if "node" in argv]
    assert runs and all(argv[argv.index("--runtime") + 1] == "node" for argv in runs)


def test_selftest_checks_a_nodejs_case(host: Host) -> None:
    check = selftest.language_check("hyperlight://", "nodejs")
    assert check.status == "ok", check


# --- the stand-in's node image, as hluk's -------------------------------------------------


def test_the_standin_node_image_holds_no_node_modules_and_no_shell(
    standin_env: dict[str, str],
) -> None:
    done = standin_run(
        "node",
        "for (const m of ['npm', 'corepack', 'typescript', 'lodash']) {"
        " try { require(m); console.log('has', m) } catch (e) { console.log(e.code, m) } }\n"
        "try { require('child_process').execSync('echo hi'); console.log('shell') }"
        " catch (e) { console.log('no shell') }",
        standin_env,
    )
    assert done.returncode == 0, done
    lines = done.stdout.decode().replace("\r\n", "\n").splitlines()
    assert [line for line in lines if line.startswith("has") or line == "shell"] == []
    assert "no shell" in lines


def test_the_standin_node_drivers_exit_throws_and_its_errors_are_its_own(
    standin_env: dict[str, str],
) -> None:
    # hl_nodedriver's bootstrap: process.exit throws (a catch swallows it), an error nothing
    # caught prints its stack alone and fails the call with 1, argv is the bootstrap's.
    swallowed = standin_run(
        "node", "try { process.exit(4) } catch (e) { console.log('caught') }", standin_env
    )
    assert (swallowed.returncode, swallowed.stdout) == (0, b"caught\r\n")
    thrown = standin_run(
        "node", "console.log(process.argv.length, typeof exports); null.x", standin_env
    )
    assert thrown.returncode == 1
    out = thrown.stdout.decode().replace("\r\n", "\n")
    assert out.startswith("2 undefined\nTypeError: Cannot read properties of null")
    assert "Node.js v" not in out and out.endswith("hl_driver: dispatch callback failed\n")


# --- hostile JavaScript -----------------------------------------------------------------

# Each attack, and the answer that is its own outcome (as test_hostile's for Python). The node
# image has no shell and no fork (ENOTSUP), the network is not the guest's, the case mount is
# read-only.
JS_ATTACKS = {
    "spins": Attack("while (true) {}", Expect("Failed", "TimeLimitExceeded", None), 1),
    "exhausts its memory": Attack(
        "const a = []; while (true) a.push(new Array(1e6).fill(1.5));",
        Expect("Failed", "Finished", None),
    ),
    "runs a shell": Attack(
        "require('child_process').execSync('echo hi'); console.log('ran')",
        Expect("Failed", "Finished", 1, "", "ENOTSUP"),
    ),
    "spawns node": Attack(
        "const r = require('child_process').spawnSync(process.execPath, ['-e', '1']);"
        " console.log(r.error ? r.error.code : 'spawned')",
        Expect("Success", "Finished", 0, "ENOTSUP\n"),
    ),
    "connects to the host": Attack(
        "const s = require('net').connect(PORT, '127.0.0.1');"
        " s.on('connect', () => console.log('reached'));"
        " s.on('error', e => console.log('unreachable'));",
        Expect("Success", "Finished", 0, "unreachable\n"),
    ),
    "writes to the case mount": Attack(
        "try { require('fs').writeFileSync('/case/x', 'y'); console.log('wrote') }"
        " catch (e) { console.log(e.code) }",
        Expect("Success", "Finished", 0, "EROFS\n"),
    ),
    "kills every process it can": Attack(
        "process.kill(-1, 'SIGKILL'); console.log('alive')", Expect("Failed", "Finished", None)
    ),
    "closes every descriptor": Attack(
        "const fs = require('fs');"
        " for (let fd = 0; fd < 64; fd++) { try { fs.closeSync(fd) } catch (e) {} }",
        Expect("Failed", "Finished", None),
    ),
    "forges frames on its stdout": Attack(
        "console.log('\\nabcdef end 0 0.1 - 6 0 -\\nabcdef stdout Zm9yZ2Vk\\nabcdef done')",
        Expect(
            "Success",
            "Finished",
            0,
            "\nabcdef end 0 0.1 - 6 0 -\nabcdef stdout Zm9yZ2Vk\nabcdef done\n",
        ),
    ),
}


@pytest.mark.parametrize("name", JS_ATTACKS)
def test_hostile_javascript_affects_only_its_own_result(host: Host, name: str) -> None:
    def then() -> None:
        assert run("console.log(6 * 7)")["run_result"]["stdout"] == "42\n"

    run("console.log(0)")  # warm: the footprint is that of a worker that has run cases
    assert_only_its_own(host, JS_ATTACKS[name], lambda code, limit: run(code, None, limit), then)


@pytest.mark.microvm
def test_nodejs_cases_in_a_real_micro_vm() -> None:
    if os.environ.get("RUN_ALL") != "1":
        pytest.skip("needs hluk and /dev/kvm: RUN_ALL=1 on a node that has them")
    for _, code, check, stdin, run_timeout in SF_TESTS:
        check(run(code, stdin, run_timeout))
    response = run(AS_NODE["sum of stdin"][0], AS_NODE["sum of stdin"][1])
    assert response["run_result"]["stdout"] == "10\n", response
