"""FedAli: the ALP layer's invariants, the backbones, the algorithm, and a short real run."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import uci_har_slice
from protofed.algorithms import Reply, Setting, build_algorithm
from protofed.algorithms.fedali import GLOBAL_BANKS, LOCAL_BANKS, SCALARS, FedAli
from protofed.config import ModelConfig, TrainConfig, load_config
from protofed.data.federated import ClientData
from protofed.errors import ConfigError
from protofed.models import build_model
from protofed.nn.alp import ALP, alp_layers
from protofed.runtime import prepare, simulate
from protofed.training.client import Client

D = 8


@pytest.fixture(autouse=True)
def _one_thread():
    """2 shared cores: intra-op threads only contend (conftest restores the count)."""
    torch.set_num_threads(1)


def _layer(g: int = 6, **kw) -> ALP:
    torch.manual_seed(0)
    layer = ALP(D, g, **kw)
    with torch.no_grad():
        layer.glu.proj.weight.normal_() if layer.glu is not None else None
    return layer


def _tokens(b: int = 5, z: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, z, D, generator=torch.Generator().manual_seed(seed)) * 3


# the ALP layer ------------------------------------------------------------------------------
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("matching", ["wasserstein", "cosine", "euclidean"])
def test_output_keeps_the_shape_and_has_unit_norm(training: bool, matching: str) -> None:
    layer = _layer(matching=matching).train(training)
    x = _tokens()
    out = layer(x)
    assert out.shape == x.shape
    assert torch.allclose(out.norm(dim=-1), torch.ones(5, 4), atol=1e-5)
    assert not torch.allclose(out, F.normalize(x, dim=-1))  # beta = 0.2 moved it


def test_prototypes_are_buffers_and_never_enter_the_autograd_graph() -> None:
    layer = _layer()
    names = dict(layer.named_parameters())
    assert not any("prototypes" in n for n in names)
    assert {"local_prototypes", "global_prototypes", "beta", "gamma"} <= set(layer.state_dict())
    for bank in (layer.local_prototypes, layer.global_prototypes):
        bank.requires_grad_(True)  # even if someone asks for it, the layer stops the gradient
    x = _tokens().requires_grad_(True)
    for training in (True, False):
        out = layer.train(training)(x)
        grads = torch.autograd.grad(
            out.sum(),
            [x, layer.local_prototypes, layer.global_prototypes, layer.glu.proj.weight],
            allow_unused=True,
        )
        assert grads[0] is not None and grads[3] is not None  # input and GLU are trained
        assert grads[1] is None and grads[2] is None  # the prototypes are not


def _reference_ema(layer: ALP, x: torch.Tensor) -> torch.Tensor:
    """Step 5 written out from the dense plan: each prototype's top-k tokens, weighted mean."""
    flat = x.reshape(-1, D)
    g = layer.num_prototypes
    plan = layer.plan(flat, torch.cat([layer.local_prototypes, layer.global_prototypes]))[:, :g]
    k = math.ceil(len(flat) / g)
    target = torch.empty(g, D)
    for j in range(g):
        w, idx = plan[:, j].topk(k)
        target[j] = (w / w.sum()) @ flat[idx]
    return layer.gamma * layer.local_prototypes + (1 - layer.gamma) * target, target


def test_an_ema_step_moves_every_local_prototype_toward_its_assigned_tokens() -> None:
    layer = _layer(g=6, gamma=0.9).train()
    x = _tokens(b=5, z=4)  # 20 tokens, 6 prototypes: k = ceil(20 / 6) = 4
    assert layer.topk_count(20, 5) == 4
    expected, target = _reference_ema(layer, x)
    before = layer.local_prototypes.clone()
    glob = layer.global_prototypes.clone()
    layer(x)
    assert torch.allclose(layer.local_prototypes, expected, atol=1e-5)
    assert torch.all((layer.local_prototypes - target).norm(dim=1) < (before - target).norm(dim=1))
    assert torch.equal(layer.global_prototypes, glob)  # only the server changes those


