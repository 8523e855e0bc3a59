"""Where every data set comes from: public source, checksums, licence, converter.

`SOURCES[name]` says which raw files make the data set, where to download them (mirrors in
order), their checksums (the publisher's where one exists, else recorded at first
download), the converter that turns them into the files the loader reads, and the licence
terms. `fetch(name, root)` does it all; `status(name, root)` says what is present. The raw
archives stay in `<root>/raw/<source>/` (delete them once converted if disk is short; a later
fetch then downloads again). docs/data.md is the human-readable version of this table.
"""

from __future__ import annotations

import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from protofed.core.files import first_line
from protofed.data import convert
from protofed.data.download import Log, Remote, expected_hash, fetch_file, stderr_log, verify
from protofed.errors import ConfigError

MB = 1_000_000


@dataclass(frozen=True)
class Source:
    """How to obtain one data set from its public distribution."""

    files: tuple[Remote, ...]
    convert: Callable[[Path, Path], list[Path]]
    produces: tuple[str, ...]  # paths under the data root that the loader reads
    publisher: str  # short, for `protofed data list`
    homepage: str
    licence: str  # short; `terms` says more where needed
    citation: str
    terms: str = ""
    raw: str = ""  # folder under <root>/raw/ (data sets cut from one archive share it)
    differs: str = ""  # what the papers used where our conversion differs
    # (path under the root, what it is): a smaller copy the loader reads when `produces` is absent
    alternatives: tuple[tuple[str, str], ...] = field(default=())

    def raw_dir(self, root: Path, name: str) -> Path:
        return root / "raw" / (self.raw or name)

    @property
    def download_size(self) -> int:
        return sum(f.size or 0 for f in self.files)


_UCI = "https://archive.ics.uci.edu"
_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": ("md5:f68b3c2dcbeaaa9fbdd348bbdeb94873", 9_912_422),
    "train-labels-idx1-ubyte.gz": ("md5:d53e105ee54ea40749a09fcbcd1e9432", 28_881),
    "t10k-images-idx3-ubyte.gz": ("md5:9fb629c4189551a2d022fa330f9573f3", 1_648_877),
    "t10k-labels-idx1-ubyte.gz": ("md5:ec29112dd5afa0611ce80d1b7f02629c", 4_542),
}
_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
_LIBSVM = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass/"
_OFFICE = (
    "https://raw.githubusercontent.com/jindongwang/transferlearning/"
    "73cb050b7e8b969b9d0ebb04a9377aa033043eb2/code/BDA/data/"
)
_WISDM = Remote(
    "WISDM_ar_latest.tar.gz",
    ("https://www.cis.fordham.edu/wisdm/includes/datasets/latest/WISDM_ar_latest.tar.gz",),
    None,
    11 * MB,
)
_WISDM_TERMS = "free for research; cite Kwapisz et al. 2010 and keep readme.txt with the data"

_FEDALI_DOCS = {
    "convert_realworld": "realworld2016_dataset.zip's acc_<activity>_<position>.csv -> X (N, 3, "
    "128) at 50 Hz, 50 % overlap, z-scored per device; one client per subject x position (105).",
    "convert_hhar_paper": "Phones_accelerometer.csv, every phone -> X (N, 3, 128) at 50 Hz, 50 % "
    "overlap, z-scored per device; one client per user x phone model (36).",
}


def _fedali(name: str) -> Callable[[Path, Path], list[Path]]:
    """A converter of data.sources.fedali_har, imported only when it runs (it loads torch)."""

    def run(raw: Path, root: Path) -> list[Path]:
        from protofed.data.sources import fedali_har

        converter: Callable[[Path, Path], list[Path]] = getattr(fedali_har, name)
        return converter(raw, root)

    run.__doc__ = _FEDALI_DOCS[name]
    return run


