"""The commands the README and docs/ show are the ones the tests and CI run.

A test that runs a documented command keeps it as a constant; here each constant must appear, as
the test runs it, on the page that documents it (tests/e2e/test_slurm.py checks its own commands
the same way). Every script, example and console-script option a page names must exist, and
every script or example a page shows must be run by a test or by CI.
"""

from __future__ import annotations

import re
from typing import Dict, List, Set, Tuple

import pytest
import tomllib

from tests.docs_commands import (
    REPO,
    all_commands,
    bash_commands,
    one_line,
    shown,
)
from tests.e2e.test_train_merak import DOCUMENTED_MAIN_JOB
from tests.e2e.test_train_models import DOCUMENTED_POWER_LIMIT

CI = (REPO / ".ci" / "run").read_text()


def ci_test_command() -> str:
    """The test command .ci/run runs: the line after its comment naming it."""
    lines = CI.splitlines()
    return one_line(lines[lines.index("# The README's test command:") + 1])


def main_job_command() -> str:
    """``scripts/bootstrap && <bootstrap's venv>/bin/perseus-train``: the main job, no overrides."""
    venv = re.search(
        r"^VENV=\$\{PERSEUS_VENV:-(\S+)\}$", (REPO / "scripts/bootstrap").read_text(), re.M
    )
    assert venv, "scripts/bootstrap no longer names its default environment"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "perseus-train" in scripts
    return f"scripts/bootstrap && {venv.group(1)}/bin/perseus-train"


def test_the_quick_start_runs_the_main_job_and_ci_s_test_command() -> None:
    quick_start = [main_job_command(), ci_test_command()]
    assert quick_start == ["scripts/bootstrap && .venv/bin/perseus-train", CI.splitlines()[-1]]
    for page in ("README.md", "docs/getting-started.md"):
        # The first bash block of each: the two commands, in that order, and nothing else.
        assert bash_commands(page)[:2] == quick_start, page
    assert "scripts/bootstrap" in CI  # CI's environment is the one the quick start makes


def test_the_test_command_is_the_last_thing_ci_runs() -> None:
    assert ci_test_command() == one_line(CI.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("command", "page", "inline"),
    [
        (DOCUMENTED_MAIN_JOB, "docs/frameworks/merak.md", True),
        (["perseus-train", *DOCUMENTED_POWER_LIMIT], "docs/perseus-train.md", False),
        (["perseus-train", *DOCUMENTED_POWER_LIMIT], "docs/power-limits-batch-size.md", True),
    ],
)
def test_a_command_an_e2e_test_runs_is_on_its_page(
    command: List[str], page: str, inline: bool
) -> None:
    assert shown(command, page, inline=inline), (one_line(command), page)


def test_shown_fails_on_a_drifted_command() -> None:
    # The check above is not vacuous: one changed argument and the page no longer shows it.
    drifted = [*DOCUMENTED_POWER_LIMIT[:-1], "energy=min_energy"]
    assert not shown(["perseus-train", *drifted], "docs/perseus-train.md")
    assert not shown(["perseus-train", *DOCUMENTED_POWER_LIMIT[1:]], "docs/perseus-train.md")


# A program a page shows, and the file whose options it takes.
_SCRIPT = re.compile(
    r"(?<![\w/.+-])((?:scripts|examples)/[\w./+-]+|[\w-]+\.py|perseus-(?:doctor|gpu))"
)
_OPTION = re.compile(r"^\[*(--[a-z][\w-]*)")


def _program_file(name: str) -> str:
    """The repository file behind a program name a page shows ('' when it is none of ours)."""
    if name.startswith("perseus-"):
        target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"][name]
        return target.split(":")[0].replace(".", "/") + ".py"
    if "/" not in name:
        return f"scripts/{name}" if (REPO / "scripts" / name).is_file() else ""
    return name


def documented_options() -> Dict[str, Set[Tuple[str, str]]]:
    """program file -> ``(page, --option)`` for every option written after it in a command."""
    found: Dict[str, Set[Tuple[str, str]]] = {}
    for page, command in all_commands():
        for segment in re.split(r"&&|\||;|\$\(", command):
            words = segment.split()
            for i, word in enumerate(words):
                if not _SCRIPT.fullmatch(word) or not _program_file(word):
                    continue
                options = found.setdefault(_program_file(word), set())
                for later in words[i + 1 :]:
                    option = _OPTION.match(later)
                    if option:
                        options.add((page, option.group(1)))
    return found


def test_every_documented_script_exists_and_takes_the_options_shown() -> None:
    programs = documented_options()
    assert "scripts/bench_real_gpu_hooks.py" in programs  # the extraction finds what pages show
    assert ("docs/gpus.md", "--pairs-tiny") in programs["scripts/bench_real_gpu_hooks.py"]
    problems = []
    for program, options in sorted(programs.items()):
        path = REPO / program
        if not path.is_file():
            problems.append(f"{program}: no such file (shown on {sorted(options) or 'a page'})")
            continue
        source = path.read_text()
        for page, option in sorted(options):
            if f'"{option}"' not in source and f"'{option}'" not in source:
                problems.append(f"{page}: {program} has no option {option}")
    assert not problems, "\n".join(problems)


def _run_by_a_test_or_ci(program: str) -> bool:
    path = REPO / program
    if program.startswith("scripts/") and path.suffix == ".py":
        return (REPO / "tests/e2e/scripts" / f"test_{path.stem}.py").is_file()
    if program.startswith("scripts/"):
        return program in CI
    tests = (p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    return any(path.name in text for text in tests)


def test_every_documented_script_and_example_is_run_by_a_test_or_ci() -> None:
    shown_programs = {
        p
        for p in documented_options()
        if p.startswith(("scripts/", "examples/")) and (REPO / p).suffix in ("", ".py", ".sbatch")
    }
    assert {"scripts/bootstrap", "scripts/lint", "examples/recurring_training.py"} <= shown_programs
    missing = sorted(
        p for p in shown_programs if (REPO / p).is_file() and not _run_by_a_test_or_ci(p)
    )
    assert not missing, missing


def test_every_repository_path_a_page_shows_exists() -> None:
    prefixes = "scripts|examples|tests|conf|perseus|docs|adapters"
    missing = set()
    for page, command in all_commands():
        for path in re.findall(rf"(?<![\w/.+-])((?:{prefixes})/[\w./+-]*)", command):
            path = path.rstrip(".,:;")
            if not (REPO / path).exists():
                missing.add(f"{page}: {path}")
    assert not missing, sorted(missing)
