"""The evaluation protocol's arithmetic and its round-selection rule."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from protofed.core.results import RoundRecord, SampleSizes
from protofed.evaluation import per_segment_scores, select_global_round, select_round


def test_per_client_scores_match_scikit_learn():
    rng = np.random.default_rng(0)
    n, c = 7, 5
    owner = np.sort(rng.integers(0, n, 400))
    owner[:3] = 3  # client 3 certainly has data; some others may have none
    y = rng.integers(0, c, len(owner))
    y[owner == 2] = rng.choice([0, 4], (owner == 2).sum())  # a client with two classes only
    pred = np.where(rng.random(len(y)) < 0.6, y, rng.integers(0, c, len(y)))
    pred[owner == 1] = -1  # a client that was not predicted counts as all wrong
    acc, f1 = per_segment_scores(y, pred, owner, n, c)
    for i in range(n):
        mine = owner == i
        if not mine.any():
            assert np.isnan(acc[i]) and np.isnan(f1[i])
            continue
        labels = np.unique(y[mine])
        ref = f1_score(y[mine], pred[mine], labels=labels, average="macro", zero_division=0)
        assert f1[i] == pytest.approx(ref)
        assert acc[i] == pytest.approx(accuracy_score(y[mine], pred[mine]))


def test_f1_labels_rules_differ_where_a_client_predicts_a_class_it_lacks():
    """Client 0 has classes 0 and 1 and predicts 2 once: `true` averages over {0, 1}, `union`
    over {0, 1, 2} (class 2's F1 is 0). Client 1 predicts only its own classes: no difference."""
    y = np.array([0, 0, 1, 1, 0, 1, 2, 2])
    pred = np.array([0, 0, 1, 2, 0, 1, 2, 2])
    owner = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    _, true = per_segment_scores(y, pred, owner, 2, 3)
    _, union = per_segment_scores(y, pred, owner, 2, 3, labels="union")
    mine = owner == 0
    assert true[0] == pytest.approx((1 + 2 / 3) / 2)  # class 0: 1, class 1: 2/3
    assert union[0] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert true[0] == pytest.approx(
        f1_score(y[mine], pred[mine], labels=np.unique(y[mine]), average="macro")
    )
    assert union[0] == pytest.approx(f1_score(y[mine], pred[mine], average="macro"))
    assert true[1] == union[1] == pytest.approx(f1_score(y[~mine], pred[~mine], average="macro"))


def test_union_rule_matches_scikit_learns_default_per_client():
    rng = np.random.default_rng(1)
    n, c = 6, 5
    owner = np.sort(rng.integers(0, n, 300))
    y = rng.integers(0, 3, len(owner))  # the clients have classes 0..2 ...
    pred = np.where(rng.random(len(y)) < 0.5, y, rng.integers(0, c, len(y)))  # ... predict 0..4
    _, f1 = per_segment_scores(y, pred, owner, n, c, labels="union")
    for i in range(n):
        mine = owner == i
        if mine.any():
            ref = f1_score(y[mine], pred[mine], average="macro", zero_division=0)
            assert f1[i] == pytest.approx(ref)


def test_a_bare_yaml_true_names_the_f1_rule():
    from protofed.config import load_config
    from protofed.errors import ConfigError

    assert load_config(None, ["eval.f1_labels=true"]).eval.f1_labels == "true"
    assert load_config(None, ["eval.f1_labels=union"]).eval.f1_labels == "union"
    assert load_config(None, []).eval.f1_labels == "true"
    with pytest.raises(ConfigError, match="eval.f1_labels"):
        load_config(None, ["eval.f1_labels=false"])


def _rec(r, val, test, glob=None):
    record = {"round": r, "val": {"f1": val, "acc": val}, "personalization": {"acc": test}}
    glob = None if glob is None else {"acc": glob, "f1": glob}
    return RoundRecord.from_json({**record, "global": glob})


def test_selection_rules():
    history = [_rec(1, 0.5, 0.9), _rec(2, 0.7, 0.6), _rec(3, 0.6, 0.7)]
    assert select_round(history, "val").round == 2
    assert select_round(history, "best_test").round == 1
    assert select_round(history, "last").round == 3
    no_val = [_rec(1, float("nan"), 0.9), _rec(2, float("nan"), 0.6)]
    assert select_round(no_val, "val").round == 2


def test_best_test_takes_the_global_score_from_the_global_models_own_best_round():
    history = [_rec(1, 0.5, 0.9, 0.4), _rec(2, 0.7, 0.6, 0.8), _rec(3, 0.6, 0.7, None)]
    assert select_round(history, "best_test").round == 1
    assert select_global_round(history, "best_test").round == 2
    assert select_global_round(history, "val").round == 2  # the rule's own round
    assert select_global_round(history, "last").round == 3
    no_global = [_rec(1, 0.5, 0.9), _rec(2, 0.7, 0.6)]
    assert select_global_round(no_global, "best_test").global_ is None


def test_a_global_model_shared_by_the_clients_is_predicted_once_with_the_same_scores(
    digits_clients,
):
    """FedAvg's clients all hold the global model: its test predictions serve both the
    personalization and the global scores, which must equal those of a separate copy."""
    import torch

    from protofed.config import ModelConfig
    from protofed.data.federated import FederatedData
    from protofed.evaluation import Evaluator
    from protofed.models import build_model

    clients = digits_clients(150)
    fed = FederatedData(
        "digits",
        10,
        [str(i) for i in range(10)],
        (64,),
        "tabular",
        clients,
        np.zeros((2, 10), dtype=np.int64),
    )
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=[16]), (64,), 10)
    shared = {k: v.clone() for k, v in model.state_dict().items()}
    copy = {k: v.clone() for k, v in shared.items()}
    evaluator = Evaluator(fed, model)
    calls = []
    evaluator.predict_on = _counting(evaluator, calls)
    once = evaluator.evaluate(lambda i: shared, shared)
    assert calls == [len(evaluator.test.y), len(evaluator.val.y)]  # test and val, once each
    twice = evaluator.evaluate(lambda i: shared, copy)  # an equal model in other tensors
    assert len(calls) == 5  # ... is predicted again
    assert once.global_ == twice.global_ and once.personalization == twice.personalization
    assert 0.0 < once.global_.acc < 1.0


