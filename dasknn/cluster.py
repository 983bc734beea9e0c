"""Connecting to Dask: a local cluster bound to this machine, or an existing scheduler, optionally over TLS.

With TLS every connection (client, scheduler, workers) is encrypted and both ends must present a certificate
signed by the cluster's certificate authority (distributed's ``Security``, mutual authentication). A local
cluster gets a temporary authority and certificate, made here and deleted when the cluster closes; a real
cluster's files are given with ``--tls-ca/--tls-cert/--tls-key``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import ipaddress
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from . import timings
from .errors import DasknnError


def make_certificates(folder: str | os.PathLike[str], days: int = 7) -> dict[str, Path]:
    """Write a new self-signed certificate authority and one certificate it signs (for every role) to ``folder``.

    Returns the paths ``{"ca": ..., "cert": ..., "key": ...}``; the private keys are readable by this user only.
    Elliptic-curve (P-256) keys: made in milliseconds, unlike RSA.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)  # tolerate a little clock skew
    until = now + _dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dasknn temporary CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dasknn")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # one certificate for every role: it serves (scheduler, workers) and connects (client, workers)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / "ca.pem", "cert": folder / "cert.pem", "key": folder / "key.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(paths["key"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths


def security_from_files(ca: str | os.PathLike[str], cert: str | os.PathLike[str],
                        key: str | os.PathLike[str]):
    """A ``distributed.security.Security`` requiring TLS, with ``cert``/``key`` for every role and ``ca`` trusted."""
    from distributed.security import Security

    for flag, p in (("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)):
        if not Path(p).is_file():
            raise DasknnError(f"{flag}: no such file or directory", p)
    ca, cert, key = (os.fspath(Path(p).resolve()) for p in (ca, cert, key))
    try:
        sec = Security(require_encryption=True, tls_ca_file=ca,
                       tls_client_cert=cert, tls_client_key=key, tls_scheduler_cert=cert, tls_scheduler_key=key,
                       tls_worker_cert=cert, tls_worker_key=key)
        sec.get_connection_args("client")  # loads the files now: a bad one is a clear error, not a hang later
    except Exception as e:  # ssl.SSLError, ValueError: the files are not a certificate/key pair and CA
        raise DasknnError(f"the TLS files cannot be used ({type(e).__name__}: {e})", cert) from None
    return sec


@contextlib.contextmanager
def _security(tls: bool, tls_ca, tls_cert, tls_key) -> Iterator:
    """The cluster's Security (None without TLS); temporary files are removed on exit."""
    given = [p for p in (tls_ca, tls_cert, tls_key) if p]
    if given and len(given) != 3:
        raise DasknnError("--tls-ca, --tls-cert and --tls-key go together")
    if given:
        yield security_from_files(tls_ca, tls_cert, tls_key)
    elif tls:
        folder = tempfile.mkdtemp(prefix="dasknn-tls-")  # mode 0700: the key is this user's only
        try:
            paths = make_certificates(folder)
            yield security_from_files(paths["ca"], paths["cert"], paths["key"])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        yield None


@contextlib.contextmanager
def local_client(
    workers: int | None = None,
    threads_per_worker: int = 1,
    scheduler: str | None = None,
    memory_limit: str | int | None = "auto",
    gpu: bool = False,
    tls: bool = False,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
) -> Iterator:
    """Yield a ``distributed.Client``: connected to ``scheduler``, or to a new local cluster closed on exit.

    A local cluster listens on 127.0.0.1 only (nothing is opened to the network), runs one worker process per
    core by default, each with ``threads_per_worker`` threads; its HTTP routes and dashboard listen on a free
    port of 127.0.0.1 (``client.dashboard_link``). With
    ``gpu``, it is a ``dask_cuda.LocalCUDACluster``: one worker per visible GPU.

    With ``tls`` (or the three files ``tls_ca``, ``tls_cert``, ``tls_key``) every connection uses TLS with
    mutual authentication: a local cluster gets a temporary certificate authority and certificate (deleted on
    exit) unless files are given; a ``scheduler`` needs the files its cluster was started with.
    """
    from distributed import Client, LocalCluster

    timings.enter("cluster start")  # (connecting, with a scheduler given)
    if scheduler and tls and not (tls_ca and tls_cert and tls_key):
        raise DasknnError("--tls with --scheduler needs the cluster's --tls-ca, --tls-cert and --tls-key")
    with _security(tls, tls_ca, tls_cert, tls_key) as security:
        secure = {} if security is None else {"security": security, "protocol": "tls://"}
        if gpu and not scheduler:
            try:
                from dask_cuda import LocalCUDACluster
            except ImportError:
                raise DasknnError("--gpu needs CuPy and dask-cuda: pip install 'dasknn[gpu]'") from None
            cuda = _started_deaf(lambda: LocalCUDACluster(
                host="127.0.0.1", dashboard_address="127.0.0.1:0",
                CUDA_VISIBLE_DEVICES=None if workers is None else list(range(workers)),
                silence_logs=logging.ERROR, **secure), workers=None)
            yield from _run_then_close(cuda, security)
            return
        if scheduler:
            if security is not None:
                if scheduler.startswith("tcp://"):
                    raise DasknnError(f"--tls needs a tls:// scheduler address, not {scheduler}")
                if "://" not in scheduler:
                    scheduler = "tls://" + scheduler
            refused = _refused(scheduler)
            if refused:
                raise DasknnError(f"cannot reach the Dask scheduler at {scheduler} ({refused})")
            try:
                client = Client(scheduler, timeout="20s", security=security)
            except (OSError, TimeoutError) as e:
                raise DasknnError(f"cannot reach the Dask scheduler at {scheduler} ({e})") from None
            with client:
                yield client
                timings.enter("cluster stop")
            return
        n = workers or max(1, (os.cpu_count() or 1) // max(1, threads_per_worker))
        if n < 1 or threads_per_worker < 1:
            raise DasknnError("--workers and --threads-per-worker must be at least 1")
        with _scratch_folder() as scratch:
            cluster = _started_deaf(lambda: LocalCluster(
                    n_workers=n,
                    threads_per_worker=threads_per_worker,
                    processes=True,
                    host="127.0.0.1",
                    # the scheduler's HTTP routes (and the dashboard, where bokeh is installed) on a free local
                    # port: a fixed 8787 collides with any other cluster on the machine
                    dashboard_address="127.0.0.1:0",
                    memory_limit=memory_limit,
                    silence_logs=logging.ERROR,
                    preload=[__name__],  # dask_setup: a worker restarted after a loss deaf to Ctrl-C too
                    # the workers' and the scheduler's (each a Dask server with a scratch space)
                    local_directory=scratch,
                    scheduler_kwargs={} if scratch is None else {"local_directory": scratch},
                    **secure,
                ), workers=n)
            yield from _run_then_close(cluster, security)


@contextlib.contextmanager
def _scratch_folder() -> Iterator[str | None]:
    """A folder for a local cluster's workers' scratch space (their lock files, data they spill), removed once
    the cluster is closed: Dask's default, a ``dask-scratch-space`` in the temporary folder, stayed there after
    every ``dasknn infer``. None (Dask's own choice) where Dask's ``temporary-directory`` is configured."""
    import dask

    if dask.config.get("temporary-directory", None):
        yield None
        return
    folder = tempfile.mkdtemp(prefix="dasknn-dask-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


#: Seconds a local cluster's worker processes may take to be spawned (not started) while Ctrl-C is ignored.
SPAWN_SECONDS = 10.0


def _started_deaf(make, workers: int | None):
    """``make()``, a local cluster, with its ``workers`` worker processes deaf to the terminal's Ctrl-C.

    Ctrl-C on a terminal signals every process of its group: a worker that took it printed a 33-line
    ``KeyboardInterrupt`` traceback as it died (issue 42). SIGINT ignored when a process is spawned stays ignored
    in the Python it runs, so the cluster is made in a thread while this one ignores SIGINT until ``workers`` new
    worker processes exist, then hears it again and waits for the cluster: only this process acts on an interrupt,
    closing the cluster in order on its way out (a worker a nanny starts again after a loss is made deaf by
    :func:`dask_setup`). For ``workers`` None (a dask-cuda cluster: a worker per visible GPU) SIGINT is ignored
    while the whole cluster is made, here. Elsewhere than the main thread nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        return make()
    if workers is None:
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return make()
        finally:
            signal.signal(signal.SIGINT, handler)
    made: dict = {}

    def build() -> None:
        try:
            made["cluster"] = make()
        except BaseException as e:  # raised again in this thread
            made["error"] = e

    thread = threading.Thread(target=build, name="dasknn-local-cluster", daemon=True)
    before = _spawned()
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        thread.start()
        deadline = time.monotonic() + SPAWN_SECONDS
        while thread.is_alive() and time.monotonic() < deadline and len(_spawned() - before) < workers:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, handler)
    try:
        while thread.is_alive():
            thread.join(0.1)
    except KeyboardInterrupt:
        thread.join()
        if "cluster" in made:
            made["cluster"].close()
        raise
    if "error" in made:
        raise made["error"]
    return made["cluster"]


def _spawned() -> set[int]:
    # this process's children running multiprocessing's spawn (a nanny's worker, once it has started Python)
    import psutil

    pids = set()
    for child in psutil.Process().children():
        try:
            if any("spawn_main" in part for part in child.cmdline()):
                pids.add(child.pid)
        except psutil.Error:  # gone, or not yet readable
            pass
    return pids


def dask_setup(worker) -> None:
    """The local cluster's workers' preload (this module, named in :func:`local_client`): the terminal's Ctrl-C is
    not theirs to act on (see :func:`_started_deaf`)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _refused(address: str) -> str | None:
    """Why a TCP connection to the scheduler at ``address`` is refused at once ("connection refused"), or None
    (it was accepted, or the address is not TCP, or the answer is slow: the client's own timeout then decides).
    A distributed client retries a refused port for its whole timeout, 25 s, where the refusal is known at once."""
    import socket

    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port

    try:
        scheme, location = parse_address(address)
        if scheme not in ("tcp", "tls"):
            return None
        host, port = parse_host_port(location)
        with socket.create_connection((host, port), timeout=REFUSAL_SECONDS):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except (OSError, ValueError, TypeError):
        return None


#: Seconds to wait for a scheduler's port to answer before the client's own, longer, timeout takes over.
REFUSAL_SECONDS = 3.0


#: How long closing waits for a heartbeat already sent to be answered (a scheduler answers in milliseconds).
HEARTBEAT_DRAIN_SECONDS = 10.0


async def _stop_heartbeat(dask_worker) -> None:
    """Stop this worker's heartbeat and wait until one already sent has its answer (run on each worker).

    ``Worker.close`` stops the heartbeat's timer but not a heartbeat waiting for the scheduler's answer, then
    closes the worker's connections under it: that heartbeat fails with ``CommClosedError``, which distributed
    logs with its traceback. With no heartbeat left in flight, the workers close in silence, whatever the order.
    """
    dask_worker.periodic_callbacks["heartbeat"].stop()
    code = type(dask_worker).heartbeat.__code__
    deadline = time.monotonic() + HEARTBEAT_DRAIN_SECONDS
    while _awaiting(code) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def _awaiting(code) -> bool:
    # whether a task of this event loop is inside the coroutine ``code`` (anywhere in its chain of awaits)
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        while coro is not None:
            if getattr(coro, "cr_code", None) is code:
                return True
            coro = getattr(coro, "cr_await", None)
    return False


#: ``distributed.deploy.lost-worker-timeout`` while a local cluster runs (see :func:`_run_then_close`).
LOST_WORKER_TIMEOUT = "24h"


def _run_then_close(cluster, security) -> Iterator:
    """Yield a client of ``cluster``; then close in order: the client, the workers, the scheduler (a generator to
    delegate to).

    However the run ended (an interrupt too), the workers' heartbeats are stopped and drained first (see
    :func:`_stop_heartbeat`), so closing them interrupts no message to the scheduler. Nothing is silenced: an
    error logged while closing is still printed.
    """
    import dask
    from distributed import Client

    # exits in reverse: the client, then the cluster (SpecCluster.close: its workers, then its scheduler)
    with cluster, Client(cluster, security=security) as client:
        # SpecCluster closes a worker's nanny for good lost-worker-timeout (15 s) after the worker left the
        # scheduler, if no worker of its name is registered at that moment; a client.restart() under way then
        # (its workers out, not yet back) lost the nannies and the restart never returned (dask/distributed#7312).
        # A local cluster's nannies restart their workers themselves: they are closed with the cluster instead.
        try:
            with dask.config.set({"distributed.deploy.lost-worker-timeout": LOST_WORKER_TIMEOUT}):
                yield client
        finally:
            timings.enter("cluster stop")
            try:
                client.run(_stop_heartbeat, on_error="ignore")
            except Exception:  # a worker gone already: it has no heartbeat left to stop
                pass


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--tls``, ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` to a command's parser."""
    parser.add_argument("--tls", action="store_true",
                        help="TLS with mutual authentication between client, scheduler and workers (a local "
                             "cluster gets temporary certificates unless --tls-ca/--tls-cert/--tls-key are given)")
    parser.add_argument("--tls-ca", metavar="PEM", help="the cluster's certificate authority (implies --tls)")
    parser.add_argument("--tls-cert", metavar="PEM", help="this client's certificate, signed by --tls-ca")
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")


def tls_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of :func:`local_client` that :func:`add_tls_arguments` parsed."""
    return {"tls": bool(getattr(args, "tls", False)), "tls_ca": getattr(args, "tls_ca", None),
            "tls_cert": getattr(args, "tls_cert", None), "tls_key": getattr(args, "tls_key", None)}
