"""FedAli's unsupervised pre-training: HART's encoder as a masked autoencoder (MAE).

FedAli section 5.4: HART with its ALP layers is pre-trained "in a self-supervised manner
using MAE (He et al. 2022)" on public HAR sets other than the target; the encoder and the
local prototypes then start federated training (the 1024-unit layer and the head stay new),
and the pre-trained local prototypes become the initial global ones. `Pretraining` trains
(`MaskedAutoencoder`: HART's own tokens, random masking, an MAE decoder, MSE on the masked
tokens) on `pooled_windows`, writes the checkpoint (safetensors, named as the model's
state_dict) and keeps its whole state beside it after every epoch, so an interrupted
pre-training continues (`--resume`) to the same checkpoint; `load_init` reads a checkpoint
into a model (`model.init`). docs/pretraining.md gives the objective, the checkpoint and
every setting settled here.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from protofed.config import DataConfig, ExperimentConfig
from protofed.core.files import atomic_write_bytes, tensors_digest
from protofed.core.seeding import MODEL_INIT, derive_seed
from protofed.data import load_dataset
from protofed.data.harmonize import (
    HAR_WINDOWS,
    channels_of,
    harmonized_windows,
    missing_channels,
    own_sets,
)
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.models.transformers import DIM, FRAME, HartBlock, HartFeatures
from protofed.nn.alp import BETA, GAMMA, GLOBAL, LOCAL, alp_layers

PRETRAIN = 1019
"""Seed stream of pre-training (decoder init, masks, batch order), apart from core.seeding's."""

DECODER_KERNELS = (3, 7, 7, 15)  # the official HART_decoder's convolution kernels
META = "__meta__"
FORMAT = "protofed-pretrain-1"


def is_encoder_key(name: str) -> bool:
    """A state_dict entry `model.init` carries: HART's encoder and the ALP local banks
    (not the 1024-unit layer, the head, the global banks or the per-round beta/gamma)."""
    if not name.startswith("features.") or name.startswith("features.embed."):
        return False
    return name.rsplit(".", 1)[-1] not in (GLOBAL, BETA, GAMMA)


# ------------------------------------------------------------------------------ the data
@dataclass
class Pool:
    """Unlabeled windows (N, C, T) pooled from several data sets, with what was done."""

    x: torch.Tensor
    counts: dict[str, int]
    channels: list[str]
    notes: list[str] = field(default_factory=list)


def pooled_windows(cfg: ExperimentConfig) -> Pool:
    """The pre-training windows for the target `cfg.data`: every window of the other HAR sets,
    labels never used, made comparable with the target's by `protofed.data.harmonize`
    (channels by meaning, each set z-scored per channel, resampled to the target's length)."""
    target = load_dataset(cfg.data)
    if target.kind != "sensor" or target.X.ndim != 3:
        raise ConfigError(f"pretrain: data.name={cfg.data.name} is not a set of sensor windows")
    want = channels_of(target)
    length = target.X.shape[-1]
    # the target's own sets: itself, or the members of a combined federation
    own = own_sets(cfg.data.name, cfg.data.members)
    names = cfg.pretrain.datasets or [n for n in HAR_WINDOWS if n not in own]
    seen = [n for n in names if n in own]
    if seen:
        raise ConfigError(
            f"pretrain.datasets includes the target data set '{seen[0]}': its test "
            "windows would be seen in pre-training"
        )
    xs, counts, notes = [], {}, []
    for i, name in enumerate(names):
        try:
            ds = load_dataset(DataConfig(name=name, channels="all", dir=cfg.data.dir))
        except ConfigError as exc:  # the key the user wrote, not data.name
            if not str(exc).startswith("data.name:"):
                raise
            raise ConfigError(f"pretrain.datasets:{str(exc).removeprefix('data.name:')}") from None
        if ds.kind != "sensor" or ds.X.ndim != 3:
            raise ConfigError(f"pretrain.datasets: '{name}' is not a set of sensor windows")
        missing = missing_channels(ds, want)
        if missing:
            notes.append(f"{name} skipped: no {', '.join(missing)}")
            continue
        rows = None  # ds.y is never read
        if cfg.pretrain.max_windows is not None and len(ds.X) > cfg.pretrain.max_windows:
            rng = np.random.default_rng(derive_seed(cfg.seed, PRETRAIN, 1, i))
            rows = np.sort(rng.choice(len(ds.X), cfg.pretrain.max_windows, replace=False))
        if ds.X.shape[-1] != length:
            notes.append(f"{name}: windows of {ds.X.shape[-1]} samples resampled to {length}")
        xs.append(harmonized_windows(ds, want, length, rows))
        counts[name] = len(xs[-1])
    if not xs:
        raise ConfigError(
            f"pretrain: no data set to pre-train on for {cfg.data.name}'s channels "
            f"({', '.join(want)}): {'; '.join(notes) or 'none listed'}"
        )
    return Pool(torch.from_numpy(np.concatenate(xs)), counts, want, notes)