def _counting(evaluator, calls: list[int]):
    """`evaluator.predict_on`, recording how many inputs each call predicts."""
    predict = evaluator.predict_on

    def spy(weights, split, lo=0, hi=None, body=None):
        calls.append(len(evaluator._inputs(split)[lo:hi]))
        return predict(weights, split, lo, hi, body)

    return spy


def _two_client_setup(digits_clients):
    """Two real digits clients and two different mlp models (one per client)."""
    import torch

    from protofed.config import ModelConfig
    from protofed.data.federated import FederatedData
    from protofed.models import build_model

    fed = FederatedData(
        "digits",
        10,
        [str(i) for i in range(10)],
        (64,),
        "tabular",
        digits_clients(300),
        np.zeros((2, 10), dtype=np.int64),
    )
    weights = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model(ModelConfig(name="mlp", hidden=[16]), (64,), 10)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    return fed, model, weights


def test_the_generalization_sample_is_stratified_and_fixed_by_the_seed():
    from protofed.evaluation import stratified_sample

    y = np.repeat(np.arange(5), [400, 250, 120, 33, 7])
    rng = np.random.default_rng(1)
    y = y[rng.permutation(len(y))]
    for size in (1, 17, 100, 333, 809):
        idx = stratified_sample(y, size, np.random.default_rng(7))
        assert len(idx) == size and len(np.unique(idx)) == size and np.all(np.diff(idx) > 0)
        got = np.bincount(y[idx], minlength=5)
        want = np.bincount(y, minlength=5) * size / len(y)
        assert np.all(np.abs(got - want) < 1), (size, got, want)
    same = stratified_sample(y, 100, np.random.default_rng(7))
    assert np.array_equal(same, stratified_sample(y, 100, np.random.default_rng(7)))
    assert not np.array_equal(same, stratified_sample(y, 100, np.random.default_rng(8)))


