"""Model zoo: parameter counts on the meta device, tiny variants train, partition methods."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from perseus.config.schema import ModelConfig
from perseus.errors import ConfigError
from perseus.models.build import build_sequential, count_parameters
from perseus.models.data import synthetic_batch
from perseus.models.losses import loss_fn
from perseus.models.partition import partition
from perseus.models.zoo import describe

CONF = Path(__file__).resolve().parents[3] / "conf" / "model"

# Millions of parameters from the reference system's model table (Merak examples README);
# t5-3b / t5-11b are listed there only as "3B" / "11B": their HF-config counts are used.
REFERENCE_M = {
    "bert-base-uncased": 109.43,
    "bert-large-uncased": 334.95,
    "bert-huge-uncased": 1276.40,
    "gpt3-small": 124.44,
    "gpt3-medium": 354.82,
    "gpt3-large": 758.73,
    "gpt3-xl": 1313.63,
    "gpt3-2.7b": 2648.93,
    "gpt3-6.7b": 6654.21,
    "gpt3-13b": 12848.14,
    "gpt3-39b": 39491.63,
    "gpt3-80b": 80600.16,
    "gpt3-175b": 174591.68,
    "t5-small": 60.51,
    "t5-base": 222.90,
    "t5-large": 737.67,
    "t5-3b": 2851.60,
    "t5-11b": 11307.32,
    "wide-resnet50_2": 68.88,
    "wide-resnet50_4": 223.44,
    "wide-resnet50_8": 804.16,
    "wide-resnet101_2": 126.89,
    "wide-resnet101_4": 419.63,
    "wide-resnet101_8": 1517.37,
    # BigScience's model cards (exact counts: 3,002,557,440 and 176,247,271,424).
    "bloom-3b": 3002.557440,
    "bloom-176b": 176247.271424,
}
TINY = ["gpt3-tiny", "bert-tiny", "t5-tiny", "bloom-tiny", "wide-resnet-tiny"]


def load(name: str) -> ModelConfig:
    merged = OmegaConf.merge(
        OmegaConf.structured(ModelConfig), OmegaConf.load(CONF / f"{name}.yaml")
    )
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, ModelConfig)
    return cfg


def test_every_zoo_yaml_is_covered() -> None:
    names = {p.stem for p in CONF.glob("*.yaml")}
    assert names == set(REFERENCE_M) | set(TINY)


@pytest.mark.parametrize("name", sorted(REFERENCE_M))
def test_parameter_count_matches_reference(name: str) -> None:
    cfg = load(name)
    assert cfg.name == name
    with torch.device("meta"):
        model = build_sequential(describe(cfg))
    assert all(p.device.type == "meta" for p in model.parameters())
    count_m = count_parameters(model) / 1e6
    assert abs(count_m - REFERENCE_M[name]) / REFERENCE_M[name] < 0.02, count_m


@pytest.mark.parametrize("name", TINY)
def test_tiny_variant_trains_on_cpu(name: str) -> None:
    torch.manual_seed(0)
    desc = describe(load(name))
    model = build_sequential(desc)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    inputs, labels = synthetic_batch(desc, batch_size=2, seed=0)
    losses = []
    for _ in range(10):  # overfit one batch: the loss must drop
        opt.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


def test_tied_embedding_shared_with_head() -> None:
    model = build_sequential(describe(load("gpt3-tiny")))
    x = torch.randint(0, 512, (2, 8))
    model(x).sum().backward()
    # The head's gradient lands on the embedding matrix: tied, one parameter.
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.startswith(f"{len(model) - 1}.") for n in names)
    assert model[0].word.weight.grad is not None


def test_partition_methods() -> None:
    desc = describe(load("gpt3-xl"))  # 27 layers: embedding, 24 blocks, norm, head
    assert desc.num_layers == 27
    assert partition(desc, "uniform", 4) == [0, 7, 14, 21, 27]
    assert partition(desc, "uniform_transformer", 4) == [0, 7, 13, 19, 27]
    assert partition(desc, "custom:0,8,14,21,27", 4) == [0, 8, 14, 21, 27]


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("custom:0,8,14,21", "needs 5"),
        ("custom:0,8,14,21,30", "must end with the layer count"),
        ("custom:1,8,14,21,27", "must start at layer 0"),
        ("custom:0,8,8,21,27", "strictly increasing"),
        ("custom:0,a,14,21,27", "comma-separated integers"),
        ("balanced", "choose uniform, uniform_transformer"),
    ],
)
def test_partition_errors_name_the_problem(method: str, message: str) -> None:
    desc = describe(load("gpt3-xl"))
    with pytest.raises(ConfigError, match=message) as err:
        partition(desc, method, 4)
    assert "model.partition" in str(err.value)


def test_uniform_transformer_rejects_resnet_and_too_many_stages() -> None:
    with pytest.raises(ConfigError, match="needs a transformer model"):
        partition(describe(load("wide-resnet-tiny")), "uniform_transformer", 2)
    with pytest.raises(ConfigError, match=r"parallelism.pp=20 exceeds the 11 layers"):
        partition(describe(load("gpt3-tiny")), "uniform", 20)


def test_bad_sizes_and_family() -> None:
    cfg = load("gpt3-tiny")
    cfg.num_attention_heads = 5
    with pytest.raises(ConfigError, match="not divisible"):
        describe(cfg)
    cfg = load("gpt3-tiny")
    cfg.family = "lstm"
    with pytest.raises(ConfigError, match="model.family='lstm'"):
        describe(cfg)
