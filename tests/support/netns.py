"""Several hosts on this machine: the scheduler, the client and each worker in a network namespace of its own, joined
by veth pairs on one bridge, each link rate-limited (``tc ... tbf``), so that every byte between them crosses a real
network interface. A worker can sit behind a relay that delays what crosses it (this kernel has no ``netem``), and a
worker's link can be cut (``ip link set ... down``).

Needs root and ``ip``/``tc`` (iproute2); :func:`available` says why not where it cannot run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dasknn.testing import stop_process_groups

#: The hosts' network: 10.78.N.0/24 (N per cluster, so two clusters never share addresses).
NET = "10.78"


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def available() -> str:
    """Empty where namespaces can be made here, else why not (a skip's reason)."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"dkprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        return f"ip netns add is not permitted here ({made.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


def require() -> None:
    """For a script: end it in one line where namespaces cannot be made here (:func:`available`)."""
    why_not = available()
    if why_not:
        raise SystemExit(f"no network namespaces here: {why_not}")


@dataclass
class Host:
    """One namespace: its name, its address, the veth end in the root namespace (on the bridge)."""

    ns: str
    address: str
    veth: str


@dataclass
class NamespacedCluster:
    """A scheduler, workers and a client's namespace (see :func:`namespaced_cluster`)."""

    scheduler: str  # its address, tcp://...
    client: Host
    workers: list[Host]
    processes: list[subprocess.Popen] = field(default_factory=list)

    def namespaces(self) -> dict[str, str]:
        """Each worker's address (without its port) to its namespace: what a link cut needs to find it."""
        return {host.address: host.ns for host in self.workers}

    def run_client(self, args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
        """Run ``python args`` in the client's namespace."""
        return subprocess.run(["ip", "netns", "exec", self.client.ns, sys.executable, *args], capture_output=True,
                              text=True, timeout=timeout, env=env)

    def cut(self, worker: int) -> None:
        """Cut worker ``worker``'s link: its namespace's interface goes down."""
        _ip("link", "set", "eth0", "down", ns=self.workers[worker].ns)


def limit_rate(host: Host, rate: str) -> None:
    """Limit ``host``'s link to ``rate`` (``tc``'s notation: ``1gbit``, ``100mbit``) both ways: a token bucket
    (``tbf``) on the namespace's end and on the root namespace's."""
    for dev, ns in (("eth0", host.ns), (host.veth, None)):
        cmd = ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "128kb", "latency", "10ms"]
        subprocess.run(cmd if ns is None else ["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True)


@dataclass(frozen=True)
class Link:
    """A namespace reached from the root namespace by one veth pair: the far host and the near end's address."""

    host: Host
    near: str  # the root namespace's address on the link

    def bytes_in(self) -> int:
        """Bytes that have come from the namespace over the link (received by the root namespace's end)."""
        return int(Path(f"/sys/class/net/{self.host.veth}/statistics/rx_bytes").read_text())

    def bytes_out(self) -> int:
        """Bytes that have gone to the namespace over the link."""
        return int(Path(f"/sys/class/net/{self.host.veth}/statistics/tx_bytes").read_text())


@contextlib.contextmanager
def namespace_behind_link(rate: str) -> Iterator[Link]:
    """One namespace, reached from this (root) namespace by a single veth pair limited to ``rate`` both ways
    (:func:`limit_rate`): every process here that talks to it shares the link. Removed after."""
    tag = uuid.uuid4().hex[:4]
    subnet = f"{NET}.{int(tag, 16) % 200 + 20}"
    host = Host(f"dk{tag}far", f"{subnet}.1", f"dk{tag}far")
    try:
        subprocess.run(["ip", "netns", "add", host.ns], check=True, capture_output=True)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        _ip("addr", "add", f"{subnet}.254/24", "dev", host.veth)
        _ip("link", "set", host.veth, "up")
        _ip("addr", "add", f"{host.address}/24", "dev", "eth0", ns=host.ns)
        _ip("link", "set", "eth0", "up", ns=host.ns)
        _ip("link", "set", "lo", "up", ns=host.ns)
        limit_rate(host, rate)
        yield Link(host, f"{subnet}.254")
    finally:
        subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host.veth], capture_output=True)


@contextlib.contextmanager
def http_server(host: Host, folder: str | os.PathLike[str], port: int = 8000) -> Iterator[str]:
    """``folder`` served over plain HTTP from ``host``'s namespace at its address (``http_files.py`` beside this:
    keep-alive, ``sendfile``, byte ranges; fast enough to fill 1 Gbit/s); yields the root URL once it answers."""
    script = Path(__file__).with_name("http_files.py")
    proc = _spawn(host.ns, [str(script), "--bind", host.address, str(port), "--directory", str(folder)],
                  dict(os.environ))
    root = f"http://{host.address}:{port}"
    try:
        wait_until_answering(f"{root}/", proc)
        yield root
    finally:
        stop_process_groups([proc], 10.0)


def wait_until_answering(url: str, proc: subprocess.Popen, seconds: float = 30) -> None:
    """Return once ``url`` answers a GET (any status); raise where ``proc``, its server, ends or ``seconds``
    pass first."""
    import time
    import urllib.error
    import urllib.request

    end = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # an answer
        except OSError:
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError(f"no server answered at {url}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def namespaced_cluster(workers: int = 2, rate: str = "1gbit", delay_worker: int | None = None,
                       delay_seconds: float = 0.001, env: dict[str, str] | None = None,
                       memory_limit: str = "2GB") -> Iterator[NamespacedCluster]:
    """A ``dask scheduler`` and ``workers`` nanny-managed ``dask worker`` processes, each in its own namespace, and a
    namespace for the client; every link limited to ``rate`` (``tc tbf``, both ways). With ``delay_worker``, that
    worker is reached through a relay that holds everything it forwards, both ways, ``delay_seconds``."""
    tag = uuid.uuid4().hex[:4]
    subnet = f"{NET}.{int(tag, 16) % 200 + 20}"
    bridge = f"dkbr{tag}"
    hosts: list[Host] = []
    procs: list[subprocess.Popen] = []
    relay = None
    env = dict(os.environ) if env is None else env
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.254/24", "dev", bridge)  # (the test itself watches from here)
        _ip("link", "set", bridge, "up")
        for i, role in enumerate(["sched", "client", *(f"w{w}" for w in range(workers))]):
            host = Host(f"dk{tag}{role}", f"{subnet}.{i + 1}", f"dk{tag}{role}"[:15])
            hosts.append(host)
            subprocess.run(["ip", "netns", "add", host.ns], check=True, capture_output=True)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
            _ip("link", "set", host.veth, "master", bridge)
            _ip("link", "set", host.veth, "up")
            _ip("addr", "add", f"{host.address}/24", "dev", "eth0", ns=host.ns)
            _ip("link", "set", "eth0", "up", ns=host.ns)
            _ip("link", "set", "lo", "up", ns=host.ns)
            limit_rate(host, rate)
        sched, client, worker_hosts = hosts[0], hosts[1], hosts[2:]
        scheduler = f"tcp://{sched.address}:8786"
        procs.append(_spawn(sched.ns, ["-m", "dask", "scheduler", "--host", sched.address, "--port", "8786",
                                       "--no-dashboard"], env))
        for w, host in enumerate(worker_hosts):
            args = ["-m", "dask", "worker", scheduler, "--nthreads", "1", "--memory-limit", memory_limit, "--nanny",
                    "--no-dashboard", "--host", host.address]
            if w == delay_worker:
                # peers reach this worker through a relay on the scheduler's host, which holds what it forwards
                relay = DelayRelay(sched.ns, sched.address, 9100, host.address, 9101, delay_seconds)
                args = ["-m", "dask", "worker", scheduler, "--nthreads", "1", "--memory-limit", memory_limit,
                        "--nanny", "--no-dashboard", "--listen-address", f"tcp://{host.address}:9101",
                        "--contact-address", f"tcp://{sched.address}:9100"]
            procs.append(_spawn(host.ns, args, env))
        cluster = NamespacedCluster(scheduler, client, worker_hosts, procs)
        _wait_for_workers(cluster, workers, env)
        yield cluster
    finally:
        stop_process_groups(procs, 15.0)
        if relay is not None:
            relay.stop()
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True)
            subprocess.run(["ip", "link", "del", host.veth], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _spawn(ns: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _wait_for_workers(cluster: NamespacedCluster, n: int, env: dict[str, str], timeout: float = 120) -> None:
    code = ("import sys; from distributed import Client\n"
            f"c = Client({cluster.scheduler!r}, timeout='30s'); c.wait_for_workers({n}, timeout={timeout}); c.close()")
    done = cluster.run_client(["-c", code], env, timeout=timeout + 60)
    if done.returncode:
        raise RuntimeError(f"the namespaced cluster did not come up: {done.stderr[-2000:]}")


class DelayRelay:
    """A TCP relay in namespace ``ns``: listens on ``host:port``, forwards to ``to_host:to_port``, and holds every
    piece it forwards, either way, ``delay`` seconds (latency this kernel's tc cannot add)."""

    def __init__(self, ns: str, host: str, port: int, to_host: str, to_port: int, delay: float):
        code = _RELAY.format(host=host, port=port, to_host=to_host, to_port=to_port, delay=delay)
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


_RELAY = """
import asyncio

async def pipe(reader, writer):
    # a delay line: each piece is written {delay} s after it was read, and reading goes on meanwhile, so the relay
    # adds latency without capping the throughput (a piece held before the next read would cap it at a piece per
    # delay)
    loop = asyncio.get_running_loop()
    line = asyncio.Queue()

    async def release():
        try:
            while (item := await line.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    out = asyncio.ensure_future(release())
    try:
        while data := await reader.read(1 << 16):
            line.put_nowait((loop.time() + {delay}, data))
    except (ConnectionError, OSError):
        pass
    finally:
        line.put_nowait(None)
        await out

async def serve(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_connection({to_host!r}, {to_port})
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main():
    server = await asyncio.start_server(serve, {host!r}, {port})
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""
