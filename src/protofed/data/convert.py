"""Converters: a data set's public raw distribution -> the arrays its loader reads.

One function per raw format, each `(raw: Path, root: Path) -> list[Path]`: `raw` is the
folder holding the downloaded archives (or the user's own copy of them), `root` the data root;
the return value lists the files written under `root`, in the layout the loaders read (the
same as the project's shared data folder). Every converter is deterministic (fixed order,
seeded draws with `np.random.default_rng(0)` where a split or sample is drawn), writes each
output through a temporary file so a killed conversion leaves nothing half-written, and never
unpickles anything but NumPy arrays (`safe_unpickle`). docs/data.md says what each one does.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import pickle
import re
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from protofed.core.files import atomic_write, atomic_write_bytes
from protofed.errors import ConfigError

# --------------------------------------------------------------------------- shared helpers


def save_npz(path: Path, **arrays: Any) -> Path:
    """np.savez_compressed, written atomically (`core.files.atomic_write`)."""
    # Any, not ndarray: numpy's stub would have any keyword be `allow_pickle: bool`
    named: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
    return atomic_write(path, lambda handle: np.savez_compressed(handle, **named))


def save_csv(path: Path, frame: pd.DataFrame) -> Path:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return atomic_write_bytes(path, buffer.getvalue().encode())


def _need(raw: Path, name: str) -> Path:
    path = raw / name
    if not path.exists():
        raise ConfigError(f"raw file not found: {path}")
    return path


class _ArraysOnly(pickle.Unpickler):
    """An unpickler that can rebuild NumPy arrays, dtypes and scalars, and nothing else.

    Plain containers (dict, list, tuple, str, numbers) need no global and pass; any other
    global a pickle names (a function, a class, `os.system`) is refused before it is loaded.
    """

    ALLOWED = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        import codecs

        import numpy._core.multiarray as multiarray

        if module == "_codecs":
            return codecs.encode
        if name in ("_reconstruct", "scalar"):
            return getattr(multiarray, name)
        return getattr(np, name)


def safe_unpickle(handle: IO[bytes], where: str) -> Any:
    """Read a pickle of NumPy arrays (Python 2 pickles included) without running its code."""
    try:
        return _ArraysOnly(handle, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{where}: not a pickle of NumPy arrays only ({exc})") from None


def _windows(signal: np.ndarray, length: int) -> np.ndarray:
    """Non-overlapping windows of a (T, C) recording -> (n, C, length); the tail is dropped."""
    n = len(signal) // length
    return signal[: n * length].reshape(n, length, signal.shape[1]).transpose(0, 2, 1)


def contiguous_runs(keys: np.ndarray) -> Iterator[tuple[int, int]]:
    """(start, stop) of each run of equal consecutive rows of `keys` (N, K)."""
    change = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
    bounds = np.concatenate([[0], change, [len(keys)]])
    yield from zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)


def split_per_group(groups: np.ndarray, train_fraction: float) -> np.ndarray:
    """0 train / 1 test: in each group a seeded random `train_fraction` (rounded up) is train."""
    rng = np.random.default_rng(0)
    split = np.ones(len(groups), dtype=np.int8)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        order = rng.permutation(idx)
        split[order[: int(np.ceil(train_fraction * len(idx)))]] = 0
    return split


def _zscore_channels(X: np.ndarray) -> np.ndarray:
    mean = X.mean(axis=(0, 2), keepdims=True, dtype=np.float64)
    std = X.std(axis=(0, 2), keepdims=True, dtype=np.float64)
    return ((X - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)


def open_member(archive: zipfile.ZipFile, suffix: str) -> IO[bytes]:
    """The one member whose path ends in `suffix` (anywhere in the tree)."""
    names = [n for n in archive.namelist() if n.endswith(suffix) and "__MACOSX" not in n]
    if not names:
        raise ConfigError(f"{archive.filename}: no member ending in '{suffix}'")
    return archive.open(sorted(names, key=len)[0])


# --------------------------------------------------------------------------- UCI-HAR

UCI_CHANNELS = [
    f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz"
]
UCI_CLASSES = [
    "WALKING",
    "WALKING_UPSTAIRS",
    "WALKING_DOWNSTAIRS",
    "SITTING",
    "STANDING",
    "LAYING",
]


def _uci_archive(raw: Path) -> zipfile.ZipFile:
    """The UCI zip; the repository's current download nests 'UCI HAR Dataset.zip' inside."""
    zips = sorted(raw.glob("*.zip"))
    if not zips:
        raise ConfigError(f"uci_har: no .zip in {raw}")
    outer = zipfile.ZipFile(zips[0])
    if any(n.endswith("Inertial Signals/body_acc_x_train.txt") for n in outer.namelist()):
        return outer
    inner = [n for n in outer.namelist() if n.endswith(".zip") and "__MACOSX" not in n]
    if not inner:
        raise ConfigError(f"{zips[0]}: holds neither 'UCI HAR Dataset/' nor an inner zip")
    return zipfile.ZipFile(io.BytesIO(outer.read(inner[0])))


