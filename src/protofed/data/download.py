"""Downloading raw archives: mirrors, resume, checksums.

pooch does the caching, the hash check and the atomic move into place; this module adds what
pooch lacks: resuming an interrupted download (a `<file>.part` kept beside the target and
continued with an HTTP Range request or a file seek), `file://` URLs (tests serve their
archives that way, and an institution may mirror data on a shared disk), mirrors tried in
order, and trust-on-first-use checksums for sources that publish none: the sha256 of the
first download is recorded in `checksums.json` beside the files and every later download or
re-check must match it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from protofed.core.files import atomic_write_text
from protofed.errors import ConfigError

CHECKSUMS = "checksums.json"
CHUNK = 1 << 20
Log = Callable[[str], None]


@dataclass(frozen=True)
class Remote:
    """One file of a data set's public distribution.

    `known_hash` is the publisher's checksum as pooch spells it ("md5:..." / "sha256:..."),
    or None where the publisher gives none (then the first download's sha256 is recorded).
    `size` is the approximate size in bytes, for `protofed data list`.
    """

    filename: str
    urls: tuple[str, ...]
    known_hash: str | None = None
    size: int | None = None


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ResumableDownloader:
    """A pooch downloader that continues `part` instead of starting over.

    pooch hands each attempt a fresh temporary name; the bytes accumulate in `part` (a stable
    name) and are moved onto pooch's temporary only once complete, so a killed download loses
    nothing and a corrupt one is deleted by pooch's hash check.
    """

    def __init__(self, part: Path, log: Log = stderr_log, progress: bool | None = None) -> None:
        self.part = part
        self.log = log
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.resumed_at = 0  # bytes already present when this download started
        self.transferred = 0  # bytes read from the source by this download

    def __call__(
        self, url: str, output_file: Any, pooch: Any = None, check_only: bool = False
    ) -> Any:
        if check_only:
            return True
        offset = self.part.stat().st_size if self.part.is_file() else 0
        self.resumed_at = offset
        if offset:
            self.log(f"resuming {self.part.name[:-5]} at {offset / 1e6:.1f} MB")
        scheme = urlparse(url).scheme
        if scheme == "file":
            self._copy_local(url, offset)
        elif scheme in ("http", "https"):
            self._http(url, offset)
        else:
            raise ConfigError(f"{url}: unsupported URL scheme '{scheme}' (http, https or file)")
        name = output_file if isinstance(output_file, str) else output_file.name
        os.replace(self.part, name)
        return None

    def _copy_local(self, url: str, offset: int) -> None:
        source = Path(unquote(urlparse(url).path))
        if not source.is_file():
            raise OSError(f"no such file: {source}")
        total = source.stat().st_size
        if offset > total:  # a stale part from another file: start over
            offset = 0
            self.part.unlink()
        with source.open("rb") as src, self.part.open("ab") as dst:
            src.seek(offset)
            self._pump(iter(lambda: src.read(CHUNK), b""), dst, offset, total)

    def _http(self, url: str, offset: int) -> None:
        import requests

        headers = {"Range": f"bytes={offset}-"} if offset else {}
        with requests.get(url, headers=headers, stream=True, timeout=60) as response:
            if response.status_code == 416:  # the part already holds every byte
                return
            response.raise_for_status()
            if offset and response.status_code != 206:  # the server ignored the range
                self.log("the server cannot resume: starting over")
                offset = 0
                self.part.unlink()
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length else None
            with self.part.open("ab") as dst:
                self._pump(response.iter_content(CHUNK), dst, offset, total)

    def _pump(self, chunks: Any, dst: Any, offset: int, total: int | None) -> None:
        from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

        with Progress(
            *Progress.get_default_columns(),
            DownloadColumn(),
            TransferSpeedColumn(),
            disable=not self.progress,
            transient=True,
        ) as bar:
            task = bar.add_task(self.part.name[:-5], total=total, completed=offset)
            for chunk in chunks:
                dst.write(chunk)
                self.transferred += len(chunk)
                bar.advance(task, len(chunk))
            dst.flush()
            os.fsync(dst.fileno())


def read_checksums(folder: Path) -> dict[str, str]:
    path = folder / CHECKSUMS
    if not path.is_file():
        return {}
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable checksum record ({exc})") from None
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path}: expected a JSON object of file name -> 'sha256:...'")
    return {str(k): str(v) for k, v in recorded.items()}


def _record_checksum(folder: Path, filename: str, digest: str) -> None:
    recorded = read_checksums(folder)
    recorded[filename] = digest
    atomic_write_text(folder / CHECKSUMS, json.dumps(recorded, indent=1, sort_keys=True) + "\n")


def expected_hash(remote: Remote, folder: Path) -> str | None:
    """The publisher's checksum, else the one recorded at the first download, else None."""
    return remote.known_hash or read_checksums(folder).get(remote.filename)


def verify(path: Path, expected: str) -> None:
    """Raise a one-line ConfigError when `path` does not hash to `expected`."""
    import pooch

    algorithm, _, digest = expected.partition(":")
    actual = pooch.file_hash(str(path), alg=algorithm)
    if actual != digest.lower():
        raise ConfigError(
            f"{path}: {algorithm} checksum mismatch (expected {digest}, got {actual}); "
            "delete the file and fetch again"
        )


def fetch_file(
    remote: Remote, folder: Path, *, log: Log = stderr_log, progress: bool | None = None
) -> Path:
    """Bring `remote` into `folder` (or check the copy already there) and return its path."""
    import pooch
    import requests

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / remote.filename
    expected = expected_hash(remote, folder)
    if target.is_file():
        if expected is not None:
            verify(target, expected)
        else:
            _record_checksum(folder, remote.filename, "sha256:" + pooch.file_hash(str(target)))
        return target
    failures = []
    for url in remote.urls:
        downloader = ResumableDownloader(folder / f"{remote.filename}.part", log, progress)
        log(f"downloading {remote.filename} from {url}")
        try:
            pooch.retrieve(url, expected, fname=remote.filename, path=folder, downloader=downloader)
        except ValueError as exc:  # pooch's hash mismatch: the bytes are gone with its temp
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(
                f"{remote.filename} from {url}: checksum mismatch, download removed "
                f"(expected {expected}; {str(exc).splitlines()[0]})"
            ) from None
        except (OSError, requests.RequestException) as exc:
            failures.append(f"{url}: {exc}")
            continue
        if remote.known_hash is None and expected is None:
            _record_checksum(folder, remote.filename, "sha256:" + pooch.file_hash(str(target)))
        return target
    part = folder / f"{remote.filename}.part"
    kept = (
        f"; {part.stat().st_size / 1e6:.1f} MB kept, fetch again to resume"
        if part.is_file()
        else ""
    )
    raise ConfigError(f"could not download {remote.filename} ({'; '.join(failures)}){kept}")
