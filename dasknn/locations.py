"""Where things are read and written: a local path or a URL, decided once, from the argument parsed to the call that
opens it.

A location is a :class:`~pathlib.Path` (a local file or folder) or a ``str`` holding a URL (``s3://``, ``gs://``,
``https://``, ``file://`` ...), opened through fsspec. :func:`as_location` makes one from what a user gave, checking
that the URL's protocol has an fsspec implementation installed; nothing turns a URL into a ``Path``. The operations
stores need on either kind (exists, is a file, remove, list, join) are here, and so is the translation of what an
object store's client raises (credentials refused, no such bucket, an endpoint that does not answer) into one
:class:`~dasknn.errors.DasknnError` line. Imports neither Zarr nor Dask: the command line's argument types use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import DasknnError

#: A local path, or a URL (kept as the string given, without a trailing slash).
Location = Path | str

#: The ``pip install`` that brings a protocol's fsspec implementation, where dasknn has an extra for it.
EXTRAS = {"s3": "dasknn[s3]", "s3a": "dasknn[s3]", "http": "dasknn[remote]", "https": "dasknn[remote]"}

#: Object-store client settings (botocore's ``Config``) that bound how long an endpoint that does not answer can
#: hold a command: seconds to connect, seconds a read may wait for the next bytes, attempts per request (s3fs asks
#: twice at most, a HEAD then a listing, for what may be a folder: 40 s at most). The user's fsspec configuration
#: (``FSSPEC_S3_CONFIG_KWARGS='{"read_timeout": 60}'``) overrides them.
S3_CONFIG = {"connect_timeout": 5, "read_timeout": 10, "retries": {"max_attempts": 2, "mode": "standard"}}
#: s3fs's own tries of a request that timed out, over botocore's attempts (s3fs's default, 5, would multiply
#: them): one, botocore's attempts being the retries.
S3_RETRIES = 1

#: The packages whose exceptions are an object store's or a file system's answer (or silence), not a bug of ours.
REMOTE_MODULES = frozenset({"botocore", "aiobotocore", "aiohttp", "s3fs", "fsspec", "gcsfs", "adlfs"})


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a location by URL (``s3://``, ``gs://``, ``https://``, ``file://`` ...: read and written
    through fsspec) rather than a local path."""
    return "://" in os.fspath(path)


def protocol_of(url: str) -> str:
    """The URL's protocol, lower case (``s3`` for ``s3://nets/n.zarr``)."""
    return url.split("://", 1)[0].lower()


def as_location(path: str | os.PathLike[str]) -> Location:
    """What ``path`` names: the URL as given (without a trailing slash; its protocol checked to be installed) or a
    local :class:`~pathlib.Path` (as given, not resolved). The command line's type for every store argument."""
    if isinstance(path, Path):
        return path
    text = os.fspath(path)
    if not is_url(text):
        return Path(text)
    url = text.rstrip("/")
    require_protocol(url)
    return url


def location(path: str | os.PathLike[str]) -> Location:
    """A store's location: an absolute local path, or the URL (see :func:`as_location`)."""
    loc = as_location(path)
    return loc.resolve() if isinstance(loc, Path) else loc


