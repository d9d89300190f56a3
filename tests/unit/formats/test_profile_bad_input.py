"""Malformed profile CSVs, as users make them: each one a ProfileError naming file, row and fix.

Every case writes real bytes to a file and reads it with :func:`read_profile_csv` (the reader of
perseus-plan and of the emulated GPU): the error class, the file, the position and what was found
must be in the message, and nothing else may escape (no UnicodeDecodeError, csv.Error, ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest

from perseus.errors import ProfileError
from perseus.formats.profile.table import read_profile_csv

HEADER = "stage,instruction,frequency,time,energy"
ROWS = [
    "0,forward,1410,0.10,20.0",
    "0,forward,1200,0.12,18.0",
    "0,backward,1410,0.20,40.0",
    "1,forward,1410,0.11,21.0",
    "1,backward,1410,0.21,41.0",
]
GOOD = "\n".join([HEADER, *ROWS]) + "\n"


def _file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "profile.csv"
    path.write_bytes(data)
    return path


def _with_row(row: str) -> bytes:
    return (GOOD + row + "\n").encode()


def _error(path: Path) -> str:
    with pytest.raises(ProfileError) as info:
        read_profile_csv(path)
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message  # one line
    return message


# (content, fragments of the message): the bad row is always row 7 (header row 1 + 5 rows).
BAD_ROWS = [
    ("1,forward,1200,,21.0", ["row 7", "time is empty"]),
    ("1,forward,1200,nan,21.0", ["row 7", "time is nan"]),
    ("1,forward,1200,NaN,21.0", ["row 7", "time is NaN"]),
    ("1,forward,1200,inf,21.0", ["row 7", "time is inf"]),
    ("1,forward,1200,-Infinity,21.0", ["row 7", "time is -Infinity"]),
    ("1,forward,1200,abc,21.0", ["row 7", "time 'abc' is not a number"]),
    ("1,forward,1200,0,21.0", ["row 7", "time 0.0 must be a finite number > 0"]),
    ("1,forward,1200,-0.5,21.0", ["row 7", "time -0.5"]),
    ("1,forward,1200,1e7,21.0", ["row 7", "time 10000000.0", "<= 1000000 s"]),
    ("1,forward,1200,1e400,21.0", ["row 7", "time is 1e400"]),
    ("1,forward,1200,0.1,-3", ["row 7", "energy -3.0 must be a finite number >= 0"]),
    ("1,forward,1200,0.1,inf", ["row 7", "energy is inf"]),
    ("1,forward,1200,0.1,1e13", ["row 7", "energy 10000000000000.0"]),
    ("1,forward,1200,0.1,", ["row 7", "energy is empty"]),
    ("1,forward,0,0.1,3", ["row 7", "frequency 0 must be an integer > 0"]),
    ("1,forward,-5,0.1,3", ["row 7", "frequency -5"]),
    ("1,forward,12.5,0.1,3", ["row 7", "frequency 12.5 must be an integer"]),
    ("1,forward,1000000,0.1,3", ["row 7", "frequency 1000000", "<= 100000 MHz"]),
    ("1,forward," + "9" * 5000 + ",0.1,3", ["row 7", "frequency is 99999", "5000 characters"]),
    ("1,forward,0x10,0.1,3", ["row 7", "frequency '0x10' is not a number"]),
    ("-1,forward,1410,0.1,3", ["row 7", "stage -1 must be an integer >= 0"]),
    ("1.5,forward,1410,0.1,3", ["row 7", "stage 1.5 must be an integer"]),
    ("x,forward,1410,0.1,3", ["row 7", "stage 'x' is not a number"]),
    ("10000000,forward,1410,0.1,3", ["row 7", "stage 10000000"]),
    ("1,Forward,1410,0.1,3", ["row 7", "instruction 'Forward' must be one of 'forward'"]),
    ("1,fwd,1410,0.1,3", ["row 7", "instruction 'fwd'"]),
    ("1,,1410,0.1,3", ["row 7", "instruction ''"]),
    ("1,forward,1410,0.1,3", ["row 7", "duplicate of row 5", "one measurement per frequency"]),
    ("1,forward,1410.0,0.1,3", ["row 7", "duplicate of row 5"]),
    ("1,forward,1200,0.1,3,", ["row 7", "6 fields", "remove the trailing comma"]),
    ("1,forward,1200,0.1,3,,", ["row 7", "7 fields", "remove the trailing comma"]),
    ("1,forward,1200,0.1,3,note", ["row 7", "6 fields", "name the extra column"]),
    ("1,forward,1200,0.1", ["row 7", "4 fields", "fill in every column"]),
    ("1;forward;1200;0.1;3", ["row 7", "1 fields", "fill in every column"]),
    ("stage,instruction,frequency,time,energy", ["row 7", "stage 'stage' is not a number"]),
]


@pytest.mark.parametrize(("row", "fragments"), BAD_ROWS)
def test_bad_row(tmp_path: Path, row: str, fragments: List[str]) -> None:
    message = _error(_file(tmp_path, _with_row(row)))
    for fragment in fragments:
        assert fragment in message, message


BAD_FILES = [
    (b"", ["is empty"]),
    (b"\n\n   \n", ["is empty"]),
    (HEADER.encode() + b"\n", ["no rows", "at least one stage"]),
    (b"\xef\xbb\xbf" + HEADER.encode() + b"\n", ["no rows"]),  # BOM: header still read
    (
        GOOD.replace(HEADER, "Stage, Instruction, Frequency, Time, Energy").encode(),
        [
            "row 1",
            "the header is 'Stage, Instruction, Frequency, Time, Energy'",
            "read as the columns ['Stage', ' Instruction', ' Frequency', ' Time', ' Energy']",
            "expected the columns stage,instruction,frequency,time,energy",
            "write the column names in lower case",
        ],
    ),
    (
        GOOD.replace(HEADER, "stage,\u00a0instruction,frequency,time,energy\u200b").encode(),
        ["'energy\\u200b'", "missing column(s) ['energy']"],  # no-break space trimmed
    ),
    (
        GOOD.replace(HEADER, "stage,instruction,frequency,time").encode(),
        ["the header is 'stage,instruction,frequency,time'", "missing column(s) ['energy']"],
    ),
    (
        GOOD.replace(HEADER, "stage,instruction,freq_mhz,time_s,energy_j").encode(),
        ["missing column(s) ['frequency', 'time', 'energy']"],
    ),
    ("\n".join(ROWS).encode() + b"\n", ["the first row must be the header"]),
    (GOOD.replace(",", ";").encode(), ["separate the columns with commas, not ';'"]),
    (GOOD.replace(",", "\t").encode(), ["separate the columns with commas, not '\\t'"]),
    (
        GOOD.replace(HEADER, HEADER + ",time").encode(),
        ["column(s) ['time'] appear more than once"],
    ),
    (GOOD.encode() + b"1,forward,1200,0.1,\xff\n", ["line 7 column 20", "byte 0xff", "UTF-8"]),
    (GOOD.encode("utf-16"), ["line 1 column 1", "byte 0xff is not UTF-8"]),
    (b"\x00\x01\x02binary\xfe\xfa", ["byte 0xfe is not UTF-8"]),
    (GOOD.encode() + b"1,forward,1200,0.1,3\x00\n", ["row 7", "energy '3\\x00' is not a number"]),
    (
        GOOD.encode() + b"1,forward,1200,0.1,3" + b"9" * 200_000 + b"\n",
        ["row 7", "cannot parse as CSV", "field larger than field limit"],
    ),
    (GOOD.replace("1,backward,1410,0.21,41.0\n", "").encode(), ["stage 1 has no backward rows"]),
    (GOOD.replace("1,", "2,").encode(), ["stage 1 has no forward rows", "every stage 0..2"]),
    (GOOD.replace("0,", "3,").encode(), ["stage 0 has no forward rows"]),
]


@pytest.mark.parametrize(("data", "fragments"), BAD_FILES)
def test_bad_file(tmp_path: Path, data: bytes, fragments: List[str]) -> None:
    message = _error(_file(tmp_path, data))
    for fragment in fragments:
        assert fragment in message, message


def test_directory_is_named_as_one(tmp_path: Path) -> None:
    folder = tmp_path / "profile.csv"
    folder.mkdir()
    message = _error(folder)
    assert "is a directory, not a file" in message and "does not exist" not in message


def test_missing_file(tmp_path: Path) -> None:
    assert "does not exist" in _error(tmp_path / "profile.csv")


def test_unreadable_file(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD.encode())
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # root reads any file
            pytest.skip("this user reads files without read permission")
        assert "cannot read profile" in _error(path)
    finally:
        path.chmod(0o644)


def test_row_numbers_are_file_lines_with_blank_lines_and_crlf(tmp_path: Path) -> None:
    data = (HEADER + "\r\n\r\n" + "\r\n".join(ROWS) + "\r\n1,forward,1200,nan,3\r\n").encode()
    assert "row 8: time is nan" in _error(_file(tmp_path, data))


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbf" + GOOD.encode(),  # spreadsheet's byte-order mark
        GOOD.replace("\n", "\r\n").encode(),  # Windows line endings
        GOOD.replace("\n", "\n\n").encode(),  # blank lines
        GOOD.replace(HEADER, "energy,time,frequency,instruction,stage")
        .replace("0,forward,1410,0.10,20.0", "20.0,0.10,1410,forward,0")
        .replace("0,forward,1200,0.12,18.0", "18.0,0.12,1200,forward,0")
        .replace("0,backward,1410,0.20,40.0", "40.0,0.20,1410,backward,0")
        .replace("1,forward,1410,0.11,21.0", "21.0,0.11,1410,forward,1")
        .replace("1,backward,1410,0.21,41.0", "41.0,0.21,1410,backward,1")
        .encode(),  # columns in another order
        "\n".join([HEADER + ",note", *(row + ",x" for row in ROWS)]).encode(),  # extra column
        "\n".join([HEADER, *('"' + row.replace(",", '","') + '"' for row in ROWS)]).encode(),
    ],
)
def test_harmless_variations_are_read(tmp_path: Path, data: bytes) -> None:
    profile = read_profile_csv(_file(tmp_path, data))
    assert profile.num_stages == 2
    assert profile.frequencies(0, "forward") == [1410, 1200]
    assert profile.lookup(1, "backward", 1410).energy_j == 41.0