# ----------------------------------------------------------------------------- the model
class MaskedAutoencoder(nn.Module):
    """HART's encoder (`features`, shared with the classifier) plus an MAE decoder."""

    def __init__(self, features: HartFeatures, mask_ratio: float, decoder_blocks: int) -> None:
        super().__init__()
        self.features = features
        self.num_tokens = int(features.tokens)
        self.num_mask = min(self.num_tokens - 1, max(1, int(mask_ratio * self.num_tokens)))
        self.decoder_embed = nn.Linear(DIM, DIM)
        self.mask_token = nn.Parameter(torch.randn(1, 1, DIM) * 0.02)
        self.decoder_pos = nn.Parameter(torch.randn(1, self.num_tokens, DIM) * 0.02)
        rates = torch.linspace(0, 0.1, decoder_blocks).tolist()  # official: 0 .. 0.1
        kernels = [DECODER_KERNELS[i % len(DECODER_KERNELS)] for i in range(decoder_blocks)]
        self.decoder = nn.ModuleList(
            HartBlock(DIM, k, r, None) for k, r in zip(kernels, rates, strict=True)
        )
        self.decoder_norm = nn.LayerNorm(DIM)
        self.predict = nn.Linear(DIM, features.channels * FRAME)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The mean squared error on the masked tokens of windows x (B, C, T)."""
        target = self.features.patches(x)  # (B, Z, C * FRAME)
        tokens = self.features.embed_patches(target)
        b, z, d = tokens.shape
        order = torch.rand(b, z, generator=generator).to(x.device).argsort(dim=1)
        masked = order[:, : self.num_mask].sort(dim=1).values
        keep = order[:, self.num_mask :].sort(dim=1).values  # time order for the convolutions
        visible = tokens.gather(1, keep.unsqueeze(-1).expand(-1, -1, d))
        encoded = self.decoder_embed(self.features.encode(visible))
        h = self.mask_token.expand(b, z, d).scatter(
            1, keep.unsqueeze(-1).expand(-1, -1, d), encoded
        )
        h = h + self.decoder_pos
        for block in self.decoder:
            h = block(h)
        pred = self.predict(self.decoder_norm(h))
        index = masked.unsqueeze(-1).expand(-1, -1, target.shape[-1])
        return F.mse_loss(pred.gather(1, index), target.gather(1, index))


# -------------------------------------------------------------------------- pre-training
@dataclass
class Pretraining:
    """Everything validated and built: data, model, decoder, optimizer (see `build`)."""

    cfg: ExperimentConfig
    pool: Pool
    model: nn.Module
    mae: MaskedAutoencoder
    optimizer: torch.optim.Optimizer
    device: torch.device
    losses: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None  # batch order and masks; None until `run`
    rng_states: dict[str, torch.Tensor] = field(default_factory=dict)  # drop path's, per epoch

    @classmethod
    def build(cls, cfg: ExperimentConfig) -> Pretraining:
        """Every config error surfaces here, before any training or writing."""
        if cfg.model.name != "hart":
            raise ConfigError(f"pretrain: model.name must be hart (got '{cfg.model.name}')")
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        device = torch.device(cfg.train.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"train.device={cfg.train.device} but no CUDA device is available")
        pool = pooled_windows(cfg)
        shape = tuple(pool.x.shape[1:])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(cfg.seed, MODEL_INIT))  # where a run would start
            model = build_model(cfg.model, shape, 2)
            if not isinstance(model.features, HartFeatures):  # model.name is hart: it is
                raise TypeError(f"pretrain: hart built {type(model.features).__name__} features")
            torch.manual_seed(derive_seed(cfg.seed, PRETRAIN, 2))
            mae = MaskedAutoencoder(
                model.features, cfg.pretrain.mask_ratio, cfg.pretrain.decoder_blocks
            )
        for alp in alp_layers(mae).values():
            alp.use_global = False  # no server: align to the layer's own prototypes
        mae.to(device)
        p = cfg.pretrain
        params = list(mae.parameters())
        if p.optimizer == "sgd":
            optimizer: torch.optim.Optimizer = torch.optim.SGD(params, lr=p.lr, momentum=0.9)
        elif p.optimizer == "adam":
            optimizer = torch.optim.Adam(params, lr=p.lr)
        else:
            optimizer = torch.optim.AdamW(params, lr=p.lr, weight_decay=p.weight_decay)
        return cls(cfg, pool, model, mae, optimizer, device)

    def describe(self) -> str:
        sets = ", ".join(f"{k} {v}" for k, v in self.pool.counts.items())
        x = self.pool.x
        return (
            f"pre-training on {len(x)} unlabeled windows ({sets}), {x.shape[1]} channels "
            f"({', '.join(self.pool.channels)}) x {x.shape[2]} samples; "
            f"{self.mae.num_mask} of {self.mae.num_tokens} tokens masked"
        ) + "".join(f"; {n}" for n in self.pool.notes)

    def run(
        self,
        on_epoch: Callable[[int, float], None] | None = None,
        on_state: Callable[[dict[str, torch.Tensor]], None] | None = None,
    ) -> list[float]:
        """The epochs not yet done; after each, `on_state(self.state())` (to keep it), then
        `on_epoch(epoch, mean loss)`. Seeded: batches and masks come from the PRETRAIN
        stream, so a config gives the same checkpoint every time, resumed or not."""
        x, bs = self.pool.x, self.cfg.pretrain.batch_size
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(derive_seed(self.cfg.seed, PRETRAIN, 3))
        self.mae.train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.cfg.seed, PRETRAIN, 4))  # drop path
            if "cpu" in self.rng_states:  # resumed: where the kept state left them
                torch.set_rng_state(self.rng_states["cpu"])
            if "cuda" in self.rng_states and self.device.type == "cuda":
                torch.cuda.set_rng_state(self.rng_states["cuda"], self.device)
            for epoch in range(len(self.losses) + 1, self.cfg.pretrain.epochs + 1):
                order = torch.randperm(len(x), generator=self.generator)
                # summed on the device in float64 (the same sum as on the host): reading
                # each step's loss would stall a GPU's queue once per step
                total = torch.zeros((), dtype=torch.float64, device=self.device)
                for start in range(0, len(x), bs):
                    batch = x[order[start : start + bs]].to(self.device)
                    loss = self.mae(batch, self.generator)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.optimizer.step()
                    total += loss.detach().double() * len(batch)
                self.losses.append(float(total) / len(x))
                if not math.isfinite(self.losses[-1]):
                    raise ConfigError(
                        f"pretrain diverged in epoch {epoch} (loss {self.losses[-1]}): start "
                        "over with a lower pretrain.lr (and --force)"
                    )
                self.rng_states = {"cpu": torch.get_rng_state()}
                if self.device.type == "cuda":
                    self.rng_states["cuda"] = torch.cuda.get_rng_state(self.device)
                if on_state is not None:
                    on_state(self.state())
                if on_epoch is not None:
                    on_epoch(epoch, self.losses[-1])
        return self.losses

    @functools.cached_property
    def data_digest(self) -> str:
        """The pooled windows' SHA-256: a resumed pre-training must see the same data."""
        return hashlib.sha256(self.pool.x.numpy().tobytes()).hexdigest()

    def state(self) -> dict[str, torch.Tensor]:
        """What continues this pre-training (`restore`) from the end of its last epoch:
        the MAE's weights and buffers (encoder, ALP banks, decoder), the optimizer's
        moments, the random streams, the losses."""
        if self.generator is None or not self.rng_states:
            raise RuntimeError("a pre-training's state is taken after one of its epochs")
        tensors = {
            f"mae.{k}": v.detach().cpu().contiguous() for k, v in self.mae.state_dict().items()
        }
        for index, moments in self.optimizer.state_dict()["state"].items():
            for name, value in moments.items():
                tensors[f"optimizer.{index}.{name}"] = torch.as_tensor(value).cpu().contiguous()
        tensors["rng.generator"] = self.generator.get_state()
        tensors.update({f"rng.{k}": v for k, v in self.rng_states.items()})
        meta = {
            "format": STATE_FORMAT,
            "settings": settings(self.cfg),
            "data": self.data_digest,
            "losses": self.losses,
        }
        tensors[META] = _json_tensor(meta)
        return tensors

    def restore(self, path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Continue from a state `read_state` checked against the config."""
        where = f"pretrain --resume: {path}"
        if meta.get("data") != self.data_digest:
            raise ConfigError(f"{where} was saved on other windows (data or pretrain.datasets)")
        saved = {k.removeprefix("mae."): v for k, v in tensors.items() if k.startswith("mae.")}
        moments: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                index, _, name = key.removeprefix("optimizer.").partition(".")
                moments.setdefault(int(index) if index.isdigit() else -1, {})[name] = value
        fault = self._state_fault(tensors, saved, moments)
        if fault:
            raise ConfigError(f"{where} does not fit this model ({fault}); start over with --force")
        self.mae.load_state_dict(saved)
        optimizer = self.optimizer.state_dict()
        optimizer["state"] = moments
        self.optimizer.load_state_dict(optimizer)
        self.generator = torch.Generator()
        self.generator.set_state(tensors["rng.generator"])
        self.rng_states = {k: tensors[f"rng.{k}"] for k in ("cpu", "cuda") if f"rng.{k}" in tensors}
        self.losses = list(meta["losses"])

    def _state_fault(
        self,
        tensors: dict[str, torch.Tensor],
        saved: dict[str, torch.Tensor],
        moments: dict[int, dict[str, torch.Tensor]],
    ) -> str | None:
        """The first tensor of a kept state that this pre-training cannot continue from."""
        own = self.mae.state_dict()
        params = list(self.mae.parameters())
        names = ("momentum_buffer",) if self.cfg.pretrain.optimizer == "sgd" else ADAM_MOMENTS
        random_state = torch.Generator().get_state()  # the CPU's Mersenne Twister
        for key in ("rng.generator", "rng.cpu"):
            if key not in tensors:
                return f"no tensor '{key}'"
            value = tensors[key]
            if value.dtype != random_state.dtype or value.shape != random_state.shape:
                return f"'{key}' is not a random generator's state"
        fault = tensors_fault(saved, own)
        if fault is not None:
            kind, key = fault
            if kind == "missing":
                return f"no tensor 'mae.{key}'"
            if kind == "extra":
                return f"'mae.{key}', which it lacks"
            return f"'mae.{key}' is {tuple(saved[key].shape)}, not {tuple(own[key].shape)}"
        for index, have in sorted(moments.items()):  # a parameter never updated has none
            if not 0 <= index < len(params) or set(have) != set(names):
                return f"the optimizer's moments of parameter {index} ({', '.join(sorted(have))})"
            for name, value in have.items():
                if name != "step" and value.shape != params[index].shape:
                    return f"'optimizer.{index}.{name}' is {tuple(value.shape)}"
        return None

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, seed: int = 0) -> float:
        """Reconstruction loss on `x` in eval mode with masks drawn from `seed`."""
        was = self.mae.training
        self.mae.eval()
        try:
            g = torch.Generator().manual_seed(seed)
            return float(self.mae(x.to(self.device), g))
        finally:
            self.mae.train(was)

    def checkpoint(self) -> dict[str, torch.Tensor]:
        tensors = {
            k: v.detach().cpu().contiguous()
            for k, v in self.model.state_dict().items()
            if is_encoder_key(k)
        }
        meta = {
            "format": FORMAT,
            "target": self.cfg.data.name,
            "datasets": self.pool.counts,
            "channels": self.pool.channels,
            "window": int(self.pool.x.shape[-1]),
            "alp": self.cfg.model.alp.enabled,
            "pretrain": self.cfg.pretrain.model_dump(mode="json"),
            "seed": self.cfg.seed,
            "settings": settings(self.cfg),
            "losses": self.losses,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tensors[META] = _json_tensor(meta)
        return tensors


def _json_tensor(meta: dict[str, Any]) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)


# ------------------------------------------------------------------ resumable state files
STATE_FORMAT = "protofed-pretrain-state-1"
ADAM_MOMENTS = ("exp_avg", "exp_avg_sq", "step")  # Adam's and AdamW's, amsgrad off


def state_path(out: str | Path) -> Path:
    """Where a pre-training that writes `out` keeps its state between epochs."""
    out = Path(out)
    return out.with_name(f"{out.stem}.state{out.suffix}")


def settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a pre-training computes from: the seed, the data, the model and `pretrain.*`,
    except where the data lie and how many epochs (a resumed one may go on for longer);
    `train.*` (device, threads) says where it runs, not what it computes."""
    return {
        "seed": cfg.seed,
        "data": cfg.data.model_dump(mode="json", exclude={"dir"}),
        "model": cfg.model.model_dump(mode="json"),
        "pretrain": cfg.pretrain.model_dump(mode="json", exclude={"epochs"}),
    }


def settings_difference(saved: Any, now: dict[str, Any], prefix: str = "") -> str | None:
    """The first key whose value differs, as `key was A, now B`; None if none does."""
    if not isinstance(saved, dict):
        return f"{prefix.rstrip('.') or 'settings'} unknown"
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found = settings_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key} was {a!r}, now {b!r}"
    return None


