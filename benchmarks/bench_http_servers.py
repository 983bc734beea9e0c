"""``python -m http.server`` against ``tests/support/http_files.py``, side by side, serving through a rate-limited
link (issue 45).

The rate-limited store's harness (``bench_rate_limited_store.py``) serves the store from a network namespace of its
own through one veth pair limited by ``tc tbf`` (``netns.namespace_behind_link``). A row at 1 Gbit/s measures the
link only if the server can fill it: this reads the same files through the same link from each server, as the
workers do (fsspec's HTTP file system, one file after another, ``--readers`` readers at once each reading every
file), and prints MB/s over the link, the bytes that crossed it and the server's CPU seconds. With ``--busy N``, N
processes spin meanwhile, as the workers compute on these cores during a run.

The files: ``--files`` files of ``--file-mb`` MB of random bytes (a layer's chunks at 65,536 x 480 are about 4 MB),
or with ``--dir`` the files of a folder (e.g. a store), in order, up to ``--limit-mb``.

    sudo python benchmarks/bench_http_servers.py [--rate 1gbit] [--readers 2] [--files 48] [--file-mb 4]
        [--dir FOLDER --limit-mb 400] [--rounds 2] [--busy 0]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))  # the network-namespace helpers

PORT = 8000


@contextlib.contextmanager
def stdlib_server(host, folder: Path) -> Iterator[str]:
    """``python -m http.server`` (the harness's server before issue 45's 1 Gbit/s row) in ``host``'s namespace."""
    import netns

    from dasknn.testing import stop_process_groups

    proc = subprocess.Popen(["ip", "netns", "exec", host.ns, sys.executable, "-m", "http.server", "--bind",
                             host.address, str(PORT), "--directory", str(folder)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    root = f"http://{host.address}:{PORT}"
    try:
        netns.wait_until_answering(f"{root}/", proc)
        yield root
    finally:
        stop_process_groups([proc], 10.0)


def read_all(root: str, names: list[str], readers: int) -> float:
    """Seconds for ``readers`` readers at once, each reading every file of ``names`` under ``root`` in turn
    (fsspec's HTTP file system, a session of its own each)."""
    import fsspec

    def reader() -> None:
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        for name in names:
            fs.cat_file(f"{root}/{name}")

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def _children_cpu() -> float:
    """CPU seconds of this process's ended children."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def files(args, scratch: Path) -> tuple[Path, list[str]]:
    """The folder served and the files read (relative names)."""
    if args.dir:
        root = Path(args.dir)
        names, total = [], 0
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            if total >= args.limit_mb * 1e6:
                break
            names.append(str(path.relative_to(root)))
            total += path.stat().st_size
        return root, names
    rng = np.random.default_rng(0)
    for i in range(args.files):
        (scratch / f"f{i:03d}").write_bytes(rng.bytes(int(args.file_mb * 1e6)))
    return scratch, [f"f{i:03d}" for i in range(args.files)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="the link's rate, as tc writes it")
    p.add_argument("--readers", type=int, default=2, help="readers at once, each reading every file")
    p.add_argument("--files", type=int, default=48)
    p.add_argument("--file-mb", type=float, default=4.0)
    p.add_argument("--dir", default=None, help="serve this folder's files instead (e.g. a store)")
    p.add_argument("--limit-mb", type=float, default=400.0, help="with --dir: read files up to this many MB")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the servers taking turns")
    p.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile (the workers' computing)")
    args = p.parse_args()

    import netns

    netns.require()
    with tempfile.TemporaryDirectory() as scratch:
        folder, names = files(args, Path(scratch))
        size = sum(os.path.getsize(folder / n) for n in names)
        print(f"{len(names)} files, {size:,} bytes, {args.readers} readers each reading all, link {args.rate} "
              f"both ways; load average {os.getloadavg()[0]:.1f}", flush=True)
        servers = {"python -m http.server": stdlib_server, "http_files.py": netns.http_server}
        print("| round | server | seconds | MB/s over the link | bytes over the link | server CPU s |\n"
              "|--:|---|--:|--:|--:|--:|")
        spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            with netns.namespace_behind_link(args.rate) as link:
                for r in range(1, args.rounds + 1):
                    for label, server in servers.items():
                        cpu = _children_cpu()
                        with server(link.host, folder) as root:
                            before = link.bytes_in()
                            seconds = read_all(root, names, args.readers)
                            crossed = link.bytes_in() - before
                        cpu = _children_cpu() - cpu  # the server's, counted once it has ended
                        print(f"| {r} | {label} | {seconds:.2f} | {crossed / seconds / 1e6:.1f} | {crossed:,} | "
                              f"{cpu:.2f} |", flush=True)
        finally:
            for proc in spinning:
                proc.kill()
                proc.wait()
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