def test_topk_rules_paper_and_official() -> None:
    paper, official = _layer(g=64), _layer(g=64, topk="official")
    assert paper.topk_count(64 * 8, 64) == 8  # ceil(B * Z / G)
    assert official.topk_count(64 * 8, 64) == 1  # ceil(B / G): k = 1 for FedAli's G >= 64
    assert _layer(g=2048).topk_count(512, 64) == 1


@pytest.mark.parametrize("training", [True, False])
def test_beta_zero_returns_the_normalised_input(training: bool) -> None:
    layer = _layer().train(training)
    layer.beta.fill_(0.0)
    x = _tokens()
    assert torch.allclose(layer(x), F.normalize(x, dim=-1), atol=1e-6)


def test_a_new_beta_takes_effect_however_it_is_set() -> None:
    """The layer caches beta as a number (no GPU sync per step): every way of setting the
    buffer must still reach the next forward."""
    layer = _layer().eval()
    x = _tokens()
    aligned = layer(x)
    state = layer.state_dict()
    state["beta"] = torch.tensor(0.0)
    layer.load_state_dict(state)  # the algorithm's way: copied in place
    assert torch.allclose(layer(x), F.normalize(x, dim=-1), atol=1e-6)
    layer.beta.fill_(0.2)
    assert torch.allclose(layer(x), aligned)
    layer.beta = torch.tensor(0.0)  # a new buffer object
    assert torch.allclose(layer(x), F.normalize(x, dim=-1), atol=1e-6)


@pytest.mark.parametrize("inference", ["batch", "sample"])
@pytest.mark.parametrize("matching", ["wasserstein", "cosine", "euclidean"])
def test_inference_never_changes_prototypes(inference: str, matching: str) -> None:
    layer = _layer(inference=inference, matching=matching).eval()
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with torch.no_grad():
        layer(_tokens())
    layer(_tokens(seed=3))  # with autograd on, too
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


def test_training_aligns_to_global_prototypes_and_inference_to_local_ones() -> None:
    layer = _layer(g=5, glu=False)
    x = _tokens()
    flat = x.reshape(-1, D)
    beta = float(layer.beta)
    # inference: each token is mixed with its argmax local prototype of the local-only plan
    layer.eval()
    idx = layer.plan(flat, layer.local_prototypes).argmax(1)
    expected = F.normalize(beta * layer.local_prototypes[idx] + (1 - beta) * flat, dim=-1)
    assert torch.allclose(layer(x).reshape(-1, D), expected, atol=1e-5)
    # training: the argmax over the global half of the joint plan
    layer.train()
    banks = torch.cat([layer.local_prototypes, layer.global_prototypes])
    idx = layer.plan(flat, banks)[:, 5:].argmax(1)
    expected = F.normalize(beta * layer.global_prototypes[idx] + (1 - beta) * flat, dim=-1)
    assert torch.allclose(layer(x).reshape(-1, D), expected, atol=1e-5)


@pytest.mark.parametrize("g", [5, 40])  # fewer prototypes than the 20 tokens, and more
@pytest.mark.parametrize("training", [True, False])
def test_glu_of_the_matched_prototypes_per_token_or_per_prototype_agree(
    g: int, training: bool
) -> None:
    """The layer runs the GLU once per prototype when G < N and gathers; that must be the
    per-token GLU of the matched prototypes, in value and in the GLU's gradient."""
    layer = _layer(g=g).train(training)
    x = _tokens()
    flat = x.reshape(-1, D)
    if training:
        bank = layer.global_prototypes.clone()
        idx = layer.plan(flat, torch.cat([layer.local_prototypes, bank]))[:, g:].argmax(1)
    else:
        bank = layer.local_prototypes.clone()
        idx = layer.plan(flat, bank).argmax(1)
    beta = float(layer.beta)
    expected = F.normalize(beta * layer.glu(bank[idx]) + (1 - beta) * flat, dim=-1)
    (expected_grad,) = torch.autograd.grad(expected.pow(3).sum(), [layer.glu.proj.weight])
    out = layer(x).reshape(-1, D)
    (grad,) = torch.autograd.grad(out.pow(3).sum(), [layer.glu.proj.weight])
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.allclose(grad, expected_grad, atol=1e-4)