def read_state(path: Path, cfg: ExperimentConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A kept state, checked against `cfg` before any data are loaded."""
    tensors, meta = _read_tensors(path, "pretrain --resume")
    where = f"pretrain --resume: {path}"
    if meta.get("format") != STATE_FORMAT:
        raise ConfigError(f"{where} is not a pre-training state; start over with --force")
    differs = settings_difference(meta.get("settings"), settings(cfg))
    if differs:
        raise ConfigError(
            f"{where} was saved with other settings ({differs}); resume with the config it "
            "was started with, or start over with --force"
        )
    losses = meta.get("losses")
    if not isinstance(losses, list) or not all(
        isinstance(v, float) and math.isfinite(v) for v in losses
    ):
        raise ConfigError(f"{where} has no list of epoch losses; start over with --force")
    if len(losses) > cfg.pretrain.epochs:
        raise ConfigError(
            f"{where} holds {len(losses)} epochs, more than pretrain.epochs="
            f"{cfg.pretrain.epochs}: raise it, or start over with --force"
        )
    return tensors, meta


def check_complete(out: Path, cfg: ExperimentConfig) -> None:
    """`out`, already written, is what `cfg` would write (else a one-line error)."""
    meta = _read_tensors(out, "pretrain --resume")[1]
    if not isinstance(meta.get("settings"), dict):
        raise ConfigError(
            f"pretrain --resume: {out} exists and records no settings to compare (an older "
            "protofed made it): choose another --out, or replace it with --force"
        )
    differs = settings_difference(meta.get("settings"), settings(cfg))
    done = len(meta.get("losses") or [])
    if differs is None and done != cfg.pretrain.epochs:
        differs = f"pretrain.epochs was {done}, now {cfg.pretrain.epochs}"
    if differs:
        raise ConfigError(
            f"pretrain --resume: {out} exists, made with other settings ({differs}): choose "
            "another --out, or replace it with --force"
        )


# --------------------------------------------------------------------- checkpoint files
def tensors_fault(
    found: Mapping[str, torch.Tensor], wanted: Mapping[str, torch.Tensor]
) -> tuple[str, str] | None:
    """The first way `found` is not `wanted`'s tensors by name and shape, as ("missing",
    key), ("shape", key) or ("extra", key); None if there is none. Each caller words it."""
    for key, value in wanted.items():
        if key not in found:
            return "missing", key
        if tuple(found[key].shape) != tuple(value.shape):
            return "shape", key
    extra = sorted(set(found) - set(wanted))
    return ("extra", extra[0]) if extra else None


DIGEST = "protofed.sha256"
"""The safetensors header's metadata key for `tensors_digest` of the file's tensors, in
name order: checked on every read, so a flipped bit is a damaged file, not a resumed or
diverged pre-training. A file without it (written before) is read unchecked."""


def _digest(tensors: Mapping[str, torch.Tensor]) -> str:
    return tensors_digest({k: tensors[k] for k in sorted(tensors)})


def save_checkpoint(path: str | Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Write the safetensors file atomically, with its tensors' digest in its metadata."""
    data = safetensors.torch.save(tensors, metadata={DIGEST: _digest(tensors)})
    return atomic_write_bytes(path, data)


