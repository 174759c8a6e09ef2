"""The runner's frames on hluk's console, found and decoded as they arrive: the host's side of
``guest/protocol.py``, which both sides read."""

from __future__ import annotations

import binascii
import mmap
import os
import re

from ..guest import protocol

READ_SIZE = 64 * 1024
# Room beyond READ_SIZE in the read buffer for what may begin a marker (the nonce's length and
# two); a longer marker gets buffers of its own.
_MARKER_ROOM = 256
# The buffers of consoles whose watch is over, reused by the next ones (at most this many kept):
# a console then allocates and zero-fills none (108 KiB a case, which, on a nested VM's cold
# caches, cost a trivial case more than its reads did).
_SPARE_LIMIT = 64
_spare: list[tuple[bytearray, bytearray]] = []
# Of the console text before the solution starts (hluk's driver, the runner's set-up), the end
# is kept for failure messages; nothing the console shows after the start is ever used.
PREAMBLE_LIMIT = 4096
_BASE64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


class _Output:
    """One stream's output, as the runner announced its size: written once, where it ends up.
    Large ones live in a mapping of their own, returned to the system when the case is done
    rather than kept by the allocator of whichever thread ran the case."""

    MAPPED_FROM = 64 * 1024

    def __init__(self, size: int) -> None:
        self.buffer: bytearray | mmap.mmap = (
            mmap.mmap(-1, size) if size >= self.MAPPED_FROM else bytearray(size)
        )
        self.size = size
        self.length = 0

    def add(self, data: bytes) -> None:
        end = self.length + len(data)
        if end <= self.size:  # more than announced is not the runner's
            self.buffer[self.length : end] = data
            self.length = end

    def view(self) -> memoryview:
        return memoryview(self.buffer)[: self.length]


_NO_OUTPUT = memoryview(b"")