def test_ablation_switches() -> None:
    x = _tokens()
    flat = x.reshape(-1, D)
    no_local = _layer(g=5, glu=False, local_at_inference=False).eval()
    idx = no_local.plan(flat, no_local.global_prototypes).argmax(1)
    beta = float(no_local.beta)
    expected = F.normalize(beta * no_local.global_prototypes[idx] + (1 - beta) * flat, dim=-1)
    assert torch.allclose(no_local(x).reshape(-1, D), expected, atol=1e-5)
    no_global = _layer(g=5, glu=False, use_global=False).train()
    bank = no_global.local_prototypes.clone()
    idx = no_global.plan(flat, bank).argmax(1)
    expected = F.normalize(beta * bank[idx] + (1 - beta) * flat, dim=-1)
    assert torch.allclose(no_global(x).reshape(-1, D), expected, atol=1e-5)
    cosine = _layer(g=5, matching="cosine").eval()
    cos = F.normalize(flat, dim=-1) @ F.normalize(cosine.local_prototypes, dim=-1).T
    assert torch.equal(cosine.plan(flat, cosine.local_prototypes).argmax(1), cos.argmax(1))
    euclid = _layer(g=5, matching="euclidean").eval()
    dist = torch.cdist(flat, euclid.local_prototypes)
    assert torch.equal(euclid.plan(flat, euclid.local_prototypes).argmax(1), dist.argmin(1))


def test_sample_mode_is_batch_independent() -> None:
    layer = _layer(g=6, inference="sample").eval()
    x = _tokens(b=6)
    with torch.no_grad():
        together = layer(x)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(6)])
    assert torch.allclose(together, alone, atol=1e-6)


def test_small_epsilon_uses_the_log_domain_and_stays_finite(monkeypatch) -> None:
    from protofed.nn import alp

    calls: list[float] = []
    real = alp.sinkhorn_log

    def spy(scores, epsilon, iterations, order):
        calls.append(epsilon)
        return real(scores, epsilon, iterations, order)

    monkeypatch.setattr(alp, "sinkhorn_log", spy)
    layer = _layer(epsilon=1e-3).train()
    out = layer(_tokens())
    assert calls and set(calls) == {1e-3}  # exp(1 / 1e-3) overflows: the log domain matched
    assert torch.isfinite(out).all() and torch.isfinite(layer.local_prototypes).all()


# backbones ----------------------------------------------------------------------------------
ALP_SMALL = {"enabled": True, "prototypes": [8, 8, 4, 4, 2, 2]}


@pytest.mark.parametrize(
    ("name", "shape"), [("hart", (6, 128)), ("hart", (3, 128)), ("vit_tiny", (3, 32, 32))]
)
@pytest.mark.parametrize("alp", [False, True])
def test_backbones_have_features_head_and_one_alp_per_block(name, shape, alp) -> None:
    model = build_model(ModelConfig(name=name, alp=ALP_SMALL if alp else {}), shape, 5)
    x = torch.randn(3, *shape)
    emb = model.features(x)
    assert emb.shape == (3, model.embedding_dim)
    assert model(x).shape == (3, 5)
    layers = alp_layers(model)
    assert len(layers) == (6 if alp else 0)
    if alp:
        assert [m.num_prototypes for m in layers.values()] == ALP_SMALL["prototypes"]
        assert all(n.endswith(".alp") for n in layers)
        assert not any("prototypes" in n for n, _ in model.named_parameters())


def test_alp_config_errors() -> None:
    with pytest.raises(ConfigError, match="model.alp.enabled"):
        build_model(ModelConfig(name="mlp", alp={"enabled": True}), (6, 128), 6)
    with pytest.raises(ConfigError, match="one count per block"):
        build_model(
            ModelConfig(name="hart", alp={"enabled": True, "prototypes": [4, 4]}), (6, 128), 6
        )
    with pytest.raises(ConfigError, match="vit_tiny"):
        build_model(ModelConfig(name="vit_tiny"), (3, 30, 30), 6)