def _text_matrix(handle: IO[bytes]) -> np.ndarray:
    return pd.read_csv(handle, sep=r"\s+", header=None, dtype=np.float64).to_numpy()


def convert_uci_har(raw: Path, root: Path) -> list[Path]:
    """Inertial Signals text files -> X (N, 9, 128) float32 [channel, time]; train then test.

    y is 0..5 in activity_labels.txt order, subject 1..30, split the published one (subjects
    of the train folder 0, of the test folder 1). Values are the published ones, unscaled.
    """
    archive = _uci_archive(raw)
    xs, ys, subjects, splits = [], [], [], []
    for code, part in enumerate(("train", "test")):
        signals = []
        for channel in UCI_CHANNELS:
            with open_member(archive, f"{part}/Inertial Signals/{channel}_{part}.txt") as f:
                signals.append(_text_matrix(f))
        with open_member(archive, f"{part}/y_{part}.txt") as f:
            y = _text_matrix(f).reshape(-1).astype(np.int64) - 1
        with open_member(archive, f"{part}/subject_{part}.txt") as f:
            subject = _text_matrix(f).reshape(-1).astype(np.int64)
        for channel, sig in zip(UCI_CHANNELS, signals, strict=True):
            if sig.shape != (len(y), 128):
                raise ConfigError(f"uci_har: {channel}_{part}.txt has shape {sig.shape}")
        xs.append(np.stack(signals, axis=1).astype(np.float32))
        ys.append(y)
        subjects.append(subject)
        splits.append(np.full(len(y), code))
    return [
        save_npz(
            root / "har" / "uci_har.npz",
            X=np.concatenate(xs),
            y=np.concatenate(ys).astype(np.int8),
            subject=np.concatenate(subjects).astype(np.int8),
            split=np.concatenate(splits).astype(np.int8),
            channels=np.array(UCI_CHANNELS),
            class_names=np.array(UCI_CLASSES),
            split_note=np.array("UCI-HAR published split (21 train / 9 test subjects)"),
        )
    ]


# --------------------------------------------------------------------------- WISDM v1.1

WISDM_CLASSES = ["walk", "jog", "sit", "stand", "upstairs", "downstairs"]
_WISDM_RAW_NAMES = ["Walking", "Jogging", "Sitting", "Standing", "Upstairs", "Downstairs"]
WINDOW = 128


def _wisdm_tar(raw: Path) -> tarfile.TarFile:
    tars = sorted(raw.glob("*.tar.gz"))
    if not tars:
        raise ConfigError(f"wisdm: no .tar.gz in {raw}")
    return tarfile.open(tars[0], "r:gz")


def _tar_member(archive: tarfile.TarFile, suffix: str) -> bytes:
    for member in archive.getmembers():
        if member.isfile() and member.name.endswith(suffix):
            handle = archive.extractfile(member)
            assert handle is not None
            return handle.read()
    raise ConfigError(f"{archive.name!s}: no member ending in '{suffix}'")


def parse_wisdm_raw(text: str) -> pd.DataFrame:
    """`user,activity,timestamp,x,y,z;` records -> a frame; malformed records are dropped.

    The release has lines holding two records, records split over two lines and empty
    fields; records are therefore split on ';' rather than on newlines.
    """
    rows = []
    for record in re.split(r";|\n", text):
        fields = [f.strip() for f in record.strip().strip(",").split(",")]
        if len(fields) != 6 or fields[1] not in _WISDM_RAW_NAMES:
            continue
        try:
            rows.append(
                (int(fields[0]), fields[1], float(fields[3]), float(fields[4]), float(fields[5]))
            )
        except ValueError:
            continue
    return pd.DataFrame(rows, columns=["user", "activity", "x", "y", "z"])


