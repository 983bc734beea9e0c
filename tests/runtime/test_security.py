"""Security: local clusters listen on loopback only, TLS with mutual authentication, stores read as data only."""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import ssl
from pathlib import Path

import numpy as np
import psutil
import pytest
import zarr

from dasknn import generate, store
from dasknn.cli import main
from dasknn.cluster import local_client, make_certificates, security_from_files
from dasknn.errors import DasknnError

PACKAGE = Path(__file__).resolve().parents[2] / "dasknn"


def _listening(pid: int) -> list[str]:
    return [c.laddr.ip for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]


def test_scheduler_workers_and_dashboard_listen_on_loopback_only(client):
    info = client.sync(client.scheduler.identity, n_workers=-1)  # asked now, not a cached copy
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", info["address"])
    assert info["workers"] and all(re.fullmatch(r"tcp://127\.0\.0\.1:\d+", w) for w in info["workers"])
    assert client.dashboard_link.startswith("http://127.0.0.1:")
    # every listening socket of the scheduler's process (this one) and of the worker processes
    pids = {os.getpid(), *client.run(os.getpid).values()}
    ips = [ip for pid in pids for ip in _listening(pid)]
    assert len(pids) == 3 and ips and set(ips) == {"127.0.0.1"}


@pytest.fixture(scope="module")
def tls_client():
    with local_client(workers=1, tls=True) as c:
        yield c


def test_tls_cluster_computes_and_listens_on_tls_only(tls_client):
    info = tls_client.sync(tls_client.scheduler.identity, n_workers=-1)
    assert info["address"].startswith("tls://127.0.0.1:")
    assert all(w.startswith("tls://127.0.0.1:") for w in info["workers"])
    assert tls_client.submit(sum, [1, 2, 3]).result() == 6
    sec = tls_client.security
    assert sec.require_encryption and Path(sec.tls_ca_file).is_file()
    assert Path(sec.tls_client_key).stat().st_mode & 0o077 == 0  # the key is this user's only


@pytest.mark.cluster
def test_client_with_the_certificate_is_admitted(tls_client):
    sec = tls_client.security
    with local_client(scheduler=tls_client.scheduler.address, tls_ca=sec.tls_ca_file, tls_cert=sec.tls_client_cert,
                      tls_key=sec.tls_client_key) as other:
        assert other.submit(pow, 2, 10).result() == 1024


@pytest.mark.cluster
def test_client_without_the_certificate_is_refused(tls_client, tmp_path):
    from distributed import Client

    address = tls_client.scheduler.address
    # a certificate from another authority: the scheduler does not trust it (nor does the client trust the
    # scheduler's)
    foreign = make_certificates(tmp_path)
    with pytest.raises((OSError, TimeoutError)):
        Client(address, security=security_from_files(foreign["ca"], foreign["cert"], foreign["key"]), timeout="3s")
    with pytest.raises(DasknnError, match="cannot reach the Dask scheduler"):
        with local_client(scheduler=address, tls_ca=foreign["ca"], tls_cert=foreign["cert"], tls_key=foreign["key"]):
            pass
    # no certificate at all, though trusting the cluster's authority: the server demands one (mutual TLS)
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=tls_client.security.tls_ca_file)
    ctx.check_hostname = False
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"\x00" * 16)
                reply = s.recv(1)  # TLS 1.3 reports the missing certificate after the handshake
        except (ssl.SSLError, ConnectionError):
            reply = b""
    assert reply == b""
    # and plain TCP to the TLS port gets nowhere
    with pytest.raises((OSError, TimeoutError)):
        Client(address.replace("tls://", "tcp://"), timeout="3s")


