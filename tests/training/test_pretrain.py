"""FedAli's MAE pre-training (`protofed pretrain`) and `model.init`, on the real HAR windows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from typer.testing import CliRunner

from protofed.cli import app
from protofed.config import load_config
from protofed.errors import ConfigError
from protofed.nn.alp import GLOBAL, LOCAL
from protofed.runtime.prepare import build_model_and_algorithm
from protofed.training.pretrain import (
    Pretraining,
    is_encoder_key,
    read_checkpoint,
    save_checkpoint,
    state_path,
)

# every test pretrains or reads real data: all of them integration
pytestmark = pytest.mark.integration

runner = CliRunner()
CONFIG = "configs/fedali_hhar_natural.yaml"
SMALL = [  # the paper's HART (6 blocks, d = 192) with small prototype banks, 200 windows
    "model.alp.prototypes=[32,16,16,16,16,16]",
    "pretrain.max_windows=100",
    "pretrain.batch_size=50",
    "train.threads=1",
]


def _config(data: Path, *extra: str):
    return load_config(CONFIG, [f"data.dir={data}", *SMALL, *extra])


def _sets(args: list[str]) -> list[str]:
    return [a for item in args for a in ("-s", item)]


@pytest.fixture(scope="module")
def checkpoint(shared_data: Path, tmp_path_factory) -> Path:
    """One epoch of `protofed pretrain` through the command line."""
    out = tmp_path_factory.mktemp("pretrain") / "hhar.safetensors"
    result = runner.invoke(
        app,
        ["pretrain", CONFIG, *_sets(SMALL), "-s", "pretrain.epochs=1", "--out", str(out)]
        + ["--data-dir", str(shared_data), "-q"],
    )
    assert result.exit_code == 0, result.output
    assert "uci_har 100, wisdm 100" in result.output  # the target (hhar) is left out
    return out


def test_mae_reduces_the_reconstruction_loss_on_real_windows(shared_data: Path) -> None:
    job = Pretraining.build(_config(shared_data, "pretrain.epochs=4"))
    assert job.pool.counts == {"uci_har": 100, "wisdm": 100}
    assert job.mae.num_mask == 4  # the official 0.6 of 8 tokens, floored
    x = job.pool.x[::2]
    banks = {k: v.clone() for k, v in job.model.state_dict().items() if k.endswith(LOCAL)}
    before = job.evaluate(x, seed=1)
    losses = job.run()
    after = job.evaluate(x, seed=1)
    assert after < 0.5 * before, (before, after, losses)
    assert losses[-1] < 0.75 * losses[0]
    # the ALP layers' local prototypes moved by their EMA (training mode)
    for k, v in job.model.state_dict().items():
        if k.endswith(LOCAL):
            assert not torch.equal(v, banks[k]), k


def test_model_init_loads_every_encoder_tensor_and_prototype_bank(
    checkpoint: Path, shared_data: Path
) -> None:
    tensors, meta = read_checkpoint(checkpoint)
    assert meta["target"] == "hhar" and meta["datasets"] == {"uci_har": 100, "wisdm": 100}
    cfg = _config(shared_data, f"model.init={checkpoint}")
    scratch_cfg = _config(shared_data)
    model, algorithm = build_model_and_algorithm(cfg, (3, 128), 6, 9, torch.device("cpu"))
    scratch, _ = build_model_and_algorithm(scratch_cfg, (3, 128), 6, 9, torch.device("cpu"))
    state, fresh = model.state_dict(), scratch.state_dict()
    encoder = [k for k in state if is_encoder_key(k)]
    assert sorted(encoder) == sorted(tensors)  # every encoder tensor, nothing else
    assert sum(k.endswith(LOCAL) for k in tensors) == 6  # one bank per block
    for key in encoder:
        assert torch.equal(state[key], tensors[key]), key
        assert not torch.equal(state[key], fresh[key]) or key.endswith("norm.bias"), key
    for key in (k for k in state if k.endswith(GLOBAL)):  # global banks = pre-trained local
        assert torch.equal(state[key], tensors[key[: -len(GLOBAL)] + LOCAL]), key
    for key in (k for k in state if not is_encoder_key(k) and not k.endswith(GLOBAL)):
        assert torch.equal(state[key], fresh[key]), key  # 1024-unit layer, head: as from scratch
    server = algorithm.init_server()  # FedAli: the pre-trained local prototypes go out as global
    for key, bank in server["global"].items():
        assert torch.equal(bank, tensors[key[: -len(GLOBAL)] + LOCAL]), key
    for key, bank in algorithm.initial_local().items():
        assert torch.equal(bank, tensors[key]), key


def test_checkpoints_are_safetensors_and_legacy_torch_files_still_load(
    checkpoint: Path, tmp_path: Path
) -> None:
    raw = checkpoint.read_bytes()
    header = int.from_bytes(raw[:8], "little")  # safetensors: u64 header size, JSON header
    assert json.loads(raw[8 : 8 + header])["__meta__"]["dtype"] == "U8"
    tensors, meta = read_checkpoint(checkpoint)
    legacy = tmp_path / "legacy.pt"  # what versions without safetensors wrote
    torch.save(
        {**tensors, "__meta__": torch.tensor(list(json.dumps(meta).encode()), dtype=torch.uint8)},
        legacy,
    )
    again, meta_again = read_checkpoint(legacy)
    assert meta_again == meta and again.keys() == tensors.keys()
    assert all(torch.equal(again[k], tensors[k]) for k in tensors)
    pickled = tmp_path / "object.pt"  # anything beyond tensors is refused, never unpickled
    torch.save({"x": Path("/")}, pickled)
    with pytest.raises(ConfigError, match="not a protofed pretrain checkpoint"):
        read_checkpoint(pickled)


def _one_line(result) -> str:
    text = (result.stderr or result.output).strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1, (result.exit_code, text)
    return text


def test_a_bad_init_file_is_one_line_exit_2(
    checkpoint: Path, shared_data: Path, tmp_path: Path
) -> None:
    tensors, _ = read_checkpoint(checkpoint)
    name = "features.blocks.2.mlp.0.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    bad = save_checkpoint(tmp_path / "bad.safetensors", tensors)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a checkpoint")
    base = ["run", CONFIG, *_sets(SMALL[:1]), "--data-dir", str(shared_data), "-q"]
    base += ["--out", str(tmp_path / "r")]
    cases = {
        tmp_path / "missing.safetensors": "file not found",
        bad: f"tensor '{name}' is (384, 191)",
        garbage: "model.init",
    }
    for path, expected in cases.items():
        line = _one_line(runner.invoke(app, [*base, "-s", f"model.init={path}"]))
        assert expected in line, line
    # a model without ALP layers cannot take a checkpoint that has them
    line = _one_line(
        runner.invoke(
            app, [*base, "-s", f"model.init={checkpoint}", "-s", "model.alp.enabled=false"]
        )
    )
    assert "alp" in line
    # a model other than HART: the key to change is model.name
    line = _one_line(
        runner.invoke(
            app,
            [*base, "-s", f"model.init={checkpoint}", "-s", "model.name=mlp"]
            + ["-s", "model.alp.enabled=false"],
        )
    )
    assert "model.name=hart" in line, line
    # metadata that is not the JSON protofed writes
    tensors, _ = read_checkpoint(checkpoint)
    for i, meta in enumerate((torch.tensor([0xFF, 0xFE], dtype=torch.uint8), torch.ones(3))):
        odd = save_checkpoint(tmp_path / f"meta{i}.safetensors", {**tensors, "__meta__": meta})
        line = _one_line(runner.invoke(app, [*base, "-s", f"model.init={odd}"]))
        assert "__meta__" in line, line
    assert not (tmp_path / "r").exists()


def test_bad_pretrain_data_sets_name_their_key(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.safetensors"
    base = ["pretrain", CONFIG, *_sets(SMALL), "--out", str(out), "--data-dir", str(shared_data)]
    for value in ("[nope]", "[]"):
        line = _one_line(runner.invoke(app, [*base, "-s", f"pretrain.datasets={value}"]))
        assert "pretrain.datasets" in line, line
    assert not out.exists()


def test_an_unwritable_out_is_refused_before_training(tmp_path: Path) -> None:
    """Hours of pre-training must not end in "cannot write": the target is probed first."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    base = ["pretrain", CONFIG, *_sets(SMALL), "--data-dir", str(tmp_path / "no_data")]
    for out, expected in (
        (tmp_path, "is a folder"),
        (a_file / "x.safetensors", "is a file"),
        (Path("/proc/protofed/x.safetensors"), "cannot write"),
    ):
        line = _one_line(runner.invoke(app, [*base, "--force", "--out", str(out)]))
        assert expected in line, line  # not the missing data: the out is checked first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_labels_are_never_read(shared_data: Path, tmp_path: Path) -> None:
    """The same checkpoint when every label of the pooled sets is garbage (random classes)."""
    garbage = tmp_path / "data"
    (garbage / "har").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("wisdm.npz", "hhar_sa.npz"):
        d = dict(np.load(shared_data / "har" / name))
        classes = int(d["y"].max()) + 1  # labels out of range are refused by the loader
        d["y"] = rng.integers(0, classes, size=len(d["y"])).astype(d["y"].dtype)
        np.savez(garbage / "har" / name, **d)
    shutil.copy(shared_data / "har" / "uci_har.npz", garbage / "har" / "uci_har.npz")
    target = ["data.name=uci_har", "data.channels=[total_acc_x,total_acc_y,total_acc_z]"]
    out = {}
    for label, root in (("real", shared_data), ("garbage", garbage)):
        job = Pretraining.build(_config(root, *target, "pretrain.epochs=1"))
        assert job.pool.counts == {"wisdm": 100, "hhar": 100}
        job.run()
        out[label] = job.checkpoint()
    for key, value in out["real"].items():
        if key != "__meta__":
            assert torch.equal(value, out["garbage"][key]), key