def test_paper_default_prototype_counts() -> None:
    assert ModelConfig().alp.prototypes == [2048, 1024, 512, 256, 128, 64]
    assert FedAli.describe_params() == {
        "beta": 0.2,
        "first_round_beta": 0.0,
        "gamma": 0.999,
        "kmeans_iters": 300,
        "local_banks": "keep",
        "kmeans_backend": "torch",
    }


# the algorithm ------------------------------------------------------------------------------
def _setting(model) -> Setting:
    init = {k: v.clone() for k, v in model.state_dict().items()}
    return Setting(num_clients=3, num_classes=4, train=TrainConfig(), init_model=init)


def _model():
    torch.manual_seed(0)
    return build_model(ModelConfig(name="hart", alp=ALP_SMALL), (3, 32), 4)


def _client(model, cid: int, rounds: int = 1) -> Client:
    g = torch.Generator().manual_seed(cid)
    x, y = torch.randn(24, 3, 32, generator=g), torch.arange(24) % 4
    data = ClientData(
        name=str(cid),
        group=None,
        train_x=x,
        train_y=y,
        val_x=x[:4],
        val_y=y[:4],
        test_x=x[:4],
        test_y=y[:4],
    )
    train = TrainConfig(optimizer="adam", lr=1e-3, batch_size=8, local_epochs=1)
    return Client(cid, data, model, train, rounds, g)


def test_fedali_requires_alp_layers() -> None:
    model = build_model(ModelConfig(name="hart"), (3, 32), 4)
    with pytest.raises(ConfigError, match="model.alp.enabled=true"):
        build_algorithm("fedali", {}, _setting(model))


@pytest.mark.integration
def test_messages_replies_and_state_carry_the_right_prototypes() -> None:
    model = _model()
    algo = build_algorithm("fedali", {}, _setting(model))
    server = algo.init_server()
    assert set(server) == {"model", GLOBAL_BANKS}
    assert not any(k.endswith("local_prototypes") for r in server.values() for k in r)
    first, later = algo.configure(server, 0, 1), algo.configure(server, 0, 2)
    betas = [k for k in first[SCALARS] if k.endswith(".beta")]
    assert len(betas) == 6
    assert all(
        float(first[SCALARS][k]) == 0.0 and float(later[SCALARS][k]) == pytest.approx(0.2)
        for k in betas
    )
    client = _client(model, 0)
    result = algo.fit(client, later, {})
    reply, metrics, state = result.reply, result.metrics, result.state[LOCAL_BANKS]
    assert "num_examples" not in metrics  # the engine stamps it
    assert set(result.reply) == {"model", LOCAL_BANKS}
    assert set(state) == set(reply[LOCAL_BANKS]) and len(state) == 6
    assert all(k.endswith("local_prototypes") for k in state)
    sent = reply["model"]
    assert not any(k.endswith(("prototypes", ".beta", ".gamma")) for k in sent)
    init = algo.setting.init_model
    moved = [not torch.equal(state[k], init[k]) for k in state]
    assert all(moved)  # EMA ran during local training
    params = dict(model.named_parameters())
    assert all(k in sent for k in params)  # every trainable weight goes up, GLU included
    assert any(".alp.glu." in k for k in sent)
    # personalized model = global weights + the client's local prototypes
    personal = algo.client_model(later, result.state)
    assert set(personal) == set(model.state_dict())
    assert all(torch.equal(personal[k], state[k]) for k in state)
    # global model = global weights + the global prototypes in both banks
    glob = algo.global_model(server)
    for k in state:
        assert torch.equal(glob[k], server[GLOBAL_BANKS][k.replace("local_", "global_")])
    # a second round starts from the kept local prototypes
    state2 = algo.fit(_client(model, 0, 2), later, result.state).state[LOCAL_BANKS]
    assert not torch.equal(state2[next(iter(state))], state[next(iter(state))])


