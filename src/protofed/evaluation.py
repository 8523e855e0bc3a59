"""The evaluation protocol: personalization, generalization and global scores.

- Personalization: each client's own model on its own test split (FedAli section 5.1.4).
- Generalization: each client's own model on the union of all clients' test splits.
- Global: the server's model (if the method has one) on that union.
Each is reported as accuracy and macro-F1, mean and std across clients. Macro-F1 averages over
the classes present in the labels (`eval.f1_labels=true`, the default: a class a client never
sees does not count as a zero on its own split), or over the classes present in the labels or
the predictions (`union`: scikit-learn's default, FedAli's official code, where a class a
client predicts but lacks counts as a zero).

Clients whose models are the same tensors (FedAvg: every client holds the global model) are
evaluated once: predictions on the union are computed per distinct model and sliced. Distinct
models that share their body (FedRep, FedPer, FedBABU: the server's body with each client's
head) share its embeddings: the body runs once per split and only the heads run per model.

Generalization costs (distinct client models) x (union size) predictions a round, and both
grow with the number of clients (for models that share a body: one body pass over the union
plus a head pass per model; a runtime with worker processes hands them whole models,
`PREDICT_CHUNK` at a time, through `evaluate`'s `predict_many`). Distinct models of one
architecture can also predict together, `stacked_models` at a time, in one `torch.func.vmap`
pass per batch (`predict_stacked`): the same arithmetic in fewer, larger kernels, meant for
where launching kernels costs (a GPU). It is opt-in: it measured no faster on the CPU nor on
one GPU work (docs/speed.md, benchmarks/stacked_evaluation.py).
`eval.generalization_samples` scores it on a fixed class-stratified sample of the union
instead (drawn once from the run's seed), by default of at most `GENERALIZATION_CAP` samples.
Personalization and the global score always use the whole splits.

Batch-dependent models (`FedModel.batch_dependent`: FedAli's ALP layers balance Sinkhorn over
the batch) predict each client's test and validation splits alone, in batches of
`batch_size` from the split's start, never in a batch shared with another client, so a
client's personalization does not depend on who else is in the federation (the official
FedAli code predicts each client's test split alone). Generalization and the global score
predict the union (or the sample) in its fixed order, clients concatenated by index, in
batches of `batch_size`: there a batch holds several clients' windows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from numpy.typing import ArrayLike
from sklearn.metrics import f1_score
from torch.func import functional_call, vmap

from protofed.core.results import (
    ClientScores,
    GlobalScores,
    RoundRecord,
    RoundScores,
    SampleSizes,
    Scores,
    finite,
)
from protofed.core.seeding import EVALUATION, numpy_generator
from protofed.core.types import Arrays
from protofed.data.federated import FederatedData
from protofed.models.base import FedModel
from protofed.prototypes import embed
from protofed.training.client import load_weights
from protofed.training.loop import predict

Spec = tuple[str, int, int | None]
"""What a model predicts: a split ("test", "val" or "gen", the generalization sample) and the
range [lo:hi] of its samples (hi None: to the end)."""

PredictMany = Callable[[list[tuple[Arrays, list[Spec]]]], Iterable[list[np.ndarray]]]
"""Predictions of several models, each on its specs (`Evaluator.evaluate`)."""

PREDICT_CHUNK = 32
"""Clients whose new models go to `predict_many` at a time: the weights in flight stay bounded."""

F1Labels = Literal["true", "union"]
"""Which classes macro-F1 averages over: those in y_true, or those in y_true or y_pred."""


def _macro_f1(y_true: np.ndarray, y_pred: np.ndarray, labels: F1Labels = "true") -> float:
    """Macro-F1 over the classes present in `y_true` (or in either, `union`), as scikit-learn."""
    if len(y_true) == 0:
        return float("nan")
    present = np.unique(y_true) if labels == "true" else np.union1d(y_true, y_pred)
    return float(f1_score(y_true, y_pred, labels=present, average="macro", zero_division=0))


def _acc(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float((y_true == y_pred).mean()) if len(y_true) else float("nan")


def per_segment_scores(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    segment: np.ndarray,
    num_segments: int,
    num_classes: int,
    labels: F1Labels = "true",
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and macro-F1 of every segment (client) at once.

    The same numbers as scikit-learn's `f1_score(labels=unique(y_true), average="macro",
    zero_division=0)` per segment, or with `union` its default labels (`f1_score(average=
    "macro")`; tests compare both), computed from one joint count of (segment, class) true
    positives, false positives and false negatives: with a thousand clients, one
    scikit-learn call per client would cost more than the predictions.
    """
    counts = class_counts(y_true, y_pred, segment, num_segments, num_classes)
    return scores_from_counts(*counts, labels=labels)


