"""The experiment config: typed, validated, and settable key by key from the command line.

A config is YAML with six sections (data, model, algorithm, train, eval, aggregation) plus
`seed` (and `flower`, read only by the Flower engine). Every
key can be overridden with `-s section.key=value`; values are parsed as YAML scalars, so
`-s train.lr=0.01` is a float and `-s data.channels=[0,1,2]` a list. Unknown keys and wrong
types are errors that name the key. Algorithm hyperparameters live under `algorithm.` and are
validated by the algorithm's own typed model (see `protofed.algorithms`).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from protofed.errors import ConfigError

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: training runs in float32, so a larger value (finite in
Python's float64) would overflow where it is used."""


def _admits(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether `annotation` (with its unions, lists and tuples) names one of `kinds`."""
    if annotation in kinds or annotation is Any:
        return True
    return any(_admits(arg, kinds) for arg in get_args(annotation) if arg is not Ellipsis)


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
"""`1e-3`: a float in YAML 1.2, a string to PyYAML (YAML 1.1 wants `1.0e-3`)."""


def _strict(annotation: Any, value: Any) -> Any:
    """`value` for a field of `annotation`, checked the strict way: a boolean is not a
    number, a string is not a number (but `1e-3`, which PyYAML reads as one, is the float it
    spells); an int is a float (YAML's `lr: 1`); a float beyond float32's range is refused."""
    if not _admits(annotation, (int, float)):
        return value
    many = isinstance(value, (list, tuple))
    items = list(value) if many else [value]
    for i, item in enumerate(items):
        if isinstance(item, bool) and not _admits(annotation, (bool,)):
            raise ValueError("a boolean is not a number")
        if isinstance(item, str) and not _admits(annotation, (str,)):
            if not (_admits(annotation, (float,)) and _EXPONENT.fullmatch(item.strip())):
                raise ValueError("a string is not a number")
            items[i] = item = float(item)
        if isinstance(item, float) and math.isfinite(item) and abs(item) > FLOAT32_MAX:
            raise ValueError(f"overflows float32 (at most {FLOAT32_MAX:.6g} in magnitude)")
    return items if many else items[0]


class _Section(BaseModel):
    # allow_inf_nan=False: `-s train.lr=.inf` is a config error, not a diverged run
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_types(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        return value if field is None else _strict(field.annotation, value)


class DynamicConfig(_Section):
    """Classes withheld from some clients at the start and given back on a schedule.

    FedSub's dynamic scenario: `client_fraction` of the clients (chosen from the seed) each
    lose `classes` of their classes (never all: one class with train and test samples stays);
    every `every` rounds each of them gets one back, in train, val and test alike
    (runtime/dynamic.py). Any algorithm runs on it: the runtime masks the data it hands out.
    """

    enabled: bool = False
    client_fraction: float = Field(
        0.6, gt=0, le=1, description="Share of clients that lose classes."
    )
    classes: int = Field(1, ge=1, description="Classes withheld per chosen client (capped).")
    every: int = Field(50, ge=1, description="Rounds between two returns of a withheld class.")


class DataConfig(_Section):
    name: str = "digits"
    partition: Literal["iid", "dirichlet", "pathological", "natural", "mixed"] = "dirichlet"
    num_clients: int | None = Field(
        None,
        ge=1,
        validate_default=True,
        description="Clients to simulate (unset: 10). natural: that many groups, drawn from "
        "the seed; unset: every group.",
    )
    clients: list[str | int] | Literal["all"] | None = Field(
        None,
        description="natural: the groups (subjects, users, ...) to use, by name; 'all': every "
        "group, data.num_clients not read (how runs before the key read a natural partition).",
    )
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (label skew).")
    classes_per_client: int = Field(
        2, ge=1, description="pathological / mixed: classes per client."
    )
    classes_spread: int = Field(
        0,
        ge=0,
        description="mixed: each client draws its class count uniformly from "
        "classes_per_client +- classes_spread (PFPL's 'average n'); 0: exactly classes_per_client.",
    )
    min_size: int = Field(10, ge=1, description="dirichlet: minimum samples per client.")
    max_retries: int = Field(100, ge=1, description="dirichlet: redraws before giving up.")
    channels: str | list[int | str] = Field(
        "default", description="Sensor channels: 'default', 'all', or a list of names/indices."
    )
    members: list[str] = Field(
        ["hhar", "wisdm"],
        description="har_combined: the HAR sets whose users form one federation.",
    )
    split: tuple[float, float, float] = Field(
        (0.7, 0.1, 0.2), description="Per-client train/val/test fractions (stratified)."
    )
    predefined_split: bool = Field(
        False, description="Use the source's published train/test split (val carved from train)."
    )
    path: str | None = Field(None, description="arrays: .npz, .csv or .parquet file.")
    label_column: str = "label"
    group_column: str | None = None
    image_size: int | None = Field(
        None, ge=4, le=1024, description="Resize images to this side (at most 1024)."
    )
    dir: str | None = Field(
        None, description="Data root (stored absolute); else PROTOFED_DATA; else a cache dir."
    )
    standardize: bool | None = Field(
        None,
        description="Per-feature z-score fitted on the clients' training data only; None: on "
        "for data.name=arrays (tabular and sensor), off where a loader already normalises.",
    )
    dynamic: DynamicConfig = Field(
        default_factory=DynamicConfig, description="Classes withheld and given back over rounds."
    )

    @field_validator("num_clients")
    @classmethod
    def _ten_unless_natural(cls, v: int | None, info: ValidationInfo) -> int | None:
        """Unset: 10 clients, except for a natural partition (one client per group)."""
        return 10 if v is None and info.data.get("partition") != "natural" else v

    @field_validator("dir")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        """A relative data.dir would mean another folder when a run is resumed elsewhere."""
        return None if v is None else str(Path(v).expanduser().absolute())

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(f < 0 for f in v) or abs(sum(v) - 1.0) > 1e-6 or v[0] <= 0 or v[2] <= 0:
            raise ValueError(
                "train/val/test fractions must be >= 0, sum to 1, with train and test > 0"
            )
        return v


class AlpConfig(_Section):
    """FedAli's ALP layers (protofed/nn/alp.py) in the transformer backbones (hart, vit_tiny).

    Architecture only; FedAli's beta and gamma are algorithm hyperparameters, sent to the
    layers as buffers. Defaults are the paper's (section 5.1 and 4.1).
    """

    enabled: bool = Field(False, description="An ALP layer after each block's first LayerNorm.")
    prototypes: list[int] = Field(
        default_factory=lambda: [2048, 1024, 512, 256, 128, 64],
        description="Prototypes per block (one count per block, or one for all blocks).",
    )
    matching: Literal["wasserstein", "cosine", "euclidean"] = Field(
        "wasserstein", description="Sinkhorn plan (paper), or point-to-point argmax (ablation)."
    )
    epsilon: float = Field(0.05, gt=0, description="Sinkhorn sharpness.")
    iterations: int = Field(3, ge=0, description="Sinkhorn normalisation steps.")
    topk: Literal["paper", "official"] = Field(
        "paper", description="EMA tokens per prototype: ceil(B*Z/G) (paper) or ceil(B/G) (code)."
    )
    glu: bool = Field(True, description="GLU on the matched prototypes (False: ablation).")
    use_global: bool = Field(
        True, description="Align to global prototypes in training (False: ablation)."
    )
    local_at_inference: bool = Field(
        True, description="Infer with local prototypes (False: global ones, ablation)."
    )
    inference: Literal["batch", "sample"] = Field(
        "batch",
        description="Sinkhorn over the whole batch (paper) or per sample (batch-independent).",
    )
    update: Literal["topk", "single"] = Field(
        "topk",
        description="Local EMA update: soft top-k per prototype (paper) or each token's argmax "
        "prototype alone (single: the official code from scratch).",
    )
    sinkhorn_order: Literal["rows_last", "columns_last"] = Field(
        "rows_last",
        description="Sinkhorn step that ends each iteration: tokens (rows_last, SwAV's code) or "
        "prototypes (columns_last: the paper's eq. 3 and the official code).",
    )
    normalize_only: bool = Field(
        False,
        description="Layers that only L2-normalise each token, no prototypes (a control; "
        "needs enabled=true; not a FedAli model).",
    )

    @field_validator("prototypes")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(g < 1 for g in v):
            raise ValueError("prototype counts must be a non-empty list of positive integers")
        return v


class HartConfig(_Section):
    """The `hart` backbone's attention and MLP (defaults: protofed's; FedAli's official
    code: head_dim 48, dropouts 0.3, swish; configs/fedali_official.yaml; its pre-trained
    branch: dropouts 0.1, drop-path 0.1, head dropout 0.5, configs/fedali_official_pretrained.yaml)."""

    head_dim: int | None = Field(
        None, ge=1, description="Dimensions per attention head (None: width / heads, 16)."
    )
    attention_dropout: float = Field(
        0.0, ge=0, lt=1, description="Dropout on the attention weights."
    )
    mlp_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout after the MLP's hidden layer.")
    mlp_activation: Literal["gelu", "swish", "relu"] = Field(
        "gelu", description="The blocks' MLP activation."
    )
    embedding_activation: Literal["relu", "swish", "gelu"] = Field(
        "relu", description="The 1024-unit embedding layer's activation."
    )
    drop_path: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="Stochastic depth of the last block, rising linearly from 0 at the first "
        "(official: 0.3 from scratch, 0.1 in the pre-trained branch).",
    )
    head_dropout: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="Dropout after the 1024-unit embedding layer (official: 0.3 from scratch, "
        "0.5 in the pre-trained branch's clients).",
    )


class ModelConfig(_Section):
    name: str = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [200, 200], description="mlp hidden sizes.")
    embedding_dim: int | None = Field(None, ge=1, description="Embedding size where configurable.")
    alp: AlpConfig = Field(
        default_factory=AlpConfig, description="FedAli's ALP layers (hart, vit_tiny)."
    )
    hart: HartConfig = Field(
        default_factory=HartConfig, description="The hart backbone's attention and MLP."
    )
    init: str | None = Field(
        None,
        description="Start from this `protofed pretrain` checkpoint: encoder weights and ALP "
        "prototype banks (docs/pretraining.md); the 1024-unit layer and the head stay new.",
    )

    @field_validator("init")
    @classmethod
    def _init_absolute(cls, v: str | None) -> str | None:
        """Stored absolute, like data.dir: a resumed run must name the same file."""
        return None if v is None else str(Path(v).expanduser().absolute())


class AlgorithmConfig(BaseModel):
    """`name` plus the algorithm's own hyperparameters (validated by the algorithm)."""

    model_config = ConfigDict(extra="allow")
    name: str = "fedavg"

    def hyperparameters(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _float32_range(self) -> AlgorithmConfig:
        """The hyperparameters' types are the algorithm's to check; their range here."""
        for key, given in (self.model_extra or {}).items():
            spelt = isinstance(given, str) and _EXPONENT.fullmatch(given.strip())
            value = float(given) if spelt else given
            if isinstance(value, float) and math.isfinite(value) and abs(value) > FLOAT32_MAX:
                raise ValueError(
                    f"'algorithm.{key}' overflows float32 (at most {FLOAT32_MAX:.6g} in magnitude)"
                )
        return self


class TrainConfig(_Section):
    rounds: int = Field(20, ge=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    nesterov: bool = Field(False, description="Nesterov momentum (SGD with momentum > 0).")
    weight_decay: float = Field(0.0, ge=0)
    client_fraction: float = Field(1.0, gt=0, le=1)
    clients_per_round: int | None = Field(
        None, ge=1, description="Overrides client_fraction; at most every client."
    )
    device: str = "cpu"
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads, and the cores an unset train.workers counts; default: "
        "OMP_NUM_THREADS, else the cores this process may use.",
    )
    workers: int | None = Field(
        None,
        ge=1,
        description="Processes training clients in parallel (each single-threaded); 1: serial; "
        "None: on CPU one per core (train.threads, else OMP_NUM_THREADS, else the CPU "
        "affinity), at most the round's clients and 8; on GPU 1.",
    )
    checkpoint_every: int | str = Field(
        "auto",
        description="Rounds between checkpoints (the last round always has one), or auto: "
        "after a round once the time since the last checkpoint is 49 times what writing it "
        "took, so checkpoints take at most about 2 % of a run (docs/reliability.md).",
    )
    fused: Literal["auto", "true", "false"] = Field(
        "auto",
        description="The autograd-free training step for sequential models (training/fused.py; "
        "not torch's fused optimizer kernels): auto: where a start-up measurement on the run's "
        "shapes found it faster on this machine (cached); true: wherever it applies; false: "
        "never (autograd).",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Local training's forward pass and loss: fp32, or bf16 autocast (weights "
        "stay fp32; evaluation stays fp32; bf16 takes the autograd loop, never the fused one).",
    )
    on_nonfinite: Literal["stop", "drop"] = Field(
        "stop",
        description="A reply with NaN or inf: stop the run (status diverged, exit code 3) or "
        "drop the reply (counted in the summary).",
    )
    stacked: Literal["auto", "true", "false"] = Field(
        "auto",
        description="Train a round's clients together, their weights stacked along a client "
        "axis (training/stacked.py), where the algorithm can; auto: where it measured faster.",
    )

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _rounds_or_auto(cls, value: Any) -> Any:
        """A whole number of rounds or the word auto, nothing else (a bool, "3", 2.0)."""
        if value == "auto" or (type(value) is int and value >= 1):
            return value
        raise ValueError("'auto' or a number of rounds, at least 1")

    @field_validator("stacked", "fused", mode="before")
    @classmethod
    def _stacked_switch(cls, value: Any) -> Any:
        """A bare `true` / `false` (YAML's booleans) means the same choice as the string."""
        return str(value).lower() if isinstance(value, bool) else value


class EvalConfig(_Section):
    every: int = Field(1, ge=1)
    selection: Literal["val", "best_test", "last"] = "val"
    metric: Literal["f1", "acc"] = Field("f1", description="Metric the selection rule maximises.")
    generalization: bool = Field(True, description="Evaluate each client model on all test data.")
    generalization_samples: int | None = Field(
        None,
        ge=0,
        description="Score generalization on a class-stratified sample of this many of the "
        "union's test samples, fixed by the seed; 0: the whole union; None: the whole union "
        "up to 20,000 samples, a 20,000 sample above.",
    )
    batch_size: int = Field(1024, ge=1)
    stacked_models: int | None = Field(
        None,
        ge=1,
        description="Distinct client models that predict a whole split together, in one "
        "torch.func.vmap pass per batch; 1 or None: one at a time (stacking measured slower "
        "on the CPU and no faster on the one GPU work measured).",
    )
    keep_prototypes_every: int = Field(
        0,
        ge=0,
        description="Keep the class prototypes every k evaluated rounds in "
        "RUN/prototypes/round_<r>.npz (for `protofed embed --prototypes`); 0: never.",
    )
    client_model: Literal["received", "trained"] = Field(
        "received",
        description="A client's own model: the one it would receive next (received), or the "
        "one it held right after its last local training (trained: FedAli's official code; "
        "one model kept per client, see trained_memory_mb).",
    )
    f1_labels: Literal["true", "union"] = Field(
        "true",
        description="Macro-F1 averaged over the classes in y_true (true), or in y_true and "
        "y_pred (union: scikit-learn's default, FedAli's official code).",
    )
    trained_memory_mb: float = Field(
        4096,
        gt=0,
        description="eval.client_model=trained: a run whose clients x model bytes exceed this "
        "is refused before it starts.",
    )
    unseen_clients: int | float = Field(
        0,
        description="Unseen users: hold out this many clients (an int), or this fraction of "
        "the federation (a float in (0, 1), rounded, at least one), chosen by the seed; they "
        "never train and are scored every evaluated round as the `unseen` score "
        "(docs/protocol.md, Unseen users); 0: off.",
    )
    finetune_epochs: int = Field(
        0,
        ge=0,
        description="eval.unseen_clients: local epochs of the algorithm's own client fit on an "
        "unseen client's training split, from an empty client state, before its model is "
        "scored; 0: its model with an empty state, untrained.",
    )

    @field_validator("unseen_clients", mode="before")
    @classmethod
    def _unseen_count(cls, v: Any) -> Any:
        """A count (int >= 0) or a fraction in (0, 1); a bool is neither."""
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError("must be a count of clients (int >= 0) or a fraction in (0, 1)")
        if isinstance(v, float) and not 0 < v < 1:
            raise ValueError(f"a fraction must lie in (0, 1), not {v!r} (a count is an int)")
        if isinstance(v, int) and v < 0:
            raise ValueError(f"must not be negative, not {v}")
        return v

    @field_validator("f1_labels", mode="before")
    @classmethod
    def _bare_true(cls, v: Any) -> Any:
        """YAML reads `f1_labels: true` as a boolean: it names the rule `true`."""
        return "true" if v is True else v


class FlowerConfig(_Section):
    """The Flower engine (`protofed run --engine flower`, protofed/flower); the built-in
    engine ignores it. A reply that fails validation or a client that fails is left out of
    the round; the round goes on while at least `min_replies` replies remain."""

    min_replies: int = Field(
        1, ge=1, description="Fewest valid replies a round may aggregate (else the run stops)."
    )
    timeout_s: float | None = Field(
        None, gt=0, description="Seconds the server waits for a round's replies; None: all."
    )
    client_cpus: float = Field(
        1.0, gt=0, description="Simulation: CPUs per ClientApp (Ray runs cores / this at once)."
    )
    client_gpus: float = Field(
        0.0,
        ge=0,
        description="Simulation: GPUs per ClientApp (0.5: two share one); train.device=cuda needs > 0.",
    )
    ray_address: str | None = Field(
        None,
        min_length=1,
        description="Simulation: the Ray cluster to run on, 'HOST:PORT' of its head or 'auto' "
        "(RAY_ADDRESS, else the last `ray start` on this machine); None: a Ray instance of "
        "the run's own, even if RAY_ADDRESS is set (docs/flower.md, On a Ray cluster).",
    )


class AggregationConfig(_Section):
    """How the server averages model weights (docs/aggregation.md).

    The default, an example-weighted mean, lets one client move the model anywhere; the
    robust rules and the update-norm checks bound what a few bad replies can do.
    """

    rule: Literal["mean", "trimmed_mean", "median", "krum"] = Field(
        "mean",
        description="mean (example-weighted, streaming), or a robust rule that ignores "
        "num_examples: coordinate-wise trimmed_mean or median, or krum.",
    )
    trim: float = Field(
        0.1,
        ge=0,
        lt=0.5,
        description="trimmed_mean: fraction of replies cut at each end, per coordinate "
        "(rounded up, at least one reply left).",
    )
    byzantine: int = Field(
        1, ge=0, description="krum: f, the bad replies tolerated; needs 2f+3 replies a round."
    )
    max_update_norm: float | None = Field(
        None,
        gt=0,
        description="Drop a reply whose update (its weights minus the server's) has a larger "
        "L2 norm; None: no bound.",
    )
    max_norm_ratio: float | None = Field(
        None,
        ge=1,
        description="Drop a reply whose update norm exceeds this times the round's median "
        "update norm; None: no bound.",
    )


class PrivacyConfig(_Section):
    """Client-level differential privacy (docs/privacy.md): every record a client sends is
    clipped and Gaussian noise is added, on the server to the mean (`central`) or by each
    client (`local`); dp-accounting's accountant gives epsilon at `delta` after every round.
    Off by default: a run without it computes exactly what it did before."""

    enabled: bool = False
    mode: Literal["central", "local"] = Field(
        "central",
        description="central: the server adds the noise to the mean of the clipped replies "
        "and sees nothing else; local: each client noises what it sends.",
    )
    clip_norm: float = Field(
        1.0, gt=0, description="L2 bound on a client's model update (its weights minus those sent)."
    )
    prototype_clip: float = Field(
        1.0,
        gt=0,
        description="L2 bound on each other record a client sends (a class-prototype table, "
        "FedAli's banks), as one vector.",
    )
    noise_multiplier: float | None = Field(
        None,
        ge=0,
        description="sigma: noise std over the L2 sensitivity; None: calibrated from "
        "target_epsilon for the run's rounds and sampling.",
    )
    target_epsilon: float | None = Field(
        None, gt=0, description="The epsilon the whole run may spend (sets noise_multiplier)."
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="The delta epsilon is stated at.")
    sampling: Literal["fixed", "poisson"] = Field(
        "fixed",
        description="fixed: the round's m of N clients without replacement (replace-one "
        "adjacency); poisson: each client with probability m/N (add-or-remove-one).",
    )
    accountant: Literal["auto", "rdp", "pld"] = Field(
        "auto",
        description="dp-accounting's Renyi (rdp) or privacy-loss-distribution (pld) "
        "accountant; auto: pld, the tighter, wherever it applies (Poisson sampling, or no "
        "sampling at all), else rdp.",
    )
    noise: Literal["secure", "seeded"] = Field(
        "secure",
        description="secure: noise and client sampling from the operating system's entropy, "
        "never recorded; seeded: from the config's seed, replayable by anyone who holds the "
        "config (simulations for research only: not a guarantee).",
    )
    clear_evaluation: bool = Field(
        False,
        description="Flower deployment: let each client send its per-class test and "
        "validation counts in the clear (outside epsilon, which then says so); false: a "
        "private deployment is refused, its evaluation would leak them silently.",
    )
    audit: int = Field(
        0,
        ge=0,
        description="Canary clients inserted for an empirical epsilon in the same run (as "
        "many more held out); 0: no audit.",
    )
    adaptive: bool = Field(
        False, description="Adaptive clipping (Andrew et al. 2021): clip_norm is the start."
    )
    target_quantile: float = Field(
        0.5, gt=0, lt=1, description="adaptive: the fraction of updates left unclipped."
    )
    clip_lr: float = Field(0.2, gt=0, description="adaptive: the geometric step of clip_norm.")
    count_noise: float | None = Field(
        None,
        gt=0,
        description="adaptive: std of the noise on the unclipped count; None: the round's "
        "clients / 20, as in the paper.",
    )
    secure_aggregation: bool = Field(
        False,
        description="central mode on Flower: the clipped replies are added up by Flower's "
        "SecAgg+ (masks that cancel in the sum), so the server holds their sum, never one "
        "of them, and adds the noise to it.",
    )
    secagg_threshold: float = Field(
        0.5,
        gt=0,
        le=1,
        description="secure_aggregation: the fraction of a client's neighbours whose key "
        "shares rebuild its masks if it drops out (Flower's reconstruction_threshold); a "
        "server colluding with fewer learns nothing of a reply.",
    )

    @model_validator(mode="after")
    def _secure_aggregation_is_central(self) -> PrivacyConfig:
        """SecAgg+ hides the replies in a sum: it serves central mode, where the sum is all
        the server needs, and leaves no single reply for the audit's canaries to sit beside."""
        if self.secure_aggregation and self.mode != "central":
            raise ValueError(
                "privacy.secure_aggregation sums the clipped replies for the server's noise: "
                "it needs privacy.mode=central (local mode's replies are noised already)"
            )
        if self.secure_aggregation and self.audit:
            raise ValueError(
                "privacy.audit: the audit's canaries are not inserted into a secure "
                "aggregation's sum yet; set privacy.audit=0 or privacy.secure_aggregation=false"
            )
        return self

    @model_validator(mode="after")
    def _keys_mean_privacy(self) -> PrivacyConfig:
        """A privacy key set without `enabled` would run without privacy, silently: refused.
        `enabled: false` written out is the user's own choice (a sweep's non-private arm)."""
        given = sorted(self.model_fields_set - {"enabled"})
        if given and "enabled" not in self.model_fields_set:
            raise ValueError(
                f"privacy.{given[0]} is set but privacy.enabled is not: add "
                "privacy.enabled=true (or privacy.enabled=false to run without privacy)"
            )
        return self


class PretrainConfig(_Section):
    """`protofed pretrain`: FedAli's masked-autoencoder pre-training of HART (section 5.4;
    docs/pretraining.md). Read by that command only; a run sees its result through
    `model.init`, so these keys are not part of a run's fingerprint."""

    datasets: list[str] | None = Field(
        None,
        min_length=1,
        description="Unlabeled window sets pooled for pre-training; None: every HAR window set "
        "except data.name (uci_har, wisdm, hhar).",
    )
    mask_ratio: float = Field(
        0.6, gt=0, lt=1, description="Share of tokens masked (official code: 0.6, floor)."
    )
    epochs: int = Field(100, ge=1, description="Passes over the pooled windows.")
    batch_size: int = Field(64, ge=1)
    optimizer: Literal["adam", "adamw", "sgd"] = "adamw"
    lr: float = Field(5e-4, gt=0)
    weight_decay: float = Field(0.05, ge=0, description="AdamW decay (MAE's 0.05).")
    max_windows: int | None = Field(
        None, ge=1, description="Keep at most this many windows per data set (quick looks)."
    )
    decoder_blocks: int = Field(4, ge=1, description="HART blocks in the decoder (official: 4).")


class ExperimentConfig(_Section):
    seed: int = Field(0, ge=0, description="Every random stream derives from it.")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    flower: FlowerConfig = Field(default_factory=FlowerConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _close_key(loc: tuple[Any, ...]) -> str:
    """The hint after a misspelt key, e.g. ` (did you mean 'train.rounds'?)`, from the
    fields of its section ("" when none is close)."""
    section: type[BaseModel] = ExperimentConfig
    for part in loc[:-1]:
        field = section.model_fields.get(str(part))
        inner = field.annotation if field is not None else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return ""
        section = inner
    close = difflib.get_close_matches(str(loc[-1]), list(section.model_fields), n=1)
    return f" (did you mean '{'.'.join([*map(str, loc[:-1]), close[0]])}'?)" if close else ""


def _format_validation_error(err: ValidationError) -> str:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "config"
    if first["type"] == "extra_forbidden":
        return f"unknown config key '{key}'{_close_key(tuple(first['loc']))}"
    sentence = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "value_error" and sentence.startswith(f"{key}."):
        return sentence  # a section's validator, whose sentence names the key
    value = first.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    return f"invalid value for '{key}': {first['msg']}{shown}"


def _parse_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` overrides to a nested dict, in order."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, text = item.split("=", 1)
        set_key(raw, key.strip(), _parse_scalar(text))
    return raw


def flatten(
    tree: Mapping[str, Any], prefix: str = "", *, keep_empty: bool = True
) -> dict[str, Any]:
    """{"train": {"lr": 0.1}} -> {"train.lr": 0.1}: a nested config by dotted key (lists stay
    values; an empty section too, unless `keep_empty` is False)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}.", keep_empty=keep_empty))
        elif keep_empty or not isinstance(value, Mapping):
            out[name] = value
    return out


def set_key(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted `key` (`train.lr`) of a nested config dict, creating sections."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"override key '{key}' is malformed")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{key}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def load_raw(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        what = "is a folder, not a config file" if p.is_dir() else "not found"
        raise ConfigError(f"config file {what}: {p}")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{p}: not valid YAML ({exc.__class__.__name__}{where})") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return raw


EXECUTION_KEYS: tuple[str, ...] = (
    "data.dir",
    "train.device",
    "train.threads",
    "train.workers",
    "train.fused",
    "train.stacked",
    "train.checkpoint_every",
    "eval.keep_prototypes_every",
    "eval.trained_memory_mb",
    "eval.stacked_models",
    "flower.timeout_s",
    "flower.client_cpus",
    "flower.client_gpus",
    "flower.ray_address",
)
"""The execution group: the keys that change where and how fast a run goes, what it keeps
for figures and how much memory it may spend, never what it computes (the same numbers, to
floating-point rounding: the equality tests of workers, the autograd-free step and stacking
hold them to it). The one list the resume check (`runtime.fingerprint`), the report's
grouping, the sweep's run identity and the docs (docs/running-fast.md) read. Not in it:
`eval.batch_size` (a batch-dependent model, FedAli's ALP layers, predicts differently at
another batch size) and `train.precision` (bf16 computes other numbers)."""


# Settings a first run on each data set can trust, used for every key the config leaves unset
# (`protofed data info NAME` lists them; a config or -s override always wins). Without them a
# run gets the generic defaults above: an MLP and SGD without momentum for one local epoch,
# which on UCI-HAR natural clients reach 35 % generalization F1 in 15 rounds.
_SENSOR = {"model.name": "cnn1d", "train.momentum": 0.9, "train.local_epochs": 2}
_IMAGES = {"model.name": "cnn", "train.momentum": 0.9, "train.lr": 0.01}
_TABLES = {"train.momentum": 0.9, "train.local_epochs": 2}
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "uci_har": _SENSOR,
    "wisdm": _SENSOR,
    "hhar": _SENSOR,
    "har_combined": _SENSOR,
    "realworld": _SENSOR,
    "hhar_paper": _SENSOR,
    "fedali_combined": _SENSOR,
    "wisdm_features": _TABLES,
    "wesad": _TABLES,
    "office_caltech": _TABLES,
    "arrays": _TABLES,
    "mnist": _IMAGES,
    "usps": _IMAGES,
    "mnist_m": _IMAGES,
    "digits_domains": _IMAGES,
    "cifar10": _IMAGES,
    "cifar100": _IMAGES,
    "femnist": _IMAGES,
}


def _has_key(raw: dict[str, Any], key: str) -> bool:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def with_dataset_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` plus DATASET_DEFAULTS[data.name] for every key `raw` does not set."""
    data = raw.get("data")
    name = data.get("name", "digits") if isinstance(data, dict) else "digits"
    defaults = DATASET_DEFAULTS.get(name, {}) if isinstance(name, str) else {}
    missing = [k for k in defaults if not _has_key(raw, k)]
    if not missing:
        return raw
    import copy

    out = copy.deepcopy(raw)
    for key in missing:
        set_key(out, key, defaults[key])
    return out


def build_config(raw: dict[str, Any]) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(with_dataset_defaults(raw))
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> ExperimentConfig:
    """Read YAML (or start from defaults), apply overrides, validate."""
    raw = apply_overrides(load_raw(path), overrides or [])
    return build_config(raw)
