"""The paper's real-GPU runs as experiment configs: ``perseus-train +experiment=sosp24/<run>``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from perseus.apps import train
from perseus.apps.common import register_configs
from perseus.config.validation import to_object
from perseus.models.partition import partition
from perseus.models.zoo import describe

EXPERIMENTS = Path(__file__).resolve().parents[2] / "conf" / "experiment" / "sosp24"

# The Perseus (SOSP '24) artifact's workloads (dp1+pp4+tp1/models_A100.csv and
# dp1+pp8+tp1/models_A40.csv): model, pp, microbatch size, microbatches, published partition.
PUBLISHED = {
    "a100-gpt3-xl": ("gpt3-xl", 4, 8, 128, "custom:0,8,14,21,27"),
    "a100-bert-huge": ("bert-huge-uncased", 4, 8, 32, "custom:0,8,14,20,26"),
    "a100-t5-3b": ("t5-3b", 4, 4, 32, "custom:0,16,33,53,74"),
    "a100-wide-resnet101_8": ("wide-resnet101_8", 4, 64, 24, "custom:0,7,16,25,34"),
    "a100-bloom-3b": ("bloom-3b", 4, 4, 128, "custom:0,10,18,26,32"),
    "a40-gpt3-2.7b": ("gpt3-2.7b", 8, 4, 256, "uniform_transformer"),
    "a40-bert-huge": ("bert-huge-uncased", 8, 8, 32, "uniform_transformer"),
    "a40-t5-3b": ("t5-3b", 8, 4, 32, "custom:0,9,16,24,33,43,53,63,74"),
    "a40-bloom-3b": ("bloom-3b", 8, 4, 128, "custom:0,6,10,14,18,22,26,30,32"),
    "a40-wide-resnet101_8": ("wide-resnet101_8", 8, 32, 48, "custom:0,4,9,13,17,21,25,30,34"),
}


def _compose(experiment: str):
    register_configs()
    with initialize_config_module("perseus.conf", version_base="1.3"):
        return compose("perseus_train", overrides=[f"+experiment=sosp24/{experiment}"])


def test_every_run_has_a_config() -> None:
    assert {p.stem for p in EXPERIMENTS.glob("*.yaml")} == set(PUBLISHED)


@pytest.mark.parametrize("experiment", sorted(PUBLISHED))
def test_experiment_sets_the_published_run(experiment: str) -> None:
    model, pp, mbs, nmb, published = PUBLISHED[experiment]
    cfg = to_object(_compose(experiment))
    assert cfg.model.name == model
    par = cfg.parallelism
    assert (par.pp, par.dp, par.tp, par.microbatch_size, par.num_microbatches) == (
        pp,
        1,
        1,
        mbs,
        nmb,
    )
    assert cfg.framework.name == "merak"
    assert (cfg.profiler.mode, cfg.profiler.warmup_instructions) == ("sweep", 5)
    a100 = experiment.startswith("a100")
    assert cfg.planner.p2p_power_w == (83.64 if a100 else 70.38)
    assert cfg.gpu.emulated.profile is not None
    assert ("a100_sxm" if a100 else "a40") in cfg.gpu.emulated.profile
    text = (EXPERIMENTS / f"{experiment}.yaml").read_text()
    assert f"Published partition_method: {published}" in text
    # The partition is valid for Perseus's layers of the model.
    description = describe(cfg.model)
    parts = partition(description, cfg.model.partition, pp)
    if published.startswith("custom:") and model.startswith(("gpt3", "bert", "bloom")):
        # Same transformer blocks on every stage as the published partition: Merak's GPT shards
        # are wte, wpe, blocks, head (blocks start at shard 2); BERT's and BLOOM's are
        # embedding, blocks, head (blocks start at shard 1), as in Perseus's layers.
        first_block = 2 if model.startswith("gpt3") else 1
        merak = [int(p) for p in published[len("custom:") :].split(",")]
        blocks = description.block_ids
        ours = [sum(parts[s] <= b < parts[s + 1] for b in blocks) for s in range(pp)]
        theirs = [
            len(range(max(merak[s], first_block), min(merak[s + 1], first_block + len(blocks))))
            for s in range(pp)
        ]
        assert ours == theirs


@pytest.mark.parametrize("experiment", sorted(PUBLISHED))
def test_cfg_job_prints_the_experiment(
    experiment: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``perseus-train +experiment=sosp24/<run> --cfg job``, parsed by the console script's own
    entry point in this process (the installed command: ``tests/e2e/test_console_scripts.py``)."""
    monkeypatch.setattr(
        sys, "argv", ["perseus-train", f"+experiment=sosp24/{experiment}", "--cfg", "job"]
    )
    train.main()
    out = capsys.readouterr().out
    model, pp, mbs, nmb, _ = PUBLISHED[experiment]
    lines = (f"name: {model}", f"pp: {pp}", f"microbatch_size: {mbs}", f"num_microbatches: {nmb}")
    assert all(line in out for line in lines)
