"""configs/fedali_official_pretrained.yaml against the official code's pre-trained branch
(getalp/FedAli with loadPretrain = True), key by key.

Every value below was read from the official repository; the comment names the file and the
function (or main.py's setting) it comes from. Values with no protofed knob are in `GAPS`:
the preset's header must name each of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protofed.config import flatten, load_config

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "configs" / "fedali_official_pretrained.yaml"

OFFICIAL: dict[str, object] = {
    # main.py: dataSetName = 'HHAR'
    "data.name": "hhar",
    # main.py: algorithm FEDALI builds model.createAndLoadHART_ALP(loadPretrain=True), whose
    # clients run model.py HART_ALP_GLOBAL (fed_util.py fedAli_global_Trainer)
    "model.name": "hart",
    "algorithm.name": "fedali",
    # main.py: prototypeLayers = [2048, 1024, 512, 256, 128, 64]
    "model.alp.enabled": True,
    "model.alp.prototypes": [2048, 1024, 512, 256, 128, 64],
    # main.py: singleUpdate = False -> alp_model.py AlignmentWithProtoype.alignment_process's
    # soft update (top-k tokens per prototype, weighted mean, EMA)
    "model.alp.update": "topk",
    # alp_model.py AlignmentWithProtoype.alignment_process: memorySlotSize = B // G, >= 1
    "model.alp.topk": "official",
    # alp_model.py AlignmentWithProtoype.sinkhorn_matrix: the loop ends on the prototype step
    "model.alp.sinkhorn_order": "columns_last",
    # main.py: useGLU = True; matchMethod 'OT' (model.py createAndLoadHART_ALP default)
    "model.alp.glu": True,
    "model.alp.matching": "wasserstein",
    # alp_model.py HART_ALP_globalLocal_encoder: SensorWiseMHA(projectionQuarter = 48, ...),
    # Keras MultiHeadAttention(num_heads = 3, key_dim = 48)
    "model.hart.head_dim": 48,
    # alp_model.py HART_ALP_globalLocal_encoder: dropout_rate = 0.1 (attention, block MLP)
    "model.hart.attention_dropout": 0.1,
    "model.hart.mlp_dropout": 0.1,
    # mae_model.py mlp2: Dense(2d, swish); model.py HART_ALP_GLOBAL: Dense(1024, swish)
    "model.hart.mlp_activation": "swish",
    "model.hart.embedding_activation": "swish",
    # alp_model.py HART_ALP_globalLocal_encoder: np.linspace(0, dropout_rate * 10, 6) * 0.1
    "model.hart.drop_path": 0.1,
    # model.py HART_ALP_GLOBAL: Dropout(dropout_rate = 0.5) after the 1024-unit layer
    "model.hart.head_dropout": 0.5,
    # main.py: usePersonalPrototype = False (local banks re-initialised from the global ones)
    "algorithm.local_banks": "reset",
    # main.py: influenceFactor = 0.2, 0.0 in round 0 (the FEDALI branch of the round loop)
    "algorithm.beta": 0.2,
    "algorithm.first_round_beta": 0.0,
    # main.py: initial_lr = end_lr = 0.999 -> LinearLearningRateScheduler -> prototypeDecay
    "algorithm.gamma": 0.999,
    # main.py: communicationRound = 200, localEpoch = 5, batch_size = 64
    "train.rounds": 200,
    "train.local_epochs": 5,
    "train.batch_size": 64,
    # fed_util.py fedAli_global_Trainer: tf.keras.optimizers.Adam(clientLearningRate),
    # main.py: clientLearningRate = 1e-4
    "train.optimizer": "adam",
    "train.lr": 0.0001,
    # main.py: every client every round (trainPool = range(clientCount))
    "train.client_fraction": 1.0,
    # fed_util.py fedAli_global_Trainer: localModel.evaluate(...) at Keras' batch 32
    "eval.batch_size": 32,
    "eval.client_model": "trained",
}

GAPS: dict[str, str] = {
    # fed_util.py fedAli_global_Trainer: tf.keras.optimizers.Adam(clientLearningRate), Keras'
    # default epsilon 1e-7 against torch's 1e-8 (protofed has no train knob for it)
    "epsilon": "1e-7",
    # mae_model.py DropPath inside SensorWiseMHA and liteFormer: masks per branch
    "drop-path is one per-sample mask": "independent mask inside each attention",
}


def test_pretrained_preset_matches_the_official_pretrained_branch_key_by_key() -> None:
    cfg = load_config(PRESET)
    got = flatten(cfg.to_dict())
    got.update({f"algorithm.{k}": v for k, v in cfg.algorithm.hyperparameters().items()})
    for key, want in OFFICIAL.items():
        assert key in got, key
        assert got[key] == pytest.approx(want) if isinstance(want, float) else got[key] == want, (
            f"{key}: preset {got[key]!r}, official {want!r}"
        )


def test_pretrained_preset_starts_from_a_checkpoint_and_names_its_gaps() -> None:
    cfg = load_config(PRESET)
    assert cfg.model.init is not None and cfg.model.init.endswith(".safetensors")
    text = PRESET.read_text().splitlines()
    lines = [line.lstrip("#").strip() for line in text if line.startswith("#")]
    header = " ".join(line for line in lines if line)  # the comments' text, one line
    for gap, official in GAPS.items():
        assert gap in header and official in header, gap
    # the paper's selection rule needs every round evaluated
    assert "-s eval.selection=best_test -s eval.every=1" in header


def test_from_scratch_preset_hint_evaluates_every_round() -> None:
    text = (ROOT / "configs" / "fedali_official.yaml").read_text()
    assert "-s eval.selection=best_test -s eval.every=1" in text
    assert "loadPretrain" in text and "fedali_official_pretrained.yaml" in text


def test_pretrained_preset_model_builds_and_trains_a_step_on_hhar_shapes() -> None:
    """The preset's HART (3 accelerometer channels, 128 samples) without its checkpoint:
    a training step moves the loss's gradients and the banks (the soft top-k update)."""
    import torch

    from protofed.models import build_model

    cfg = load_config(PRESET, ["model.init=null", "model.alp.prototypes=[16,16,8,8,4,4]"])
    torch.manual_seed(0)
    model = build_model(cfg.model, (3, 128), 6)
    banks = {k: v.clone() for k, v in model.state_dict().items() if "local" in k}
    assert banks
    model.train()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 3, 128)), torch.arange(8) % 6)
    loss.backward()
    after = model.state_dict()
    assert any(not torch.equal(after[k], v) for k, v in banks.items())


