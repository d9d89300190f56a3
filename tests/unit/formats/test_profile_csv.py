from __future__ import annotations

from pathlib import Path

import pytest

import perseus
from perseus.errors import ProfileError
from perseus.formats.profile.table import Profile, blocking_power_per_stage_w, read_profile_csv

HEADER = "stage,instruction,frequency,time,energy\n"
GOOD = (
    "0,forward,1410,0.10,20.0\n"
    "0,forward,1200,0.12,18.0\n"
    "0,backward,1410,0.20,40.0\n"
    "1,forward,1410,0.11,21.0\n"
    "1,backward,1410,0.21,41.0\n"
)


def _write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "profile.csv"
    path.write_text(header + body)
    return path


def test_load_good_profile_with_extra_column(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "".join(line + ",x\n" for line in GOOD.splitlines()),
        header=HEADER.strip() + ",note\n",
    )
    profile = read_profile_csv(path)
    assert profile.num_stages == 2
    assert profile.frequencies(0, "forward") == [1410, 1200]
    assert profile.lookup(1, "backward", 1410).energy_j == 41.0
    assert profile.max_frequency_mhz(0, "forward") == 1410


def test_spaces_around_names_and_values_are_trimmed(tmp_path: Path) -> None:
    spaced = "".join(" " + line.replace(",", " , ") + "\n" for line in GOOD.splitlines())
    path = _write(tmp_path, spaced, header="stage, instruction, frequency, time, energy \n")
    assert read_profile_csv(path).rows() == read_profile_csv(_write(tmp_path, GOOD)).rows()


def test_round_trip(tmp_path: Path) -> None:
    profile = read_profile_csv(_write(tmp_path, GOOD))
    again = read_profile_csv(profile.write(tmp_path / "out" / "p.csv"))
    assert again.rows() == profile.rows()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        read_profile_csv(tmp_path / "nope.csv")


def test_missing_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "0,forward,1410,0.1\n", header="stage,instruction,frequency,time\n")
    with pytest.raises(
        ProfileError, match=r"profile\.csv, row 1: .*missing column\(s\) \['energy'\]"
    ):
        read_profile_csv(path)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("1,forward,1200,,21.0", r"row 7: time is empty"),
        ("1,forward,1200,nan,21.0", r"row 7: time is nan"),
        ("1,forward,1200,0.0,21.0", r"row 7: time 0\.0 must be a finite number > 0"),
        ("1,forward,1200,-0.5,21.0", r"row 7: time -0\.5 must be a finite number > 0"),
        ("1,forward,1200,0.1,-3", r"row 7: energy -3\.0 must be a finite number >= 0"),
        ("1,sideways,1200,0.1,3", r"row 7: instruction 'sideways'"),
        ("1,forward,12.5,0.1,3", r"row 7: frequency 12\.5 must be an integer"),
        ("1,forward,1410,0.1,3", r"row 7: duplicate of row 5"),
        ("-1,forward,1410,0.1,3", r"row 7: stage -1 must be an integer >= 0"),
    ],
)
def test_bad_rows_name_file_row_and_problem(tmp_path: Path, bad_line: str, message: str) -> None:
    path = _write(tmp_path, GOOD + bad_line + "\n")
    with pytest.raises(ProfileError, match=message) as info:
        read_profile_csv(path)
    assert str(path) in str(info.value)


def test_stage_without_backward(tmp_path: Path) -> None:
    body = GOOD.replace("1,backward,1410,0.21,41.0\n", "")
    with pytest.raises(ProfileError, match="stage 1 has no backward rows"):
        read_profile_csv(_write(tmp_path, body))


def test_gap_in_stages(tmp_path: Path) -> None:
    body = GOOD.replace("1,", "2,")
    with pytest.raises(ProfileError, match="stage 1 has no forward rows"):
        read_profile_csv(_write(tmp_path, body))