def test_infer_command_with_tls(slice_store, capsys):
    assert main(["infer", "--network", str(slice_store), "--tls", "--workers", "1", "--batch", "200",
                 "--dtype", "float64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matches_truth"] is True


@pytest.mark.parametrize("argv, message", [
    (["--tls-ca", "ca.pem"], "go together"),
    (["--tls-ca", "no-ca.pem", "--tls-cert", "no-cert.pem", "--tls-key", "no-key.pem"], "--tls-ca: no such file"),
    (["--tls", "--scheduler", "tls://127.0.0.1:1"], "needs the cluster's --tls-ca"),
])
def test_tls_option_errors(slice_store, capsys, argv, message):
    assert main(["infer", "--network", str(slice_store), "--workers", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# --- stores are read as data only ----------------------------------------------------------------------------

@pytest.fixture()
def small_store(tmp_path) -> Path:
    net = generate.network(64, 2, seed=4, bias=-0.3)
    return store.write_network(tmp_path / "s.zarr", net, generate.images(8, 64, seed=4), np.array([1, 2]))


class _Marker:
    """Unpickling this creates a file: proof that a store's bytes were unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.fixture()
def pickle_codec():
    """A pickle codec, registered as a plugin could register one: decoding a chunk unpickles it."""
    from zarr.codecs import BytesCodec
    from zarr.core.buffer import default_buffer_prototype
    from zarr.registry import register_codec

    class PickleCodec(BytesCodec):
        @classmethod
        def from_dict(cls, data):
            return cls()

        def to_dict(self):
            return {"name": "numcodecs.pickle"}

        async def _decode_single(self, chunk_bytes, chunk_spec):
            obj = pickle.loads(chunk_bytes.to_bytes())
            return default_buffer_prototype().nd_buffer.from_numpy_array(np.asarray(obj, dtype=np.float32))

    register_codec("numcodecs.pickle", PickleCodec)
    return PickleCodec


def test_pickle_codec_in_a_store_is_refused_unread(small_store, tmp_path, pickle_codec):
    values = small_store / "layers" / "1" / "values"
    meta = json.loads((values / "zarr.json").read_text())
    meta["codecs"] = [{"name": "numcodecs.pickle"}]
    (values / "zarr.json").write_text(json.dumps(meta))
    marker = tmp_path / "unpickled"
    (values / "c" / "0").write_bytes(pickle.dumps(_Marker(str(marker))))
    # zarr itself would decode it: the codec is registered
    with pytest.raises(Exception):
        zarr.open_array(values, mode="r")[:]
    assert marker.exists()
    marker.unlink()
    for check in ("full", "metadata"):
        with pytest.raises(DasknnError, match="layer 1: values: codec numcodecs.pickle is not allowed"):
            store.open_store(small_store, check=check)
    assert not marker.exists()


def test_object_dtype_arrays_are_refused(small_store):
    root = zarr.open_group(small_store, mode="r+")
    del root["inputs/truth"]
    root["inputs"].create_array("truth", shape=(2,), dtype=str)[:] = np.array(["1", "2"])
    s = store.open_store(small_store)
    with pytest.raises(DasknnError, match="inputs: truth: (data type|codec) .* is not allowed"):
        s.inputs.truth()
    del root["layers/2/indices_1"]
    root["layers/2"].create_array("indices_1", shape=(64 * 32,), dtype=str)
    with pytest.raises(DasknnError, match="layer 2: indices_1: (data type|codec) .* is not allowed"):
        store.open_store(small_store)


def test_dasknn_never_unpickles():
    # no pickle.load(s), np.load(allow_pickle=True), joblib or dill anywhere in the package
    forbidden = re.compile(r"pickle\.loads?\(|allow_pickle\s*=\s*True|cloudpickle\.loads?|joblib\.load|dill\.load"
                           r"|import pickle|from pickle")
    hits = [f"{p.name}:{n}" for p in PACKAGE.glob("*.py") for n, line in enumerate(p.read_text().splitlines(), 1)
            if forbidden.search(line)]
    assert hits == []
    # and every np.load says allow_pickle=False
    loads = [line for p in PACKAGE.glob("*.py") for line in p.read_text().splitlines() if "np.load(" in line]
    assert all("allow_pickle=False" in line for line in loads)
