"""A real S3 API on loopback for the tests: moto's standalone server, one bucket, one IAM user whose keys are the
only ones it accepts, and the environment that points dasknn (and the workers it starts) at it."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

BUCKET = "nets"
#: What a test environment must not inherit: a profile or a session token of the machine's own AWS set-up.
_CLEARED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL_S3", "FSSPEC_S3", "FSSPEC_S3_ENDPOINT_URL")


@dataclass(frozen=True)
class S3Endpoint:
    """A running S3 API: its URL and the keys it accepts."""

    url: str
    key: str
    secret: str

    def environment(self, **changes: str) -> dict[str, str]:
        """The variables that point botocore (and so s3fs) at this endpoint with these keys, ``changes`` applied."""
        env = {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": self.url}
        return {**env, **changes}


class _WaitingServer:
    """Moto's S3 application served on 127.0.0.1 by a threaded server that answers each request ``wait`` seconds
    late, as an object store's first byte comes tens of milliseconds after its request (the benchmarks' endpoint;
    the tests use moto's own :class:`~moto.server.ThreadedMotoServer`)."""

    def __init__(self, wait: float):
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        moto = DomainDispatcherApplication(create_backend_app)

        def late(environ, start_response):
            time.sleep(wait)
            return moto(environ, start_response)

        self._server = make_server("127.0.0.1", 0, late, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def get_host_and_port(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()


@contextlib.contextmanager
def moto_server(wait_ms: float = 0.0) -> Iterator[S3Endpoint]:
    """Start moto's server on 127.0.0.1, make the bucket and a user allowed every S3 action (whose keys the
    endpoint carries); yield the endpoint, stop the server after. Moto accepts any keys until
    :func:`authentication` turns its checks on. ``wait_ms``: each request answered that many milliseconds late."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request
    server = _WaitingServer(wait_ms / 1e3) if wait_ms > 0 else ThreadedMotoServer(ip_address="127.0.0.1", port=0,
                                                                                  verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        # moto's accounts live in this process: a server started after another begins from nothing, as a fresh one
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"))
        anyone = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "setup",
                  "aws_secret_access_key": "setup"}
        boto3.client("s3", **anyone).create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam", **anyone)
        iam.create_user(UserName="dasknn")
        iam.put_user_policy(UserName="dasknn", PolicyName="s3", PolicyDocument=(
            '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'))
        keys = iam.create_access_key(UserName="dasknn")["AccessKey"]
        yield S3Endpoint(url, keys["AccessKeyId"], keys["SecretAccessKey"])
    finally:
        server.stop()


@contextlib.contextmanager
def authentication(endpoint: S3Endpoint) -> Iterator[None]:
    """Within the block, the server checks every request's keys against its users, as AWS does.

    Only within a block: moto 5.2's check rejects a correctly signed listing whose query holds a ``/``
    (``prefix=a/``, as s3fs lists), so the tests that read and write run with the checks off.
    """
    def checks_after(requests: str) -> None:  # moto's switch: requests left unchecked from now on
        urllib.request.urlopen(urllib.request.Request(f"{endpoint.url}/moto-api/reset-auth", data=requests.encode(),
                                                      method="POST", headers={"Content-Type": "text/plain"}))

    checks_after("0")
    try:
        yield
    finally:
        checks_after("inf")


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (and the machine's own AWS settings cleared) within the block; workers
    started within it inherit them. s3fs's cached file systems (made under other settings) are dropped."""
    import s3fs

    saved = {k: os.environ.get(k) for k in (*values, *_CLEARED)}
    for k in _CLEARED:
        os.environ.pop(k, None)
    os.environ.update(values)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def stalled_endpoint() -> Iterator[str]:
    """A URL whose server accepts connections (the kernel's backlog does) and never answers a byte."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
