"""Streamed data, pipeline and model mode against a store behind a rate-limited link, side by side (issue 45).

On a GPU cluster the workers compute 50-100x faster than these two cores, so reading the network from where it is
kept (an object store, a shared file system) is most of a run. A slow link here stands in for that balance: the
store is served from a network namespace of its own (``tests/support/netns.py``, ``namespace_behind_link``) through
one veth pair limited by ``tc tbf`` to ``--rate`` both ways, which every worker shares; the workers, the scheduler
and the client stay on this host (their exchange is not limited: the cluster's interconnect is not what is
measured). The store is plain HTTP (``tests/support/http_files.py`` in the namespace: keep-alive, ``sendfile``,
byte ranges; ``bench_http_servers.py`` compares it with ``python -m http.server``), or with ``--s3`` an S3 API
(moto's server) in the namespace.

Made once, before anything is timed: the store (``dasknn generate --weights random`` with its float64 truth, under
``--dir``; without the truth with ``--no-truth``), model mode's partition (kept in the store, so served with it) and its part plan (written by the workers
reading the layers through the link into a local folder beside the store, then served too: each worker streams its
share of the weights from it through the link, as from a plan kept next to the layers in S3). The kernels are
compiled on every worker by a small run on the local store.

Then data mode streamed runs on the local store (``local``: what computing and decoding cost, no link), and each
mode runs once on the store's URL: data mode streamed (every worker reads every layer), pipeline mode
(each stage reads its own layers once), model mode with K = ``--workers`` parts streamed from the part plan, and
``--mode auto`` (with ``--explain``: what it predicted, what it chose); ``data-again`` and ``model-again`` are data
and model mode streaming as before issue 45, each chunk fetching its layers again (``bench_read_once.fetched_again``;
with ``--chunks`` above the workers, a worker's next chunks decode what its stream kept). Printed side by side: the engine's load
and inference seconds (a resident mode reads its weights in the load phase, a streamed one while it infers), the
call's wall seconds, bytes that crossed the link (the interface's counter), the engine's bytes read
(decoded), the categories and whether they equal the truth.

    sudo python benchmarks/bench_rate_limited_store.py [--neurons 4096] [--layers 120] [--images 200]
        [--rate 100mbit] [--workers 2] [--memory-limit 2GB] [--modes local,data,pipeline,model,auto] [--s3]
        [--chunks N] [--dir /tmp/bench-rate-limited] [--no-truth]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))  # the network-namespace helpers
sys.path.insert(0, str(HERE))

PORT = 8000


@dataclass(frozen=True)
class Row:
    """One mode's run against the store behind the link."""

    mode: str
    ran: str  # the mode that ran (auto's choice)
    seconds: float  # the engine's inference seconds
    load: float  # the engine's load phase (weights held, images), the kernels' warm-up in it
    wall: float
    link_bytes: int
    bytes_read: int
    categories: np.ndarray
    exact: bool | None  # None: no truth to compare with (--no-truth)
    note: str = ""


def network(folder: Path, neurons: int, layers: int, images: int, seed: int, truth: bool) -> Path:
    """The generated random-weights store, with its float64 truth where ``truth`` (made once)."""
    from dasknn import generate

    path = folder / f"n{neurons}-l{layers}-i{images}-s{seed}-random.zarr"
    if not path.exists():
        generate.write(path, neurons, layers, images, seed=seed, truth=truth, weights="random")
    return path


_MOTO = """
import sys, time, logging
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
ThreadedMotoServer(ip_address=sys.argv[1], port={port}, verbose=False).start()
while True:
    time.sleep(3600)
"""