def test_kmeans_on_identical_clients_returns_their_mean() -> None:
    model = _model()
    algo = build_algorithm("fedali", {"kmeans_iters": 5}, _setting(model))
    server = algo.init_server()
    reply = algo.fit(_client(model, 0), algo.configure(server, 0, 2), {}).reply
    replies = [Reply(i, dict(reply), {}, float(n)) for i, n in enumerate([10, 30, 5])]
    new = algo.aggregate(server, iter(replies), 1).server
    for local in algo.local_names:
        glob = local.replace("local_", "global_")
        assert torch.allclose(new[GLOBAL_BANKS][glob], reply[LOCAL_BANKS][local], atol=1e-5)
    for k in algo.weight_names:
        assert torch.allclose(new["model"][k], reply["model"][k], atol=1e-6)


@pytest.mark.integration
def test_server_weights_are_the_sample_weighted_mean_and_centroids_start_at_the_mean() -> None:
    model = _model()
    algo = build_algorithm("fedali", {"kmeans_iters": 1}, _setting(model))
    server = algo.init_server()
    msg = algo.configure(server, 0, 2)
    r0 = algo.fit(_client(model, 0), msg, {}).reply
    r1 = algo.fit(_client(model, 1), msg, {}).reply
    replies = iter([Reply(0, r0, {}, 1.0), Reply(1, r1, {}, 3.0)])
    result = algo.aggregate(server, replies, 2)
    new = {**result.server["model"], **result.server[GLOBAL_BANKS]}
    name = algo.weight_names[0]
    assert torch.allclose(new[name], 0.25 * r0["model"][name] + 0.75 * r1["model"][name], atol=1e-6)
    r0, r1 = r0[LOCAL_BANKS], r1[LOCAL_BANKS]
    # K-means stays near its start (the weighted mean): one Lloyd step moves each centroid
    # to the mean of its members, all within the two clients' prototypes' hull
    local = algo.local_names[-1]
    start = 0.25 * r0[local] + 0.75 * r1[local]
    glob = new[local.replace("local_", "global_")]
    assert glob.shape == start.shape
    assert (glob - start).norm(dim=1).max() <= (r0[local] - r1[local]).norm(dim=1).max() + 1e-4


@pytest.mark.integration
def test_torch_and_sklearn_server_kmeans_give_the_same_global_prototypes() -> None:
    """The server step with `kmeans_backend` torch (default) and sklearn (float64) on three
    clients' trained banks: the same global prototypes to float32 rounding."""
    model = _model()
    banks = {}
    for backend in ("torch", "sklearn"):
        algo = build_algorithm("fedali", {"kmeans_backend": backend}, _setting(_model()))
        server = algo.init_server()
        msg = algo.configure(server, 0, 2)
        replies = [
            Reply(c, algo.fit(_client(model, c), msg, {}).reply, {}, float(10 + c))
            for c in range(3)
        ]
        banks[backend] = algo.aggregate(server, iter(replies), 2).server[GLOBAL_BANKS]
    for name, bank in banks["torch"].items():
        assert torch.allclose(bank, banks["sklearn"][name], atol=1e-5, rtol=0)