def convert_wisdm(raw: Path, root: Path) -> list[Path]:
    """WISDM_ar_v1.1_raw.txt -> X (N, 3, 128) float32 at 20 Hz, z-scored per channel.

    Windows are non-overlapping and never cross a change of user or activity (file order);
    user = published id - 1; split: a seeded two-thirds of each user's windows train.
    """
    archive = _wisdm_tar(raw)
    frame = parse_wisdm_raw(_tar_member(archive, "_raw.txt").decode("latin1"))
    if frame.empty:
        raise ConfigError("wisdm: no valid record in WISDM_ar_v1.1_raw.txt")
    label = frame["activity"].map({n: i for i, n in enumerate(_WISDM_RAW_NAMES)}).to_numpy()
    user = frame["user"].to_numpy()
    signal = frame[["x", "y", "z"]].to_numpy(np.float32)
    xs, ys, users = [], [], []
    for start, stop in contiguous_runs(np.stack([user, label], axis=1)):
        w = _windows(signal[start:stop], WINDOW)
        xs.append(w)
        ys.append(np.full(len(w), label[start]))
        users.append(np.full(len(w), user[start] - 1))
    X = _zscore_channels(np.concatenate(xs))
    users_all = np.concatenate(users)
    return [
        save_npz(
            root / "har" / "wisdm.npz",
            X=X,
            y=np.concatenate(ys).astype(np.int8),
            user=users_all.astype(np.int16),
            split=split_per_group(users_all, 2 / 3),
            channels=np.array(["acc_x", "acc_y", "acc_z"]),
            class_names=np.array(WISDM_CLASSES),
        )
    ]


def parse_arff(text: str) -> pd.DataFrame:
    """A dense ARFF table -> a frame; '?' is missing. (scipy's reader refuses the release's
    quoted nominal values, and the format is simple enough to read as CSV after @data.)"""
    names = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        head = line.strip()
        if head.lower().startswith("@attribute"):
            names.append(head.split()[1].strip("'\""))
        elif head.lower().startswith("@data"):
            body = "\n".join(ln for ln in lines[i + 1 :] if ln.strip() and not ln.startswith("%"))
            frame = pd.read_csv(
                io.StringIO(body), header=None, names=names, na_values="?", quotechar='"'
            )
            return frame
    raise ConfigError("ARFF file has no @data section")


def convert_wisdm_features(raw: Path, root: Path) -> list[Path]:
    """WISDM_ar_v1.1_transformed.arff -> the release's CSV layout, plus its readme (the
    WISDM terms ask that readme.txt travel with the data)."""
    archive = _wisdm_tar(raw)
    frame = parse_arff(_tar_member(archive, "_transformed.arff").decode("latin1"))
    out = [save_csv(root / "har" / "wisdm_features.csv", frame)]
    return [
        *out,
        atomic_write_bytes(root / "har" / "wisdm_readme.txt", _tar_member(archive, "readme.txt")),
    ]


# --------------------------------------------------------------------------- HHAR

HHAR_CLASSES = ["bike", "sit", "stand", "walk", "stairs_up", "stairs_down"]
_HHAR_RAW = ["bike", "sit", "stand", "walk", "stairsup", "stairsdown"]
HHAR_MODEL = "s3"