SOURCES: dict[str, Source] = {
    "uci_har": Source(
        publisher="UCI ML Repository",
        files=(
            Remote(
                "human_activity_recognition_using_smartphones.zip",
                (
                    f"{_UCI}/static/public/240/human+activity+recognition+using+smartphones.zip",
                    f"{_UCI}/ml/machine-learning-databases/00240/UCI%20HAR%20Dataset.zip",
                ),
                None,
                61 * MB,
            ),
        ),
        convert=convert.convert_uci_har,
        produces=("har/uci_har.npz",),
        homepage=f"{_UCI}/dataset/240",
        licence="CC BY 4.0",
        citation="Anguita et al., ESANN 2013",
        differs="The shared copy is PFLlib's conversion with a per-subject 75/25 split; the "
        "converter keeps UCI's published 21/9-subject split (protofed re-splits every client "
        "itself unless data.predefined_split=true). The windows are the same.",
        alternatives=(("UCI HAR Dataset", "the unpacked UCI download"),),
    ),
    "wisdm": Source(
        publisher="WISDM Lab, Fordham",
        files=(_WISDM,),
        convert=convert.convert_wisdm,
        produces=("har/wisdm.npz",),
        homepage="https://www.cis.fordham.edu/wisdm/dataset.php",
        licence="WISDM Lab terms",
        terms=_WISDM_TERMS,
        citation="Kwapisz, Weiss and Moore, SIGKDD Explorations 2010",
        raw="wisdm",
        differs="The shared copy is AdaTime's windowing (7292 windows, AdaTime's split); the "
        "converter cuts non-overlapping 128-sample windows from the raw stream (about 8400) "
        "and splits two thirds of each user's windows for training.",
    ),
    "wisdm_features": Source(
        publisher="WISDM Lab, Fordham",
        files=(_WISDM,),
        convert=convert.convert_wisdm_features,
        produces=("har/wisdm_features.csv", "har/wisdm_readme.txt"),
        homepage="https://www.cis.fordham.edu/wisdm/dataset.php",
        licence="WISDM Lab terms",
        terms=_WISDM_TERMS,
        citation="Kwapisz, Weiss and Moore, SIGKDD Explorations 2010",
        raw="wisdm",
    ),
    "hhar": Source(
        publisher="UCI ML Repository",
        files=(
            Remote(
                "heterogeneity_activity_recognition.zip",
                (f"{_UCI}/static/public/344/heterogeneity+activity+recognition.zip",),
                None,
                1_100 * MB,
            ),
        ),
        convert=convert.convert_hhar,
        produces=("har/hhar_sa.npz",),
        homepage=f"{_UCI}/dataset/344",
        licence="CC BY 4.0",
        citation="Stisen et al., SenSys 2015",
        differs="The shared copy holds only AdaTime's test windows of the Samsung phones; the "
        "converter windows every Galaxy S3 recording (non-overlapping, 128 samples) and splits "
        "two thirds of each user's windows for training. FedAli used the full HHAR.",
    ),
    "hhar_paper": Source(
        publisher="UCI ML Repository",
        files=(
            Remote(
                "heterogeneity_activity_recognition.zip",
                (f"{_UCI}/static/public/344/heterogeneity+activity+recognition.zip",),
                None,
                1_100 * MB,
            ),
        ),
        convert=_fedali("convert_hhar_paper"),
        produces=("har/hhar_paper.npz",),
        homepage=f"{_UCI}/dataset/344",
        licence="CC BY 4.0",
        citation="Stisen et al., SenSys 2015",
        raw="hhar",
        differs="FedAli's clients (user x phone model, 36) at 50 Hz with 50 % overlap; "
        "accelerometer only (the paper adds the gyroscope).",
    ),
    "realworld": Source(
        publisher="Univ. Mannheim",
        files=(
            Remote(
                "realworld2016_dataset.zip",
                (
                    "http://wifo5-14.informatik.uni-mannheim.de/sensor/dataset/realworld2016/"
                    "realworld2016_dataset.zip",
                ),
                None,
                3_500 * MB,
            ),
        ),
        convert=_fedali("convert_realworld"),
        produces=("har/realworld.npz",),
        homepage="https://www.uni-mannheim.de/dws/research/projects/activity-recognition/"
        "dataset/dataset-realworld/",
        licence="research use",
        terms="see the homepage; cite Sztyler and Stuckenschmidt, PerCom 2016",
        citation="Sztyler and Stuckenschmidt, PerCom 2016",
        differs="FedAli's clients (subject x body position, 105) at 50 Hz with 50 % overlap; "
        "accelerometer only (the paper adds the gyroscope).",
    ),
    "wesad": Source(
        publisher="Univ. Siegen",
        files=(
            Remote(
                "WESAD.zip",
                ("https://uni-siegen.sciebo.de/s/HGdUkoNlW1Ub0Gx/download",),
                None,
                2_250 * MB,
            ),
        ),
        convert=convert.convert_wesad,
        produces=("wearable/wesad_features.csv",),
        homepage="https://ubi29.informatik.uni-siegen.de/usi/data_wesad.html",
        licence="academic, non-commercial",
        terms="WESAD readme: for academic and non-commercial use only",
        citation="Schmidt et al., ICMI 2018",
        differs="The shared copy is a widely copied third-party feature set (54 columns, 30 "
        "duplicated by a bug upstream, wrist and chest); the converter computes 33 wrist "
        "(Empatica E4) features per 30 s window from the published per-subject pickles. "
        "FedSub used the raw wrist signals.",
    ),
    "mnist": Source(
        publisher="LeCun et al.",
        files=tuple(
            Remote(name, tuple(m + name for m in _MNIST_MIRRORS), md5, size)
            for name, (md5, size) in _MNIST_MD5.items()
        ),
        convert=convert.convert_mnist,
        produces=("digits/mnist.npz",),
        homepage="http://yann.lecun.com/exdb/mnist/",
        licence="CC BY-SA 3.0",
        citation="LeCun et al., Proc. IEEE 1998",
    ),
    "usps": Source(
        publisher="LIBSVM data sets",
        files=(
            Remote(
                "usps.bz2", (f"{_LIBSVM}usps.bz2",), "md5:ec16c51db3855ca6c91edd34d0e9b197", 6 * MB
            ),
            Remote(
                "usps.t.bz2",
                (f"{_LIBSVM}usps.t.bz2",),
                "md5:8ea070ee2aca1ac39742fdd1ef5ed118",
                2 * MB,
            ),
        ),
        convert=convert.convert_usps,
        produces=("digits/usps.npz",),
        homepage="https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html#usps",
        licence="none stated",
        terms="a public benchmark since Hull 1994; LIBSVM scaled it to [-1, 1]",
        citation="Hull, IEEE TPAMI 1994",
    ),
    "mnist_m": Source(
        publisher="Ganin and Lempitsky",
        files=(
            Remote(
                "mnist_m.tar.gz",
                ("https://cornell.box.com/shared/static/jado7quprg6hzzdubvwzh9umr75damwi",),
                "md5:859df31c91afe82e80e5012ba928f279",
                89 * MB,
            ),
        ),
        convert=convert.convert_mnist_m,
        produces=("digits/mnist_m.npz",),
        homepage="http://yaroslav.ganin.net/",
        licence="none stated",
        terms="digits of MNIST blended with patches of BSDS500 photos",
        citation="Ganin and Lempitsky, ICML 2015",
        differs="The shared copy is the test split only (9001 images); the fetched file adds "
        "the 59001 training images, and the loader then uses both.",
        alternatives=(("digits/mnist_m_test.npz", "test split only"),),
    ),
    "cifar10": Source(
        publisher="Univ. Toronto",
        files=(
            Remote(
                "cifar-10-binary.tar.gz",
                ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
                "md5:c32a1d4ab5d03f1284b67883e8d87530",
                170 * MB,
            ),
        ),
        convert=convert.convert_cifar10,
        produces=("images/cifar10.npz",),
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html",
        licence="none stated",
        citation="Krizhevsky, tech. report 2009",
        differs="The shared copy is a stratified 20000-image subset; the fetched file is all "
        "60000 images, which the loader prefers when present (the papers use all 60000).",
        alternatives=(("images/cifar10_20k.npz", "stratified 20k subset"),),
    ),
    "cifar100": Source(
        publisher="Univ. Toronto",
        files=(
            Remote(
                "cifar-100-binary.tar.gz",
                ("https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",),
                "md5:03b5dce01913d631647c71ecec9e9cb8",
                168 * MB,
            ),
        ),
        convert=convert.convert_cifar100,
        produces=("images/cifar100.npz",),
        homepage="https://www.cs.toronto.edu/~kriz/cifar.html",
        licence="none stated",
        citation="Krizhevsky, tech. report 2009",
        differs="As CIFAR-10: the shared copy is a 10000-image subset, the fetched file all "
        "60000 (fine labels).",
        alternatives=(("images/cifar100_10k.npz", "stratified 10k subset"),),
    ),
    "femnist": Source(
        publisher="LEAF, via Flower on HF Hub",
        files=(
            Remote(
                "femnist-train-00000-of-00001.parquet",
                (
                    "https://huggingface.co/datasets/flwrlabs/femnist/resolve/main/data/"
                    "train-00000-of-00001.parquet",
                ),
                None,
                201 * MB,
            ),
        ),
        convert=convert.convert_femnist,
        produces=("images/femnist.npz",),
        homepage="https://leaf.cmu.edu/",
        licence="BSD-2-Clause",
        terms="LEAF is BSD-2-Clause; the images come from NIST Special Database 19",
        citation="Caldas et al., LEAF, arXiv:1812.01097",
        differs="Downloaded from Flower's copy of the full set (814277 images, 3597 writers), "
        "then sampled as LEAF's niid 5 % (whole writers) with a 90/10 split per writer. The "
        "shared copy is a partial LEAF 5 % sample. LEAF's own JSON output is also accepted: "
        "protofed data fetch femnist --raw DIR (DIR/train/*.json, DIR/test/*.json).",
        alternatives=(("images/femnist_partial.npz", "partial LEAF sample"),),
    ),
    "office_caltech": Source(
        publisher="GFK release, via GitHub",
        files=tuple(
            Remote(f"{stem}_SURF_L10.mat", (f"{_OFFICE}{stem}_SURF_L10.mat",), None, size)
            for stem, size in (
                ("amazon", 2 * MB),
                ("Caltech10", 2 * MB),
                ("dslr", MB),
                ("webcam", MB),
            )
        ),
        convert=convert.convert_office_caltech,
        produces=("features/office_caltech10_surf.npz",),
        homepage="https://github.com/jindongwang/transferlearning",
        licence="research use",
        terms="SURF features of the GFK release (Gong et al. 2012), hosted in an MIT repo",
        citation="Gong et al., CVPR 2012",
        differs="PFPL used the images with a CNN; only the SURF bag-of-words features are "
        "published in a form that can be fetched.",
    ),
}
# digits_domains is MNIST + USPS + MNIST-M, har_combined the HAR sets of data.members (any of
# three): fetching either fetches its parts.
COMPOSITE = {
    "digits_domains": ("mnist", "usps", "mnist_m"),
    "har_combined": ("uci_har", "wisdm", "hhar"),
    "fedali_combined": ("hhar_paper", "realworld"),
}