def class_counts(
    y_true: np.ndarray, y_pred: np.ndarray, segment: np.ndarray, num_segments: int, num_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segments, classes) true positives, support and predicted counts.

    Counts add up across segments, so scores on a union follow from its parts' counts (the
    Flower deployment: each client counts on its own data, the server adds).
    """
    size = num_segments * num_classes
    correct = y_true == y_pred
    tp = np.bincount(segment[correct] * num_classes + y_true[correct], minlength=size)
    support = np.bincount(segment * num_classes + y_true, minlength=size)
    valid = (y_pred >= 0) & (y_pred < num_classes)
    predicted = np.bincount(segment[valid] * num_classes + y_pred[valid], minlength=size)
    tp, support, predicted = (
        a.reshape(num_segments, num_classes) for a in (tp, support, predicted)
    )
    return tp, support, predicted


def scores_from_counts(
    tp: np.ndarray, support: np.ndarray, predicted: np.ndarray, labels: F1Labels = "true"
) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and macro-F1 (over the classes present, see `F1Labels`) of each row of
    (segments, classes) counts; NaN for a row without samples."""
    denom = support + predicted  # 2TP + FP + FN
    f1 = np.divide(2 * tp, denom, out=np.zeros(tp.shape), where=denom > 0)
    present = support > 0
    has_samples = present.sum(1) > 0
    if labels == "union":
        present = present | (predicted > 0)
    n_present = present.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        macro = np.where(has_samples, (f1 * present).sum(1) / n_present, np.nan)
        acc = np.where(has_samples, tp.sum(1) / support.sum(1), np.nan)
    return acc, macro


def summarize(accs: ArrayLike, f1s: ArrayLike) -> Scores:
    """Mean and std across clients of per-client accuracy and F1 (NaN: a client without
    data; every score None when no client has any)."""
    a, f = np.asarray(accs, dtype=float), np.asarray(f1s, dtype=float)
    if np.all(np.isnan(a)):
        return Scores.absent()
    return Scores(
        acc=finite(np.nanmean(a)),
        f1=finite(np.nanmean(f)),
        acc_std=finite(np.nanstd(a)),
        f1_std=finite(np.nanstd(f)),
    )


@dataclass
class _Union:
    """All clients' samples of one split, concatenated, with each client's slice."""

    x: torch.Tensor
    y: np.ndarray
    bounds: list[tuple[int, int]]
    owner: np.ndarray  # the client index of every sample

    @classmethod
    def of(cls, fed: FederatedData, split: str) -> _Union:
        xs = [getattr(c, f"{split}_x") for c in fed.clients]
        ys = [getattr(c, f"{split}_y") for c in fed.clients]
        bounds, start = [], 0
        for y in ys:
            bounds.append((start, start + len(y)))
            start += len(y)
        owner = np.repeat(np.arange(len(ys)), [len(y) for y in ys])
        return cls(torch.cat(xs), torch.cat(ys).cpu().numpy().astype(np.int64), bounds, owner)


GENERALIZATION_CAP = 20_000
"""The largest union scored whole when eval.generalization_samples is unset: no shipped data
set's default split exceeds it, so their numbers are those of the whole union."""


def generalization_size(setting: int | None, union: int) -> int:
    """The samples generalization is scored on: `setting` (eval.generalization_samples), the
    whole union when it is 0 or not smaller, and at most `GENERALIZATION_CAP` when None."""
    if setting is None:
        return min(union, GENERALIZATION_CAP)
    return union if setting == 0 or setting >= union else setting


