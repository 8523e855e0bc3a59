"""Head first, then the body aligned to global prototypes: the local update of FedPAC and ProtoHAR.

Both methods decouple the classifier from the representation in the same way each round:

1. the head (classifier) is trained for `head_epochs` on the received body, body frozen;
2. the body is trained for `body_epochs`, head frozen, on
       CE(head(f(x)), y) + lam * mse(f(x), P[y])
   where P are the global class prototypes the server sent (`prototype_regularized_loss`);
   classes without a global prototype (none in the first round) add nothing.

They differ in what the server does with the results (FedPAC combines heads across clients,
ProtoHAR keeps heads local and averages prototypes per client), so this update, the
hyperparameters it takes and the server's first state (the body, no prototype yet) live here.
"""

from __future__ import annotations

import torch
from pydantic import Field

from protofed.algorithms.base import Hyperparams, Setting
from protofed.algorithms.common.prototype_losses import prototype_regularized_loss
from protofed.algorithms.common.split import body_parameters, head_parameters, split_arrays
from protofed.core.types import MODEL, Arrays, Metrics, Records
from protofed.prototypes import PROTOS, pack_prototypes, unpack_prototypes
from protofed.training.client import Client


class DecoupledParams(Hyperparams):
    """The hyperparameters both methods share (the defaults are both authors' runs)."""

    lam: float = Field(1.0, ge=0, description="Weight of the prototype alignment term (1).")
    head_epochs: int = Field(
        1, ge=0, description="Epochs training the head, body frozen, each round (1)."
    )
    body_epochs: int | None = Field(
        None, ge=0, description="Epochs training the body, head frozen; None: train.local_epochs."
    )
    head_lr: float | None = Field(
        None,
        gt=0,
        description="Learning rate of the head phase; None: train.lr (FedPAC's authors: 0.1; "
        "ProtoHAR's: 10x the body's).",
    )


def body_without_prototypes(setting: Setting) -> Records:
    """The server's first state: the initial body, and no global prototype yet."""
    body, head = split_arrays(setting.init_model)
    weight = head["head.weight"]  # (classes, embedding dim)
    none = pack_prototypes(
        torch.zeros_like(weight), weight.new_zeros(len(weight)), with_counts=False
    )
    return {MODEL: body, PROTOS: none}


def global_prototypes(
    server: Records, num_classes: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The server's packed global prototypes as `Algorithm.prototypes` names them."""
    means, counts = unpack_prototypes(server[PROTOS], num_classes)
    return {"global": (means, counts)} if bool((counts > 0).any()) else {}


def head_then_aligned_body(
    client: Client, protos: Arrays, params: DecoupledParams, num_classes: int
) -> Metrics:
    """Train the workspace model's head, then its body with prototype alignment; metrics.

    The global prototypes come packed in `protos` (`prototypes.pack_prototypes`).
    `body_epochs=None` means `train.local_epochs`; `head_lr=None` means `train.lr`.
    """
    prototypes, present = unpack_prototypes(protos, num_classes)
    model = client.model
    head_epochs, lam, head_lr = params.head_epochs, params.lam, params.head_lr
    body_epochs = client.train.local_epochs if params.body_epochs is None else params.body_epochs
    metrics: Metrics = {"steps": 0.0}
    if head_epochs > 0:
        m = client.train_model(epochs=head_epochs, parameters=head_parameters(model), lr=head_lr)
        metrics["head_loss"] = metrics["loss"] = m["loss"]
        metrics["steps"] += m["steps"]
    if body_epochs > 0:
        device = _device(model)
        loss_fn = prototype_regularized_loss(prototypes.to(device), present.to(device), lam)
        m = client.train_model(
            epochs=body_epochs, parameters=body_parameters(model), loss_fn=loss_fn
        )
        metrics["body_loss"] = metrics["loss"] = m["loss"]
        metrics["steps"] += m["steps"]
    return metrics


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
