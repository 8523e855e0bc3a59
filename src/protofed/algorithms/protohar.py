"""ProtoHAR (Cheng et al., IEEE JBHI 2023): a global representation guided by global prototypes,
and a personal classifier.

D. Cheng, L. Zhang, C. Bu, X. Wang, H. Wu, A. Song. ProtoHAR: Prototype Guided Personalized
Federated Learning for Human Activity Recognition. IEEE J. Biomed. Health Inform. 27(8), 2023.

The model is decoupled into a shared representation (the body) and a local classifier (the
head). Each round a client
1. trains its own head for `head_epochs` on the received global body, body frozen ("solving a
   better classifier" on the global representation, so the local model does not drift);
2. trains the body for `body_epochs`, head frozen, on CE + lam * mse(f(x), P[y]) with the global
   prototypes P ("the global prototype corrects the activity feature representation");
3. sends the body and its class prototypes (the class means of its embeddings).
The server averages the bodies by sample count and, per class, the prototypes of the clients
that have the class with equal weights (the authors' code averages per client, not per sample:
this is what separates it from FedProto's and FedPAC's count-weighted merge). The head never
leaves the client; there is no global model (a body without a head cannot classify).

Decisions (the paper and the authors' code, cheng-haha/ProtoHAR, read for understanding):
- Defaults from the authors' run script: lam = 1.0 and one head epoch per round. Their head
  learning rate is 10x the body's (0.01 vs 0.001); `head_lr` sets it, None is `train.lr`.
- The distance is the mean squared error (the code's default `--distance MSE`), averaged over the
  samples whose class has a global prototype (the code also averages in a zero for the others).
- Prototypes are the class means of the trained body's embeddings in eval mode, computed once
  after local training; the code accumulates them batch by batch during training (in train
  mode, with the body still moving). Its optional similarity weighting (`--weighting`, off in
  the published runs) is not implemented.
- Before any global prototype exists (round 1) the body is trained with CE only.
- Prototypes travel as `pack_prototypes` rows: only the classes a client has (or, going
  down, the classes some client had), so the bytes counted are the bytes needed.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from protofed.algorithms.base import Algorithm
from protofed.algorithms.common.decoupled import (
    DecoupledParams,
    body_without_prototypes,
    global_prototypes,
    head_then_aligned_body,
)
from protofed.algorithms.common.split import split_arrays
from protofed.core.types import MODEL, AggregateResult, Arrays, Client, FitResult, Records, Reply
from protofed.prototypes import (
    PROTOS,
    embedding_means,
    merge_means,
    pack_prototypes,
    unpack_prototypes,
)

HEAD = "head"  # a client's state: its personal head


def client_mean_prototypes(
    means: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ProtoHAR's server merge: per class, the plain mean over the clients that have the class.

    means (M, C, D), counts (M, C) -> prototypes (C, D), number of clients per class (C,).
    """
    return merge_means(means, (counts > 0).to(means.dtype))


class ProtoHAR(Algorithm):
    name = "protohar"
    summary = (
        "Global body aligned to global prototypes (CE + lam*MSE), personal head trained first."
    )
    reference = (
        "Cheng et al., ProtoHAR: Prototype Guided Personalized Federated Learning for Human "
        "Activity Recognition, IEEE JBHI 2023"
    )
    has_global_model = False

    Params = DecoupledParams

    params: DecoupledParams

    def init_server(self) -> Records:
        return body_without_prototypes(self.setting)

    def local_head(self, state: Records) -> Arrays:
        return state[HEAD] if state else split_arrays(self.setting.init_model)[1]

    def fit(self, client: Client, message: Records, state: Records) -> FitResult:
        client.load(message[MODEL])
        client.load(self.local_head(state))
        metrics = head_then_aligned_body(
            client, message[PROTOS], self.params, self.setting.num_classes
        )
        means, counts = embedding_means(
            client.model, client.data.train_x, client.data.train_y, self.setting.num_classes
        )
        body, head = split_arrays(client.weights())
        return FitResult(
            {MODEL: body, PROTOS: pack_prototypes(means, counts)}, metrics, {HEAD: head}
        )

    def aggregate(
        self, server: Records, replies: Iterable[Reply], server_round: int
    ) -> AggregateResult:
        mean, seen, metrics = self.average(replies, records=[MODEL], reference=server)
        dense = [unpack_prototypes(r.records[PROTOS], self.setting.num_classes) for r in seen]
        means, clients = client_mean_prototypes(
            torch.stack([m for m, _ in dense]), torch.stack([c for _, c in dense])
        )
        return AggregateResult(
            {MODEL: mean[MODEL], PROTOS: pack_prototypes(means, clients, with_counts=False)},
            metrics,
        )

    def prototypes(self, server: Records) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return global_prototypes(server, self.setting.num_classes)

    def client_model(self, message: Records, state: Records) -> Arrays:
        return {**message[MODEL], **self.local_head(state)}
