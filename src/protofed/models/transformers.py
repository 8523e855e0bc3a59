"""Small transformers of FedAli: `hart` for sensor windows and `vit_tiny` for 32x32 images.

Both take an optional ALP layer (protofed/nn/alp.py) right after each block's first
LayerNorm, feeding the attention branch(es); the residual adds the block input, not the ALP
output (FedAli, section 4.1; notes on the official alp_model.py). `model.alp.*` configures
them (config.AlpConfig); `model.alp.enabled=false` builds the plain backbone, which is what
FedAvg, FedProx, FedPer and Local run for the paper's comparison. The architectures are in
`HART`'s and `ViTTiny`'s docstrings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from protofed.config import AlpConfig, HartConfig, ModelConfig
from protofed.errors import ConfigError
from protofed.models.base import FedModel
from protofed.models.cnn1d import require_sequence
from protofed.nn.alp import ALP, TokenNormalize

BLOCKS = 6
DIM = 192
FRAME = 16
HART_KERNELS = (3, 7, 15, 31, 31, 31)


ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "swish": nn.SiLU, "relu": nn.ReLU}
"""The activations `model.hart.*_activation` name (swish = SiLU, x * sigmoid(x))."""


def make_alps(cfg: AlpConfig, dim: int, blocks: int) -> list[nn.Module | None]:
    """One ALP layer per block from `model.alp` (None everywhere when disabled; a token
    normalisation without prototypes with `normalize_only`)."""
    if not cfg.enabled:
        return [None] * blocks
    if cfg.normalize_only:
        return [TokenNormalize() for _ in range(blocks)]
    counts = cfg.prototypes * blocks if len(cfg.prototypes) == 1 else cfg.prototypes
    if len(counts) != blocks:
        raise ConfigError(
            f"model.alp.prototypes needs one count per block ({blocks}) or a single count; got {len(cfg.prototypes)}"
        )
    return [
        ALP(
            dim,
            g,
            epsilon=cfg.epsilon,
            iterations=cfg.iterations,
            matching=cfg.matching,
            topk=cfg.topk,
            update=cfg.update,
            sinkhorn_order=cfg.sinkhorn_order,
            glu=cfg.glu,
            use_global=cfg.use_global,
            local_at_inference=cfg.local_at_inference,
            inference=cfg.inference,
        )
        for g in counts
    ]


class DropPath(nn.Module):
    """Stochastic depth: drop a sample's residual branch with probability p (training only)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[0], *([1] * (x.dim() - 1)), device=x.device) >= self.p
        return x * keep.to(x.dtype) / (1 - self.p)


class Mlp(nn.Sequential):
    """Linear, activation, dropout, linear, dropout (`out_dropout`: the official HART has
    none after its second layer)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        dropout: float = 0.0,
        activation: str = "gelu",
        out_dropout: float | None = None,
    ) -> None:
        super().__init__(
            nn.Linear(dim, hidden),
            ACTIVATIONS[activation](),
            nn.Dropout(dropout),
            nn.Linear(hidden, dim),
            nn.Dropout(dropout if out_dropout is None else out_dropout),
        )


class Attention(nn.Module):
    """Multi-head self-attention on (B, Z, d), by torch's fused scaled-dot-product kernel.

    `head_dim` (default d / heads): each head's width; the heads' concatenation (heads x
    head_dim) is projected back to d, as Keras' MultiHeadAttention with key_dim does."""

    def __init__(
        self, dim: int, heads: int, dropout: float = 0.0, head_dim: int | None = None
    ) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.head_dim = head_dim or dim // heads
        inner = self.heads * self.head_dim
        self.qkv = nn.Linear(dim, 3 * inner)
        self.out = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, z, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, z, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(b, z, self.heads * self.head_dim))