def stratified_sample(y: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` sorted indices of `y`, each class's share of them within one sample of its share
    of `y` (largest remainders; ties to the lower class), drawn without replacement by `rng`."""
    classes, counts = np.unique(y, return_counts=True)
    quota = counts * size / len(y)
    take = np.floor(quota).astype(np.int64)
    extra = np.argsort(-(quota - take), kind="stable")[: size - int(take.sum())]
    take[extra] += 1
    picked = [
        rng.choice(np.flatnonzero(y == k), size=int(t), replace=False)
        for k, t in zip(classes, take, strict=True)
    ]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def _fingerprint(arrays: Arrays, names: Callable[[str], bool] = lambda _: True) -> tuple[Any, ...]:
    """Models that share storage are the same model (only while both are alive: a freed
    tensor's address is reused, so fingerprints are compared among live models only);
    `names` restricts it to some tensors (a model's body)."""
    return tuple((k, v.data_ptr()) for k, v in sorted(arrays.items()) if names(k))


def _is_body(name: str) -> bool:
    return name.startswith("features.")


def _whole(spec: Spec) -> bool:
    return spec[1] == 0 and spec[2] is None


@dataclass
class _Round:
    """What `Evaluator.evaluate` tracks over one round's clients, for its helpers: each
    client's weights (None once scored), model and shared-body fingerprints, clients per
    model, and the predictions kept by model."""

    models: list[Arrays | None]
    keys: list[tuple[Any, ...]]
    shared: list[tuple[Any, ...] | None]
    counts: Counter[Any]
    predictions: dict[tuple[Any, ...], dict[tuple[Any, ...], Any]]


@dataclass
class _Predicted:
    """A round's predictions, placed: every client's labels on its test and validation
    slices, its model's generalization scores, and the global model's test labels."""

    test: np.ndarray
    val: np.ndarray
    gen_acc: np.ndarray
    gen_f1: np.ndarray
    global_test: np.ndarray | None = None


class Evaluator:
    """Scores client and global models on the federated splits; built once per run."""

    def __init__(
        self,
        fed: FederatedData,
        model: FedModel,
        batch_size: int = 1024,
        generalization: bool = True,
        *,
        generalization_samples: int | None = None,
        seed: int = 0,
        f1_labels: F1Labels = "true",
        stacked_models: int | None = None,
    ) -> None:
        """`generalization_samples` and `seed`: the union's sample generalization is scored
        on (`generalization_size`), the same every round and every run with this seed.
        `stacked_models`: distinct models predicting a whole split together (None: 1, one at
        a time: stacking measured slower on the CPU, no faster on one GPU work); models
        whose forward is not head(features(x)) or depends on the batch predict one at a
        time."""
        self.fed = fed
        self.model = model
        self.batch_size = batch_size
        self.generalization = generalization
        self.f1_labels = f1_labels
        self.test = _Union.of(fed, "test")
        self.val = _Union.of(fed, "val")
        self.model_keys = set(model.state_dict())
        # a body's embeddings serve every model that shares it only where the model is
        # exactly head(features(x)) and a sample's embedding does not depend on its batch
        plain = (
            isinstance(model, FedModel)
            and type(model).forward is FedModel.forward
            and not model.batch_dependent
        )
        self.share_bodies = plain
        self.stacked_models = (stacked_models or 1) if plain else 1
        # batch-dependent models: each client's own splits are predicted alone (`_needs`)
        self.own_splits = isinstance(model, FedModel) and model.batch_dependent
        self._embedded: dict[tuple[Any, ...], torch.Tensor] = {}
        union = len(self.test.y)
        self.gen_size = generalization_size(generalization_samples, union)
        # the sample: its indices into the union, inputs and labels (None: the whole union)
        self.gen_index: np.ndarray | None = None
        self.gen_x: torch.Tensor | None = None
        self.gen_y = self.test.y
        if generalization and self.gen_size < union:
            rng = numpy_generator(seed, EVALUATION)
            self.gen_index = stratified_sample(self.test.y, self.gen_size, rng)
            self.gen_x = self.test.x[torch.from_numpy(self.gen_index).to(self.test.x.device)]
            self.gen_y = self.test.y[self.gen_index]

    def _inputs(self, split: str) -> torch.Tensor:
        x = {"test": self.test.x, "val": self.val.x, "gen": self.gen_x}[split]
        assert x is not None
        return x

    def predict_on(
        self,
        weights: Arrays,
        split: str,
        lo: int = 0,
        hi: int | None = None,
        body: tuple[Any, ...] | None = None,
    ) -> np.ndarray:
        """Predictions of `weights` on `split`'s inputs [lo:hi] ("test", "val" or "gen": the
        generalization sample). `body`: the fingerprint of a body other models of this round
        share; its embedding of the whole split is computed once, and only the head runs."""
        if weights.keys() != self.model_keys:
            missing = sorted(self.model_keys - weights.keys())[:3]
            raise ValueError(f"an evaluated model must carry every weight; missing {missing}")
        load_weights(self.model, weights)
        x = self._inputs(split)
        if body is None:
            return predict(self.model, x[lo:hi], self.batch_size).cpu().numpy()
        features = self._embedded.get((body, split))
        if features is None:
            features = embed(self.model, x, self.batch_size)
            self._embedded[(body, split)] = features
        return predict(self.model.head, features[lo:hi], self.batch_size).cpu().numpy()

    @torch.no_grad()
    def predict_stacked(self, models: list[Arrays], split: str) -> list[np.ndarray]:
        """Predictions of each of `models` on the whole of `split`, all in one vmapped pass
        per batch; each batch holds batch_size / len(models) samples, so memory stays that
        of one model on batch_size samples."""
        for weights in models:
            if weights.keys() != self.model_keys:
                missing = sorted(self.model_keys - weights.keys())[:3]
                raise ValueError(f"an evaluated model must carry every weight; missing {missing}")
        device = next(self.model.parameters()).device
        stacked = {k: torch.stack([m[k] for m in models]).to(device) for k in self.model_keys}
        self.model.eval()

        def labels(weights: Arrays, x: torch.Tensor) -> torch.Tensor:
            return functional_call(self.model, weights, (x,)).argmax(dim=1)

        batched = vmap(labels, in_dims=(0, None))
        chunk = max(1, self.batch_size // len(models))
        x = self._inputs(split)
        out = [batched(stacked, part) for part in x.split(chunk)]
        pred = torch.cat(out, dim=1) if out else torch.empty(len(models), 0, dtype=torch.long)
        return list(pred.cpu().numpy())

    def _stack_ahead(self, i: int, spec: Spec, r: _Round) -> None:
        """Client i's model needs the whole split `spec`: it predicts it together with the
        next clients' distinct models that need it too (up to `stacked_models`), and every
        prediction is kept for its model."""
        group: dict[tuple[Any, ...], Arrays] = {}
        for j in range(i, len(r.models)):
            if len(group) == self.stacked_models:
                break
            key, weights = r.keys[j], r.models[j]
            if key in group or weights is None or r.shared[j] is not None:
                continue
            if spec in r.predictions.get(key, {}) or spec not in self._needs(j, r.counts[key] > 1):
                continue
            group[key] = weights
        preds = self.predict_stacked(list(group.values()), spec[0])
        for key, pred in zip(group, preds, strict=True):
            r.predictions.setdefault(key, {})[spec] = pred

    def _predict_elsewhere(
        self, predict_many: PredictMany, span: range, r: _Round, workers: int = 1
    ) -> None:
        """Every model of the clients in `span` not yet predicted, and without a shared body,
        predicts all its clients need through `predict_many`. With fewer such models than
        `workers` (FedAvg's one global model), each spec is cut into pieces of whole batches
        (`_pieces`), so every worker predicts and the batches, hence the predictions, are
        those of the uncut spec."""
        jobs: dict[tuple[Any, ...], tuple[Arrays, list[Spec]]] = {}
        for i in span:
            key, weights = r.keys[i], r.models[i]
            if r.shared[i] is None and key not in r.predictions and weights is not None:
                jobs.setdefault(key, (weights, self._needs(i, r.counts[key] > 1)))
        if not jobs:
            return
        parts = -(-workers // len(jobs))  # pieces per model, so every worker has one
        if parts == 1:
            done = predict_many(list(jobs.values()))
            for key, preds in zip(jobs, done, strict=True):
                r.predictions[key] = dict(zip(jobs[key][1], preds, strict=True))
            return
        tasks: list[tuple[Arrays, list[Spec]]] = []
        owners: list[
            tuple[tuple[Any, ...], Spec]
        ] = []  # each task's model and the spec it is a piece of
        for key, (weights, specs) in jobs.items():
            for spec in specs:
                for piece in self._pieces(spec, parts):
                    tasks.append((weights, [piece]))
                    owners.append((key, spec))
        pieces: dict[tuple[tuple[Any, ...], Spec], list[np.ndarray]] = {}
        for owner, preds in zip(owners, predict_many(tasks), strict=True):
            pieces.setdefault(owner, []).append(preds[0])
        for (key, spec), parts_of_spec in pieces.items():
            r.predictions.setdefault(key, {})[spec] = np.concatenate(parts_of_spec)

    def _pieces(self, spec: Spec, parts: int) -> list[Spec]:
        """`spec` cut into at most `parts` consecutive ranges of whole batches (of
        `batch_size`, counted from the spec's start, as `predict_on` batches it)."""
        split, lo, hi = spec
        end = len(self._inputs(split)) if hi is None else hi
        batches = -(-(end - lo) // self.batch_size)
        parts = max(1, min(parts, batches))
        cuts = [lo + (k * batches // parts) * self.batch_size for k in range(parts)] + [end]
        return [(split, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]

    def _gen_scores(self, pred: np.ndarray) -> tuple[float, float]:
        """Generalization accuracy and macro-F1 of predictions on the sample (NaN if off)."""
        if not self.generalization:
            return float("nan"), float("nan")
        return _acc(self.gen_y, pred), _macro_f1(self.gen_y, pred, self.f1_labels)

    def _needs(self, i: int, several: bool) -> list[Spec]:
        """What client i's model predicts: the test union where several clients share the
        model or generalization is scored on the whole union, else its own test split (and
        the generalization sample, if any); the validation union where several clients share
        the model, else its own validation split (validation has no generalization score).
        A batch-dependent model: its own splits always, plus the union or the sample for
        generalization (`_own_needs`)."""
        if self.own_splits:
            return self._own_needs(i)
        lo, hi = self.test.bounds[i]
        vlo, vhi = self.val.bounds[i]
        whole = self.generalization and self.gen_index is None
        specs: list[Spec] = [("test", 0, None) if whole or several else ("test", lo, hi)]
        if several and len(self.val.y):
            specs.append(("val", 0, None))
        elif vhi > vlo:
            specs.append(("val", vlo, vhi))
        if not (whole or several) and self.gen_x is not None:
            specs.append(("gen", 0, None))
        return specs

    def _own_needs(self, i: int) -> list[Spec]:
        """What client i's batch-dependent model predicts: its own test and validation splits,
        each alone, and the test union (or the sample) only for generalization."""
        lo, hi = self.test.bounds[i]
        vlo, vhi = self.val.bounds[i]
        specs: list[Spec] = [("test", lo, hi)]
        if vhi > vlo:
            specs.append(("val", vlo, vhi))
        if self.generalization:
            specs.append(("test", 0, None) if self.gen_index is None else ("gen", 0, None))
        return specs

    def evaluate(
        self,
        client_model: Callable[[int], Arrays],
        global_model: Arrays | None,
        predict_many: PredictMany | None = None,
        workers: int = 1,
    ) -> RoundScores:
        """Scores for one round. `client_model(i)` gives client i's personalized weights.

        Each distinct model predicts once what its clients need (`_needs`); models that share
        a body run it once per split here (`predict_on`), where its embeddings are. The
        others go to `predict_many` where given (e.g. a pool of processes: the clients' new
        models `PREDICT_CHUNK` clients at a time, `predict_many([(weights, specs), ...])`
        giving each one's predictions in order, as `predict_on` would; `workers`: how many
        it runs at once), else predict whole splits `stacked_models` at a time
        (`predict_stacked`), else one by one. Then the predictions are scored (`score`).
        """
        global_key = _fingerprint(global_model) if global_model is not None else None
        plan = self._plan(client_model)
        predicted = self._predict_round(plan, global_key, predict_many, workers)
        if global_model is not None and predicted.global_test is None:
            predicted.global_test = self.predict_on(global_model, "test")
        return self.score(predicted)

    def _plan(self, client_model: Callable[[int], Arrays]) -> _Round:
        """Which clients share a model, and which share a body (whose embeddings are made
        once this round). Every client's weights are held while fingerprinting (no extra
        memory where they live elsewhere, as FedAvg's global model or Local's states; a model
        built on the fly, as FedALA's aggregate, cannot reuse the address of another
        client's freed one and pass for it), then released one by one as they are scored."""
        held = [client_model(i) for i in range(len(self.fed.clients))]
        keys = [_fingerprint(m) for m in held]
        bodies = [_fingerprint(m, _is_body) for m in held]
        models_per_body = Counter(body for _, body in set(zip(keys, bodies, strict=True)))
        shared = [b if self.share_bodies and models_per_body[b] > 1 else None for b in bodies]
        models: list[Arrays | None] = list(held)
        return _Round(models, keys, shared, Counter(keys), {})

    def _predict_round(
        self,
        r: _Round,
        global_key: tuple[Any, ...] | None,
        predict_many: PredictMany | None,
        workers: int = 1,
    ) -> _Predicted:
        """Every client's predictions on what it is scored on, each distinct model predicting
        once; predictions and embeddings are dropped once their last client is served."""
        n = len(self.fed.clients)
        out = _Predicted(
            test=np.full(len(self.test.y), -1, dtype=np.int64),
            val=np.full(len(self.val.y), -1, dtype=np.int64),
            gen_acc=np.full(n, np.nan),
            gen_f1=np.full(n, np.nan),
        )
        left_of_model = Counter(r.keys)
        left_of_body = Counter(b for b in r.shared if b is not None)
        self._embedded.clear()
        for i in range(n):
            if predict_many is not None and i % PREDICT_CHUNK == 0:
                span = range(i, min(i + PREDICT_CHUNK, n))
                self._predict_elsewhere(predict_many, span, r, workers)
            key, body = r.keys[i], r.shared[i]
            known, specs = self._predict_client(i, r)
            self._place(i, known, specs, out)
            left_of_model[key] -= 1
            if not left_of_model[key]:
                if key == global_key:  # the global model is often a client's (FedAvg's)
                    out.global_test = known.get(("test", 0, None))
                del r.predictions[key]
            if body is not None:
                left_of_body[body] -= 1
                if not left_of_body[body]:
                    for split in ("test", "val", "gen"):
                        self._embedded.pop((body, split), None)
        return out

    def _predict_client(self, i: int, r: _Round) -> tuple[dict[tuple[Any, ...], Any], list[Spec]]:
        """Client i's model's predictions by spec, with what client i needs of them (computed
        unless its model already made them); the client's weights are released."""
        key, body = r.keys[i], r.shared[i]
        weights, r.models[i] = r.models[i], None
        assert weights is not None
        known = r.predictions.setdefault(key, {})
        specs = self._needs(i, r.counts[key] > 1)
        for spec in specs:
            if spec not in known and self.stacked_models > 1 and body is None and _whole(spec):
                r.models[i] = weights  # held while its group predicts
                self._stack_ahead(i, spec, r)
                r.models[i] = None
            if spec not in known:
                known[spec] = self.predict_on(weights, *spec, body=body)
        return known, specs

    def _place(
        self, i: int, known: dict[tuple[Any, ...], Any], specs: list[Spec], out: _Predicted
    ) -> None:
        """Client i's share of its model's predictions, put where it is scored: its test and
        validation slices, and its generalization scores (once per model, on the sample)."""
        lo, hi = self.test.bounds[i]
        vlo, vhi = self.val.bounds[i]
        for spec in specs:
            pred, split, b = known[spec], spec[0], spec[2]
            if split == "test" and b is None:  # the union: this client's slice (unless
                if ("test", lo, hi) not in specs:  # predicted alone), and generalization
                    out.test[lo:hi] = pred[lo:hi]
                if ("gen_scores",) not in known:
                    on_sample = pred if self.gen_index is None else pred[self.gen_index]
                    known[("gen_scores",)] = self._gen_scores(on_sample)
                out.gen_acc[i], out.gen_f1[i] = known[("gen_scores",)]
            elif split == "test":
                out.test[lo:hi] = pred
            elif split == "val":
                out.val[vlo:vhi] = pred if b is not None else pred[vlo:vhi]
            else:  # a model of its own, scored on the generalization sample
                out.gen_acc[i], out.gen_f1[i] = self._gen_scores(pred)

    def score(self, predicted: _Predicted) -> RoundScores:
        """The round's scores from every client's predictions (macro-F1 over the classes
        `f1_labels` says)."""
        n, c, rule = len(self.fed.clients), self.fed.num_classes, self.f1_labels
        test, val = predicted.test, predicted.val
        pers_acc, pers_f1 = per_segment_scores(self.test.y, test, self.test.owner, n, c, rule)
        val_acc, val_f1 = per_segment_scores(self.val.y, val, self.val.owner, n, c, rule)
        gen = self.generalization
        clients = ClientScores(
            pers_acc=_finite_list(pers_acc),
            pers_f1=_finite_list(pers_f1),
            gen_acc=_finite_list(predicted.gen_acc) if gen else [],
            gen_f1=_finite_list(predicted.gen_f1) if gen else [],
            val_acc=_finite_list(val_acc),
            val_f1=_finite_list(val_f1),
        )
        global_scores = None
        if predicted.global_test is not None:
            pred = predicted.global_test
            _, f1s = per_segment_scores(self.test.y, pred, self.test.owner, n, c, rule)
            global_scores = GlobalScores(
                acc=finite(_acc(self.test.y, pred)),
                f1=finite(_macro_f1(self.test.y, pred, rule)),
                f1_std=finite(float(np.nanstd(f1s))),
            )
        return RoundScores(
            personalization=summarize(pers_acc, pers_f1),
            generalization=summarize(predicted.gen_acc, predicted.gen_f1) if gen else None,
            val=summarize(val_acc, val_f1),
            global_=global_scores,
            clients=clients,
            samples=SampleSizes(
                test=len(self.test.y), generalization=self.gen_size if gen else None
            ),
        )


def _finite_list(values: np.ndarray) -> list[float | None]:
    return [finite(v) for v in values.tolist()]


SELECTION_DOC = {
    "val": "the round with the best mean validation score of the client models",
    "best_test": "the round with the best mean test accuracy (the papers' rule; optimistic)",
    "last": "the last evaluated round",
}


def select_round(history: list[RoundRecord], rule: str, metric: str = "f1") -> RoundRecord:
    """Pick the reported round from the evaluated rounds' records."""
    if not history:
        raise ValueError("no evaluated rounds to select from")
    if rule == "last":
        return history[-1]
    if rule == "best_test":
        return max(history, key=lambda h: _nan_to_low(h.personalization.acc))
    if rule == "val":
        if all(_nan_to_low(getattr(h.val, metric)) == -np.inf for h in history):  # no val data
            return history[-1]
        return max(history, key=lambda h: _nan_to_low(getattr(h.val, metric)))
    raise ValueError(f"unknown selection rule '{rule}'")


def select_global_round(history: list[RoundRecord], rule: str, metric: str = "f1") -> RoundRecord:
    """The round whose global score is reported: under `best_test`, the global model's own
    best test accuracy (the round picked for the client models says nothing about the
    server's model); under the other rules, the round `select_round` picks."""
    if rule == "best_test":
        scored = [h for h in history if h.global_ is not None]
        if scored:
            return max(scored, key=lambda h: _nan_to_low(h.global_.acc if h.global_ else None))
    return select_round(history, rule, metric)


def _nan_to_low(v: float | None) -> float:
    return -np.inf if v is None or np.isnan(v) else v
