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

    def add(self, data: bytes) -> int:
        """Add `data` (nothing of it if more than announced: that is not the runner's); the
        bytes taken."""
        end = self.length + len(data)
        if end > self.size:
            return 0
        self.buffer[self.length : end] = data
        self.length = end
        return len(data)

    def view(self) -> memoryview:
        return memoryview(self.buffer)[: self.length]


_NO_OUTPUT = memoryview(b"")
_CR = ord("\r")


class Console:
    """The runner's frames in hluk's stdout, found and decoded as they arrive.

    Only what a frame needs is kept: the line of a frame being received (at most a frame's
    length) and, before the start, the end of the other text; the output goes straight into
    its stream. Reads land in one buffer, frame lines in another, both made once per case, so
    a case allocates little besides its output (a worker's allocator then has nothing to
    fragment over thousands of cases), and holds about its output once, whatever the guest
    writes. A frame line that one read holds whole is decoded where it was read; only one cut
    by a read's end is copied into the line buffer. Every case's report passes here, so the
    common path (whole frames, each in one read) is kept short: the state's defaults are the
    class's, and a frame is dispatched on its kind once."""

    # What a console starts with (an instance's own value replaces one as it changes).
    total = 0
    started = False
    refusal: str | None = None
    end: protocol.End | None = None
    done = False
    last = False  # the done frame said the guest ends next
    _kept = 0  # unscanned bytes that may begin a marker, at the head of the read buffer
    _line_length: int | None = None  # None: not within a frame line cut by a read's end
    _missing = 0  # of the output the end frame announced, the bytes not yet copied
    _released = False

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce.encode("ascii")
        self.marker = b"\n" + self.nonce + b" "
        self.outputs: dict[str, _Output] = {}
        self.files: dict[int, _Output] = {}
        # The next read lands after the kept bytes. Only what was read or copied in is ever
        # looked at: a spare buffer's old bytes are not.
        spare = _spare.pop() if _spare and len(self.marker) <= _MARKER_ROOM else None
        if spare is None:
            spare = (
                bytearray(READ_SIZE + max(_MARKER_ROOM, len(self.marker))),
                bytearray(protocol.MAX_FRAME_LINE),
            )
        self._buffer, self._line = spare
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
        kept = self._kept
        count = os.readv(fd, [memoryview(self._buffer)[kept : kept + READ_SIZE]])
        self.total += count
        self._scan(kept + count)
        return count

    def _scan(self, end: int) -> None:
        data, view, marker = self._buffer, memoryview(self._buffer), self.marker
        position = 0
        if self._line_length is not None:
            position = self._rest_of_line(view, 0, end)
        while position >= 0:
            found = data.find(marker, position, end)
            if found < 0:
                # The marker may straddle this read and the next: its possible start is kept.
                keep = max(position, end - len(marker) + 1)
                if not self.started:
                    self._text(view[position:keep])
                self._kept = kept = end - keep
                if kept:
                    data[:kept] = view[keep:end]
                return
            if not self.started:
                self._text(view[position:found])
            position = found + len(marker)
            newline = data.find(b"\n", position, end)
            if newline < 0 or newline - position > protocol.MAX_FRAME_LINE:
                self._line_length = 0
                position = self._rest_of_line(view, position, end)
            else:
                self._frame(view[position:newline])
                position = newline  # the newline may begin the next frame
        self._kept = 0

    def _rest_of_line(self, view: memoryview, position: int, end: int) -> int:
        """Copy the frame line that `view[position:end]` holds (the rest of one begun, or its
        start) into the line buffer, and decode it if its newline is here; where the scan goes
        on (its newline), or -1 if the line takes the rest of the read."""
        length = self._line_length
        assert length is not None
        newline = self._buffer.find(b"\n", position, end)
        stop = end if newline < 0 else newline
        total = length + stop - position
        if total > protocol.MAX_FRAME_LINE:
            self._line_length = None  # too long for a frame: not the runner's
            return newline
        self._line[length:total] = view[position:stop]
        self._line_length = total if newline < 0 else None
        if newline >= 0:
            self._frame(memoryview(self._line)[:total])
        return newline

    def _text(self, text: memoryview) -> None:
        if text:
            self._preamble += text
            del self._preamble[:-PREAMBLE_LIMIT]

    def _frame(self, line: memoryview) -> None:
        if line and line[-1] == _CR:
            line = line[:-1]
        head = bytes(line[:16])
        space = head.find(b" ")
        if space >= 0:
            kind, rest = head[:space], line[space + 1 :]
        else:  # a kind alone, with empty fields (b"": longer than any kind)
            kind, rest = (head if len(line) <= 16 else b""), _NO_OUTPUT
        if kind == protocol.START:
            self.started = True
        elif kind == protocol.REFUSED:
            if not self.started and self.refusal is None:
                self.refusal = _base64_text(rest)
        elif not self.started or self.done:
            return
        elif kind in protocol.STREAMS:
            if self.end is not None and (data := _base64(rest)) is not None:
                self._missing -= self.outputs[protocol.STREAMS[kind]].add(data)
        elif kind == protocol.DONE:
            if self.end is not None:
                self.done = True
                self.last = bytes(rest) == protocol.LAST
        elif kind == protocol.END:
            if self.end is None:
                self._ended(bytes(rest).split(b" "))
        elif kind == protocol.FILE and self.end is not None:
            index = bytes(rest[:15]).split(b" ", 1)[0]
            output = self.files.get(int(index)) if index.isdigit() else None
            data = _base64(rest[len(index) + 1 :])
            if output is not None and data is not None:
                self._missing -= output.add(data)

    def _ended(self, fields: list[bytes]) -> None:
        """The end frame's `fields`: the solution has ended, and its output's sizes follow."""
        try:
            self.end = end = protocol.parse_end(fields)
        except ValueError:
            return  # not the runner's: a frame a solution forged
        self.outputs["stdout"] = _Output(end.sizes[0])
        self.outputs["stderr"] = _Output(end.sizes[1])
        for index, size in enumerate(end.files):
            if size >= 0:
                self.files[index] = _Output(size)
        self._missing = end.copied

    @property
    def whole(self) -> bool:
        """Whether the report is done and each output got the size its end frame announced."""
        return self.done and not self._missing

    def stream(self, name: str) -> memoryview:
        output = self.outputs.get(name)
        return _NO_OUTPUT if output is None else output.view()

    def preamble(self) -> bytes:
        """The end of the text before the start, once hluk's stdout has ended."""
        if not self.started:
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
