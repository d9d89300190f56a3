"""Model zoo: turn a :class:`~perseus.config.schema.ModelConfig` into an ordered list of layers.

A model is described as a flat sequence of layers (``LayerDef``) so the same description builds a
plain ``nn.Sequential`` (torch DDP, parameter counting on the meta device) or a DeepSpeed
``PipelineModule`` cut at any layer boundary. Weight tying (embedding shared with the output head)
is expressed with ``tie_key``: layers with the same key are ONE module, called through
``forward_fn`` at the later position (DeepSpeed's ``TiedLayerSpec`` does the same across stages).

Families (``model.family``): ``gpt`` (GPT-2 architecture with GPT-3 sizes), ``bert`` (masked LM),
``t5`` (encoder-decoder, v1.0), ``bloom`` (ALiBi decoder; embedding, blocks, head),
``wide_resnet`` (torchvision layout, ``num_layers`` 50 or 101).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from perseus.config.schema import ModelConfig
from perseus.errors import ConfigError

FAMILIES = ("gpt", "bert", "t5", "bloom", "wide_resnet")
_RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


@dataclass
class LayerDef:
    """One pipeline layer: a module class and its constructor arguments."""

    module: type
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # Layers with the same key share one module (weight tying).
    tie_key: Optional[str] = None
    # How a tied layer's later occurrence calls the shared module: fn(module, x).
    forward_fn: Optional[Callable[..., Any]] = None
    # True for the repeated transformer blocks (partition=uniform_transformer balances these).
    is_block: bool = False


@dataclass
class ModelDescription:
    """A model as pipeline layers plus what its inputs look like."""

    name: str
    family: str
    layers: List[LayerDef]
    vocab_size: int = 0
    seq_length: int = 0
    num_classes: int = 0
    image_size: int = 0

    @property
    def num_layers(self) -> int:
        """Number of pipeline layers (what partition boundaries index)."""
        return len(self.layers)

    @property
    def block_ids(self) -> List[int]:
        """Layer ids of the transformer blocks."""
        return [i for i, layer in enumerate(self.layers) if layer.is_block]


def describe(cfg: ModelConfig) -> ModelDescription:
    """The layer sequence of the configured model.

    Raises:
        ConfigError: unknown family or inconsistent sizes, naming the key to fix.
    """
    builders = {"gpt": _gpt, "bert": _bert, "t5": _t5, "bloom": _bloom, "wide_resnet": _wide_resnet}
    if cfg.family not in builders:
        raise ConfigError(
            f"model.family={cfg.family!r} (model {cfg.name!r}): choose one of {FAMILIES}"
        )
    _check_sizes(cfg)
    return builders[cfg.family](cfg)


def _check_sizes(cfg: ModelConfig) -> None:
    if cfg.num_layers < 1:
        raise ConfigError(f"model.num_layers={cfg.num_layers} (model {cfg.name!r}): must be >= 1")
    if cfg.family == "wide_resnet":
        if cfg.num_layers not in _RESNET_BLOCKS:
            raise ConfigError(
                f"model.num_layers={cfg.num_layers} (model {cfg.name!r}): wide_resnet depth must "
                f"be one of {sorted(_RESNET_BLOCKS)}"
            )
        return
    heads = cfg.num_attention_heads
    if cfg.kv_channels is None and (heads < 1 or cfg.hidden_size % heads):
        raise ConfigError(
            f"model.hidden_size={cfg.hidden_size} is not divisible by "
            f"model.num_attention_heads={heads} (model {cfg.name!r}): change either"
        )


def _ffn(cfg: ModelConfig) -> int:
    return cfg.ffn_hidden_size or 4 * cfg.hidden_size


def _positions(cfg: ModelConfig) -> int:
    return cfg.max_position_embeddings or cfg.seq_length


def _tied_stack(
    cfg: ModelConfig,
    family: str,
    modules: tuple,
    middle: LayerDef,
    head_fn: Callable[..., Any],
) -> ModelDescription:
    """Tied embedding, ``num_layers`` blocks, one more layer, and the tied output head.

    Args:
        cfg: The model's sizes.
        family: The family name recorded in the description.
        modules: ``(embedding class, block class)``.
        middle: The layer between the last block and the head.
        head_fn: How the head calls the shared embedding module: ``fn(module, x)``.
    """
    embedding, block = modules
    h = cfg.hidden_size
    embed = {"vocab_size": cfg.vocab_size, "hidden_size": h, "max_positions": _positions(cfg)}
    sizes = {"hidden_size": h, "num_heads": cfg.num_attention_heads, "ffn_size": _ffn(cfg)}
    layers = [LayerDef(embedding, embed, tie_key="embed")]
    layers += [LayerDef(block, sizes, is_block=True) for _ in range(cfg.num_layers)]
    layers.append(middle)
    layers.append(LayerDef(embedding, embed, tie_key="embed", forward_fn=head_fn))
    return ModelDescription(
        name=cfg.name,
        family=family,
        layers=layers,
        vocab_size=cfg.vocab_size,
        seq_length=cfg.seq_length,
    )


def _gpt(cfg: ModelConfig) -> ModelDescription:
    from torch import nn

    from perseus.models.layers import gpt as g

    final_norm = LayerDef(nn.LayerNorm, {"normalized_shape": cfg.hidden_size})
    return _tied_stack(cfg, "gpt", (g.GPTEmbedding, g.GPTBlock), final_norm, g.tied_logits)


def _bert(cfg: ModelConfig) -> ModelDescription:
    from perseus.models.layers import bert as b

    transform = LayerDef(b.BertMLMTransform, {"hidden_size": cfg.hidden_size})
    modules = (b.BertEmbedding, b.BertBlock)
    return _tied_stack(cfg, "bert", modules, transform, b.tied_mlm_logits)


def _bloom(cfg: ModelConfig) -> ModelDescription:
    from perseus.models.layers import bloom as b

    embed = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size}
    sizes = {"hidden_size": cfg.hidden_size, "num_heads": cfg.num_attention_heads}
    sizes["ffn_size"] = _ffn(cfg)
    layers = [LayerDef(b.BloomEmbedding, embed, tie_key="embed")]
    layers += [LayerDef(b.BloomBlock, sizes, is_block=True) for _ in range(cfg.num_layers)]
    head = LayerDef(b.BloomEmbedding, embed, tie_key="embed", forward_fn=b.tied_bloom_logits)
    layers.append(head)
    return ModelDescription(
        name=cfg.name,
        family="bloom",
        layers=layers,
        vocab_size=cfg.vocab_size,
        seq_length=cfg.seq_length,
    )


def _t5(cfg: ModelConfig) -> ModelDescription:
    from perseus.models.layers import t5 as t

    h, heads = cfg.hidden_size, cfg.num_attention_heads
    embed = {"vocab_size": cfg.vocab_size, "hidden_size": h}
    block = {
        "hidden_size": h,
        "num_heads": heads,
        "ffn_size": _ffn(cfg),
        "kv_channels": cfg.kv_channels or h // heads,
    }
    layers = [LayerDef(t.T5Embedding, embed, tie_key="embed")]
    layers += [LayerDef(t.T5EncoderBlock, block, is_block=True) for _ in range(cfg.num_layers)]
    layers.append(LayerDef(t.T5EncoderFinalNorm, {"hidden_size": h}))
    layers += [LayerDef(t.T5DecoderBlock, block, is_block=True) for _ in range(cfg.num_layers)]
    layers.append(LayerDef(t.T5DecoderFinalNorm, {"hidden_size": h}))
    layers.append(LayerDef(t.T5Embedding, embed, tie_key="embed", forward_fn=t.tied_t5_logits))
    return ModelDescription(
        name=cfg.name,
        family="t5",
        layers=layers,
        vocab_size=cfg.vocab_size,
        seq_length=cfg.seq_length,
    )


def _wide_resnet(cfg: ModelConfig) -> ModelDescription:
    from perseus.models.layers import resnet as r

    base = cfg.base_channels
    layers = [LayerDef(r.ResNetStem, {"channels": base})]
    in_channels = base
    for group, num_blocks in enumerate(_RESNET_BLOCKS[cfg.num_layers]):
        planes = base * 2**group
        width = planes * cfg.width_factor
        for index in range(num_blocks):
            stride = 2 if group > 0 and index == 0 else 1
            kwargs = {
                "in_channels": in_channels,
                "planes": planes,
                "width": width,
                "stride": stride,
            }
            layers.append(LayerDef(r.Bottleneck, kwargs, is_block=True))
            in_channels = planes * 4
    layers.append(
        LayerDef(r.ResNetHead, {"in_channels": in_channels, "num_classes": cfg.num_classes})
    )
    return ModelDescription(
        cfg.name, "wide_resnet", layers, num_classes=cfg.num_classes, image_size=cfg.image_size
    )