def test_generalization_size_rule():
    from protofed.evaluation import GENERALIZATION_CAP, generalization_size

    assert generalization_size(None, 500) == 500
    assert generalization_size(None, GENERALIZATION_CAP + 1) == GENERALIZATION_CAP
    assert generalization_size(0, 10**6) == 10**6
    assert generalization_size(40, 500) == 40
    assert generalization_size(500, 500) == generalization_size(900, 500) == 500


def test_a_sample_of_the_whole_union_gives_the_whole_union_scores(digits_clients):
    from protofed.evaluation import Evaluator

    fed, model, weights = _two_client_setup(digits_clients)
    reference = Evaluator(fed, model).evaluate(weights.__getitem__, weights[0])
    union = sum(len(c.test_y) for c in fed.clients)
    assert reference.samples == SampleSizes(test=union, generalization=union)
    for setting in (0, union, union + 5):
        got = Evaluator(fed, model, generalization_samples=setting, seed=3).evaluate(
            weights.__getitem__, weights[0]
        )
        assert got == reference


def test_a_sample_changes_generalization_only(digits_clients):
    """Personalization, validation and the global score stay on the whole splits; the sample
    is drawn once per seed, so two evaluators with one seed give the same scores."""
    from protofed.evaluation import Evaluator

    fed, model, weights = _two_client_setup(digits_clients)
    whole = Evaluator(fed, model).evaluate(weights.__getitem__, weights[0])
    first = Evaluator(fed, model, generalization_samples=40, seed=3)
    sampled = first.evaluate(weights.__getitem__, weights[0])
    assert sampled.samples == SampleSizes(test=whole.samples.test, generalization=40)
    for key in ("personalization", "val", "global_"):
        assert getattr(sampled, key) == getattr(whole, key), key
    for key in ("pers_acc", "pers_f1", "val_acc", "val_f1"):
        assert getattr(sampled.clients, key) == getattr(whole.clients, key), key
    assert np.bincount(first.gen_y, minlength=10).sum() == 40
    again = Evaluator(fed, model, generalization_samples=40, seed=3)
    assert np.array_equal(again.gen_index, first.gen_index)
    assert again.evaluate(weights.__getitem__, weights[0]) == sampled
    other = Evaluator(fed, model, generalization_samples=40, seed=4)
    assert not np.array_equal(other.gen_index, first.gen_index)
    # a model shared by both clients (FedAvg) is scored on the same sample
    shared = first.evaluate(lambda i: weights[0], weights[0])
    assert shared.clients.gen_acc == [sampled.clients.gen_acc[0]] * 2


def test_personalized_models_predict_the_validation_union_never(digits_clients):
    """With generalization, each client's own model predicts the whole test union (its
    generalization score) but only its own validation split: validation has no generalization
    score. The scores are those of predicting both unions and slicing."""
    import torch

    from protofed.config import ModelConfig
    from protofed.data.federated import FederatedData
    from protofed.evaluation import Evaluator, per_segment_scores
    from protofed.models import build_model

    clients = digits_clients(150)
    n = len(clients)
    fed = FederatedData(
        "digits", 10, [str(i) for i in range(10)], (64,), "tabular", clients, np.zeros((2, 10))
    )
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mlp", hidden=[16]), (64,), 10)
    models = []
    for _ in range(n):
        models.append({k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items()})
    evaluator = Evaluator(fed, model)
    calls = []
    predict = evaluator.predict_on
    evaluator.predict_on = _counting(evaluator, calls)
    scores = evaluator.evaluate(lambda i: models[i], None)
    own_val = [hi - lo for lo, hi in evaluator.val.bounds]
    assert calls == [c for i in range(n) for c in (len(evaluator.test.y), own_val[i])]
    # the old way: every model on both unions, each client's slice of its own predictions
    val_pred = np.concatenate(
        [predict(models[i], "val")[lo:hi] for i, (lo, hi) in enumerate(evaluator.val.bounds)]
    )
    acc, f1 = per_segment_scores(evaluator.val.y, val_pred, evaluator.val.owner, n, 10)
    assert scores.clients.val_acc == acc.tolist()
    assert scores.clients.val_f1 == f1.tolist()
    evaluator.generalization = False
    assert evaluator.evaluate(lambda i: models[i], None).val == scores.val