def convert_hhar(raw: Path, root: Path) -> list[Path]:
    """Phones_accelerometer.csv, Samsung Galaxy S3 phones -> X (N, 3, 128) z-scored.

    Rows are ordered by (user, device, creation time); windows are non-overlapping and never
    cross a change of user, device or activity; 'null' activity is dropped; user a..i -> 0..8;
    split: a seeded two-thirds of each user's windows train.
    """
    zips = sorted(raw.glob("*.zip"))
    if not zips:
        raise ConfigError(f"hhar: no .zip in {raw}")
    outer = zipfile.ZipFile(zips[0])
    inner_names = [n for n in outer.namelist() if n.endswith(".zip") and "Activity" in n]
    archive = zipfile.ZipFile(io.BytesIO(outer.read(inner_names[0]))) if inner_names else outer
    with open_member(archive, "Phones_accelerometer.csv") as f:
        frame = pd.read_csv(
            f, usecols=["Creation_Time", "x", "y", "z", "User", "Model", "Device", "gt"]
        )
    frame = frame[(frame["Model"] == HHAR_MODEL) & frame["gt"].isin(_HHAR_RAW)]
    frame = frame.sort_values(["User", "Device", "Creation_Time"], kind="stable")
    label = frame["gt"].map({n: i for i, n in enumerate(_HHAR_RAW)}).to_numpy()
    user = frame["User"].map(lambda u: ord(str(u)) - ord("a")).to_numpy()
    device = pd.factorize(frame["Device"])[0]
    signal = frame[["x", "y", "z"]].to_numpy(np.float32)
    xs, ys, users = [], [], []
    for start, stop in contiguous_runs(np.stack([user, device, label], axis=1)):
        w = _windows(signal[start:stop], WINDOW)
        xs.append(w)
        ys.append(np.full(len(w), label[start]))
        users.append(np.full(len(w), user[start]))
    users_all = np.concatenate(users)
    return [
        save_npz(
            root / "har" / "hhar_sa.npz",
            X=_zscore_channels(np.concatenate(xs)),
            y=np.concatenate(ys).astype(np.int8),
            user=users_all.astype(np.int16),
            split=split_per_group(users_all, 2 / 3),
            channels=np.array(["acc_x", "acc_y", "acc_z"]),
            class_names=np.array(HHAR_CLASSES),
        )
    ]


# --------------------------------------------------------------------------- WESAD

_WESAD_LABELS = {3: 0, 1: 1, 2: 2}  # study protocol code -> 0 amusement, 1 baseline, 2 stress
_WESAD_RATES = {"ACC": 32, "BVP": 64, "EDA": 4, "TEMP": 4}
_LABEL_HZ = 700
WESAD_WINDOW_S = 30


def _slope(values: np.ndarray, hz: float) -> float:
    t = np.arange(len(values)) / hz
    return float(np.polyfit(t, values, 1)[0]) if len(values) > 1 else 0.0


def _peak_frequency(values: np.ndarray, hz: float) -> float:
    spectrum = np.abs(np.fft.rfft(values - values.mean()))
    return float(np.fft.rfftfreq(len(values), 1.0 / hz)[int(np.argmax(spectrum))])


