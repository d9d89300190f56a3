"""A pipeline schedule given by its own actions: per rank, what runs, in order.

Perseus generates three schedules itself (:mod:`perseus.schedule`); any other schedule an
engine can express — zero-bubble schedules that split a backward into its input and weight
halves, V-shaped ones that put two model chunks on each rank (``torch.distributed.pipelining``'s
``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``) — is described by the engine's own action
list, a :class:`PipelineOrder`. The planner builds its dependency graph from it
(:func:`perseus.planner.dag.build_dag`), the runtime and the coordination server check the
ranks' instruction sequences against it, and it travels in a job's spec.

An action is ``(kind, microbatch, stage)``: ``kind`` one of :data:`KINDS`, ``stage`` the
pipeline stage (model chunk) it computes, numbered along the model, ``0 .. num_stages - 1``.
A rank holds one or more stages. In text an action is written like the engine writes it,
``{stage}{letter}{microbatch}`` (``0F3``: stage 0's forward of microbatch 3; letters in
:data:`LETTERS`), and a rank's actions are joined by commas.

Dependencies between actions (what the engine sends and receives between stages): the
forward of ``(stage, m)`` needs the forward of ``(stage - 1, m)``; the backward (or the input
half of it) of ``(stage, m)`` needs that of ``(stage + 1, m)``, and on the last stage its own
forward; the weight half needs the input half of the same ``(stage, m)``.

Standard library only (the training process imports it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Dict, List, Sequence, Tuple

from perseus.config.checked import Bound
from perseus.errors import ConfigError

# Bounds of an order on the wire (a job's spec; the server's validation reads them): the
# wire's stages, and a rank's actions (``perseus.wire.fields.MAX_INSTRUCTIONS`` of them, each
# at most 12 characters).
MAX_RANKS = 512
MAX_RANK_CHARS = 3 * 4096 * 8 * 12

FORWARD = "forward"
BACKWARD = "backward"
BACKWARD_INPUT = "backward_input"
BACKWARD_WEIGHT = "backward_weight"

#: Instruction kinds, in the order the planner numbers them.
KINDS: Tuple[str, ...] = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
#: One letter per kind (the engine's notation, also the wire's sequence encoding).
LETTERS: Dict[str, str] = {
    FORWARD: "F",
    BACKWARD: "B",
    BACKWARD_INPUT: "I",
    BACKWARD_WEIGHT: "W",
}
KIND_OF_LETTER: Dict[str, str] = {letter: kind for kind, letter in LETTERS.items()}

#: ``(kind, microbatch, stage)``
Action = Tuple[str, int, int]

NAME_PATTERN = r"^[a-z0-9_]{1,64}$"
ACTION_PATTERN = r"[0-9]{1,4}[FBIW][0-9]{1,6}"
RANK_PATTERN = rf"^{ACTION_PATTERN}(,{ACTION_PATTERN})*$"
_ACTION = re.compile(r"([0-9]{1,4})([FBIW])([0-9]{1,6})")


def encode_actions(actions: Sequence[Action]) -> str:
    """``[("forward", 0, 1)]`` -> ``"1F0"`` (actions joined by commas)."""
    return ",".join(f"{stage}{LETTERS[kind]}{mb}" for kind, mb, stage in actions)


def decode_actions(text: str) -> List[Action]:
    """The actions of ``"0F0,0F1,1B0"`` (see :func:`encode_actions`).

    Raises:
        ConfigError: text that is not actions separated by commas.
    """
    out: List[Action] = []
    for i, item in enumerate(text.split(",")):
        match = _ACTION.fullmatch(item.strip())
        if match is None:
            raise ConfigError(
                f"pipeline order: action {i} is {item!r}; write actions as "
                "<stage><F|B|I|W><microbatch>, e.g. 0F3, separated by commas"
            )
        stage, letter, mb = match.groups()
        out.append((KIND_OF_LETTER[letter], int(mb), int(stage)))
    return out


@dataclass(frozen=True)
class PipelineOrder:
    """A schedule as its actions: per pipeline rank, ``"0F0,0F1,1F0,..."`` in execution order.

    Attributes:
        name: What the schedule is called (``zbv_zero_bubble``; lower case, digits, ``_``).
        ranks: Per rank, its actions encoded (:func:`encode_actions`).

    Construction parses the actions and checks that every stage sits on one rank; whether the
    order is complete (every microbatch's forward and backward on every stage) is
    :meth:`problems`; whether it deadlocks, the planner's dependency graph finds.

    Raises:
        ConfigError: a bad name, no rank, an empty rank, an action that does not parse, a
            stage on two ranks.
    """

    name: Annotated[str, Bound(pattern=NAME_PATTERN)]
    ranks: Annotated[
        List[Annotated[str, Bound(pattern=RANK_PATTERN, max_length=MAX_RANK_CHARS)]],
        Bound(min_length=1, max_length=MAX_RANKS),
    ]

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and re.fullmatch(NAME_PATTERN, self.name)):
            raise ConfigError(
                f"pipeline order: name {self.name!r} must be 1-64 lower-case letters, digits or '_'"
            )
        if not self.ranks:
            raise ConfigError(f"pipeline order {self.name}: no rank has any action")
        parsed = []
        for r, text in enumerate(self.ranks):
            if not text:
                raise ConfigError(f"pipeline order {self.name}: rank {r} has no action")
            parsed.append(tuple(decode_actions(text)))
        # Parsed once; not a field (the wire carries the text).
        object.__setattr__(self, "_actions", tuple(parsed))
        owner: Dict[int, int] = {}
        for r, actions in enumerate(parsed):
            for _, _, stage in actions:
                if owner.setdefault(stage, r) != r:
                    raise ConfigError(
                        f"pipeline order {self.name}: stage {stage} runs on ranks "
                        f"{owner[stage]} and {r}; each stage (model chunk) lives on one rank"
                    )

    def __str__(self) -> str:
        return self.name

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def of(cls, name: str, ranks: Sequence[Sequence[Action]]) -> PipelineOrder:
        """The order of per-rank ``(kind, microbatch, stage)`` lists."""
        return cls(name, [encode_actions(actions) for actions in ranks])

    # -- views ----------------------------------------------------------------------------------
    @property
    def actions(self) -> Tuple[Tuple[Action, ...], ...]:
        """Per rank, its ``(kind, microbatch, stage)`` actions in execution order."""
        parsed: Tuple[Tuple[Action, ...], ...] = self.__dict__["_actions"]
        return parsed

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks (GPUs of one pipeline)."""
        return len(self.actions)

    @property
    def num_stages(self) -> int:
        """Pipeline stages (model chunks over all ranks)."""
        return 1 + max(stage for actions in self.actions for _, _, stage in actions)

    @property
    def num_microbatches(self) -> int:
        """Microbatches per iteration."""
        return 1 + max(mb for actions in self.actions for _, mb, _ in actions)

    @property
    def num_model_chunks(self) -> int:
        """The most stages one rank holds."""
        return max(len(self.stages_of(r)) for r in range(self.num_ranks))

    def kinds(self) -> Tuple[str, ...]:
        """The instruction kinds the order uses, in :data:`KINDS` order."""
        used = {kind for actions in self.actions for kind, _, _ in actions}
        return tuple(kind for kind in KINDS if kind in used)

    def stages_of(self, rank: int) -> List[int]:
        """The stages rank ``rank`` holds, ascending (its model chunks 0, 1, ...)."""
        return sorted({stage for _, _, stage in self.actions[rank]})

    def rank_of_stage(self) -> Dict[int, int]:
        """Stage -> the rank that holds it."""
        return {stage: r for r, actions in enumerate(self.actions) for _, _, stage in actions}

    def chunks(self) -> List[List[Tuple[str, int, int]]]:
        """Per rank, ``(kind, microbatch, model chunk)`` (chunk: index in :meth:`stages_of`)."""
        out = []
        for r, actions in enumerate(self.actions):
            chunk_of = {stage: c for c, stage in enumerate(self.stages_of(r))}
            out.append([(kind, mb, chunk_of[stage]) for kind, mb, stage in actions])
        return out

    def sequences(self) -> List[List[Tuple[str, int]]]:
        """Per rank, ``(kind, k)``: the ``k``-th instruction of its kind on the rank.

        This is how a rank's hooks number instructions (they are told the kind only); it is
        the microbatch itself where a rank runs each kind's microbatches in order on one chunk.
        """
        out = []
        for actions in self.actions:
            counts: Dict[str, int] = {}
            seq = []
            for kind, _, _ in actions:
                k = counts.get(kind, 0)
                counts[kind] = k + 1
                seq.append((kind, k))
            out.append(seq)
        return out

    # -- checks ---------------------------------------------------------------------------------
    def problems(self) -> List[str]:
        """What makes the order incomplete (empty: complete), one line each.

        Every stage ``0 .. num_stages - 1`` must run every microbatch ``0 .. N - 1`` forward
        once, and its backward once, either whole or as an input half followed (on the same
        rank) by a weight half; a backward after its forward.
        """
        seen: Dict[Tuple[int, str, int], int] = {}
        out: List[str] = []
        for r, actions in enumerate(self.actions):
            for pos, (kind, mb, stage) in enumerate(actions):
                key = (stage, kind, mb)
                if key in seen:
                    out.append(f"rank {r} runs {_named(key)} twice")
                seen[key] = pos
        num_mb = self.num_microbatches
        for stage in range(self.num_stages):
            if not any((stage, FORWARD, m) in seen for m in range(num_mb)):
                out.append(f"stage {stage} runs nothing (stages must be numbered 0, 1, ...)")
                continue
            for m in range(num_mb):
                out.extend(self._microbatch_problems(seen, stage, m))
            if len(out) > 8:
                break
        return out[:8]

    @staticmethod
    def _microbatch_problems(
        seen: Dict[Tuple[int, str, int], int], stage: int, m: int
    ) -> List[str]:
        def at(kind: str) -> int:
            return seen.get((stage, kind, m), -1)

        f, b, i, w = at(FORWARD), at(BACKWARD), at(BACKWARD_INPUT), at(BACKWARD_WEIGHT)
        if f < 0:
            return [f"stage {stage} has no forward of microbatch {m}"]
        if b >= 0 and (i >= 0 or w >= 0):
            return [f"stage {stage} runs microbatch {m}'s backward whole and split"]
        if b < 0 and (i < 0 or w < 0):
            return [f"stage {stage} has no (complete) backward of microbatch {m}"]
        if max(b, i) < f or (i >= 0 and w < i):
            return [f"stage {stage} runs microbatch {m}'s backward out of order"]
        return []

    def check(self) -> None:
        """Raise :class:`ConfigError` listing :meth:`problems` when there are any."""
        problems = self.problems()
        if problems:
            raise ConfigError(f"pipeline order {self.name} is incomplete: " + "; ".join(problems))


def _named(key: Tuple[int, str, int]) -> str:
    stage, kind, mb = key
    return f"stage {stage}'s {kind} of microbatch {mb}"
