"""How fast cases fail while hluk does not start guests, and how fast they run again after.

Threads send cases (one every --pace seconds each) to one warm guest through run_code. Then
hluk stops starting guests, either hanging before the guest starts (HLUK_STANDIN_HANG) or
crashing there (HLUK_STANDIN_SIGNAL=SEGV), for --outage seconds, and starts them again. It
prints, in seconds and in start-up deadlines (VERL_HYPERLIGHT_STARTUP_TIMEOUT, --deadline):
- how long after the outage began the first case was answered at once (the guest's gate open);
- how long each case answered during the outage took, before and once the gate was open: the
  first against what every case cost without a gate (its deadline, then its retry's);
- how long after the outage ended the first case succeeded again (at most the back-off the
  gate had reached: 1 s after it opened, doubled by each failed probe up to 30 s, or as
  --first-back-off and --max-back-off say; plus a probe).

Uses the stand-in hluk from tests/ unless HLUK_PATH is set (see bench_run_code.py).
Usage: python benchmarks/bench_fail_fast.py [--deadline 5] [--threads 8] [--outage 40]
(--first-back-off 30: the gate as it was before its back-off doubled, for comparison)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_code import use_standin_unless_configured

from verl_hyperlight import run_code
from verl_hyperlight.case import gate as _gate

AT_ONCE = "answered at once"


@dataclass(frozen=True)
class Answer:
    sent: float
    took: float
    status: str
    at_once: bool


def send(index: int) -> Answer:
    sent = time.monotonic()
    response, error = run_code("hyperlight://", f"print({index})", "", None, 10, 1024)
    took = time.monotonic() - sent
    assert error is None and response is not None, error
    return Answer(sent, took, response["status"], AT_ONCE in response.get("message", ""))


def outage(kind: str, args: argparse.Namespace) -> dict[str, float]:
    _gate.forget()
    answers: list[Answer] = []
    stop = threading.Event()
    counter = iter(range(10**9))
    lock = threading.Lock()

    def sender() -> None:
        while not stop.is_set():
            with lock:
                index = next(counter)
            answer = send(index)
            with lock:
                answers.append(answer)
            stop.wait(args.pace)

    send(-1)  # warm
    threads = [threading.Thread(target=sender) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    began = time.monotonic()
    os.environ.update(
        {"hang": {"HLUK_STANDIN_HANG": "1"}, "crash": {"HLUK_STANDIN_SIGNAL": "SEGV"}}[kind]
    )
    time.sleep(args.outage)
    ended = time.monotonic()
    os.environ.pop("HLUK_STANDIN_HANG", None)
    os.environ.pop("HLUK_STANDIN_SIGNAL", None)
    deadline = ended + args.max_back_off + 4 * args.deadline + 10
    while time.monotonic() < deadline:
        with lock:
            if any(a.sent >= ended and a.status == "Success" for a in answers):
                break
        time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join()

    during = [a for a in answers if began <= a.sent < ended]
    at_once = [a for a in during if a.at_once]
    waited = [a for a in during if not a.at_once]
    first_at_once = min((a.sent + a.took for a in at_once), default=float("nan"))
    recovered = min(
        (a.sent + a.took for a in answers if a.sent >= ended and a.status == "Success"),
        default=float("nan"),
    )
    return {
        "fail fast after": first_at_once - began,
        "cases that waited": len(waited),
        "median wait of those": statistics.median(a.took for a in waited)
        if waited
        else float("nan"),
        "cases answered at once": len(at_once),
        "median of those": statistics.median(a.took for a in at_once) if at_once else float("nan"),
        "recovered after": recovered - ended,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline", type=float, default=5.0, help="start-up deadline, s")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--pace", type=float, default=0.05, help="each thread's pause, s")
    parser.add_argument("--outage", type=float, default=40.0, help="how long hluk fails, s")
    parser.add_argument(
        "--first-back-off", type=float, default=_gate.BACK_OFF_FIRST_SECONDS, help="s"
    )
    parser.add_argument("--max-back-off", type=float, default=_gate.BACK_OFF_MAX_SECONDS, help="s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        print("hluk:", use_standin_unless_configured(Path(scratch)))
        os.environ["VERL_HYPERLIGHT_STARTUP_TIMEOUT"] = str(args.deadline)
        _gate.BACK_OFF_FIRST_SECONDS = args.first_back_off
        _gate.BACK_OFF_MAX_SECONDS = args.max_back_off
        d = args.deadline
        print(
            f"start-up deadline D = {d:g} s, back-off {args.first_back_off:g} s "
            f"doubling up to {args.max_back_off:g} s, {args.threads} "
            f"threads, outage {args.outage:g} s; without a gate every case took its deadline "
            f"and its retry's: 2 D = {2 * d:g} s"
        )
        for kind in ("hang", "crash"):
            found = outage(kind, args)
            print(f"\nhluk {'hanging' if kind == 'hang' else 'crashing'} before the guest starts:")
            for name, value in found.items():
                if name.startswith("cases"):
                    print(f"  {name:24} {value:8.0f}")
                else:
                    print(f"  {name:24} {value:8.3f} s  ({value / d:.2f} D)")


if __name__ == "__main__":
    main()
