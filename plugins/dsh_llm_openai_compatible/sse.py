"""An incremental Server-Sent Events decoder (the framing half of the wire protocol).

Framing follows the WHATWG event-stream rules: UTF-8 (a leading BOM is
dropped), lines end in CRLF, LF or CR (a CR split from its LF across two reads
is still one line end), ``:`` starts a comment, ``data`` lines accumulate
(joined with ``\\n``) and an event is dispatched on a blank line. An event
whose blank line never arrived is *not* dispatched at end of input: a
truncated stream is truncation, not a payload.

It is a plain synchronous object fed with byte chunks of any size (split
anywhere, even inside a UTF-8 sequence), so the adapter can keep every await
in one place and the decoder can be tested by splitting streams at random.
"""

from __future__ import annotations

import codecs

__all__ = ["SseDecoder"]


class SseDecoder:
    """Feed bytes, get back the ``data`` payloads of the events they completed."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._has_data = False
        self._started = False
        #: comments seen (``: keep-alive``); transport activity, never payloads
        self.comments = 0

    def feed(self, data: bytes) -> list[str]:
        """Decode ``data``; return the payloads of the events it completed, in order."""
        return self._lines(self._decoder.decode(data), final=False)

    def close(self) -> list[str]:
        """End of input: flush the decoder. An unterminated event is dropped."""
        return self._lines(self._decoder.decode(b"", final=True), final=True)

    def _lines(self, text: str, *, final: bool) -> list[str]:
        if not self._started and text:
            self._started = True
            if text.startswith("\ufeff"):
                text = text[1:]
        buffer = self._buffer + text
        events: list[str] = []
        if "\r" not in buffer:
            return self._lf_lines(buffer, events, final=final)
        start = 0
        length = len(buffer)
        while start < length:
            cr = buffer.find("\r", start)
            lf = buffer.find("\n", start)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr + 1 == length and not final:
                    break  # the LF of a CRLF may be in the next read
                crlf = cr + 1 < length and buffer[cr + 1] == "\n"
                end, next_start = cr, cr + 2 if crlf else cr + 1
            else:
                end, next_start = lf, lf + 1
            payload = self._line(buffer[start:end])
            if payload is not None:
                events.append(payload)
            start = next_start
        self._buffer = buffer[start:]
        if final:
            self._buffer = ""
            self._data = []
            self._has_data = False
        return events

    def _lf_lines(self, buffer: str, events: list[str], *, final: bool) -> list[str]:
        """``_lines`` for text with no CR (what servers send): one split, and ``data`` lines,
        nearly all of a stream, handled inline. The same rules as :meth:`_line`."""
        lines = buffer.split("\n")
        # after the last LF: an unfinished line (dropped at the end of input, as in _lines)
        self._buffer = "" if final else lines.pop()
        data = self._data
        for line in lines if not final else lines[:-1]:
            if line.startswith("data:"):
                data.append(line[6:] if line.startswith(" ", 5) else line[5:])
                self._has_data = True
            elif line:
                self._line(line)
            elif self._has_data:
                events.append("\n".join(data))
                data.clear()
                self._has_data = False
        if final:
            self._data = []
            self._has_data = False
        return events

    def _line(self, line: str) -> str | None:
        if not line:
            if not self._has_data:
                return None
            payload = "\n".join(self._data)
            self._data = []
            self._has_data = False
            return payload
        if line.startswith(":"):
            self.comments += 1
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
        # event / id / retry and unknown fields carry nothing this protocol uses
        return None
