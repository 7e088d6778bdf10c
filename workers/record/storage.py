"""Object stores for a run's output: a local folder (`file://`) or any S3 endpoint (`s3://`).

Keys are relative to the store's root (the URL's path or prefix). `put_if_absent` is the commit
primitive: S3 conditional writes (`If-None-Match: *`) or an exclusive hard link on a folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from core.bounded_files import kind_of_mode
from core.s3 import S3Url, parse_s3_url
from core.safe_paths import stays_inside
from workers.errors import ObjectMissing, UnsafeKey, UnsupportedStoreUrl
from workers.record.object_store import ObjectInfo, ObjectStore
from workers.record.output_places import check_fresh_place, check_local_place, check_written_location

DEFAULT_FILE_MODE = 0o666  # what open() asks for; the umask takes away from it
PROC_STATUS = Path("/proc/self/status")


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (os.umask can only swap it)."""
    with contextlib.suppress(OSError):
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


class FolderStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()
        self.file_mode = DEFAULT_FILE_MODE & ~current_umask()

    def _path(self, key: str) -> Path:
        """The file of `key`; UnsafeKey for a key that leaves the root, or whose way there passes a symbolic
        link (one placed inside a run's output after enqueue would carry its parts elsewhere)."""
        if not stays_inside(key):
            raise UnsafeKey(f"object key {key!r} would name a file outside {self.root}: refused")
        path = self.root / key
        for on_the_way in (*(self.root / part for part in reversed(Path(key).parents)), path):
            if on_the_way.is_symlink():
                raise UnsafeKey(
                    f"{on_the_way} is a symbolic link (to {os.readlink(on_the_way)}): nothing is written or "
                    f"read through it; remove it from the output {self.root}"
                )
        return path

    def _prefix_path(self, prefix: str) -> Path:
        return self.root if not prefix.rstrip("/") else self._path(prefix.rstrip("/"))

    def _open_temp(self, key: str) -> tuple[int, Path]:
        """A temporary file beside `key`'s path, with the mode a plain `open` would give it.

        mkstemp makes files 0600; the objects of a run are meant for whoever may read the folder."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        os.fchmod(fd, self.file_mode)
        return fd, Path(temp)

    def _write_temp(self, key: str, data: bytes) -> Path:
        fd, temp = self._open_temp(key)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return temp

    @staticmethod
    def _sync_folder(path: Path) -> None:
        """A rename or link is durable only once its folder is synced: without this a power cut may
        forget a manifest entry whose commit Redis already recorded."""
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.replace(self._write_temp(key, data), path)
        self._sync_folder(path)

    def put_file(self, key: str, path: Path) -> None:
        """The file's content under `key`, appearing whole or not at all."""
        fd, temp = self._open_temp(key)
        with os.fdopen(fd, "wb") as handle, path.open("rb") as source:
            shutil.copyfileobj(source, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self._path(key))
        self._sync_folder(self._path(key))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        temp = self._write_temp(key, data)
        try:
            os.link(temp, self._path(key))
        except FileExistsError:
            return False
        finally:
            temp.unlink()
        self._sync_folder(self._path(key))
        return True

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as error:
            raise ObjectMissing(key) from error

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        base = self._prefix_path(prefix)
        if not base.is_dir():
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.startswith(".tmp-"):
                stat = path.stat()
                yield ObjectInfo(str(path.relative_to(self.root)), stat.st_size, stat.st_mtime)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()


def folder_of(url_path: str) -> Path:
    """The folder a file:// URL's path names: `as_uri()` writes a space as %20, so it is read back."""
    return Path(unquote(url_path))


def _s3_location(url: str) -> S3Url:
    location = parse_s3_url(url)
    if location is None:
        raise UnsupportedStoreUrl(f"{url!r} names no bucket: use s3://bucket/prefix")
    return location


def open_store(url: str, *, s3_client: Any = None) -> ObjectStore:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return FolderStore(folder_of(parsed.path))
    if parsed.scheme == "s3":
        location = _s3_location(url)
        # boto3 only for S3 outputs: a tenth of a second to import
        from workers.record.s3_store import S3Store

        return S3Store(location.bucket, location.key, s3_client)
    raise UnsupportedStoreUrl(f"{url!r}: output must be file:///absolute/path or s3://bucket/prefix")


LOCAL_FILE_HOSTS = ("", "localhost")  # file://localhost/x is /x; any other host is a mistyped URL
OUTPUT_FORMS = "a folder, file:///absolute/path or s3://bucket/prefix"


def normalise_output(url: str) -> str:
    """Turn a bare or relative folder into an absolute file:// URL; check an s3:// URL names a bucket.

    Refused (UnsupportedStoreUrl): an empty output (it would be the current folder), `s3://` or
    `s3:///x` (no bucket), `file://name/x` (a host, usually a missing third slash: the folder would be
    /x at the root), and any other scheme."""
    if not url.strip():
        raise UnsupportedStoreUrl(f"the output is empty: give {OUTPUT_FORMS}")
    check_written_location(url)
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        _s3_location(url)
        return url
    if parsed.scheme == "file":
        if parsed.netloc not in LOCAL_FILE_HOSTS:
            raise UnsupportedStoreUrl(
                f"{url!r} names the host {parsed.netloc!r}, so its folder would be {parsed.path or '/'!r}: "
                "a file URL has three slashes (file:///absolute/path); give a relative folder as a plain path"
            )
        if not parsed.path:
            raise UnsupportedStoreUrl(f"{url!r} names no folder: use file:///absolute/path")
        check_written_location(str(folder_of(parsed.path)))  # a %0A or a %2E%2E is checked decoded
        return folder_of(parsed.path).resolve().as_uri()
    if parsed.scheme:
        raise UnsupportedStoreUrl(f"{url!r}: output must be {OUTPUT_FORMS}")
    return Path(url).resolve().as_uri()


def run_output_under(root: str, run: str) -> str:
    """Run `run`'s own output under a root (a folder or an s3:// prefix), normalised: `<root>/<run>`. A run
    name is one path segment (workers/state/keys.py), so two runs' outputs under one root never nest."""
    return f"{normalise_output(root).rstrip('/')}/{run}"


def check_output_folder(url: str) -> None:
    """Refuse a folder output that cannot hold a run, before anything is written: a file or a device
    (`/dev/null`), a path through a file, a system folder, or a folder inside another run's output
    (workers/record/output_places.py). An s3:// URL passes: only the store itself can tell (`open_store`)."""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return
    path = folder_of(parsed.path)
    if path.exists() and not path.is_dir():
        raise UnsupportedStoreUrl(f"{str(path)!r} is {_kind_of_file(path)}, not a folder")
    check_local_place(path)
    ancestor = next(parent for parent in path.parents if parent.exists())
    if not ancestor.is_dir():
        raise UnsupportedStoreUrl(
            f"{str(path)!r} cannot be a folder: {str(ancestor)!r} is {_kind_of_file(ancestor)}"
        )


def check_fresh_output(url: str, *, ours: Sequence[str], allow_shared: bool) -> None:
    """Refuse a folder where a new run's output or an export is to be made that is a shared place (/var,
    /opt, /srv, a home folder or a hidden one in it) unless `allow_shared`, or that holds anything but
    `ours` (workers/record/output_places.py). An s3:// URL passes."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        check_fresh_place(folder_of(parsed.path), ours=ours, allow_shared=allow_shared)


def _kind_of_file(path: Path) -> str:
    """What a path that is no folder is: a device, a pipe, a socket (core/bounded_files.py names them), or
    a file."""
    return kind_of_mode(path.stat().st_mode) or "a file"