def test_the_init_file_is_part_of_the_fingerprint(
    checkpoint: Path, shared_data: Path, tmp_path: Path
) -> None:
    from protofed.errors import ConfigError
    from protofed.runtime.fingerprint import check_fingerprint, fingerprint
    from protofed.runtime.prepare import prepare

    init = tmp_path / "init.safetensors"
    shutil.copy(checkpoint, init)
    prepared = prepare(_config(shared_data, f"model.init={init}"))
    saved = fingerprint(prepared)
    assert "pretrain.epochs" not in saved["config"] and "init" in saved
    tensors, _ = read_checkpoint(init)
    tensors["features.pos"] = tensors["features.pos"] + 1
    save_checkpoint(init, tensors)
    with pytest.raises(ConfigError, match="model.init"):
        check_fingerprint(saved, fingerprint(prepared), tmp_path, 3)


def test_a_combined_federation_pretrains_on_the_sets_outside_it(shared_data: Path) -> None:
    from protofed.training.pretrain import pooled_windows

    cfg = _config(shared_data, "data.name=har_combined", "data.members=[hhar,wisdm]")
    assert pooled_windows(cfg).counts == {"uci_har": 100}  # never a member's windows
    cfg = _config(shared_data, "data.name=har_combined", "pretrain.datasets=[uci_har,wisdm]")
    with pytest.raises(ConfigError, match="includes the target data set 'wisdm'"):
        pooled_windows(cfg)