def source(name: str) -> Source:
    if name in COMPOSITE:
        raise ConfigError(f"'{name}' is made of {', '.join(COMPOSITE[name])}: fetch those")
    found = SOURCES.get(name)
    if found is None:
        import difflib

        close = difflib.get_close_matches(name, [*SOURCES, *COMPOSITE], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"no download for data set '{name}'{hint} (fetchable: {', '.join([*SOURCES, *COMPOSITE])})"
        )
    return found


def present(name: str, root: Path) -> list[Path]:
    """The converted files of `name` that are in `root` (the loader reads these)."""
    names = COMPOSITE.get(name, (name,))
    return [
        root / p for n in names if n in SOURCES for p in SOURCES[n].produces if (root / p).exists()
    ]


def status(name: str, root: Path) -> tuple[str, list[Path]]:
    """'yes', 'no', 'partly' (some parts of a composite) or 'subset' (only an alternative
    copy), and the files the loader would read."""
    names = COMPOSITE.get(name, (name,))
    states, files = [], []
    for part in names:
        spec = SOURCES[part]
        full = [root / p for p in spec.produces]
        alts = [root / p for p, _ in spec.alternatives if (root / p).exists()]
        if all(p.exists() for p in full):
            states.append("yes")
            files += full
        elif alts:
            states.append("subset")
            files += alts[:1]
        else:
            states.append("no")
    if len(set(states)) == 1:
        return states[0], files
    return ("partly" if "no" in states else "subset"), files


