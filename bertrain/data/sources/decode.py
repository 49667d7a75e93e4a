"""Reading (possibly compressed) bytes into decoded lines, with invalid UTF-8 and binary files handled."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from collections import Counter
from typing import Any, Iterator, Optional

from bertrain.data.sources.lookup import InputFile
from bertrain.errors import DataError

BLOCK_BYTES = 1 << 22
BINARY_SNIFF_BYTES = 8000  # like git: a NUL byte in the first 8000 bytes marks a binary file
# Byte-order marks of the encodings whose text holds NUL bytes, UTF-32 first (its little-endian mark starts with
# UTF-16's): such a file is text in the wrong encoding, not binary, and the user can convert it.
BYTE_ORDER_MARKS = ((b"\xff\xfe\x00\x00", "utf32"), (b"\x00\x00\xfe\xff", "utf32"), (b"\xff\xfe", "utf16"),
                    (b"\xfe\xff", "utf16"))


class BinaryFile(Exception):
    """Internal: the file is skipped; `reason` is "binary" (NUL bytes), "utf16" or "utf32" (a byte-order mark)."""

    def __init__(self, reason: str = "binary"):
        super().__init__(reason)
        self.reason = reason


def unreadable_reason(head: bytes) -> Optional[str]:
    """Why a file starting with `head` is skipped: "utf16"/"utf32" (byte-order mark), "binary", or None."""
    for mark, encoding in BYTE_ORDER_MARKS:
        if head.startswith(mark):
            return encoding
    return "binary" if b"\x00" in head[:BINARY_SNIFF_BYTES] else None


class ByteProgress:
    """Tracks how many on-disk (compressed) bytes of the current file were consumed."""

    def __init__(self, raw: Any):
        self.raw = raw

    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0


def open_binary(item: InputFile) -> tuple[io.BufferedIOBase, Any]:
    """Open a (possibly compressed) file for binary reading: (stream, raw file for progress)."""
    try:
        raw = open(item.path, "rb")
    except OSError as error:
        raise DataError(f"Cannot open {item.path}: {error.strerror}.") from None
    if item.compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if item.compression == "bz2":
        return bz2.BZ2File(raw, mode="rb"), raw
    if item.compression == "xz":
        return lzma.LZMAFile(raw, mode="rb"), raw
    if item.compression == "zstd":
        import zstandard  # optional dependency: only .zst sources need it

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader, buffer_size=1 << 20), raw
    return raw, raw


def _utf8_cut(block: bytes) -> int:
    """Index where `block` can be cut without splitting a UTF-8 character."""
    end = len(block)
    start = end
    while start > 0 and end - start < 4 and (block[start - 1] & 0xC0) == 0x80:
        start -= 1
    if start == 0:
        return end
    lead = block[start - 1]
    if lead < 0x80:
        return end
    length = 2 if lead >= 0xC0 and lead < 0xE0 else 3 if lead < 0xF0 else 4
    return end if (start - 1) + length <= end else start - 1


def iter_lines(stream: Any, path: str, limit: Optional[int], on_decode_error: str,
               counts: Counter) -> Iterator[tuple[int, str]]:
    """Yield (line number, text) of each line; lines longer than `limit` come in pieces (counted). Raises
    BinaryFile before yielding anything when the first bytes hold a NUL byte or a UTF-16/32 byte-order mark."""
    line_no, offset, carry = 1, 0, b""
    continued = False  # the first line of this block continues a line cut at the previous block
    first = True
    while True:
        block = carry + stream.read(BLOCK_BYTES)
        carry = b""
        if first:
            reason = unreadable_reason(block)
            if reason is not None:
                raise BinaryFile(reason)
            first = False
        if not block:
            return
        cut = False
        if not block.endswith(b"\n"):
            tail = stream.readline(limit) if limit else stream.readline()
            block += tail
            if limit and tail and not tail.endswith(b"\n") and len(tail) == limit:
                cut = True
                keep = _utf8_cut(block)
                block, carry = block[:keep], block[keep:]
        try:
            text = block.decode("utf-8")
            lines = text.split("\n")
        except UnicodeDecodeError:
            lines = _decode_lines(block, path, line_no, offset, on_decode_error, counts)
        if lines and lines[-1] == "" and block.endswith(b"\n"):
            lines.pop()
        number = line_no
        for index, line in enumerate(lines):
            if line is None:  # an undecodable line skipped (counted)
                number += 1
                continue
            if line.endswith("\r"):
                line = line[:-1]
            last = index == len(lines) - 1
            if limit and len(line) > limit:
                if not (continued and index == 0):
                    counts["lines_split_long"] += 1
                for start in range(0, len(line), limit):
                    yield number, line[start:start + limit]
            else:
                if cut and last and not (continued and index == 0):
                    counts["lines_split_long"] += 1
                yield number, line
            if not (cut and last):
                number += 1
        line_no += block.count(b"\n")
        offset += len(block)
        continued = cut


def _decode_lines(block: bytes, path: str, line_no: int, offset: int, on_decode_error: str,
                  counts: Counter) -> list[Optional[str]]:
    """Decode line by line; an invalid line raises, is replaced or is skipped (None) and counted."""
    out: list[Optional[str]] = []
    position = offset
    for index, raw in enumerate(block.split(b"\n")):
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            if on_decode_error == "error":
                raise DataError(
                    f"{path}: invalid UTF-8 at line {line_no + index}, byte offset {position + error.start} "
                    f"(byte 0x{raw[error.start]:02x}; offsets count decompressed bytes). Fix the file, or set "
                    f"prepare.on_decode_error to 'replace' or 'skip' (e.g. --set prepare.on_decode_error=replace)."
                ) from None
            if on_decode_error == "replace":
                counts["lines_decode_replaced"] += 1
                out.append(raw.decode("utf-8", "replace"))
            else:
                counts["lines_decode_skipped"] += 1
                out.append(None)
        position += len(raw) + 1
    return out