def test_models_that_share_a_body_embed_it_once_with_the_same_scores(digits_clients):
    """FedRep's clients hold the server's body with their own heads: the body runs once per
    split for all of them, and every score equals that of running each model whole."""
    import torch

    from protofed.evaluation import Evaluator

    fed, model, (base, _) = _two_client_setup(digits_clients)
    n = len(fed.clients)
    body = {k: v for k, v in base.items() if k.startswith("features.")}
    generator = torch.Generator().manual_seed(0)
    models = [
        {
            **body,
            **{
                k: v + 0.5 * torch.randn(v.shape, generator=generator)
                for k, v in base.items()
                if k not in body
            },
        }
        for _ in range(n)
    ]
    embedded = []
    hook = model.features.register_forward_hook(lambda m, i, o: embedded.append(len(i[0])))
    try:
        fast = Evaluator(fed, model)
        assert fast.share_bodies
        got = fast.evaluate(models.__getitem__, None)
        once = sum(embedded)
        embedded.clear()
        slow = Evaluator(fed, model)
        slow.share_bodies = False
        want = slow.evaluate(models.__getitem__, None)
    finally:
        hook.remove()
    assert got == want
    assert once == len(fast.test.y) + len(fast.val.y)  # each union once, for both models
    assert sum(embedded) == n * len(fast.test.y) + len(fast.val.y)
    # distinct bodies: nothing shared, the same scores as before
    own = [{**m, **{k: v + 0.01 for k, v in body.items()}} for m in models]
    assert Evaluator(fed, model).evaluate(own.__getitem__, None) == slow.evaluate(
        own.__getitem__, None
    )


def test_a_batch_dependent_model_never_shares_embeddings():
    """FedAli's ALP layers balance over the batch (`inference="batch"`): reusing one pass's
    embeddings for inputs batched otherwise would change predictions."""
    from protofed.config import ModelConfig
    from protofed.evaluation import Evaluator
    from protofed.models import build_model

    def hart(inference: str):
        alp = {"enabled": True, "prototypes": [4] * 6, "inference": inference}
        return build_model(ModelConfig(name="hart", alp=alp), (2, 32), 10)

    assert hart("batch").batch_dependent and not hart("sample").batch_dependent
    assert not build_model(ModelConfig(name="hart"), (2, 32), 10).batch_dependent
    fed = _digits_federation((2, 32))
    assert not Evaluator(fed, hart("batch")).share_bodies  # what the flag is for
    assert Evaluator(fed, hart("sample")).share_bodies


def _digits_federation(shape: tuple[int, ...], clients: int = 5, size: int = 120):
    """scikit-learn's real digits in `clients` slices, reshaped (and for images upsampled to
    16 x 16) to `shape`, split 70/10/20."""
    import torch
    from sklearn.datasets import load_digits

    from protofed.data.federated import ClientData, FederatedData

    X, y = load_digits(return_X_y=True)
    x = torch.tensor(X / 16.0, dtype=torch.float32).reshape(-1, 8, 8)
    if len(shape) == 3:
        x = x.repeat_interleave(2, 1).repeat_interleave(2, 2).unsqueeze(1)
    x = x.reshape(len(x), *shape)
    t = torch.tensor(y, dtype=torch.long)
    out = []
    for i in range(clients):
        xs, ys = x[i * size : (i + 1) * size], t[i * size : (i + 1) * size]
        a, b = int(0.7 * size), int(0.8 * size)
        out.append(ClientData(f"c{i}", None, xs[:a], ys[:a], xs[a:b], ys[a:b], xs[b:], ys[b:]))
    return FederatedData(
        "digits", 10, [str(i) for i in range(10)], shape, "tabular", out, np.zeros((2, 10))
    )


