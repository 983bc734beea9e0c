"""A folder served read-only over HTTP/1.1, filling a 1 Gbit/s link on these cores with little CPU.

``python -m http.server`` speaks HTTP/1.0 (a connection a request), copies file bodies through Python in 64 KiB
pieces and ignores ``Range``. This one keeps connections open (HTTP/1.1 keep-alive, as fsspec's HTTP file system
reuses them), sends file bodies with ``sendfile`` (the kernel copies them), and answers a single byte range
(``Range: bytes=a-b``, ``a-``, ``-n``) with 206, as fsspec asks for part of a file. Directory listings (fsspec's
``ls``) and ``HEAD`` (its ``info``) are ``http.server``'s own. Through a 1 Gbit/s link, two readers reading a
65,536-wide store's files: 117 MB/s and 0.4 CPU s for 800 MB, against 100-105 MB/s and 1.0 CPU s
(``benchmarks/bench_http_servers.py``, BENCHMARKS.md).

    python http_files.py --bind ADDRESS [--directory FOLDER] [PORT]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import io
import os
import re
from http import HTTPStatus

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class FilesHandler(http.server.SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` with keep-alive, ``sendfile`` bodies and single byte ranges."""

    protocol_version = "HTTP/1.1"  # keep-alive: every answer carries its Content-Length
    disable_nagle_algorithm = True  # the headers go out at once, not held for the body's first ACK
    _span: tuple[int, int] | None = None  # (offset, length) of the body copyfile sends

    def send_head(self):
        path = self.translate_path(self.path)
        wanted = self.headers.get("Range")
        span = _parse_range(wanted, os.path.getsize(path)) if wanted and os.path.isfile(path) else None
        if span is None:  # no range, or a form not handled here (several ranges): the whole, as the RFC allows
            f = super().send_head()
            self._span = (0, os.fstat(f.fileno()).st_size) if isinstance(f, io.BufferedReader) else None
            return f
        size = os.path.getsize(path)
        if span == (0, 0):  # nothing of the file is in it
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        f = open(path, "rb")
        offset, length = self._span = span
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {offset}-{offset + length - 1}/{size}")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return f

    def copyfile(self, source, outputfile) -> None:
        if self._span is None:  # a listing (in memory)
            super().copyfile(source, outputfile)
            return
        offset, length = self._span
        self.connection.sendfile(source, offset, length)

    def log_message(self, format, *args) -> None:  # a line a request costs the shared cores
        pass


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(offset, length)`` of a single byte range in a file of ``size`` bytes; ``(0, 0)`` where none of the file is
    in it; ``None`` for a form not handled (several ranges, another unit)."""
    m = _RANGE.match(header.strip())
    if m is None or m.groups() == ("", ""):
        return None
    first, last = m.groups()
    if first == "":  # the last n bytes
        n = min(int(last), size)
        return (size - n, n) if n else (0, 0)
    start = int(first)
    if start >= size:
        return (0, 0)
    end = min(int(last), size - 1) if last else size - 1
    if end < start:
        return None
    return (start, end - start + 1)


class FilesServer(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # many workers' connections at once


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("port", type=int, nargs="?", default=8000)
    p.add_argument("--bind", required=True)
    p.add_argument("--directory", default=os.getcwd())
    args = p.parse_args()
    handler = functools.partial(FilesHandler, directory=args.directory)
    with FilesServer((args.bind, args.port), handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
