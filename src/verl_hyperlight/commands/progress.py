"""What a long command is doing, on a terminal: a bar over a timed phase, the time so far of
one that is not, and the cases finished; nothing when stderr is not a terminal."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

from .. import diagnosis


@contextlib.contextmanager
def progress(what: str, seconds: float | None = None) -> Iterator[Callable[[], None]]:
    """On a terminal (stderr), what is going on and for how long, refreshed as it goes: a bar
    over `seconds` when the phase is timed, the time so far when it is not. Yields a callable
    that counts a finished case. Nothing when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield lambda: None
        return
    try:
        from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        print(f"{what} ({diagnosis.install('cli')} to see it go)", file=sys.stderr)
        yield lambda: None
        return
    timed = seconds is not None
    layout = "{desc} {bar} {elapsed} {postfix}" if timed else "{desc} {elapsed} {postfix}"
    bar = tqdm(total=seconds, desc=what, bar_format=layout, leave=False, file=sys.stderr)
    cases = [0]
    started = time.monotonic()
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(0.25):
            if timed:
                bar.n = min(time.monotonic() - started, seconds or 0.0)
            bar.set_postfix_str(f"{cases[0]} cases" if cases[0] else "", refresh=False)
            bar.refresh()

    def tick() -> None:
        cases[0] += 1

    ticker = threading.Thread(target=refresh, daemon=True)
    ticker.start()
    try:
        yield tick
    finally:
        stop.set()
        ticker.join()
        bar.close()