def fetch(
    name: str,
    root: Path,
    *,
    raw_dir: Path | None = None,
    force: bool = False,
    log: Log = stderr_log,
    progress: bool | None = None,
) -> list[Path]:
    """Download (or take from `raw_dir`), verify and convert `name`; return the files written.

    Already-converted files are kept unless `force`; a converter failure leaves the old files.
    """
    if name in COMPOSITE:
        return [
            p
            for part in COMPOSITE[name]
            for p in fetch(part, root, raw_dir=raw_dir, force=force, log=log, progress=progress)
        ]
    spec = source(name)
    done = [root / p for p in spec.produces]
    if not force and all(p.exists() for p in done):
        log(f"{name}: already converted ({', '.join(str(p) for p in done)})")
        return done
    if raw_dir is None:
        folder = spec.raw_dir(root, name)
        for remote in spec.files:
            fetch_file(remote, folder, log=log, progress=progress)
    else:
        folder = raw_dir
        if not folder.is_dir():
            raise ConfigError(f"--raw: not a folder: {folder}")
        for remote in spec.files:
            path = folder / remote.filename
            expected = expected_hash(remote, folder)
            if path.is_file() and expected is not None:
                verify(path, expected)
    log(f"{name}: converting")
    try:
        written = spec.convert(folder, root)
    except ConfigError:
        raise
    except (
        zipfile.BadZipFile,
        tarfile.TarError,
        zlib.error,
        EOFError,
        ValueError,
        IndexError,
    ) as exc:
        # a damaged or foreign raw file (a parse that fails on it raises one of these)
        raise ConfigError(
            f"{name}: cannot convert the raw files in {folder}: {first_line(exc)}"
        ) from None
    log(f"{name}: wrote {', '.join(str(p) for p in written)}")
    return written