# a short real run ---------------------------------------------------------------------------
@pytest.mark.integration
def test_fedali_runs_on_uci_har(shared_data, tmp_path) -> None:
    """Real UCI-HAR windows (every third) of 4 subjects, 6 channels (total acc + body gyro)."""
    path = uci_har_slice(tmp_path / "uci_har_4.npz", [1, 3, 5, 6], every=3)
    cfg = load_config(
        None,
        [
            "data.name=arrays",
            f"data.path={path}",
            "data.partition=natural",
            "model.name=hart",
            "model.alp.enabled=true",
            "model.alp.prototypes=[16,16,8,8,4,4]",
            "train.rounds=2",
            "train.local_epochs=1",
            "train.batch_size=32",
            "train.optimizer=adam",
            "train.lr=0.002",
            "train.threads=1",
            "eval.every=2",
            "eval.batch_size=256",
            "algorithm.name=fedali",
            "algorithm.kmeans_iters=10",
        ],
    )
    summary = simulate(prepare(cfg)).run()
    final = summary.final
    assert final is not None
    assert summary.rounds == 2
    assert final.personalization.acc > 0.3  # 6 classes: chance is about 0.17
    assert final.generalization is not None and final.generalization.acc > 0.3
    assert final.global_ is not None and final.global_.acc > 0.3
    # up: weights + local prototypes; down: weights + global prototypes + 12 scalars (beta,
    # gamma of the 6 layers): the same size but for those scalars, for the 4 clients
    comm = summary.comm
    assert comm.down_bytes_per_round - comm.up_bytes_per_round == 4 * 12 * 4
    protos = sum(g * 192 * 4 for g in [16, 16, 8, 8, 4, 4])
    assert comm.up_bytes_per_round > 4 * protos


# the official trainer's defaults ------------------------------------------------------------
def _starting_weights(client: Client) -> dict[str, torch.Tensor]:
    """Capture the weights a client holds when its local training starts."""
    seen: dict[str, torch.Tensor] = {}
    train = client.train_model

    def capture():
        seen.update({k: v.clone() for k, v in client.weights().items()})
        return train()

    client.train_model = capture  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("rule", ["reset", "keep"])
def test_reset_starts_every_round_from_the_received_global_banks(rule: str) -> None:
    """`local_banks=reset` (the official usePersonalPrototype = False): round 1 from the
    server's initial local banks, every later round with local = the global banks received,
    whatever the client trained before; `keep` from the client's own trained banks."""
    model = _model()
    algo = build_algorithm("fedali", {"local_banks": rule, "kmeans_iters": 2}, _setting(model))
    server = algo.init_server()
    assert set(server) == {"model", GLOBAL_BANKS} | ({LOCAL_BANKS} if rule == "reset" else set())
    init, first = algo.setting.init_model, algo.configure(server, 0, 1)
    start = _starting_weights(client := _client(model, 0))
    results = [algo.fit(client, first, {}), algo.fit(_client(model, 1), first, {})]
    assert all(torch.equal(start[n], init[n]) for n in algo.local_names)
    replies = iter([Reply(c, r.reply, {}, 10.0) for c, r in enumerate(results)])
    new = algo.aggregate(server, replies, 1).server
    assert set(new) == set(server)
    second = algo.configure(new, 0, 2)
    assert set(second) == {"model", GLOBAL_BANKS, SCALARS}  # initial local banks: round 1 only
    start = _starting_weights(client := _client(model, 0, 2))
    kept = results[0].state[LOCAL_BANKS]
    trained = algo.fit(client, second, results[0].state)
    for local, glob in zip(algo.local_names, algo.global_names, strict=True):
        want = second[GLOBAL_BANKS][glob] if rule == "reset" else kept[local]
        assert torch.equal(start[local], want)
        assert torch.equal(algo.client_model(second, results[0].state)[local], want)
        # scored right after training: the banks training left, under either rule
        after = algo.trained_model(second, trained)[local]
        assert torch.equal(after, trained.state[LOCAL_BANKS][local])
        assert not torch.equal(after, want)


def test_single_update_moves_only_each_tokens_argmax_prototype() -> None:
    """`update="single"` (the official layer's default from scratch): the local prototypes
    that some token picked (argmax of its row of the local plan) move, each to gamma P +
    (1 - gamma) x of the last token that picked it; no other prototype moves."""
    g = 40  # more prototypes than the 20 tokens: some are nobody's
    layer = _layer(g, update="single").train()
    x = _tokens()
    flat = x.reshape(-1, D)
    before = layer.local_prototypes.clone()
    banks = torch.cat([layer.local_prototypes, layer.global_prototypes])
    picked = layer.plan(flat, banks)[:, :g].argmax(1)
    layer(x)
    moved = (layer.local_prototypes != before).any(1).nonzero().flatten()
    assert set(moved.tolist()) == set(picked.tolist())
    assert len(moved) <= len(flat)  # one prototype per token at most
    gamma = float(layer.gamma)
    for j in moved.tolist():
        last = int((picked == j).nonzero().max())
        want = gamma * before[j] + (1 - gamma) * flat[last]
        assert torch.allclose(layer.local_prototypes[j], want, atol=1e-6)
    topk = _layer(g).train()
    topk(x)
    assert (topk.local_prototypes != before).any(1).all()  # the paper's rule moves every one