def test_the_python_pretrain_writes_what_the_command_line_writes(
    checkpoint: Path, shared_data: Path, tmp_path: Path
) -> None:
    """`protofed.pretrain` is the command's code path: the same config gives the same
    tensors; an existing file is kept unless `overwrite`."""
    import protofed

    epochs, described = [], []
    out = protofed.pretrain(
        _config(shared_data, "pretrain.epochs=1"),
        tmp_path / "py.safetensors",
        on_epoch=lambda epoch, loss: epochs.append(epoch),
        on_start=described.append,
    )
    assert epochs == [1] and "uci_har 100, wisdm 100" in described[0]
    ours, theirs = read_checkpoint(out)[0], read_checkpoint(checkpoint)[0]
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(ConfigError, match="exists"):
        protofed.pretrain(_config(shared_data), out)


def _stop_after(last: int):
    def on_epoch(epoch: int, loss: float) -> None:
        if epoch == last:
            raise KeyboardInterrupt

    return on_epoch


def _same(a: Path, b: Path) -> bool:
    (ours, ours_meta), (theirs, theirs_meta) = read_checkpoint(a), read_checkpoint(b)
    return (
        ours.keys() == theirs.keys()
        and all(torch.equal(ours[k], theirs[k]) for k in ours)
        and ours_meta["losses"] == theirs_meta["losses"]
    )


