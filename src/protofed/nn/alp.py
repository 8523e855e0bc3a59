"""The ALP layer (ALignment with Prototypes) of FedAli, as a reusable torch module.

Ek et al., "FedAli: Personalized Federated Learning Alignment with Prototype Layers for
Generalized Mobile Services" (section 4.1, algorithm 1). Any transformer block can include it
on its token stream (B, Z, d); the backbones put it after each block's first LayerNorm.

Two banks of G prototypes (G x d) are buffers, not parameters: no gradient, no optimizer,
but they are in the state_dict, so they travel as arrays. `local_prototypes` is the client's
memory (updated by EMA during training, kept on the client); `global_prototypes` come from the
server (K-means of everyone's local prototypes). `beta` and `gamma` are scalar buffers too,
so the algorithm sets them per round through the message (beta = 0 in FedAli's first round).
The algorithm's steps are in `ALP`'s docstring; the decisions the paper leaves open, and the
ablation switches, in experiments/results/fedali.md.
"""

from __future__ import annotations

import math
import weakref
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from protofed.nn.linear import Linear
from protofed.nn.ot import (
    SINKHORN_ORDERS,
    SinkhornOrder,
    cosine_kernel,
    direct_is_safe,
    gibbs_scalings,
    sinkhorn_log,
    sinkhorn_scalings,
)

Matching = Literal["wasserstein", "cosine", "euclidean"]
LocalUpdate = Literal["topk", "single"]

LOCAL = "local_prototypes"
GLOBAL = "global_prototypes"
BETA = "beta"
GAMMA = "gamma"


class GLU(nn.Module):
    """Gated linear unit (Dauphin et al. 2017): Linear d -> 2d, then a * sigmoid(b)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = Linear(dim, 2 * dim)  # nn.Linear with oneDNN kernels in 1-thread workers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.glu(self.proj(x), dim=-1)


def _row_argmax(kernel: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim of kernel * v (..., N, G): each token's prototype.

    The cosine kernel is stored prototype-major, and torch reduces over a strided dim
    slowly: the product is copied token-major first, measured faster copy included
    (docs/speed.md).
    """
    return (kernel * v.unsqueeze(-2)).contiguous().argmax(dim=-1)


