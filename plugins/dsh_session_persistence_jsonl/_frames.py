"""Zstandard frames: how a batch becomes bytes, and how bytes are split back into frames.

A compressed log is a plain concatenation of independent, standard Zstandard
frames (RFC 8878): frame 0 holds exactly the header line, then one frame per
durable batch. Every frame carries zstd's own content checksum (the low 32 bits
of XXH64 of the plaintext), so a reader detects any flipped byte inside a
complete frame; there is no other length prefix or checksum.

:func:`split_frames` walks frame and block headers *without decompressing* and
stops at the first position that does not hold a structurally complete frame:
the file ends inside it (a torn append) or its bytes are no frame (bad magic,
reserved bits, reserved block type). Whether the bytes from there on are a torn
tail or damage is the reader's call, not the scanner's: it depends on whether an
intact frame follows (``_reader.intact_frame_after``; docs/format.md §5.1).
:func:`scan_frames` is the strict form, for callers that want an exception.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Final

import zstandard

__all__ = [
    "MAGIC",
    "FrameCorruption",
    "FrameScan",
    "compress_frame",
    "decompress_frame",
    "decompress_partial",
    "frame_end",
    "scan_frames",
    "split_frames",
]

#: Frame magic number 0xFD2FB528, little endian.
MAGIC: Final = b"\x28\xb5\x2f\xfd"

#: Node's default zstd level, which DSH uses (no level knob is exposed).
LEVEL: Final = 3


class FrameCorruption(ValueError):
    """Structurally invalid bytes at a complete frame position (``offset`` says where)."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True, slots=True)
class FrameScan:
    """Complete frames as ``(start, end)`` byte ranges, and where they stop.

    ``torn_start`` is where the structurally complete frames stop (None: they run
    to the end of the data); ``defect`` says why the bytes there are no frame when
    they say enough to tell (None: the data ends inside the frame).
    """

    frames: tuple[tuple[int, int], ...]
    torn_start: int | None
    defect: FrameCorruption | None = None


#: A ``ZstdCompressor`` must not be used by two threads at once, and batches are
#: compressed on worker threads: one compressor per thread.
_local = threading.local()


def compress_frame(plaintext: bytes) -> bytes:
    """One independent frame, one-shot (content size known), with content checksum."""
    compressor: zstandard.ZstdCompressor | None = getattr(_local, "compressor", None)
    if compressor is None:
        compressor = zstandard.ZstdCompressor(
            level=LEVEL, write_checksum=True, write_content_size=True
        )
        _local.compressor = compressor
    return compressor.compress(plaintext)


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor: making one costs ~15 µs, a read decompresses a frame per
    batch (three per agent step), and one must not be used by two threads at once."""
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def frame_end(data: bytes | memoryview, start: int) -> int | None:
    """End offset of the frame starting at ``start``; None when EOF falls inside it."""
    size = len(data)
    pos = start
    if size - pos < 4:
        return None
    if bytes(data[pos : pos + 4]) != MAGIC:
        raise FrameCorruption(
            f"corrupt Zstandard session log: invalid frame magic at byte {pos}", pos
        )
    pos += 4
    if pos >= size:
        return None
    descriptor = data[pos]
    if descriptor & 0x18:
        raise FrameCorruption(
            f"corrupt Zstandard session log: reserved frame-header bit at byte {pos}", pos
        )
    size_flag = descriptor >> 6
    single_segment = bool(descriptor & 0x20)
    has_checksum = bool(descriptor & 0x04)
    dict_bytes = (0, 1, 2, 4)[descriptor & 0x03]
    if size_flag == 0:
        fcs_bytes = 1 if single_segment else 0
    else:
        fcs_bytes = 1 << size_flag
    pos += 1 + (0 if single_segment else 1) + dict_bytes + fcs_bytes
    if pos > size:
        return None
    while True:
        if size - pos < 3:
            return None
        header = data[pos] | (data[pos + 1] << 8) | (data[pos + 2] << 16)
        last = header & 1
        block_type = (header >> 1) & 3
        block_size = header >> 3
        if block_type == 3:
            raise FrameCorruption(
                f"corrupt Zstandard session log: reserved block type at byte {pos}", pos
            )
        pos += 3 + (1 if block_type == 1 else block_size)
        if pos > size:
            return None
        if last:
            break
    if has_checksum:
        pos += 4
        if pos > size:
            return None
    return pos


def split_frames(data: bytes | memoryview) -> FrameScan:
    """Split ``data`` into structurally complete frames, up to the first position that is
    not one (never raises: :attr:`FrameScan.defect` carries the reason).

    Skippable frames are not part of the format and fail the magic check.
    """
    frames: list[tuple[int, int]] = []
    pos = 0
    while pos < len(data):
        try:
            end = frame_end(data, pos)
        except FrameCorruption as defect:
            return FrameScan(tuple(frames), pos, defect)
        if end is None:
            return FrameScan(tuple(frames), pos)
        frames.append((pos, end))
        pos = end
    return FrameScan(tuple(frames), None)


def scan_frames(data: bytes | memoryview) -> FrameScan:
    """:func:`split_frames`, raising :class:`FrameCorruption` for structurally impossible
    bytes where a frame should start; a file that ends inside a frame is not an error."""
    scan = split_frames(data)
    if scan.defect is not None:
        raise scan.defect
    return scan


def decompress_frame(frame: bytes | memoryview) -> bytes:
    """Decompress exactly one complete frame, verifying its content checksum.

    Raises ``zstandard.ZstdError`` (checksum, corrupt block, size mismatch) or
    ``ValueError`` when the bytes are not exactly one whole frame. Streaming
    decompression is used because migration-written frames carry no content size.
    """
    decompressor = _decompressor().decompressobj()
    out = decompressor.decompress(bytes(frame))
    if not decompressor.eof:
        raise ValueError("frame ended before its last block")
    if decompressor.unused_data:
        raise ValueError("bytes follow the end of the frame")
    return out


def decompress_partial(torn: bytes | memoryview) -> bytes:
    """Whatever plaintext a torn frame still yields; no plaintext on any decoder error.

    The checksum cannot be verified (it is missing or cut), so the caller keeps
    only complete records and treats everything after a bad one as lost.
    """
    try:
        return _decompressor().decompressobj().decompress(bytes(torn))
    except zstandard.ZstdError:
        return b""