_SHAPES = {"any": (64,), "image": (1, 16, 16), "sensor": (2, 32)}


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore:There is a performance drop")  # HART's attention on CPU
@pytest.mark.parametrize(
    "name", ["mlp", "cnn", "pflcnn", "cnnbn", "cnn1d", "cnn1dbn", "harcnn", "resnet18", "hart"]
)
def test_stacked_models_predict_as_each_model_alone(name):
    """Distinct client models predicting together in one vmapped pass (eval.stacked_models)
    give every score that predicting one model at a time gives; the global model and a pair
    of clients sharing a model are among them."""
    import torch

    from protofed.config import ModelConfig
    from protofed.evaluation import Evaluator
    from protofed.models import MODELS, build_model

    fed = _digits_federation(_SHAPES[MODELS[name].inputs], size=40 if name == "resnet18" else 120)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name), fed.input_shape, 10)
    generator = torch.Generator().manual_seed(1)
    base = model.state_dict()
    models = [
        {
            k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in base.items()
        }
        for _ in range(4)
    ]
    models.append(models[1])  # clients 1 and 4 share a model
    one = Evaluator(fed, model, stacked_models=1).evaluate(models.__getitem__, models[2])
    stacked = Evaluator(fed, model, stacked_models=3)
    assert stacked.stacked_models == 3
    calls: list[int] = []
    predict = stacked.predict_stacked
    stacked.predict_stacked = lambda ms, split: calls.append(len(ms)) or predict(ms, split)
    assert stacked.evaluate(models.__getitem__, models[2]) == one
    assert calls and max(calls) == 3 and sum(calls) >= 4  # 4 distinct models on the union


def test_stacking_is_off_by_default_and_for_batch_dependent_models():
    from protofed.config import ModelConfig
    from protofed.evaluation import Evaluator
    from protofed.models import build_model

    fed = _digits_federation((2, 32))
    assert Evaluator(fed, build_model(ModelConfig(name="cnn1d"), (2, 32), 10)).stacked_models == 1
    alp = {"enabled": True, "prototypes": [4] * 6, "inference": "batch"}
    hart = build_model(ModelConfig(name="hart", alp=alp), (2, 32), 10)
    assert Evaluator(fed, hart, stacked_models=8).stacked_models == 1


@pytest.mark.integration
def test_a_batch_dependent_clients_personalization_does_not_depend_on_the_other_clients():
    """FedAli's ALP layers balance Sinkhorn over the batch: a client's own test and
    validation splits are predicted alone, `batch_size` at a time, so adding clients to the
    federation leaves its personalization and validation scores as they were, even where
    every client holds the same model (which predicts the union for generalization)."""
    import dataclasses

    import torch

    from protofed.config import ModelConfig
    from protofed.evaluation import Evaluator
    from protofed.models import build_model

    fed = _digits_federation((2, 32), clients=4)
    torch.manual_seed(0)
    alp = {"enabled": True, "prototypes": [16] * 6}
    model = build_model(ModelConfig(name="hart", alp=alp), (2, 32), 10).eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for name in weights:
        if name.endswith(".beta"):  # tokens replaced by their prototypes: labels move
            weights[name].fill_(1.0)
    model.load_state_dict(weights)
    # the setting is batch-sensitive: client 1's windows in the union's batches of 10 (which
    # straddle clients 0 and 1) come out otherwise than in batches of its own
    evaluator = Evaluator(fed, model, batch_size=10)
    lo, hi = evaluator.test.bounds[1]
    with torch.no_grad():
        union = torch.cat([model(x) for x in evaluator.test.x.split(10)])[lo:hi]
        alone = torch.cat([model(x) for x in evaluator.test.x[lo:hi].split(10)])
    assert not torch.allclose(union, alone)
    for client in (0, 1):
        own = dataclasses.replace(fed, clients=[fed.clients[client]])
        few = Evaluator(own, model, batch_size=10).evaluate(lambda i: weights, weights)
        many = evaluator.evaluate(lambda i: weights, weights)
        for scores in ("pers_acc", "pers_f1", "val_acc", "val_f1"):
            assert getattr(few.clients, scores)[0] == getattr(many.clients, scores)[client]
