import os
import struct

import pytest

from emoji_rl.io.report import bar_figure, format_table, line_figure, trailing_mean

ROWS = [
    {
        "system": "base",
        "decoding": "none",
        "compliance": 0.125,
        "distinct_emoji": 3,
        "judge_similarity": None,
    },
    {
        "system": "sft",
        "decoding": "none",
        "compliance": 0.875,
        "distinct_emoji": 12,
        "judge_similarity": 0.41,
    },
]


def test_table_aligns_text_left_numbers_right_and_marks_missing():
    table = format_table(ROWS, ["system", "decoding", "compliance", "distinct_emoji", "judge_similarity"])
    header, rule, base, sft = table.splitlines()
    assert header.split() == ["system", "decoding", "compliance", "distinct_emoji", "judge_similarity"]
    assert base.split() == ["base", "none", "0.125", "3", "-"]
    assert sft.split() == ["sft", "none", "0.875", "12", "0.410"]
    assert len(base) == len(sft) == len(rule)


def test_bar_figure_writes_a_png(tmp_path):
    path = bar_figure(
        ROWS, ["compliance", "judge_similarity"], "decoding", "system", "test", tmp_path / "sub" / "f.png"
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_mode & 0o777 == 0o644  # readable like any report, not owner-only


def test_a_figure_that_fails_to_save_leaves_the_old_one(tmp_path, monkeypatch):
    import matplotlib.figure

    curve = {"a": [(1.0, 0.1), (2.0, 0.3)]}
    path = line_figure(curve, "t", tmp_path / "f.png")
    before = path.read_bytes()

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", fail)
    with pytest.raises(OSError, match="disk full"):
        line_figure(curve, "t", path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["f.png"]


def _png_size(path):
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the IHDR chunk
    return width, height


def test_line_figure_wraps_its_panels_into_rows(tmp_path):
    curve = [(1.0, 0.1), (2.0, 0.3)]
    one_row = line_figure({"a": curve, "b": curve}, "t", tmp_path / "two.png")
    # five panels, three a row; the long curve is drawn smoothed
    long_curve = [(float(x), float(x % 3)) for x in range(30)]
    five = {"a": curve, "b": curve, "c": curve, "d": curve, "e": long_curve}
    two_rows = line_figure(five, "t", tmp_path / "five.png", per_row=3)
    width, height = _png_size(one_row)
    assert width == 2 * height  # two panels side by side
    width, height = _png_size(two_rows)
    assert width * 2 == height * 3  # three columns, two rows, one panel hidden


def test_trailing_mean_by_hand():
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([2.0, 4.0, 9.0], 3) == [2.0, 3.0, 5.0]
    assert trailing_mean([2.0, 4.0], 1) == [2.0, 4.0]