def test_empty_profile(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no rows"):
        read_profile_csv(_write(tmp_path, ""))


def test_pareto_filter_per_stage_and_instruction() -> None:
    rows = [
        (0, "forward", 1410, 1.0, 10.0),
        (0, "forward", 1300, 1.1, 9.0),
        (0, "forward", 1200, 1.2, 9.5),  # slower and costlier than 1300: dominated
        (0, "forward", 1100, 1.3, 8.0),
        (0, "forward", 1000, 1.3, 8.5),  # same time as 1100, more energy
        (0, "backward", 1410, 2.0, 20.0),
        (0, "backward", 1300, 2.0, 20.0),  # exact tie: the higher frequency is kept
    ]
    profile = Profile.from_rows(rows)
    assert [m.frequency_mhz for m in profile.pareto(0, "forward")] == [1410, 1300, 1100]
    assert [m.frequency_mhz for m in profile.pareto(0, "backward")] == [1410]


def test_restrict_and_scale() -> None:
    profile = Profile.from_rows(
        [
            (0, "forward", 1410, 1.0, 10.0),
            (0, "forward", 900, 2.0, 8.0),
            (0, "backward", 900, 2.0, 8.0),
        ]
    )
    kept = profile.restrict(1000)
    assert kept.frequencies(0, "forward") == [1410]
    assert kept.frequencies(0, "backward") == [900]  # never empty: keeps the highest
    scaled = profile.scaled(10.0, 80.0)
    assert scaled.lookup(0, "forward", 900).time_s == pytest.approx(20.0)
    assert scaled.lookup(0, "forward", 900).energy_j == pytest.approx(640.0)


def test_lookup_unknown_frequency() -> None:
    profile = Profile.from_rows([(0, "forward", 1410, 1.0, 10.0), (0, "backward", 1410, 2.0, 8.0)])
    with pytest.raises(ProfileError, match="not profiled at 1000 MHz"):
        profile.lookup(0, "forward", 1000)


def test_blocking_power_per_stage() -> None:
    assert blocking_power_per_stage_w(83.64, 3) == [83.64] * 3
    assert blocking_power_per_stage_w([70, 80.5], 2) == [70.0, 80.5]
    with pytest.raises(ProfileError, match="has 3 values but the profile has 2 stages"):
        blocking_power_per_stage_w([1, 2, 3], 2)
    with pytest.raises(ProfileError, match="must be a finite number >= 0"):
        blocking_power_per_stage_w(-1.0, 2)
    with pytest.raises(ProfileError, match="one per stage"):
        blocking_power_per_stage_w("abc", 2)


def test_published_profile_loads() -> None:
    path = Path(perseus.__file__).parent / "data" / "sosp24" / "gpt3-175b+a100_sxm_bf16.csv"
    profile = read_profile_csv(path)
    assert profile.num_stages == 8
    assert len(profile.pareto(7, "backward")) >= 3


def test_uncertainty_columns_round_trip_and_other_readers_ignore_them(tmp_path) -> None:
    """A measured profile writes energy_se and uncertain; reading it back keeps both, and a
    reader that knows only the five columns gets the same rows."""
    rows = [
        (0, "forward", 1410, 0.01, 4.0),
        (0, "forward", 1200, 0.012, 3.0),
        (0, "backward", 1410, 0.02, 8.0),
    ]
    se = {(0, "forward", 1410): 0.05, (0, "backward", 1410): float("inf")}
    profile = Profile.from_rows(rows, "t", energy_se_j=se, uncertain=[(0, "backward", 1410)])
    path = profile.write(tmp_path / "p.csv")
    text = path.read_text().splitlines()
    assert text[0] == "stage,instruction,frequency,time,energy,energy_se,uncertain"
    assert text[1].endswith(",,1") and text[2].endswith(",0")  # no finite SE: empty
    back = read_profile_csv(path)
    assert back.rows() == profile.rows()
    assert back.energy_se_j == {(0, "forward", 1410): 0.05}
    assert back.uncertain == {(0, "backward", 1410)}
    assert back.is_uncertain(0, "backward", 1410) and not back.is_uncertain(0, "forward", 1200)
    scaled = back.scaled(2.0, 3.0)
    assert scaled.energy_se_j == {(0, "forward", 1410): pytest.approx(0.15)}
    assert back.restrict(1300).uncertain == {(0, "backward", 1410)}
    plain = Profile.from_rows(rows, "t")
    assert plain.write(tmp_path / "q.csv").read_text().splitlines()[0] == (
        "stage,instruction,frequency,time,energy"
    )


def test_bad_uncertainty_fields_are_refused_with_the_row(tmp_path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(
        "stage,instruction,frequency,time,energy,uncertain\n0,forward,1410,0.01,4,maybe\n"
        "0,backward,1410,0.02,8,0\n"
    )
    with pytest.raises(ProfileError, match=r"row 2: uncertain 'maybe' must be 0 or 1"):
        read_profile_csv(path)
    path.write_text(
        "stage,instruction,frequency,time,energy,energy_se\n0,forward,1410,0.01,4,-1\n"
        "0,backward,1410,0.02,8,\n"
    )
    with pytest.raises(ProfileError, match="row 2: energy_se -1.0"):
        read_profile_csv(path)