def test_an_interrupted_pretraining_resumes_to_the_checkpoint_of_an_uninterrupted_one(
    shared_data: Path, tmp_path: Path
) -> None:
    """The state kept after each epoch holds everything that moves (decoder, optimizer
    moments, random streams): stopped after epoch 1 or 2 of 2 and resumed, the checkpoint
    is the uninterrupted one tensor for tensor, and the state is gone at the end."""
    import protofed

    cfg = _config(shared_data, "pretrain.epochs=2")
    whole = protofed.pretrain(cfg, tmp_path / "whole.safetensors")
    described: list[str] = []
    epochs: list[int] = []
    for last in (1, 2):  # 2: stopped after the last epoch's state, before the checkpoint
        out = tmp_path / f"cut{last}.safetensors"
        with pytest.raises(KeyboardInterrupt):
            protofed.pretrain(cfg, out, on_epoch=_stop_after(last))
        assert not out.exists() and state_path(out).is_file()
        with pytest.raises(ConfigError, match="unfinished pre-training: continue it with --resume"):
            protofed.pretrain(cfg, out)
        described.clear()
        epochs.clear()
        protofed.pretrain(
            cfg, out, resume=True, on_start=described.append, on_epoch=lambda e, _: epochs.append(e)
        )
        assert described[0].endswith(f"resuming after epoch {last}")
        assert epochs == ([2] if last == 1 else [])  # after the last: nothing left to train
        assert _same(out, whole) and not state_path(out).exists()
    # complete: nothing to train, unless the settings differ
    assert protofed.pretrain(cfg, out, resume=True, on_start=described.append) == out
    assert len(described) == 1
    with pytest.raises(ConfigError, match=r"other settings \(pretrain\.epochs was 2, now 3\)"):
        protofed.pretrain(_config(shared_data, "pretrain.epochs=3"), out, resume=True)
    # --force starts over, even from a kept state
    with pytest.raises(KeyboardInterrupt):
        protofed.pretrain(cfg, out, overwrite=True, on_epoch=_stop_after(1))
    with pytest.raises(ConfigError, match="--force starts over and --resume continues"):
        protofed.pretrain(cfg, out, overwrite=True, resume=True)
    protofed.pretrain(cfg, out, overwrite=True)
    assert _same(out, whole) and not state_path(out).exists()


def test_resume_refuses_other_settings_and_a_bad_state_in_one_line(
    shared_data: Path, tmp_path: Path
) -> None:
    import protofed

    out = tmp_path / "e.safetensors"
    with pytest.raises(KeyboardInterrupt):
        protofed.pretrain(_config(shared_data, "pretrain.epochs=2"), out, on_epoch=_stop_after(1))
    args = ["pretrain", CONFIG, *_sets(SMALL), "-s", "pretrain.epochs=2", "--out", str(out)]
    args += ["--data-dir", str(shared_data), "--resume", "-q"]
    for extra, expected in (
        (["-s", "pretrain.lr=0.001"], "pretrain.lr was 0.0005, now 0.001"),
        (["-s", "pretrain.max_windows=90"], "pretrain.max_windows was 100, now 90"),
    ):
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 2, result.output
        assert expected in result.output and len(result.output.strip().splitlines()) == 1
    # an edited state: a moment taken out
    original = safetensors.torch.load_file(state_path(out))
    tensors = dict(original)
    del tensors[next(k for k in tensors if k.endswith(".exp_avg_sq"))]
    safetensors.torch.save_file(tensors, state_path(out))
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "optimizer's moments of parameter" in result.output
    safetensors.torch.save_file(original, state_path(out))
    # where and how fast it runs may change: train.* is not what it computes
    assert runner.invoke(app, [*args, "-s", "train.rounds=7"]).exit_code == 0
    state_path(out).write_bytes(b"not safetensors")
    out.unlink()
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert f"{state_path(out)} is not a protofed pretrain checkpoint" in result.output
    assert not out.exists()