def test_normalize_only_layers_have_no_prototypes_and_normalise_each_token() -> None:
    """`model.alp.normalize_only=true`: FedAvg's control with the ALP layers' L2
    normalisation alone; the plain backbone's weights, no banks, not batch-dependent."""
    alp = {"enabled": True, "normalize_only": True}
    model = build_model(ModelConfig(name="hart", alp=alp), (6, 128), 6)
    plain = build_model(ModelConfig(name="hart"), (6, 128), 6)
    assert not alp_layers(model) and not model.batch_dependent
    assert set(model.state_dict()) == set(plain.state_dict())
    layer = model.features.blocks[0].alp
    tokens = torch.randn(2, 8, 192) * 3
    assert torch.allclose(layer(tokens), F.normalize(tokens, dim=-1))
    assert torch.allclose(layer(tokens).norm(dim=-1), torch.ones(2, 8), atol=1e-6)
    with pytest.raises(ConfigError, match="model.alp.enabled"):
        build_algorithm("fedali", {}, _setting(model))


def test_hart_options_build_the_official_attention_and_keep_the_defaults() -> None:
    torch.manual_seed(0)
    default = build_model(ModelConfig(name="hart"), (6, 128), 6)
    attn = default.features.blocks[0].attn_acc
    assert attn.qkv.weight.shape == (3 * 48, 48) and attn.dropout == 0.0  # 3 heads x 16
    official = {
        "head_dim": 48,
        "attention_dropout": 0.3,
        "mlp_dropout": 0.3,
        "mlp_activation": "swish",
        "embedding_activation": "swish",
    }
    model = build_model(ModelConfig(name="hart", hart=official), (6, 128), 6)
    block = model.features.blocks[0]
    assert block.attn_acc.qkv.weight.shape == (3 * 144, 48)  # 3 heads x 48
    assert block.attn_gyro.out.weight.shape == (48, 144) and block.attn_acc.dropout == 0.3
    assert isinstance(block.mlp[1], torch.nn.SiLU)
    assert block.mlp[2].p == 0.3 and block.mlp[4].p == 0.0  # after the hidden layer only
    assert isinstance(model.features.embed_activation, torch.nn.SiLU)
    assert set(model.state_dict()) == set(default.state_dict())
    assert model.eval()(torch.randn(3, 6, 128)).shape == (3, 6)


@pytest.mark.integration
def test_the_official_preset_runs_one_round_on_real_data(shared_data, tmp_path) -> None:
    """configs/fedali_official.yaml through the CLI for one round, on real UCI-HAR windows
    of 4 subjects (every sixth) and small banks, one local epoch: seconds."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from protofed.cli import app

    path = uci_har_slice(tmp_path / "uci_har_4.npz", [1, 3, 5, 6], every=6)
    preset = Path(__file__).resolve().parents[2] / "configs" / "fedali_official.yaml"
    small = ["data.name=arrays", f"data.path={path}", "model.alp.prototypes=[16,16,8,8,4,4]"]
    small += ["train.rounds=1", "train.local_epochs=1", "train.workers=1", "train.threads=1"]
    small += ["eval.every=1"]
    out = tmp_path / "run"
    args = ["run", str(preset), "--out", str(out), "-q"]
    result = CliRunner().invoke(app, [*args, *[a for s in small for a in ("-s", s)]])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1
    assert summary["final"]["personalization"]["acc"] is not None
    config = (out / "config.yaml").read_text()
    assert "local_banks: reset" in config and "update: single" in config