def test_drop_path_and_head_dropout_knobs_reach_the_model_and_default_as_before() -> None:
    """model.hart.drop_path sets the blocks' stochastic-depth rates (0 ... it), head_dropout
    the embedding's dropout; at their defaults (0.3, the from-scratch branch's) the model is
    the one every recorded run used, and a checkpoint's fingerprint leaves them out (older
    runs resume as they did: runtime/fingerprint.py's LEFT_OUT_AT_DEFAULT)."""
    from protofed.models import build_model
    from protofed.runtime.fingerprint import LEFT_OUT_AT_DEFAULT

    default = load_config(None, ["model.name=hart"])
    hart = default.to_dict()["model"]["hart"]
    for key in ("drop_path", "head_dropout"):
        assert LEFT_OUT_AT_DEFAULT[f"model.hart.{key}"] == hart[key] == 0.3
    model = build_model(default.model, (3, 128), 6)
    rates = [block.drop.p for block in model.features.blocks]  # type: ignore[union-attr]
    assert rates == pytest.approx([0.0, 0.06, 0.12, 0.18, 0.24, 0.3])
    assert model.features.dropout.p == 0.3  # type: ignore[union-attr]
    cfg = load_config(PRESET, ["model.init=null"])
    dumped = cfg.to_dict()["model"]["hart"]
    assert dumped["drop_path"] == 0.1 and dumped["head_dropout"] == 0.5
    model = build_model(cfg.model, (3, 128), 6)
    rates = [block.drop.p for block in model.features.blocks]  # type: ignore[union-attr]
    assert rates == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08, 0.1])
    assert model.features.dropout.p == 0.5  # type: ignore[union-attr]
