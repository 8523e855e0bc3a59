"""The evaluation protocol: personalization, generalization and global scores.

- Personalization: each client's own model on its own test split (FedAli section 5.1.4).
- Generalization: each client's own model on the union of all clients' test splits.
- Global: the server's model (if the method has one) on that union.
Each is reported as accuracy and macro-F1, mean and std across clients. Macro-F1 on a client's
own split averages over the classes present in that split's labels, so a class the client
never sees does not count as a zero; on the union it averages over all classes present.

Clients whose models are the same tensors (FedAvg: every client holds the global model) are
evaluated once: predictions on the union are computed per distinct model and sliced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.metrics import f1_score

from protofed.algorithms.base import Arrays
from protofed.data.federated import FederatedData
from protofed.models.base import FedModel
from protofed.runtime.client import load_weights
from protofed.runtime.training import predict


def _macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    if len(y_true) == 0:
        return float("nan")
    labels = np.unique(y_true)
    return float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0))


def _acc(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float((y_true == y_pred).mean()) if len(y_true) else float("nan")


def _aggregate(accs: list[float], f1s: list[float]) -> dict[str, float]:
    a, f = np.asarray(accs, dtype=float), np.asarray(f1s, dtype=float)
    return {
        "acc": float(np.nanmean(a)),
        "acc_std": float(np.nanstd(a)),
        "f1": float(np.nanmean(f)),
        "f1_std": float(np.nanstd(f)),
    }


@dataclass
class _Union:
    """All clients' samples of one split, concatenated, with each client's slice."""

    x: torch.Tensor
    y: np.ndarray
    bounds: list[tuple[int, int]]

    @classmethod
    def of(cls, fed: FederatedData, split: str) -> _Union:
        xs = [getattr(c, f"{split}_x") for c in fed.clients]
        ys = [getattr(c, f"{split}_y") for c in fed.clients]
        bounds, start = [], 0
        for y in ys:
            bounds.append((start, start + len(y)))
            start += len(y)
        return cls(torch.cat(xs), torch.cat(ys).cpu().numpy(), bounds)


def _fingerprint(arrays: Arrays) -> tuple:
    """Models that share storage are the same model."""
    return tuple((k, v.data_ptr()) for k, v in sorted(arrays.items()))


class Evaluator:
    """Scores client and global models on the federated splits; built once per run."""

    def __init__(self, fed: FederatedData, model: FedModel, batch_size: int = 1024,
                 generalization: bool = True) -> None:
        self.fed = fed
        self.model = model
        self.batch_size = batch_size
        self.generalization = generalization
        self.test = _Union.of(fed, "test")
        self.val = _Union.of(fed, "val")
        self.model_keys = set(model.state_dict())

    def _predict(self, weights: Arrays, x: torch.Tensor) -> np.ndarray:
        if weights.keys() != self.model_keys:
            missing = sorted(self.model_keys - weights.keys())[:3]
            raise ValueError(f"an evaluated model must carry every weight; missing {missing}")
        load_weights(self.model, weights)
        return predict(self.model, x, self.batch_size).cpu().numpy()

    def _predict_split(self, weights: Arrays, union: _Union, i: int, whole: bool) -> np.ndarray:
        """Predictions on the whole union, or only on client i's slice (the rest -1)."""
        if whole or not len(union.y):
            return self._predict(weights, union.x)
        lo, hi = union.bounds[i]
        pred = np.full(len(union.y), -1)
        pred[lo:hi] = self._predict(weights, union.x[lo:hi])
        return pred

    def evaluate(
        self, client_model: Callable[[int], Arrays], global_model: Arrays | None
    ) -> dict:
        """Scores for one round. `client_model(i)` gives client i's personalized weights."""
        n = len(self.fed.clients)
        last_key: tuple | None = None
        test_pred = val_pred = np.empty(0)
        gen: tuple[float, float] | None = None
        per = {k: [] for k in ("pers_acc", "pers_f1", "gen_acc", "gen_f1", "val_acc", "val_f1")}
        for i in range(n):
            weights = client_model(i)
            # without generalization only client i's slice is predicted, so nothing is shared
            key = _fingerprint(weights) if self.generalization else (i,)
            if key != last_key:  # consecutive clients sharing one model are predicted once
                test_pred = self._predict_split(weights, self.test, i, whole=self.generalization)
                val_pred = self._predict_split(weights, self.val, i, whole=self.generalization)
                last_key = key
                gen = (_acc(self.test.y, test_pred), _macro_f1(self.test.y, test_pred)) \
                    if self.generalization else None
            lo, hi = self.test.bounds[i]
            per["pers_acc"].append(_acc(self.test.y[lo:hi], test_pred[lo:hi]))
            per["pers_f1"].append(_macro_f1(self.test.y[lo:hi], test_pred[lo:hi]))
            if gen is not None:
                per["gen_acc"].append(gen[0])
                per["gen_f1"].append(gen[1])
            vlo, vhi = self.val.bounds[i]
            per["val_acc"].append(_acc(self.val.y[vlo:vhi], val_pred[vlo:vhi]))
            per["val_f1"].append(_macro_f1(self.val.y[vlo:vhi], val_pred[vlo:vhi]))

        result: dict = {
            "personalization": _aggregate(per["pers_acc"], per["pers_f1"]),
            "generalization": (
                _aggregate(per["gen_acc"], per["gen_f1"]) if self.generalization else None
            ),
            "val": _aggregate(per["val_acc"], per["val_f1"]),
            "global": None,
            "clients": per,
        }
        if global_model is not None:
            pred = self._predict(global_model, self.test.x)
            f1s = [_macro_f1(self.test.y[lo:hi], pred[lo:hi]) for lo, hi in self.test.bounds]
            result["global"] = {
                "acc": _acc(self.test.y, pred),
                "f1": _macro_f1(self.test.y, pred),
                "f1_std": float(np.nanstd(f1s)),
            }
        return result


SELECTION_DOC = {
    "val": "the round with the best mean validation score of the client models",
    "best_test": "the round with the best mean test accuracy (the papers' rule; optimistic)",
    "last": "the last evaluated round",
}


def select_round(history: list[dict], rule: str, metric: str = "f1") -> dict:
    """Pick the reported round from the evaluated rounds' records."""
    if not history:
        raise ValueError("no evaluated rounds to select from")
    if rule == "last":
        return history[-1]
    if rule == "best_test":
        return max(history, key=lambda h: h["personalization"]["acc"])
    if rule == "val":
        if all(np.isnan(h["val"][metric]) for h in history):  # no validation data
            return history[-1]
        return max(history, key=lambda h: _nan_to_low(h["val"][metric]))
    raise ValueError(f"unknown selection rule '{rule}'")


def _nan_to_low(v: float) -> float:
    return -np.inf if v is None or np.isnan(v) else v