class ALP(nn.Module):
    """ALignment with Prototypes on a token stream (..., d).

    Training (`module.train()`), on the flattened tokens X (N = B*Z, d):
    1. plan = Sinkhorn over cosine similarities to [local; global] (N x 2G), split in two;
    2. each token takes its argmax global prototype (hard assignment);
    3. the matched prototypes (no gradient: stop-gradient below the GLU) go through the GLU;
    4. x_hat = beta * GLU + (1 - beta) * x, L2-normalised per token;
    5. local prototypes: for each, the top-k tokens of its column of the local plan, weights
       normalised to sum 1, weighted mean x_bar; P <- gamma P + (1 - gamma) x_bar
       (`update="topk"`, the paper's). `update="single"` (the official code from scratch):
       each token's argmax local prototype (row of the local plan) and only that one moves,
       P <- gamma P + (1 - gamma) x; where several tokens pick one prototype the last of
       them in token order sets it (TensorFlow's scatter update on the CPU keeps one).
    Inference (`module.eval()`): plan over the local prototypes only, argmax, GLU, mix,
    normalise; prototypes never change.

    x_bar averages the layer's input tokens as they come (the LayerNorm output), not their
    normalised copies: prototypes live in the space of the tokens they are mixed into; the
    GLU takes the raw matched prototypes (normalised only to compute cosines).
    `inference="sample"` solves one transport problem per sample (its Z tokens against the G
    prototypes): the same prediction whatever the batch. Ablation variants:
    `matching="cosine"` / `"euclidean"` replace the plan by a row-wise softmax of
    score / epsilon (no balancing; argmax = nearest prototype by cosine / by Euclidean
    distance of the raw vectors); `glu=False` mixes the matched prototypes directly;
    `use_global=False` aligns to the matched local prototypes in training too;
    `local_at_inference=False` infers with the global prototypes. `sinkhorn_order` is the
    plan's normalisation order (nn/ot.py: SwAV's `rows_last` or the official `columns_last`).
    """

    gamma: torch.Tensor  # the EMA's rate, a scalar buffer (registered in __init__)

    def __init__(
        self,
        dim: int,
        num_prototypes: int,
        *,
        beta: float = 0.2,
        gamma: float = 0.999,
        epsilon: float = 0.05,
        iterations: int = 3,
        matching: Matching = "wasserstein",
        topk: Literal["paper", "official"] = "paper",
        update: LocalUpdate = "topk",
        sinkhorn_order: SinkhornOrder = "rows_last",
        glu: bool = True,
        use_global: bool = True,
        local_at_inference: bool = True,
        inference: Literal["batch", "sample"] = "batch",
    ) -> None:
        super().__init__()
        if matching not in ("wasserstein", "cosine", "euclidean"):
            raise ValueError(f"ALP: unknown matching '{matching}'")
        if topk not in ("paper", "official"):
            raise ValueError(f"ALP: unknown topk rule '{topk}'")
        if inference not in ("batch", "sample"):
            raise ValueError(f"ALP: unknown inference mode '{inference}'")
        if update not in ("topk", "single"):
            raise ValueError(f"ALP: unknown local update '{update}'")
        if sinkhorn_order not in SINKHORN_ORDERS:
            raise ValueError(f"ALP: unknown Sinkhorn order '{sinkhorn_order}'")
        self.dim, self.num_prototypes = dim, num_prototypes
        self.epsilon, self.iterations = epsilon, iterations
        self.matching, self.topk = matching, topk
        self.update, self.sinkhorn_order = update, sinkhorn_order
        self.use_global, self.local_at_inference = use_global, local_at_inference
        self.inference = inference
        # in eval mode a sample's output depends on its batch (Sinkhorn balances over it):
        # scorers that reuse embeddings across batches must not (FedModel.batch_dependent)
        self.batch_dependent = inference == "batch"
        # standard-normal banks, as the paper; the model's seed makes them reproducible
        self.register_buffer(LOCAL, torch.randn(num_prototypes, dim))
        self.register_buffer(GLOBAL, torch.randn(num_prototypes, dim))
        self.register_buffer(BETA, torch.tensor(float(beta)))
        self.register_buffer(GAMMA, torch.tensor(float(gamma)))
        self.glu = GLU(dim) if glu else None

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, prototypes={self.num_prototypes}, matching={self.matching}, "
            f"topk={self.topk}, update={self.update}, order={self.sinkhorn_order}, "
            f"use_global={self.use_global}, "
            f"local_at_inference={self.local_at_inference}, inference={self.inference}"
        )

    # matching ---------------------------------------------------------------------------
    def match(
        self, tokens: torch.Tensor, prototypes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The plan of tokens (..., N, d) to prototypes (G, d) as (kernel, u, v).

        plan = u[..., :, None] * kernel * v[..., None, :] (ot.sinkhorn_scalings), so a row's
        argmax is that of kernel * v and a column's ranking that of u * kernel: the plan
        itself is never formed. Where the direct form is not safe the dense log-domain plan
        comes back as the kernel with unit scalings.
        """
        iterations = self.iterations if self.matching == "wasserstein" else 0
        order = self.sinkhorn_order
        if self.matching != "euclidean":
            kernel = cosine_kernel(tokens, prototypes, self.epsilon)
            if kernel is not None:
                return (kernel, *gibbs_scalings(kernel, iterations, order))
            scores = F.normalize(tokens, dim=-1) @ F.normalize(prototypes, dim=-1).transpose(-2, -1)
        else:
            scores = -torch.cdist(tokens, prototypes.expand(*tokens.shape[:-2], -1, -1))
        if direct_is_safe(scores, self.epsilon):
            return sinkhorn_scalings(scores, self.epsilon, iterations, order)
        plan = sinkhorn_log(scores, self.epsilon, iterations, order).exp()
        return plan, plan.new_ones(plan.shape[:-1]), plan.new_ones(*plan.shape[:-2], plan.shape[-1])

    def plan(self, tokens: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
        """The dense assignment plan (..., N, G) (for tests and analysis)."""
        kernel, u, v = self.match(tokens, prototypes)
        return u.unsqueeze(-1) * kernel * v.unsqueeze(-2)

    def topk_count(self, num_tokens: int, batch_size: int) -> int:
        """Tokens per prototype in the EMA target, capped at N: the paper's k = ceil(N / G)
        (`topk="paper"`) or the official code's ceil(B / G), effectively 1 (`"official"`)."""
        n = num_tokens if self.topk == "paper" else batch_size
        return max(1, min(num_tokens, math.ceil(n / self.num_prototypes)))

    @torch.no_grad()
    def update_local(
        self, tokens: torch.Tensor, column_scores: torch.Tensor, batch_size: int
    ) -> None:
        """Step 5: EMA of each local prototype toward its top-k tokens' weighted mean.

        `column_scores` (N, G) is the local plan up to a positive factor per column, which
        the normalisation of the top-k weights cancels.
        """
        k = self.topk_count(len(tokens), batch_size)
        if k == 1:  # the common case (G >= N): max is much cheaper than topk
            weights, index = column_scores.max(dim=0, keepdim=True)
        else:
            weights, index = column_scores.topk(k, dim=0)  # (k, G): each prototype's top-k tokens
        weights = weights / weights.sum(dim=0, keepdim=True).clamp_min(
            torch.finfo(weights.dtype).tiny
        )
        target = (weights.unsqueeze(-1) * tokens[index]).sum(dim=0)  # (G, d)
        bank = getattr(self, LOCAL)
        bank.mul_(self.gamma).add_((1 - self.gamma) * target.to(bank.dtype))

    @torch.no_grad()
    def update_single(self, tokens: torch.Tensor, index: torch.Tensor) -> None:
        """Step 5 as the official code from scratch: every matched local prototype moves
        toward one token that picked it (`index` (N,): each token's argmax local prototype),
        P <- gamma P + (1 - gamma) x; the last such token in order, deterministically."""
        bank = getattr(self, LOCAL)
        order = torch.arange(len(index), device=index.device)
        last = torch.full((len(bank),), -1, dtype=order.dtype, device=index.device)
        last.scatter_reduce_(0, index, order, reduce="amax")
        moved = (last >= 0).nonzero().squeeze(1)
        target = tokens[last[moved]].to(bank.dtype)
        bank[moved] = self.gamma * bank[moved] + (1 - self.gamma) * target

    @torch.no_grad()
    def _matched(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 1, 2 (and 5 in training): the bank the tokens were matched to (G, d) and
        every token's index into it (N,), in the order of `x.reshape(-1, d)`.

        Always float32, also under bf16 autocast (`train.precision=bf16`): the matching is a
        discrete choice outside autograd, and the direct Sinkhorn form's safety bound
        (nn/ot.py) is for float32 cosines.
        """
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return self._matched_fp32(x.float())
        return self._matched_fp32(x)

    def _matched_fp32(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        local, glob = getattr(self, LOCAL), getattr(self, GLOBAL)
        g = len(local)
        if self.training:
            flat = x.reshape(-1, self.dim).detach()
            banks = torch.cat([local, glob]) if self.use_global else local
            kernel, u, v = self.match(flat, banks)
            # hard assignment: argmax of the global (or, without it, the local) part of the plan
            part = slice(g, 2 * g) if self.use_global else slice(0, g)
            index = _row_argmax(kernel[:, part], v[part])
            # the local bank is about to move (EMA below): match against a copy of it
            matched_bank = glob.detach() if self.use_global else local.detach().clone()
            if self.update == "single":  # each token's argmax local prototype moves
                self.update_single(flat, _row_argmax(kernel[:, :g], v[:g]))
            else:
                local_columns = u.unsqueeze(1) * kernel[:, :g]
                self.update_local(flat, local_columns, batch_size=shape[0] if x.dim() > 2 else 1)
            return matched_bank, index
        bank = local if self.local_at_inference else glob
        per_sample = self.inference == "sample" and x.dim() > 2
        tokens = x.reshape(shape[0], -1, self.dim) if per_sample else x.reshape(-1, self.dim)
        kernel, _, v = self.match(tokens, bank)
        return bank.detach(), _row_argmax(kernel, v).reshape(-1)

    def _aligned(self, bank: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """GLU of every token's matched prototype (N, d).

        A row-wise map of rows of `bank`: when the bank has fewer rows than there are
        tokens, the GLU runs once per prototype and the result is gathered (the same
        numbers and gradient, G instead of N rows of work); otherwise per token.
        """
        if self.glu is None:
            return bank.index_select(0, index)
        if len(bank) < len(index):
            return self.glu(bank).index_select(0, index)
        return self.glu(bank.index_select(0, index))

    def _beta(self) -> float:
        """beta as a Python number, read from the buffer only when the buffer has changed.

        Reading a CUDA scalar waits for the GPU; once per layer and step that would stall
        the launch queue. The buffer object (a weak reference, so a freed one never passes
        for a new one) and its in-place version counter, both host-side, tell when the
        algorithm has set a new value.
        """
        buffer = getattr(self, BETA)
        cached = getattr(self, "_beta_cache", None)
        if cached is None or cached[0]() is not buffer or cached[1] != buffer._version:
            cached = (weakref.ref(buffer), buffer._version, float(buffer))
            self._beta_cache = cached
        return cached[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        beta = self._beta()
        if beta == 0.0 and not self.training:
            return F.normalize(x, dim=-1)  # nothing to align with: skip the matching
        bank, index = self._matched(x)  # no_grad: the stop-gradient below the GLU
        if beta == 0.0:
            return F.normalize(x, dim=-1)  # training still updates the local prototypes
        aligned = self._aligned(bank, index).reshape(x.shape)
        return F.normalize(beta * aligned + (1 - beta) * x, dim=-1)


class TokenNormalize(nn.Module):
    """The ALP layer's last step alone: each token L2-normalised, no prototypes, no GLU.

    A control for FedAli's comparisons (`model.alp.normalize_only=true`): what the layer's
    normalisation does to a backbone without any alignment to prototypes.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)


def alp_layers(model: nn.Module) -> dict[str, ALP]:
    """The model's ALP layers by module name, in forward order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, ALP)}


def alp_buffer_names(model: nn.Module, buffer: str) -> list[str]:
    """State-dict names of one buffer (`LOCAL`, `GLOBAL`, `BETA`, `GAMMA`) of every ALP layer."""
    return [f"{name}.{buffer}" for name in alp_layers(model)]
