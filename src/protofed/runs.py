"""The run directory: everything a finished or killed run leaves behind.

    config.yaml      the resolved config (what `--resume` re-reads)
    run.json         the engine that runs it and the protofed version that created it
    partition.json   per-client split sizes and the clients x classes count matrix
    partition.txt    the same matrix, readable
    metrics.jsonl    one line per evaluated round, per-client values included
    checkpoint.pt    the latest round's server and client states (tensors only), with the
                     fingerprint of the config, data and version, and the length and sha256
                     of metrics.jsonl at that round
    checksums.json   the sha256 of summary.json and metrics.jsonl as the run's end wrote
                     them (written just before summary.json; `load_run` checks them)
    summary.json     written last: the run is complete when it exists
    provenance.json  versions, git commit, machine, data files' sha256, command and times of
                     each session (`protofed.provenance`)
    .lock            held (flock) by the one process writing the directory

Files are written whole or not at all (`core.files.atomic_write`: fsync, rename, fsync).
Checkpoints hold only tensors, numbers and strings and load with `weights_only=True`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from protofed.core.files import atomic_write, atomic_write_text, tensors_digest, writing
from protofed.errors import ConfigError

try:  # POSIX; elsewhere a run directory is not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

CONFIG, PARTITION, PARTITION_TXT = "config.yaml", "partition.json", "partition.txt"
METRICS, CHECKPOINT, SUMMARY = "metrics.jsonl", "checkpoint.pt", "summary.json"
RUN, LOCK, PROVENANCE = "run.json", ".lock", "provenance.json"
CHECKSUMS = "checksums.json"
FILES = (
    CONFIG,
    RUN,
    PARTITION,
    PARTITION_TXT,
    METRICS,
    CHECKPOINT,
    CHECKSUMS,
    SUMMARY,
    PROVENANCE,
)
CHECKPOINT_KEYS = ("progress", "server", "clients", "fingerprint", "metrics")
DIGEST = "sha256"
"""The checkpoint's own key for the digest of everything else in it but the fingerprint
(`tensors_digest`; the fingerprint is compared with the run's own instead): in the same
file, so no kill can leave a checkpoint and a digest that belong to different rounds. A
checkpoint without it (written before protofed kept one) resumes unchecked."""
OLD_CHECKPOINT_KEYS = frozenset({*CHECKPOINT_KEYS, "trained"})


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Fields read from a file protofed wrote. One that parses but lacks them (edited by
    hand, truncated to `{}`, another tool's) is a ConfigError naming the file, not a KeyError
    from deep inside a report. Keep the block to the reading: it turns these errors into
    the user's."""
    try:
        yield
    except ConfigError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"{path}: not as protofed writes it ({type(exc).__name__}: {exc})"
        ) from exc


