"""Model registry and the FedModel contract, for every model on every input shape it takes."""

from __future__ import annotations

import pytest
import torch

from protofed.config import ModelConfig
from protofed.errors import ConfigError
from protofed.models import MODELS, FedModel, build_model

NUM_CLASSES = 7
BATCH = 3

VALID = {
    "mlp": [(13,), (9, 128), (1, 8, 8), (3, 16, 16)],
    "cnn": [(1, 8, 8), (1, 16, 16), (1, 28, 28), (3, 32, 32), (2, 16, 24)],
    "pflcnn": [(1, 16, 16), (1, 28, 28), (3, 32, 32), (2, 16, 24)],
    "cnn1d": [(9, 128), (3, 50), (1, 8)],
    "cnnbn": [(1, 8, 8), (1, 28, 28), (3, 32, 32)],
    "cnn1dbn": [(9, 128), (1, 8)],
    "resnet18": [(3, 32, 32), (1, 28, 28), (1, 8, 8)],
    "harcnn": [(9, 128), (3, 100), (1, 28)],
    "hart": [(6, 128), (3, 128), (1, 32)],
    "vit_tiny": [(3, 32, 32), (1, 16, 16)],
}

INVALID = {
    "mlp": [()],
    "cnn": [(64,), (9, 128), (1, 2, 2), (4, 3, 28, 28)],
    "pflcnn": [(64,), (1, 8, 8), (1, 15, 15)],
    "cnn1d": [(64,), (3, 32, 32), (9, 4)],
    "cnnbn": [(64,), (9, 128)],
    "cnn1dbn": [(64,), (3, 32, 32)],
    "resnet18": [(64,), (9, 128)],
    "harcnn": [(64,), (1, 28, 28), (9, 27)],
    "hart": [(64,), (3, 32, 32), (6, 8)],
    "vit_tiny": [(64,), (9, 128), (3, 32, 28), (3, 12, 12)],
}

CASES = [(name, shape) for name, shapes in VALID.items() for shape in shapes]


def _build(name: str, shape: tuple[int, ...], **kw) -> FedModel:
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name, **kw), shape, NUM_CLASSES)


def test_every_registered_model_is_tested() -> None:
    assert set(MODELS) == set(VALID) == set(INVALID)
    assert all(info.description for info in MODELS.values())


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_forward_features_head(name: str, shape: tuple[int, ...]) -> None:
    model = _build(name, shape).eval()
    x = torch.randn(BATCH, *shape)
    with torch.no_grad():
        out = model(x)
        emb = model.features(x)
        assert out.shape == (BATCH, NUM_CLASSES)
        assert emb.shape == (BATCH, model.embedding_dim)
        torch.testing.assert_close(model.head(emb), out)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_trains_one_step(name: str, shape: tuple[int, ...]) -> None:
    model = _build(name, shape).train()
    x, y = torch.randn(BATCH, *shape), torch.randint(0, NUM_CLASSES, (BATCH,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.head.weight.grad.abs().sum() > 0  # the loss reaches the head, not just zeros
    body = set(model.param_groups()["features"])
    assert any(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n in body)


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_param_groups_and_layers(name: str, shape: tuple[int, ...]) -> None:
    model = _build(name, shape)
    groups = model.param_groups()
    assert set(groups) == {"features", "head"}
    assert groups["features"] and groups["head"]
    names = [n for n, _ in model.named_parameters()]
    assert sorted(groups["features"] + groups["head"]) == sorted(names)
    assert len(set(groups["features"] + groups["head"])) == len(names)

    layers = model.layers()
    per_layer = [p for layer in layers for p in model.layer_params(layer)]
    assert per_layer == names  # every parameter once, in input-to-output order
    assert layers[0] == "features" or layers[0].startswith("features.")  # ViT: features.pos
    assert model.layer_params(layers[-1]) == groups["head"]


def test_layers_are_ordered_input_to_output() -> None:
    model = _build("mlp", (20,), hidden=[16, 8])
    assert model.layers() == ["features.1", "features.3", "head"]
    assert model.get_submodule("features.1").in_features == 20
    assert model.embedding_dim == 8
    model = _build("harcnn", (9, 128))
    assert model.layers() == [
        "features.0",
        "features.3",
        "features.7",
        "features.9",
        "head",
    ]


def test_harcnn_matches_pfllib() -> None:
    """UCI-HAR: 9 channels x 128 samples, 6 classes -> flatten 1664, 2,253,958 parameters."""
    model = build_model(ModelConfig(name="harcnn"), (9, 128), 6)
    assert model.get_submodule("features.7").in_features == 1664
    assert model.embedding_dim == 512
    assert sum(p.numel() for p in model.parameters()) == 2_253_958


def test_embedding_dim_override() -> None:
    assert _build("cnn1d", (9, 128), embedding_dim=32).embedding_dim == 32
    assert _build("cnn", (1, 28, 28), embedding_dim=64).embedding_dim == 64
    assert _build("mlp", (5,), hidden=[10, 4], embedding_dim=4).embedding_dim == 4
    with pytest.raises(ConfigError, match="model.embedding_dim"):
        _build("mlp", (5,), hidden=[10, 4], embedding_dim=5)
    with pytest.raises(ConfigError, match="model.embedding_dim"):
        _build("resnet18", (3, 32, 32), embedding_dim=128)


def test_cnn_flatten_sizes() -> None:
    for side, flat in ((8, 256), (16, 1024), (28, 3136), (32, 4096)):
        assert _build("cnn", (1, side, side)).get_submodule("features.7").in_features == flat
    for side, flat in ((16, 64), (28, 1024), (32, 1600)):  # PFLlib's FedAvgCNN: dim 1024 / 1600
        assert _build("pflcnn", (1, side, side)).get_submodule("features.7").in_features == flat


@pytest.mark.parametrize(
    ("name", "shape"), [(n, s) for n, shapes in INVALID.items() for s in shapes]
)
def test_bad_shapes_raise_config_error(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        _build(name, shape)
    message = str(info.value)
    assert name in message and str(shape) in message and "\n" not in message


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(ConfigError, match="did you mean 'resnet18'"):
        build_model(ModelConfig(name="resnet"), (3, 32, 32), 10)
    with pytest.raises(ConfigError, match="unknown model.name 'transformer'"):
        build_model(ModelConfig(name="transformer"), (3, 32, 32), 10)