class LiteConv(nn.Module):
    """Lightweight convolution (Wu et al. 2019): `heads` softmax-normalised depthwise kernels
    along time, each shared by a contiguous group of channels."""

    def __init__(self, dim: int, kernel: int, heads: int = 4) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"LiteConv: {dim} channels do not split into {heads} heads")
        self.dim, self.kernel, self.heads = dim, kernel, heads
        self.weight = nn.Parameter(torch.randn(heads, 1, kernel) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, Z, dim)
        w = self.weight.softmax(dim=-1).repeat_interleave(self.dim // self.heads, dim=0)
        y = F.conv1d(x.transpose(1, 2), w, padding=self.kernel // 2, groups=self.dim)
        return y.transpose(1, 2)


class HartBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        kernel: int,
        drop_path: float,
        alp: nn.Module | None,
        hart: HartConfig | None = None,
    ) -> None:
        super().__init__()
        cfg = hart or HartConfig()
        self.q = dim // 4
        self.norm1 = nn.LayerNorm(dim)
        self.alp = alp
        drop, width = cfg.attention_dropout, cfg.head_dim
        self.attn_acc = Attention(self.q, heads=3, dropout=drop, head_dim=width)
        self.lite = LiteConv(dim - 2 * self.q, kernel)
        self.attn_gyro = Attention(self.q, heads=3, dropout=drop, head_dim=width)
        self.norm2 = nn.LayerNorm(dim)
        # the official MLP drops out after its hidden layer only; protofed's default none
        self.mlp = Mlp(dim, 2 * dim, cfg.mlp_dropout, cfg.mlp_activation, out_dropout=0.0)
        self.drop = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        if self.alp is not None:
            h = self.alp(h)
        q = self.q
        branches = torch.cat(
            [self.attn_acc(h[..., :q]), self.lite(h[..., q:-q]), self.attn_gyro(h[..., -q:])],
            dim=-1,
        )
        x = x + self.drop(branches)
        return x + self.drop(self.mlp(self.norm2(x)))


class HartFeatures(nn.Module):
    def __init__(
        self,
        channels: int,
        tokens: int,
        alps: list[nn.Module | None],
        dropout: float,
        hart: HartConfig | None = None,
    ) -> None:
        super().__init__()
        cfg = hart or HartConfig()
        self.channels, self.tokens = channels, tokens
        self.split = channels == 6
        if self.split:  # accelerometer and gyroscope frames projected separately
            self.proj_acc = nn.Linear(3 * FRAME, DIM // 2)
            self.proj_gyro = nn.Linear(3 * FRAME, DIM // 2)
        else:
            self.proj = nn.Linear(channels * FRAME, DIM)
        self.pos = nn.Parameter(torch.randn(1, tokens, DIM) * 0.02)
        rates = torch.linspace(0, cfg.drop_path, len(alps)).tolist()
        self.blocks = nn.ModuleList(
            HartBlock(DIM, k, r, alp, cfg)
            for k, r, alp in zip(HART_KERNELS, rates, alps, strict=True)
        )
        self.norm = nn.LayerNorm(DIM)
        self.embed = nn.Linear(DIM, 1024)
        self.embed_activation = ACTIVATIONS[cfg.embedding_activation]()
        self.dropout = nn.Dropout(dropout)

    def frames(self, x: torch.Tensor, channels: slice) -> torch.Tensor:
        """(B, C, T) -> (B, Z, c * FRAME): non-overlapping frames of FRAME samples."""
        part = x[:, channels, : self.tokens * FRAME]
        b, c, _ = part.shape
        return (
            part.reshape(b, c, self.tokens, FRAME)
            .permute(0, 2, 1, 3)
            .reshape(b, self.tokens, c * FRAME)
        )

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, T) -> (B, Z, C * FRAME): every token's raw samples, the sensor-wise layout
        the projections read (accelerometer frame, then gyroscope frame); MAE's target."""
        if self.split:
            return torch.cat([self.frames(x, slice(0, 3)), self.frames(x, slice(3, 6))], dim=-1)
        return self.frames(x, slice(None))

    def embed_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """Patches (B, Z, C * FRAME) -> embedded tokens (B, Z, d), position added."""
        if self.split:
            half = patches.shape[-1] // 2
            h = torch.cat(
                [self.proj_acc(patches[..., :half]), self.proj_gyro(patches[..., half:])], dim=-1
            )
        else:
            h = self.proj(patches)
        return h + self.pos

    def encode(self, h: torch.Tensor) -> torch.Tensor:
        """The blocks and the final LayerNorm on any subset of tokens (MAE: the visible ones)."""
        for block in self.blocks:
            h = block(h)
        return self.norm(h)

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """The encoder's output averaged over tokens (B, d = 192), before the embedding
        layer: the representation FedAli's official code maps in its Figs. 4-5."""
        return self.encode(self.embed_patches(self.patches(x))).mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed_activation(self.embed(self.pooled(x))))


class HART(FedModel):
    """Lightweight HAR transformer (6 blocks, d = 192), optional ALP layers.

    HART (Ek et al., "Transformer-based models to deal with heterogeneous environments in
    human activity recognition", 2023), as the official FedAli code builds it: windows cut
    into non-overlapping frames of 16 samples; with 6 channels the accelerometer (first 3)
    and the gyroscope (last 3) frames are projected separately to d/2 each and concatenated,
    other channel counts (HHAR, WISDM: accelerometer only) get one projection to d; a learned
    position embedding; 6 blocks of [LayerNorm, (ALP), three branches over slices of the d
    dims: 3-head self-attention on the first quarter, a "lite" branch of 4 softmax-normalised
    depthwise convolutions along time on the middle half (kernels 3, 7, 15, 31, 31, 31),
    3-head self-attention on the last quarter, concatenated and added to the input;
    LayerNorm, MLP 2d -> d, stochastic depth rising linearly to 0.3, residual]; LayerNorm,
    mean over tokens, a 1024-unit dense layer (ReLU: settled here, the notes do not name it)
    with dropout 0.3 as the embedding, and the classifier head. `model.hart.*` (HartConfig)
    sets the attention heads' width, dropouts and activations (the official code's: 48 per
    head, 0.3, swish; the defaults keep protofed's 16, none, GELU / ReLU), the stochastic
    depth's last rate (`drop_path`) and the embedding's dropout (`head_dropout`), both 0.3
    as the official code from scratch (its pre-trained branch: 0.1 and 0.5). Stochastic
    depth draws one per-sample mask for the three concatenated branches (the official code:
    one inside each attention branch, and a whole lite-branch head across the batch).
    """

    def __init__(
        self,
        channels: int,
        time: int,
        num_classes: int,
        alp: AlpConfig | None = None,
        hart: HartConfig | None = None,
    ) -> None:
        super().__init__()
        alps = make_alps(alp or AlpConfig(), DIM, BLOCKS)
        cfg = hart or HartConfig()
        self.features = HartFeatures(
            channels, time // FRAME, alps, dropout=cfg.head_dropout, hart=hart
        )
        self.head = nn.Linear(1024, num_classes)
        self.embedding_dim = 1024


def build_hart(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> HART:
    channels, time = require_sequence("hart", input_shape, min_length=FRAME)
    return HART(channels, time, num_classes, cfg.alp, cfg.hart)


class VitBlock(nn.Module):
    def __init__(self, dim: int, heads: int, alp: nn.Module | None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.alp = alp
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        if self.alp is not None:
            h = self.alp(h)
        x = x + self.attn(h)
        return x + self.mlp(self.norm2(x))


class VitFeatures(nn.Module):
    def __init__(self, channels: int, side: int, alps: list[nn.Module | None]) -> None:
        super().__init__()
        patch = side // 8
        self.patchify = nn.Conv2d(channels, DIM, kernel_size=patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, 64, DIM) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(DIM, 3, alp) for alp in alps)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patchify(x).flatten(2).transpose(1, 2) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.norm(h).mean(dim=1)


class ViTTiny(FedModel):
    """ViT with 6 blocks of width 192 on 64 patches, optional ALP layers.

    64 patches (side / 8 pixels each, so 4x4 for 32x32), d = 192, 6 pre-norm blocks of
    3-head attention and an MLP of 2d (the HART width; settled here to keep it light on 2
    cores), learned position embedding, final LayerNorm and mean pooling as the embedding
    (d), no class token.
    """

    def __init__(
        self, channels: int, side: int, num_classes: int, alp: AlpConfig | None = None
    ) -> None:
        super().__init__()
        self.features = VitFeatures(channels, side, make_alps(alp or AlpConfig(), DIM, BLOCKS))
        self.head = nn.Linear(DIM, num_classes)
        self.embedding_dim = DIM


def build_vit_tiny(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> ViTTiny:
    shape = tuple(input_shape)
    if len(shape) != 3 or shape[1] != shape[2] or shape[1] % 8 or shape[1] < 8:
        raise ConfigError(
            f"model 'vit_tiny' needs square images (channels, side, side) with side a multiple "
            f"of 8 (64 patches); got input shape {shape}"
        )
    return ViTTiny(shape[0], shape[1], num_classes, cfg.alp)