def strict_json(obj: Any) -> Any:
    """NaN and infinity (a client without validation data) become null: strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None
        self._metrics = hashlib.sha256()  # of metrics.jsonl as this process wrote it
        self._metrics_bytes = 0
        self.partition_sha256: str | None = None  # of partition.json, for the checkpoint

    # creation / opening -----------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | Path,
        config: dict[str, Any],
        partition: dict[str, Any],
        partition_txt: str,
        overwrite: bool = False,
        engine: str = "builtin",
    ) -> RunDir:
        """A new run directory, locked by this process; on any failure nothing is left."""
        run = cls(path)
        if run.path.exists() and not run.path.is_dir():
            raise ConfigError(f"--out {run.path} is a file, not a directory")
        existing = [p for p in run.path.iterdir() if p.name != LOCK] if run.path.is_dir() else []
        if existing and not overwrite:
            raise ConfigError(
                f"run directory {run.path} already exists and is not empty "
                "(continue it with --resume or protofed.resume, overwrite it with --force or "
                "overwrite=True, or choose another directory)"
            )
        created = not run.path.exists()
        with writing(run.path):
            run.path.mkdir(parents=True, exist_ok=True)
        run.lock()  # before anything is removed: another process's run is never touched
        try:
            for name in FILES:
                with writing(run.path / name):
                    (run.path / name).unlink(missing_ok=True)
            run.remove_temporaries()
            run.write_text(PARTITION_TXT, partition_txt)
            run.write_partition(partition)
            run.write_json(RUN, {"engine": engine, "protofed": protofed_version()})
            run.write_text(METRICS, "")
            run.write_text(CONFIG, yaml.safe_dump(config, sort_keys=False))  # last: a valid run
        except BaseException:
            for name in FILES:
                with contextlib.suppress(OSError):
                    (run.path / name).unlink(missing_ok=True)
            if created:
                with contextlib.suppress(OSError):
                    (run.path / LOCK).unlink()
                    run.path.rmdir()
            run.unlock()
            raise
        return run

    @classmethod
    def open(cls, path: str | Path, lock: bool = False) -> RunDir:
        """An existing run directory; `lock`: this process is going to write it."""
        run = cls(path)
        if not (run.path / CONFIG).is_file():
            raise ConfigError(f"{run.path} is not a run directory (no {CONFIG})")
        for name in (RUN, PARTITION):  # what every reader relies on, checked up front
            if (run.path / name).is_file():
                run.read_json(name)
        if lock:
            run.lock()
        return run

    def lock(self) -> None:
        """Hold the directory for this process: a second writer gets a one-line error."""
        if fcntl is None or self._lock_fd is not None:
            return
        path = self.path / LOCK
        with writing(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(
                f"run directory {self.path} is in use by another process (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # plain files ------------------------------------------------------------------------
    def write_text(self, name: str, text: str) -> None:
        atomic_write_text(self.path / name, text)

    def write_json(self, name: str, obj: Any) -> None:
        self.write_text(name, json_text(obj))

    def write_partition(self, partition: dict[str, Any]) -> None:
        """partition.json, its sha256 kept for the checkpoints (a resume verifies it)."""
        self.write_json(PARTITION, partition)
        self.partition_sha256 = hashlib.sha256(json_text(partition).encode()).hexdigest()

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json, after checksums.json records its sha256 and metrics.jsonl's (which
        `verify_checksums` compares): a kill between the two leaves an unfinished run."""
        try:
            metrics = (self.path / METRICS).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{self.path / METRICS}: cannot read ({exc.strerror})") from None
        sums = {
            METRICS: hashlib.sha256(metrics).hexdigest(),
            SUMMARY: hashlib.sha256(json_text(summary).encode()).hexdigest(),
        }
        self.write_json(CHECKSUMS, sums)
        self.write_json(SUMMARY, summary)

    def verify_checksums(self) -> None:
        """summary.json and metrics.jsonl of a finished run are as its end wrote them
        (checksums.json); a run written before checksums, or unfinished, is not checked."""
        if not self.complete or not (self.path / CHECKSUMS).is_file():
            return
        sums = self.read_json(CHECKSUMS)
        for name in (SUMMARY, METRICS):
            recorded = sums.get(name)
            path = self.path / name
            try:
                actual = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
            except OSError as exc:
                raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
            if recorded != actual:
                raise ConfigError(
                    f"{path}: damaged (edited, truncated or missing since the run ended: its "
                    f"sha256 is not the one {CHECKSUMS} recorded); restore it from a copy, or "
                    "run it again with --force"
                )

    def remove_temporaries(self) -> list[Path]:
        """The temporaries of writes a kill cut short (`.checkpoint.pt.*.tmp`, ...: the
        names `atomic_write` gives), removed; call it holding the lock."""
        removed = []
        for name in FILES:
            for tmp in self.path.glob(f".{name}.*.tmp"):
                with contextlib.suppress(FileNotFoundError), writing(tmp):
                    tmp.unlink()
                    removed.append(tmp)
        return removed

    def read_json(self, name: str) -> dict[str, Any]:
        """One of the run's JSON files: each is an object."""
        path = self.path / name
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not readable JSON ({type(exc).__name__})") from None
        check_schema(path, value, SCHEMAS.get(name, {}))
        if name == PARTITION:
            with reading(path):
                for client in value.get("clients", []):
                    check_schema(path, client, {"name": str})
        return value

    def config(self) -> dict[str, Any]:
        path = self.path / CONFIG
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: not readable YAML ({type(exc).__name__})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: not a config (a mapping of sections expected)")
        data = raw.get("data")
        if isinstance(data, dict) and data.get("partition") == "natural" and "clients" not in data:
            data["clients"] = "all"  # written before data.clients: every group, the count unread
        return raw

    def info(self) -> dict[str, Any]:
        """run.json (an empty mapping for runs made before it existed)."""
        return self.read_json(RUN) if (self.path / RUN).is_file() else {}

    # metrics ----------------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        line = (json.dumps(strict_json(record), allow_nan=False) + "\n").encode()
        path = self.path / METRICS
        with writing(path), open(path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._metrics.update(line)
        self._metrics_bytes += len(line)

    def metrics_position(self) -> dict[str, Any]:
        """What the checkpoint records of metrics.jsonl: its length and sha256 so far."""
        return {"bytes": self._metrics_bytes, "sha256": self._metrics.hexdigest()}

    def check_metrics(self, position: dict[str, Any], server_round: int) -> tuple[bytes, bool]:
        """The records up to the checkpoint, checked byte for byte (an edited or corrupted
        line is an error), and whether a torn tail follows them; nothing is written."""
        path = self.path / METRICS
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
        size = int(position["bytes"])
        prefix = data[:size]
        if len(prefix) < size or hashlib.sha256(prefix).hexdigest() != position["sha256"]:
            raise ConfigError(
                f"{path}: the records up to round {server_round} differ from what the "
                "checkpoint recorded (edited, truncated or corrupted); nothing was changed. "
                "Start the run again with --force"
            )
        return prefix, len(data) > size

    def restore_metrics(self, position: dict[str, Any], server_round: int) -> list[dict[str, Any]]:
        """The records up to the checkpoint, checked byte for byte; a torn tail is cut.

        Records the checkpoint covers must be exactly as written (an edited or corrupted line
        is an error and nothing is rewritten); lines after them (a round that was running
        when the process died, maybe cut mid-line) are dropped and recomputed.
        """
        prefix, torn = self.check_metrics(position, server_round)
        size = len(prefix)
        if torn:
            self.write_bytes(METRICS, prefix)
        self._metrics = hashlib.sha256(prefix)
        self._metrics_bytes = size
        return [json.loads(line) for line in prefix.decode().splitlines() if line.strip()]

    def reset_metrics(self) -> None:
        self.write_text(METRICS, "")
        self._metrics, self._metrics_bytes = hashlib.sha256(), 0

    def write_bytes(self, name: str, data: bytes) -> None:
        atomic_write(self.path / name, lambda handle: handle.write(data))

    def history(self, up_to_round: int | None = None) -> list[dict[str, Any]]:
        """The records of metrics.jsonl (for reading: a torn last line is left out)."""
        path = self.path / METRICS
        if not path.exists():
            return []
        records = []
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for number, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    break  # a line cut by a kill: everything before it is intact
                raise ConfigError(f"{path}: line {number} is not JSON") from None
            if not (isinstance(rec, dict) and type(rec.get("round")) is int):
                raise ConfigError(f"{path}: line {number} is not a metrics record (no round)")
            if up_to_round is not None and rec["round"] > up_to_round:
                break
            records.append(rec)
        return records

    # checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """The state with its content digest (checked by `load_checkpoint`), atomically."""
        state = {**state, DIGEST: content_digest(state)}
        atomic_write(self.path / CHECKPOINT, lambda handle: torch.save(state, handle))

    def load_checkpoint(
        self, map_location: str | torch.device | None = None, verify: bool = True
    ) -> dict[str, Any] | None:
        """The checkpoint, or None; an unreadable or foreign file is a one-line error, and so
        is one whose content is not what was written (`verify`; else the caller checks its
        structure first, for an error that names the entry, then `check_digest`)."""
        path = self.path / CHECKPOINT
        if not path.exists():
            return None
        try:
            ckpt = torch.load(path, weights_only=True, map_location=map_location)
        except Exception as exc:  # torch raises many types for a damaged file
            raise ConfigError(
                f"{path}: not a readable checkpoint ({type(exc).__name__}: the file is "
                "corrupt or truncated); start the run again with --force"
            ) from None
        missing = [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
        if missing:
            raise ConfigError(
                f"{path}: not a checkpoint of this protofed version (no '{missing[0]}'); "
                "start the run again with --force"
            )
        if verify:
            check_digest(path, ckpt)
        return ckpt

    @property
    def complete(self) -> bool:
        return (self.path / SUMMARY).exists()


def json_text(obj: Any) -> str:
    """A run's JSON file as `RunDir.write_json` writes it (strict JSON, indented)."""
    return json.dumps(strict_json(obj), indent=2, allow_nan=False) + "\n"


def content_digest(ckpt: dict[str, Any]) -> str:
    return tensors_digest({k: v for k, v in ckpt.items() if k not in (DIGEST, "fingerprint")})


def check_digest(path: Path, ckpt: dict[str, Any]) -> None:
    """The checkpoint's content is what was written (its DIGEST). Without one, only a
    checkpoint with no key newer than the digest passes (an older protofed's): a flipped
    bit in the key's name is damage too."""
    recorded = ckpt.get(DIGEST)
    if recorded is None and set(ckpt) <= OLD_CHECKPOINT_KEYS:
        return
    if isinstance(recorded, str) and content_digest(ckpt) == recorded:
        return
    # the first checksummed version digested the fingerprint too: its checkpoints are sound
    first = tensors_digest({k: v for k, v in ckpt.items() if k != DIGEST})
    if not isinstance(recorded, str) or first != recorded:
        raise ConfigError(
            f"{path}: damaged (its content does not match the sha256 recorded when it was "
            "written); start the run again with --force"
        )


def check_schema(path: Path, value: Any, schema: dict[str, type]) -> None:
    """A JSON file protofed wrote, read back: an object whose keys in `schema` (where
    present) have their types; else a one-line error naming the file and the key."""
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: not as protofed writes it (a JSON object expected)")
    for key, kind in schema.items():
        if key in value and value[key] is not None and not isinstance(value[key], kind):
            raise ConfigError(
                f"{path}: not as protofed writes it ('{key}' is not a {SCHEMA_NAMES[kind]})"
            )


SCHEMA_NAMES = {dict: "JSON object", list: "JSON list", str: "string", int: "number"}
SCHEMAS: dict[str, dict[str, type]] = {
    PARTITION: {"clients": list, "counts": list, "class_names": list, "meta": dict},
    RUN: {"engine": str, "protofed": str},
    SUMMARY: {"final": dict, "selected": dict, "status": str},
    PROVENANCE: {"sessions": list, "data": list, "packages": dict},
    CHECKSUMS: {METRICS: str, SUMMARY: str},
}


def protofed_version() -> str:
    """The installed protofed's version (recorded in run.json and every checkpoint)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("protofed")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"