def _recorded_digest(data: bytes) -> str | None:
    """The digest a safetensors file's header records (None: none, or not safetensors)."""
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        return header.get("__metadata__", {}).get(DIGEST)
    except (ValueError, AttributeError):
        return None


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors and the metadata of a `protofed pretrain` checkpoint; one-line errors."""
    return _read_tensors(Path(path), "model.init")


def _read_tensors(path: Path, key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A checkpoint or state file's tensors and JSON metadata; one-line errors that start
    with `key`, the setting or option that named the file."""
    if not path.is_file():
        what = "a folder, not a checkpoint file" if path.is_dir() else "file not found"
        raise ConfigError(f"{key}: {what}: {path}")
    data = path.read_bytes()
    try:
        if data[:2] == b"PK":  # torch.save's zip format
            tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        else:
            tensors = safetensors.torch.load(data)
    except Exception as exc:
        raise ConfigError(
            f"{key}: {path} is not a protofed pretrain checkpoint ({type(exc).__name__})"
        ) from None
    if not isinstance(tensors, dict) or not all(
        isinstance(v, torch.Tensor) for v in tensors.values()
    ):
        raise ConfigError(f"{key}: {path} is not a dict of tensors")
    recorded = _recorded_digest(data) if data[:2] != b"PK" else None
    if recorded is not None and recorded != _digest(tensors):
        raise ConfigError(
            f"{key}: {path} is damaged (its tensors do not match the sha256 recorded when it "
            "was written); start over with --force"
        )
    meta_bytes = tensors.pop(META, None)
    try:
        meta = {} if meta_bytes is None else json.loads(bytes(meta_bytes.tolist()).decode())
    except (TypeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(
            f"{key}: {path}: its '{META}' tensor is not the JSON protofed writes "
            f"({type(exc).__name__})"
        ) from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{key}: {path}: its '{META}' tensor is not a JSON object")
    return tensors, meta


@torch.no_grad()
def load_init(model: nn.Module, path: str | Path) -> dict[str, Any]:
    """Copy a checkpoint's encoder weights and ALP local banks into `model`, in place.

    Every ALP layer's global bank gets the pre-trained local bank too: FedAli's initial
    global prototypes (section 5.4), and for other algorithms with ALP layers the bank they
    align to. The 1024-unit layer and the head keep their fresh initialisation. Every tensor
    must be there with its shape, and nothing else: a one-line error names the first that
    is not.
    """
    tensors, meta = read_checkpoint(path)
    if not any(isinstance(m, HartBlock) for m in model.modules()):  # an MLP has features.* too
        raise ConfigError(
            f"model.init: the model has no HART encoder to load {path} into; set model.name=hart"
        )
    state = model.state_dict()
    wanted = {k: v for k, v in state.items() if is_encoder_key(k)}
    fault = tensors_fault(tensors, wanted)
    if fault is not None:
        kind, key = fault
        if kind == "missing":
            raise ConfigError(
                f"model.init: {path} has no tensor '{key}' (pre-trained with other "
                "model.alp / data.channels settings?)"
            )
        if kind == "extra":
            raise ConfigError(
                f"model.init: {path} has tensor '{key}' the model lacks (pre-trained with "
                "other model.alp / data.channels settings?)"
            )
        raise ConfigError(
            f"model.init: tensor '{key}' is {tuple(tensors[key].shape)} in {path}, the "
            f"model needs {tuple(state[key].shape)}"
        )
    for key in wanted:
        state[key].copy_(tensors[key])
        if key.endswith(f".{LOCAL}"):
            state[key[: -len(LOCAL)] + GLOBAL].copy_(tensors[key])
    return meta