def local_path(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a local :class:`~pathlib.Path`, for ``what`` (``"--out of export"``) that only a local file or
    folder can be: a URL is refused in one line, never made a local folder named after it."""
    if is_url(path):
        raise DasknnError(f"{what} must be a local path (URLs name stores: .zarr)", path)
    return Path(path)


def require_protocol(url: str) -> None:
    """Refuse, in one line naming what to install, a URL whose protocol has no fsspec implementation here."""
    import fsspec
    from fsspec.registry import known_implementations

    protocol = protocol_of(url)
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        module = e.name or known_implementations.get(protocol, {}).get("class", protocol).split(".")[0]
        package = EXTRAS.get(protocol, module)
        raise DasknnError(f"{protocol}:// needs a package that is not installed: pip install '{package}'",
                          url) from None
    except ValueError:
        raise DasknnError(f"unknown protocol {protocol}:// (fsspec has no implementation of it)", url) from None


def storage_options(url: str) -> dict[str, Any]:
    """The options dasknn opens ``url``'s file system with: bounded timeouts for object stores, under the user's
    fsspec configuration (``FSSPEC_S3_CONFIG_KWARGS`` and the like), which wins."""
    if protocol_of(url) not in ("s3", "s3a"):
        return {}
    import fsspec.config

    mine = fsspec.config.conf.get("s3", {}).get("config_kwargs", {})
    return {"config_kwargs": {**S3_CONFIG, **mine}}


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of ``url`` (opened with :func:`storage_options`) and the path inside it."""
    import fsspec.core

    require_protocol(url)
    with remote_errors(url):
        fs, root = fsspec.core.url_to_fs(url, **storage_options(url))
    return bounded(fs, url), root.rstrip("/")


def bounded(fs: Any, url: str) -> Any:
    """``fs`` (opened for ``url`` with :func:`storage_options`) with what bounds its retries and cannot be given as
    an option: s3fs's own tries (:data:`S3_RETRIES`, an instance setting)."""
    if protocol_of(url) in ("s3", "s3a"):
        fs.retries = S3_RETRIES
    return fs


#: Protocols fsspec reads but cannot write (a store there is read only).
READ_ONLY_PROTOCOLS = frozenset({"http", "https"})


def writable(loc: Location) -> bool:
    """Whether dasknn can write inside ``loc``: a local folder this user may write to, or a URL whose protocol can
    be written (an object store; not HTTP)."""
    if isinstance(loc, Path):
        return os.access(loc, os.W_OK)
    return protocol_of(loc) not in READ_ONLY_PROTOCOLS


def join(loc: Location, *parts: str) -> Location:
    """``loc / part / ...``, a URL staying a URL."""
    if isinstance(loc, Path):
        return loc.joinpath(*parts)
    return "/".join([loc.rstrip("/"), *(p.strip("/") for p in parts)])


def exists(loc: Location) -> bool:
    """Whether anything (a file, a folder, keys under a prefix) is at ``loc``."""
    if isinstance(loc, Path):
        return loc.exists()
    fs, root = filesystem(loc)
    with remote_errors(loc):
        return bool(fs.exists(root))


def is_file(loc: Location) -> bool:
    """Whether ``loc`` is a file (a key, behind a URL); a server that does not have it says so, any other answer
    (credentials refused, no answer) is an error."""
    if isinstance(loc, Path):
        return loc.is_file()
    fs, root = filesystem(loc)
    with remote_errors(loc):
        try:  # info, not isfile: s3fs's isfile answers False to refused credentials too
            return fs.info(root).get("type") == "file"
        except FileNotFoundError:
            return False


def are_files(base: Location, names: list[str], in_flight: int = 64) -> list[bool]:
    """:func:`is_file` of each of ``names`` under ``base``, asked side by side: behind a URL (an asynchronous
    fsspec file system: S3, HTTP) the answers come back in about one request's wait, not one wait each (at most
    ``in_flight`` asked at once)."""
    if isinstance(base, Path) or not names:
        return [is_file(join(base, n)) for n in names]
    fs, root = filesystem(base)
    if not getattr(fs, "async_impl", False):
        return [is_file(join(base, n)) for n in names]
    import asyncio

    from fsspec.asyn import sync

    async def every() -> list[Any]:
        limit = asyncio.Semaphore(in_flight)

        async def answer(path: str) -> bool:
            async with limit:
                try:  # as is_file asks
                    return (await fs._info(path)).get("type") == "file"
                except FileNotFoundError:
                    return False

        return await asyncio.gather(*(answer(f"{root}/{n.strip('/')}") for n in names), return_exceptions=True)

    with remote_errors(base):
        answers = sync(fs.loop, every)
        for a in answers:
            if isinstance(a, BaseException):
                raise a
    return answers


def remove(loc: Location) -> None:
    """Remove ``loc`` and everything under it; nothing there is no error."""
    if isinstance(loc, Path):
        if loc.is_dir() and not loc.is_symlink():
            shutil.rmtree(loc, ignore_errors=True)
        else:
            loc.unlink(missing_ok=True)
        return
    fs, root = filesystem(loc)
    with remote_errors(loc):
        if fs.exists(root):
            fs.rm(root, recursive=True)
        fs.invalidate_cache()


def child_names(loc: Location, prefix: str = "") -> list[str]:
    """The names directly under folder ``loc`` that start with ``prefix``, sorted; none where there is no folder."""
    if isinstance(loc, Path):
        return sorted(p.name for p in loc.glob(f"{prefix}*"))
    fs, root = filesystem(loc)
    with remote_errors(loc):
        try:
            entries = fs.ls(root, detail=False, refresh=True)
        except FileNotFoundError:
            return []
    names = (str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)
    return sorted(n for n in names if n.startswith(prefix))


def remote_error_line(error: BaseException, os_errors: bool = True) -> str | None:
    """What an object store's or an fsspec file system's exception means, in one line; ``None`` for an exception
    that is not one (a bug keeps its traceback). Without ``os_errors``, a plain ``PermissionError`` or
    ``FileNotFoundError`` (which a local file raises too) is not taken for one."""
    chain = [type(error), *type(error).__mro__]
    names = {c.__name__ for c in chain}
    modules = {c.__module__.split(".")[0] for c in chain}
    text = " ".join(str(error).split()) or type(error).__name__
    if "NoCredentialsError" in names:
        return "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    if names & {"ConnectTimeoutError", "ReadTimeoutError", "FSTimeoutError", "TimeoutError", "ServerTimeoutError"}:
        return f"the endpoint did not answer in time ({text})"
    if names & {"EndpointConnectionError", "ClientConnectorError", "ConnectionError"}:
        return f"cannot reach the endpoint ({text})"
    if not os_errors and not modules & REMOTE_MODULES:
        return None
    if isinstance(error, PermissionError):
        return f"access denied: {text} (check the credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
    if isinstance(error, FileNotFoundError):
        return f"not found: {text}"
    if modules & REMOTE_MODULES:
        return f"{type(error).__name__}: {text}"
    return None


@contextlib.contextmanager
def remote_errors(url: Location) -> Iterator[None]:
    """Within the block, what reading or writing ``url`` raises (:func:`remote_error_line`) is one
    :class:`~dasknn.errors.DasknnError` naming it; a local path's errors pass as they are."""
    try:
        yield
    except DasknnError:
        raise
    except Exception as e:
        line = None if isinstance(url, Path) else remote_error_line(e)
        if line is None:
            raise
        raise DasknnError(line, url) from None