def wesad_features(record: dict[str, Any], subject: str) -> pd.DataFrame:
    """One subject's recording -> one row per 30 s window of a single study condition.

    Wrist (Empatica E4) signals only, the wearable a deployment would have: per channel mean,
    std, min, max (ACC x/y/z and magnitude, BVP, EDA, TEMP), EDA and TEMP slope, BVP peak
    frequency. Windows are non-overlapping and lie inside one labelled segment.
    """
    try:
        wrist = record["signal"]["wrist"]
        labels = np.asarray(record["label"]).reshape(-1)
    except (KeyError, TypeError):
        raise ConfigError(f"wesad {subject}: not a WESAD record (signal/wrist, label)") from None
    acc = np.asarray(wrist["ACC"], dtype=np.float64)
    channels = {
        "ACC_x": (acc[:, 0], 32),
        "ACC_y": (acc[:, 1], 32),
        "ACC_z": (acc[:, 2], 32),
        "ACC_net": (np.linalg.norm(acc, axis=1), 32),
        "BVP": (np.asarray(wrist["BVP"], dtype=np.float64).reshape(-1), 64),
        "EDA": (np.asarray(wrist["EDA"], dtype=np.float64).reshape(-1), 4),
        "TEMP": (np.asarray(wrist["TEMP"], dtype=np.float64).reshape(-1), 4),
    }
    rows = []
    for start, stop in contiguous_runs(labels[:, None]):
        code = int(labels[start])
        if code not in _WESAD_LABELS:
            continue
        seconds = (stop - start) / _LABEL_HZ
        t0 = start / _LABEL_HZ
        for k in range(int(seconds // WESAD_WINDOW_S)):
            begin = t0 + k * WESAD_WINDOW_S
            row: dict[str, Any] = {"subject": subject, "label": _WESAD_LABELS[code]}
            for name, (values, hz) in channels.items():
                seg = values[int(round(begin * hz)) : int(round((begin + WESAD_WINDOW_S) * hz))]
                if len(seg) == 0:
                    break
                row.update(
                    {
                        f"{name}_mean": seg.mean(),
                        f"{name}_std": seg.std(),
                        f"{name}_min": seg.min(),
                        f"{name}_max": seg.max(),
                    }
                )
                if name in ("EDA", "TEMP"):
                    row[f"{name}_slope"] = _slope(seg, hz)
                if name == "BVP":
                    row["BVP_peak_freq"] = _peak_frequency(seg, hz)
            else:
                rows.append(row)
    return pd.DataFrame(rows)


def convert_wesad(raw: Path, root: Path) -> list[Path]:
    """WESAD.zip's per-subject S<k>/S<k>.pkl (read with `safe_unpickle`) -> window features."""
    zips = sorted(raw.glob("*.zip"))
    frames = []
    if zips:
        archive = zipfile.ZipFile(zips[0])
        members = sorted(
            (n for n in archive.namelist() if re.search(r"S\d+/S\d+\.pkl$", n)),
            key=lambda n: int(re.findall(r"\d+", Path(n).stem)[0]),
        )
        for name in members:
            with archive.open(name) as f:
                frames.append(wesad_features(safe_unpickle(f, name), Path(name).stem))
    else:  # an unpacked WESAD/ folder
        for path in sorted(raw.rglob("S*.pkl"), key=lambda p: int(p.stem[1:])):
            with path.open("rb") as f:
                frames.append(wesad_features(safe_unpickle(f, str(path)), path.stem))
    if not frames:
        raise ConfigError(f"wesad: no S<k>/S<k>.pkl in {raw} (WESAD.zip or its folder)")
    return [save_csv(root / "wearable" / "wesad_features.csv", pd.concat(frames))]


# --------------------------------------------------------------------------- digits

MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not) of unsigned bytes -> its array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ConfigError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ConfigError(f"{path}: header says {shape} but holds {body.size} bytes")
    return body.reshape(shape)


def convert_mnist(raw: Path, root: Path) -> list[Path]:
    """The four IDX files -> x_train (60000, 28, 28) uint8, y_train, x_test, y_test."""
    arrays = {key: read_idx(_need(raw, name)) for key, name in MNIST_FILES.items()}
    return [save_npz(root / "digits" / "mnist.npz", **arrays)]


def _svmlight(path: Path, features: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_svmlight_file

    with bz2.open(path) as f:
        X, y = load_svmlight_file(f, n_features=features)
    return np.asarray(X.todense()), y.astype(np.int64)


def convert_usps(raw: Path, root: Path) -> list[Path]:
    """LIBSVM usps.bz2 / usps.t.bz2 (pixels in [-1, 1], labels 1..10) -> [0, 1], 0..9."""
    out = {}
    for part, name in (("train", "usps.bz2"), ("test", "usps.t.bz2")):
        X, y = _svmlight(_need(raw, name), 256)
        out[f"x_{part}"] = ((X + 1.0) / 2.0).reshape(-1, 16, 16).astype(np.float32)
        out[f"y_{part}"] = (y - 1).astype(np.uint8)
    return [save_npz(root / "digits" / "usps.npz", **out)]


def _png(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def convert_mnist_m(raw: Path, root: Path) -> list[Path]:
    """mnist_m.tar.gz (mnist_m_{train,test}/*.png + *_labels.txt) -> uint8 (N, 32, 32, 3)."""
    tars = sorted(raw.glob("*.tar.gz"))
    if not tars:
        raise ConfigError(f"mnist_m: no .tar.gz in {raw}")
    files: dict[str, bytes] = {}
    with tarfile.open(tars[0], "r:gz") as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.endswith((".png", "_labels.txt")):
                handle = archive.extractfile(member)
                assert handle is not None
                files[member.name] = handle.read()
    out = {}
    for part in ("train", "test"):
        label_file = [n for n in files if n.endswith(f"mnist_m_{part}_labels.txt")]
        if not label_file:
            raise ConfigError(f"{tars[0]}: no mnist_m_{part}_labels.txt")
        folder = label_file[0].rsplit("/", 1)[0] + "/" if "/" in label_file[0] else ""
        names, labels = [], []
        for line in files[label_file[0]].decode().split("\n"):
            if line.strip():
                name, label = line.split()
                names.append(name)
                labels.append(int(label))
        images = [_png(files[f"{folder}mnist_m_{part}/{name}"])[..., :3] for name in names]
        out[f"x_{part}"] = np.stack(images).astype(np.uint8)
        out[f"y_{part}"] = np.array(labels, dtype=np.uint8)
    return [save_npz(root / "digits" / "mnist_m.npz", **out)]


# --------------------------------------------------------------------------- CIFAR


def _cifar_records(data: bytes, label_bytes: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The binary version: per image `label_bytes` label bytes then 3x32x32 planar pixels."""
    size = label_bytes + 3072
    if len(data) % size:
        raise ConfigError(f"{where}: {len(data)} bytes is not a multiple of {size}")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, size)
    x = records[:, label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x), records[:, label_bytes - 1].copy()


def _convert_cifar(
    raw: Path, root: Path, out: str, parts: dict[str, list[str]], lb: int
) -> list[Path]:
    tars = sorted(raw.glob("*.tar.gz"))
    if not tars:
        raise ConfigError(f"no CIFAR binary .tar.gz in {raw}")
    blobs: dict[str, bytes] = {}
    with tarfile.open(tars[0], "r:gz") as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.endswith(".bin"):
                handle = archive.extractfile(member)
                assert handle is not None
                blobs[Path(member.name).name] = handle.read()
    arrays = {}
    for part, names in parts.items():
        missing = [n for n in names if n not in blobs]
        if missing:
            raise ConfigError(f"{tars[0]}: no member {missing[0]}")
        xs, ys = zip(*(_cifar_records(blobs[n], lb, n) for n in names), strict=True)
        arrays[f"x_{part}"] = np.concatenate(xs)
        arrays[f"y_{part}"] = np.concatenate(ys)
    return [save_npz(root / "images" / out, **arrays)]


def convert_cifar10(raw: Path, root: Path) -> list[Path]:
    """cifar-10-binary.tar.gz -> x_train (50000, 32, 32, 3) uint8 NHWC, y_train, x_test, ..."""
    train = [f"data_batch_{i}.bin" for i in range(1, 6)]
    return _convert_cifar(raw, root, "cifar10.npz", {"train": train, "test": ["test_batch.bin"]}, 1)


def convert_cifar100(raw: Path, root: Path) -> list[Path]:
    """cifar-100-binary.tar.gz -> the same layout; y is the fine label (second byte)."""
    return _convert_cifar(
        raw, root, "cifar100.npz", {"train": ["train.bin"], "test": ["test.bin"]}, 2
    )


# --------------------------------------------------------------------------- FEMNIST

FEMNIST_FRACTION = 0.05
FEMNIST_TRAIN = 0.9


def _leaf_json(raw: Path) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """LEAF's own output ({train,test}/*.json: users, user_data{x: floats in [0,1], y})."""
    xs, ys, writers, splits = [], [], [], []
    for code, part in enumerate(("train", "test")):
        for path in sorted((raw / part).glob("*.json")):
            try:
                blob = json.loads(path.read_text())
                for user in blob["users"]:
                    data = blob["user_data"][user]
                    x = np.rint(np.asarray(data["x"], dtype=np.float64) * 255.0)
                    xs.append(x.reshape(-1, 28, 28).astype(np.uint8))
                    ys.append(np.asarray(data["y"], dtype=np.int64))
                    writers += [user] * len(data["y"])
                    splits.append(np.full(len(data["y"]), code))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}: not a LEAF JSON file ({exc})") from None
    if not xs:
        raise ConfigError(f"femnist: no LEAF JSON under {raw}/train or {raw}/test")
    return np.concatenate(xs), np.concatenate(ys), writers, np.concatenate(splits)


def _femnist_parquet(files: list[Path]) -> tuple[np.ndarray, np.ndarray, list[str], None]:
    """Flower's FEMNIST on the Hugging Face Hub: image (PNG), writer_id, character."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("femnist: reading parquet needs pyarrow (pip install pyarrow)") from None
    xs, ys, writers = [], [], []
    for path in files:
        table = pq.read_table(path, columns=["image", "writer_id", "character"]).to_pydict()
        xs += [_png(img["bytes"]) for img in table["image"]]
        ys += table["character"]
        writers += [str(w) for w in table["writer_id"]]
    x = np.stack(xs).astype(np.uint8)
    if x.mean() < 128:  # ink light on dark: flip to LEAF's convention (background 255)
        x = 255 - x
    return x, np.asarray(ys, dtype=np.int64), writers, None


def _leaf_sample(writers: np.ndarray, fraction: float) -> np.ndarray:
    """LEAF's niid sampling: whole writers in a seeded order until `fraction` of samples."""
    names, counts = np.unique(writers, return_counts=True)
    order = np.random.default_rng(0).permutation(len(names))
    cumulative = np.cumsum(counts[order])
    keep = order[: int(np.searchsorted(cumulative, fraction * counts.sum())) + 1]
    return np.isin(writers, names[keep])


def convert_femnist(raw: Path, root: Path) -> list[Path]:
    """FEMNIST -> x uint8 (N, 28, 28) (background 255, as LEAF), y 0..61, writer, split.

    From LEAF JSON (raw/train, raw/test): taken as it is, split included. From Flower's
    parquet copy of the full set: LEAF's niid sample of 5 % of the samples by whole writers,
    then 90 % of each writer's samples train (seeded), as LEAF's `-s niid --sf 0.05 -t sample`.
    """
    parquet = sorted(raw.glob("*.parquet"))
    if parquet:
        x, y, names, _ = _femnist_parquet(parquet)
        writer_arr = np.asarray(names)
        keep = _leaf_sample(writer_arr, FEMNIST_FRACTION)
        x, y, writer_arr = x[keep], y[keep], writer_arr[keep]
        split = split_per_group(writer_arr, FEMNIST_TRAIN)
    else:
        x, y, names, split = _leaf_json(raw)
        writer_arr = np.asarray(names)
    writer, writer_names = pd.factorize(writer_arr)  # numbered by first appearance
    return [
        save_npz(
            root / "images" / "femnist.npz",
            x=x,
            y=y.astype(np.uint8),
            writer=writer.astype(np.int32),
            writer_names=np.asarray(writer_names, dtype=str),
            split=split.astype(np.int8),
        )
    ]


# --------------------------------------------------------------------------- Office-Caltech

OFFICE_DOMAINS = {"amazon": "amazon", "Caltech10": "caltech", "dslr": "dslr", "webcam": "webcam"}
OFFICE_CLASSES = [
    "back_pack",
    "bike",
    "calculator",
    "headphones",
    "keyboard",
    "laptop_computer",
    "monitor",
    "mouse",
    "mug",
    "projector",
]


def convert_office_caltech(raw: Path, root: Path) -> list[Path]:
    """The four <domain>_SURF_L10.mat files (fts, labels 1..10) -> X uint8 (N, 800), y, domain."""
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    xs, ys, domains = [], [], []
    for code, stem in enumerate(OFFICE_DOMAINS):
        path = _need(raw, f"{stem}_SURF_L10.mat")
        try:
            mat = loadmat(path)
        except MatReadError as exc:
            raise ConfigError(f"{path}: not a MATLAB file ({exc})") from None
        if "fts" not in mat or "labels" not in mat:
            raise ConfigError(f"{path}: expected variables 'fts' and 'labels'")
        xs.append(np.rint(mat["fts"]).astype(np.uint8))
        ys.append(mat["labels"].reshape(-1).astype(np.int64) - 1)
        domains.append(np.full(len(ys[-1]), code))
    return [
        save_npz(
            root / "features" / "office_caltech10_surf.npz",
            X=np.concatenate(xs),
            y=np.concatenate(ys).astype(np.int8),
            domain=np.concatenate(domains).astype(np.int8),
            domain_names=np.array(list(OFFICE_DOMAINS.values())),
            class_names=np.array(OFFICE_CLASSES),
        )
    ]