@contextlib.contextmanager
def s3_server(host, folder: Path, names: list[str]) -> Iterator[str]:
    """moto's S3 server in ``host``'s namespace, bucket ``nets`` holding ``names`` from ``folder`` (uploaded through
    the link before anything is timed); yields the bucket's URL, the environment pointed at the endpoint."""
    import netns
    import s3fs

    from dasknn.testing import stop_process_groups

    proc = subprocess.Popen(["ip", "netns", "exec", host.ns, sys.executable, "-c", _MOTO.format(port=PORT),
                             host.address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    endpoint = f"http://{host.address}:{PORT}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)  # the workers, started after, inherit it
    try:
        netns.wait_until_answering(f"{endpoint}/moto-api/", proc)
        fs = s3fs.S3FileSystem(endpoint_url=endpoint)
        fs.mkdir("nets")
        for name in names:
            fs.put(str(folder / name), f"nets/{name}", recursive=True)
        yield "s3://nets"
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        stop_process_groups([proc], 10.0)


def run_mode(client, link, url: str, mode: str, owners: np.ndarray, plan_url: str, truth: np.ndarray | None,
             chunks: int | None = None) -> Row:
    """One run of ``mode`` on the store at ``url`` (``local`` : data mode streamed from the local store, no link;
    ``data-again``, ``model-again``: streaming as before issue 45), the link's bytes counted around it."""
    from bench_read_once import fetched_again

    from dasknn import engine

    base = mode.removesuffix("-again")
    options = {"data": dict(resident=False), "local": dict(resident=False), "pipeline": {},
               "model": dict(partition=owners, resident=False, plan_store=plan_url),
               "auto": dict(partition=owners, plan_store=plan_url, explain=True)}[base]
    before = link.bytes_in()
    t0 = time.perf_counter()
    with fetched_again(mode.endswith("-again")):
        r = engine.infer(url, client=client, mode="data" if base == "local" else base, chunks=chunks, **options)
    wall = time.perf_counter() - t0
    note = ""
    if mode == "auto":
        predicted = ", ".join(f"{p.mode} {p.seconds:.1f} s" for p in r.predictions)
        note = f"auto chose {r.mode}" + (f" (predicted: {predicted})" if predicted else f" ({r.probe_skipped})")
        print(explained(r), flush=True)
    elif r.stages:
        note = "stages " + " ".join(f"{a}-{b}" for a, b in r.stages)
    return Row(mode, r.mode, r.seconds, r.load_seconds, wall, link.bytes_in() - before, r.bytes_read, r.categories,
               None if truth is None else bool(np.array_equal(r.categories, truth)), note)


def explained(result) -> str:
    """What auto's predictions are made of (seconds), and the calibration's rates they came from (a load and
    readers only where the code has them: bench_local_store runs the code before issue 45 too)."""
    lines = [f"  {p.mode} (K = {p.group_size}, {'resident' if p.resident else 'streamed'}): {p.seconds:.1f} s; "
             f"compute {p.compute:.1f}, read {p.read:.1f}, load {getattr(p, 'load_seconds', 0.0):.1f}, "
             f"exchange {p.exchange:.1f}, "
             f"tasks {p.tasks:.1f}, setup {p.setup_seconds:.1f}" for p in result.predictions]
    cal = result.calibration
    if cal is not None:
        rates = ", ".join(f"K = {g}: {r:.3g}" for g, r in sorted(cal.kernel_rates.items()))
        lines.append(f"  calibration: read {cal.read_rate / 1e6:.1f} MB/s (decoded, a worker; readers "
                     f"{getattr(cal, 'readers', '-')}), kernel {cal.kernel_rate:.3g} multiply-adds/s ({rates}), "
                     f"cores {cal.cores}")
    return "auto's predictions:\n" + "\n".join(lines)


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (bytes against data mode's where it ran)."""
    data = next((r for r in rows if r.mode == "data"), None)
    lines = ["| mode | ran | load s | inference s | wall s | bytes over the link | of data mode's | bytes read (decoded) "
             "| categories | equal to the truth | |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|---|---|"]
    for r in rows:
        share = f"{r.link_bytes / data.link_bytes:.2f}" if data and data.link_bytes else "-"
        lines.append(f"| {r.mode} | {r.ran} | {r.load:.2f} | {r.seconds:.2f} | {r.wall:.2f} | {r.link_bytes:,} | {share} | "
                     f"{r.bytes_read:,} | {r.categories.size} | {_exact(r.exact)} | {r.note} |")
    return "\n".join(lines)


def _exact(exact: bool | None) -> str:
    return "-" if exact is None else "yes" if exact else "NO"


def prepare(client, path: Path, url: str, parts: int, local_plan: Path, link) -> np.ndarray:
    """Untimed: the kernels compiled (a run on the local store), the partition (kept in the store) and the part
    plan (the workers read the layers at ``url``, write ``local_plan``). Returns the owners."""
    from dasknn import engine

    t0 = time.perf_counter()
    engine.infer(path, client=client, mode="data", images=20)
    owners = engine.resolve_partition(str(path), "hypergraph", parts)
    before = link.bytes_in()
    engine.infer(url, client=client, mode="model", partition=owners, resident=False, plan_store=str(local_plan),
                 images=20)
    print(f"prepared in {time.perf_counter() - t0:.1f} s (the part plan's run read {link.bytes_in() - before:,} "
          f"bytes over the link)", flush=True)
    return owners


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--neurons", type=int, default=4096)
    p.add_argument("--layers", type=int, default=120)
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", default="100mbit", help="the link's rate, as tc writes it (e.g. 100mbit, 1gbit)")
    p.add_argument("--workers", type=int, default=2, help="workers, and model mode's parts K")
    p.add_argument("--memory-limit", default="2GB")
    p.add_argument("--modes", default="local,data,pipeline,model,auto",
                   help="local: data mode streamed from the local store, no link (what computing and decoding cost)")
    p.add_argument("--s3", action="store_true", help="serve the store from moto's S3 server, not plain HTTP")
    p.add_argument("--chunks", type=int, default=None, help="image chunks of every mode (default: the engine's)")
    p.add_argument("--dir", default="/tmp/bench-rate-limited")
    p.add_argument("--no-truth", action="store_true",
                   help="make the store without its float64 truth (35 min at 65,536 x 480 here): the categories are "
                        "then compared across modes only")
    args = p.parse_args()

    import netns

    from dasknn import store
    from dasknn.cluster import local_client

    netns.require()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = network(folder, args.neurons, args.layers, args.images, args.seed, truth=not args.no_truth)
    truth = store.open_inputs(path).truth(np.float64)
    if truth is None and not args.no_truth:
        raise SystemExit(f"{path}: holds no truth (made with --no-truth): remove it, or pass --no-truth")
    plan_name = f"{path.stem}-plan-k{args.workers}.zarr"
    started = datetime.now(timezone.utc)
    with netns.namespace_behind_link(args.rate) as link:
        host = link.host
        if args.s3:
            server = s3_server(host, folder, [path.name])
        else:
            server = netns.http_server(host, folder, PORT)
        with server as root, local_client(workers=args.workers, threads_per_worker=1,
                                          memory_limit=args.memory_limit) as client:
            url = f"{root}/{path.name}"
            local_plan = folder / plan_name
            shutil.rmtree(local_plan, ignore_errors=True)  # made again: its digest names the store's URL
            owners = prepare(client, path, url, args.workers, local_plan, link)
            plan_url = f"{root}/{plan_name}"
            if args.s3:  # the plan goes up to the bucket beside the store (through the link, untimed)
                import s3fs

                s3fs.S3FileSystem().put(str(local_plan), f"nets/{plan_name}", recursive=True)
            rows = []
            for mode in args.modes.split(","):
                where = str(path) if mode == "local" else url
                rows.append(run_mode(client, link, where, mode, owners, plan_url, truth, args.chunks))
                print(f"{mode}: {rows[-1].seconds:.2f} s, {rows[-1].link_bytes:,} bytes over the link", flush=True)
    s = store.open_store(path)
    print(f"\n{started:%Y-%m-%d %H:%M} UTC, {platform.node()}, store {path.name} ({s.nbytes_on_disk():,} bytes "
          f"stored), {args.workers} workers of {args.memory_limit}, link {args.rate} both ways, "
          f"{'S3 (moto)' if args.s3 else 'HTTP'}{f', {args.chunks} chunks' if args.chunks else ''}")
    print(table(rows))
    cats = [r.categories for r in rows]
    print("categories equal across modes:", all(np.array_equal(c, cats[0]) for c in cats))


if __name__ == "__main__":
    main()
