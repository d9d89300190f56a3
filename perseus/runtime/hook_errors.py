"""The errors of hooks called out of order, with what the adapter must do instead.

The optimizer's hot path only tests its state; when a test fails it raises what is built here.
"""

from __future__ import annotations

from typing import Optional, Tuple

from perseus.errors import GPUError, PerseusError, PlanError, ScheduleMismatchError

# The optimizer's open instruction: (position, name, microbatch, frequency_mhz, energy_mj).
Opened = Tuple[int, str, int, Optional[int]]


def unended_at_step_begin(stage: int, opened: Opened) -> ScheduleMismatchError:
    """``on_step_begin`` while an instruction of the last iteration is still open."""
    return ScheduleMismatchError(
        f"stage {stage}: a new iteration began while {opened[1]} of microbatch {opened[2]} had "
        "not ended; adapters must call on_instruction_end in a finally block"
    )


def bad_begin(
    stage: int, step: int, name: str, *, closed: bool, in_step: bool, opened: Optional[Opened]
) -> PerseusError:
    """``on_instruction_begin`` on a closed optimizer, outside an iteration, or nested."""
    if closed:
        return GPUError("on_instruction_begin on a closed PerseusOptimizer")
    if not in_step:
        return ScheduleMismatchError(
            f"stage {stage}: on_instruction_begin({name!r}) outside a training iteration; call "
            "on_step_begin() first (adapters: wrap the training step)"
        )
    assert opened is not None
    return ScheduleMismatchError(
        f"stage {stage}, iteration {step}: {name} began while {opened[1]} of microbatch "
        f"{opened[2]} was still running; instructions must not nest (call on_instruction_end "
        "first)"
    )


def unknown_instruction(name: str) -> ScheduleMismatchError:
    """An instruction name that is not one of the instruction kinds."""
    return ScheduleMismatchError(
        f"on_instruction_begin({name!r}): the instruction must be 'forward' or 'backward' (or a "
        "backward's halves 'backward_input', 'backward_weight'); fix the adapter's call"
    )


def unmatched_end(stage: int, step: int, name: str, opened: Opened) -> ScheduleMismatchError:
    """``on_instruction_end(name)`` while another instruction is open."""
    return ScheduleMismatchError(
        f"stage {stage}, iteration {step}: on_instruction_end({name!r}) but {opened[1]} of "
        f"microbatch {opened[2]} was running"
    )


def no_controller(source: object, freq: int) -> PlanError:
    """A source asked for a clock on an optimizer that does not control clocks."""
    return PlanError(
        f"{type(source).__name__} asked for {freq} MHz but this optimizer does not control "
        "clocks (its source declared changes_clocks=False)"
    )