class Console:
    """The runner's frames in hluk's stdout, found and decoded as they arrive.

    Only what a frame needs is kept: the line of a frame being received (at most a frame's
    length) and, before the start, the end of the other text; the output goes straight into
    its stream. Reads land in one buffer, frame lines in another, both made once per case, so
    a case allocates little besides its output (a worker's allocator then has nothing to
    fragment over thousands of cases), and holds about its output once, whatever the guest
    writes."""

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce.encode("ascii")
        self.marker = b"\n" + self.nonce + b" "
        self.total = 0
        self.started = False
        self.refusal: str | None = None
        self.end: protocol.End | None = None
        self.done = False
        self.last = False  # the done frame said the guest ends next
        self.outputs: dict[str, _Output] = {}
        self.files: dict[int, _Output] = {}
        # Unscanned text that may begin a marker stays at the head of the buffer (_kept bytes)
        # and the next read lands after it. Only what was read or copied in is ever looked at:
        # a spare buffer's old bytes are not.
        spare = _spare.pop() if _spare and len(self.marker) <= _MARKER_ROOM else None
        if spare is None:
            spare = (
                bytearray(READ_SIZE + max(_MARKER_ROOM, len(self.marker))),
                bytearray(protocol.MAX_FRAME_LINE),
            )
        self._buffer, self._line = spare
        self._kept = 0
        self._released = False
        self._line_length: int | None = None  # None: not within a frame line
        self._preamble = bytearray()

    def release(self) -> None:
        """The watch is over and what it produced taken (its outputs are their own): the
        console's buffers go to the next console. Nothing is read or asked of it after."""
        if not self._released:
            self._released = True
            if len(_spare) < _SPARE_LIMIT:
                _spare.append((self._buffer, self._line))

    def read(self, fd: int) -> int:
        """Read what `fd` has (at most READ_SIZE bytes) and scan it; 0 at its end."""
        count = os.readv(fd, [memoryview(self._buffer)[self._kept : self._kept + READ_SIZE]])
        self.total += count
        self._scan(self._kept + count)
        return count

    def _scan(self, end: int) -> None:
        data, view = self._buffer, memoryview(self._buffer)
        self._kept = 0
        position = 0
        while position < end:
            if self._line_length is not None:
                newline = data.find(b"\n", position, end)
                stop = end if newline < 0 else newline
                length = self._line_length + stop - position
                if length > protocol.MAX_FRAME_LINE:
                    self._line_length = None  # too long for a frame: not the runner's
                else:
                    self._line[self._line_length : length] = view[position:stop]
                    self._line_length = length
                    if newline >= 0:
                        self._frame(memoryview(self._line)[:length])
                        self._line_length = None
                if newline < 0:
                    return
                position = newline  # the newline may begin the next frame
                continue
            found = data.find(self.marker, position, end)
            if found < 0:
                # The marker may straddle this read and the next: its possible start is kept.
                keep = max(position, end - len(self.marker) + 1)
                self._text(view[position:keep])
                self._kept = end - keep
                data[: self._kept] = view[keep:end]
                return
            self._text(view[position:found])
            self._line_length = 0
            position = found + len(self.marker)

    def _text(self, text: memoryview) -> None:
        if not self.started and text:
            self._preamble += text
            del self._preamble[:-PREAMBLE_LIMIT]

    def _frame(self, line: memoryview) -> None:
        if line and line[-1] == ord("\r"):
            line = line[:-1]
        space = bytes(line[:16]).find(b" ")
        kind = bytes(line if space < 0 else line[:space])
        if kind == protocol.START:
            self.started = True
        elif kind == protocol.REFUSED and not self.started and self.refusal is None:
            self.refusal = _base64_text(line[space + 1 :]) if space >= 0 else ""
        elif not self.started or self.done:
            return
        elif kind == protocol.END and self.end is None:
            try:
                self.end = protocol.parse_end(bytes(line).split(b" ")[1:])
            except ValueError:
                return  # not the runner's: a frame a solution forged
            for name, size in zip(("stdout", "stderr"), self.end.sizes, strict=True):
                self.outputs[name] = _Output(size)
            for index, size in enumerate(self.end.files):
                if size >= 0:
                    self.files[index] = _Output(size)
        elif kind in protocol.STREAMS and self.end is not None and space >= 0:
            data = _base64(line[space + 1 :])
            if data is not None:
                self.outputs[protocol.STREAMS[kind]].add(data)
        elif kind == protocol.FILE and self.end is not None and space >= 0:
            index_and_data = bytes(line[space + 1 : space + 16]).split(b" ", 1)[0]
            output = self.files.get(int(index_and_data)) if index_and_data.isdigit() else None
            data = _base64(line[space + 2 + len(index_and_data) :])
            if output is not None and data is not None:
                output.add(data)
        elif kind == protocol.DONE and self.end is not None:
            self.done = True
            self.last = bytes(line[space + 1 :]) == protocol.LAST if space >= 0 else False

    @property
    def whole(self) -> bool:
        """Whether the report is done and each output got the size its end frame announced."""
        return self.done and all(
            output.length == output.size
            for output in (*self.outputs.values(), *self.files.values())
        )

    def stream(self, name: str) -> memoryview:
        output = self.outputs.get(name)
        return _NO_OUTPUT if output is None else output.view()

    def preamble(self) -> bytes:
        """The end of the text before the start, once hluk's stdout has ended."""
        self._text(memoryview(self._buffer)[: self._kept])
        self._kept = 0
        # The \r of the console's \r\n before the start frame is the console's, not text.
        return bytes(self._preamble).replace(b"\r\n", b"\n").removesuffix(b"\r")


def _base64(text: memoryview) -> bytes | None:
    """What a frame's base64 field holds; None if it is not base64 (not the runner's)."""
    return binascii.a2b_base64(text) if _BASE64.fullmatch(text) is not None else None


def _base64_text(text: memoryview) -> str:
    data = _base64(text)
    return "" if data is None else data.decode(errors="replace")
