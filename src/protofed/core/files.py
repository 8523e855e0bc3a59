"""Files written whole or not at all, and write faults as one-line errors.

Every file protofed writes (run directories, converted data, checksums) goes through
`atomic_write`: a temporary in the same folder, flushed and fsynced, renamed over the target,
then the folder fsynced, so neither a kill nor a power cut leaves half a file under the real
name. A full or read-only disk is the user's to fix: it becomes a `ConfigError` naming the
file, and the temporary is removed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from protofed.errors import ConfigError

if TYPE_CHECKING:
    import hashlib


def npz_fault(exc: BaseException) -> str:
    """Why an `.npz` did not load, as a phrase for a one-line error. numpy's text for object
    arrays suggests `allow_pickle=True`, which protofed never does, so it is not passed on."""
    if "pickle" in str(exc):
        # numpy reads anything that is neither a zip nor a .npy as a pickle
        return "object arrays or not an .npz at all, never unpickled: save plain numeric arrays"
    return first_line(exc)


def first_line(exc: BaseException) -> str:
    """An exception as `Type: first line of its message`, for a one-line error."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_fault(path: Path, exc: OSError) -> ConfigError:
    """A write that failed for a reason outside protofed (disk full, read-only, permission)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return ConfigError(f"cannot write {path}: {reason}")


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError raised while writing `path` into a one-line `ConfigError`."""
    try:
        yield
    except OSError as exc:
        raise write_fault(path, exc) from None


def _stream_fault(exc: RuntimeError) -> bool:
    """A RuntimeError that is a failed write underneath: torch.save's zip writer turns the
    file's OSError (a full disk, a file size limit) into `[enforce fail at
    inline_container.cc]` or `unable to write`."""
    if isinstance(exc.__context__, OSError):
        return True
    text = str(exc).lower()
    return any(word in text for word in ("inline_container", "write", "file"))


def stream_write_fault(path: Path, exc: RuntimeError) -> ConfigError:
    """A write that failed under a library's writer (torch.save): one line naming the file,
    with the disk's own reason where the library kept it."""
    cause = exc.__context__
    if isinstance(cause, OSError):
        return write_fault(path, cause)
    return ConfigError(
        f"cannot write {path}: the write failed (disk full or file size limit?): {first_line(exc)}"
    )


def shared_memory_fault(exc: RuntimeError) -> ConfigError | None:
    """torch's failure to make the shared-memory file that carries tensors to a worker
    process (`unable to resize file </torch_...>`: /dev/shm full, or a file size limit), as
    a one-line error; None for any other RuntimeError."""
    text = str(exc)
    if "unable to resize file" not in text and "unable to write to file" not in text:
        return None
    return ConfigError(
        f"cannot pass tensors to the worker processes (train.workers): {first_line(exc)}; "
        "free space in /dev/shm or lift the file size limit, then continue with --resume"
    )


def tensors_digest(state: Any) -> str:
    """The SHA-256 of a state's content: every tensor's dtype, shape and bytes, every
    number and string, and the nesting of dicts and lists, in order. A flipped bit in a
    tensor changes it; the same state gives the same digest on any device."""
    import hashlib

    digest = hashlib.sha256()
    _feed(digest, state)
    return digest.hexdigest()


def _feed(digest: hashlib._Hash, value: Any) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        digest.update(f"T{t.dtype}{tuple(t.shape)}:".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, dict):
        digest.update(b"D%d:" % len(value))
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(b"L%d:" % len(value))
        for item in value:
            _feed(digest, item)
    else:  # str, int, float, bool, None: typed, so 1, 1.0, True and "1" differ
        text = repr(value).encode()
        digest.update(b"%s%d:%s" % (type(value).__name__.encode(), len(text), text))


NAME_MAX = 255
"""The longest file name, in bytes, on the file systems protofed writes to (Linux, macOS)."""
ATOMIC_NAME_MAX = NAME_MAX - len("..") - 8 - len(".tmp")
"""The longest name `atomic_write` can write: its temporary, `.NAME.XXXXXXXX.tmp` (mkstemp's
8 random characters), must fit in NAME_MAX too."""


def check_writable(path: str | Path) -> None:
    """Refuse, before hours of work, a file that `atomic_write` could not write: a folder in
    its place, a file where a folder must go, or a place that takes no file (probed with a
    temporary file, removed at once)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder (name the file to write)")
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"cannot write {path}: {existing} is a file")
    with writing(path), tempfile.TemporaryFile(dir=existing):
        pass


def _umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    # elsewhere the only way to read it is to set it: a file another thread creates meanwhile
    # is made more private (0o077), never less
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The existing file's permission bits, else 0o666 less the umask (what `open` gives a new
    file). mkstemp makes its temporary 0o600, so without this every run directory,
    checkpoint and report would be unreadable to the user's group and to other tools."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o777  # follows a link: the target's mode
    return 0o666 & ~_umask()


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Write `path` through `write(handle)`: complete and durable, or untouched."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                if hasattr(os, "fchmod"):  # POSIX; where modes cannot be set (FAT), the default
                    with contextlib.suppress(OSError):
                        os.fchmod(fd, _mode_for(path))
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except RuntimeError as exc:
            Path(tmp).unlink(missing_ok=True)
            if not _stream_fault(exc):
                raise
            raise stream_write_fault(path, exc) from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda handle: handle.write(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())
