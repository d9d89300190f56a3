"""Patching of engines that dispatch through a class-level ``_INSTRUCTION_MAP``.

DeepSpeed's ``PipelineEngine`` and Merak's fork of it run a schedule by looking every
instruction's class up in ``PipelineEngine._INSTRUCTION_MAP`` (filled when the class was
defined), so replacing ``PipelineEngine._exec_forward_pass`` on the class is never called. This
module wraps the map entries instead, and the engine's ``train_batch`` for the step boundary.

Training is told from evaluation by where the call comes from: the ``train_batch`` wrapper puts
the engine's hooks on the engine for the duration of the call, and an instruction wrapper reports
only when they are there. ``eval_batch`` runs the same forward entries without them.

Roles of wrapped entries:

* ``forward`` / ``backward``: one instruction, begun and ended around the call.
* ``recompute``: an activation recomputation that precedes a microbatch's backward pass (Merak);
  it begins the ``backward`` instruction, and the following ``backward`` entry ends it.

A recomputation entry (Merak's ``RecomputeRecvGrad``) recomputes, then blocks until the next stage
sends the gradient. That wait is not backward work: a receive function wrapped with
:func:`wrap_receive` marks where it starts, and from there until the ``backward`` entry runs the
hooks are told the instruction waits (``on_wait_begin`` / ``on_wait_end``, on hook objects that
have them), so the instruction's time and energy are the recomputation plus the backward pass.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

from perseus.adapters._common import (
    BACKWARD,
    FORWARD,
    PatchSet,
    hooks_for,
    is_wrapped,
    mark_wrapped,
)

from perseus.records import RankInfo
from perseus.runtime.types import Hooks

RECOMPUTE = "recompute"
ROLES = (FORWARD, BACKWARD, RECOMPUTE)

# Keys in the engine's instance ``__dict__`` (plain dict access: cheap on the critical path).
ACTIVE_HOOKS = "_perseus_active_hooks"
OPEN_INSTRUCTION = "_perseus_open_instruction"
WAITING = "_perseus_waiting"

# The state of the engine whose recomputation entry runs on this thread (for wrap_receive).
_recomputing = threading.local()


def active_hooks(engine: Any) -> Optional[Hooks]:
    """The hooks of the training step ``engine`` is running now, or ``None`` outside one."""
    hooks: Optional[Hooks] = vars(engine).get(ACTIVE_HOOKS)
    return hooks


def _begin_wait(state: Dict[str, Any]) -> None:
    """The recompute-begun instruction of this engine waits from now until its backward pass."""
    if state.get(WAITING):
        return
    begin = getattr(state.get(ACTIVE_HOOKS), "on_wait_begin", None)
    if begin is not None:
        state[WAITING] = True
        begin()


def wrap_receive(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a framework's gradient receive: called inside a recomputation entry, it is a wait.

    Elsewhere (a plain ``RecvGrad`` instruction, evaluation, no adapter hooks) the wrapper only
    calls ``original``.
    """

    def receive(*args: Any, **kwargs: Any) -> Any:
        state = getattr(_recomputing, "state", None)
        if state is not None:
            _begin_wait(state)
        return original(*args, **kwargs)

    return mark_wrapped(receive, original)


def _wrap_instruction(original: Callable[..., Any], role: str) -> Callable[..., Any]:
    name = FORWARD if role == FORWARD else BACKWARD

    if role == RECOMPUTE:

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            state = vars(self)
            hooks = state.get(ACTIVE_HOOKS)
            if hooks is None or state.get(OPEN_INSTRUCTION) is not None:
                return original(self, *args, **kwargs)
            hooks.on_instruction_begin(name)
            state[OPEN_INSTRUCTION] = name
            outer = getattr(_recomputing, "state", None)
            _recomputing.state = state
            ok = False
            try:
                result = original(self, *args, **kwargs)
                ok = True
                return result
            finally:
                _recomputing.state = outer
                if ok:
                    # Whatever runs until the backward pass (the gradient receive, sends) is
                    # not this instruction's work.
                    _begin_wait(state)
                else:
                    state[OPEN_INSTRUCTION] = None
                    state.pop(WAITING, None)
                    hooks.on_instruction_end(name)

    else:

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            state = vars(self)
            hooks = state.get(ACTIVE_HOOKS)
            if hooks is None:
                return original(self, *args, **kwargs)
            if state.get(OPEN_INSTRUCTION) == name:
                state[OPEN_INSTRUCTION] = None  # begun by the recomputation before it
                if state.pop(WAITING, False):
                    hooks.on_wait_end()
            else:
                hooks.on_instruction_begin(name)
            try:
                return original(self, *args, **kwargs)
            finally:
                hooks.on_instruction_end(name)

    return mark_wrapped(wrapper, original)


def _wrap_train(
    original: Callable[..., Any],
    rank_of: Callable[[Any], RankInfo],
    before_step: Optional[Callable[[Any], None]] = None,
) -> Callable[..., Any]:
    def train_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = vars(self)
        if state.get(ACTIVE_HOOKS) is not None:  # re-entered (a subclass calling super)
            return original(self, *args, **kwargs)
        if before_step is not None:
            before_step(self)
        hooks = hooks_for(rank_of(self), self)
        hooks.on_step_begin()
        state[ACTIVE_HOOKS] = hooks
        try:
            return original(self, *args, **kwargs)
        finally:
            state[ACTIVE_HOOKS] = None
            state.pop(WAITING, None)  # the optimizer ends a wait with its instruction
            left_open = state.pop(OPEN_INSTRUCTION, None)
            try:
                if left_open is not None:
                    hooks.on_instruction_end(left_open)
            finally:
                hooks.on_step_end()

    return mark_wrapped(train_batch, original)


class InstructionMapAdapter:
    """The wrappers of one engine class's step method and instruction map.

    A :class:`~perseus.adapters._common.FrameworkAdapter` applies them (:meth:`apply`).

    Args:
        engine_class: The engine class (``PipelineEngine``).
        roles: Instruction class -> role (``forward``, ``backward``, ``recompute``).
        rank_of: Reads the :class:`RankInfo` of an engine instance.
        step_method: Name of the method that runs one training iteration.
        before_step: Called with the engine at the start of every training iteration.
        patch_more: Applies further framework-specific patches through the adapter's
            :class:`PatchSet` (undone with the rest).
    """

    def __init__(
        self,
        engine_class: type,
        roles: Dict[type, str],
        rank_of: Callable[[Any], RankInfo],
        step_method: str = "train_batch",
        before_step: Optional[Callable[[Any], None]] = None,
        patch_more: Optional[Callable[[PatchSet], None]] = None,
    ) -> None:
        unknown = sorted(set(roles.values()) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown instruction roles {unknown}; use {ROLES}")
        self.engine_class = engine_class
        self.roles = dict(roles)
        self.rank_of = rank_of
        self.step_method = step_method
        self.before_step = before_step
        self.patch_more = patch_more

    def apply(self, patches: PatchSet) -> None:
        """Wrap the step method and the map entries, recording each original in ``patches``."""
        cls = self.engine_class
        instruction_map = cls._INSTRUCTION_MAP  # type: ignore[attr-defined]
        step = getattr(cls, self.step_method)
        if not is_wrapped(step):
            wrapped = _wrap_train(step, self.rank_of, self.before_step)
            patches.set_attr(cls, self.step_method, wrapped)
        for instruction_class, role in self.roles.items():
            entry = instruction_map[instruction_class]
            if not is_wrapped(entry):
                patches.set_item(instruction_map, instruction_class, _wrap_instruction(entry, role))
        if self.patch_more is not None:
            self.patch_more(patches)
