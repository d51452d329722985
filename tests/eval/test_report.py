from emoji_rl.eval.report import bar_figure, format_table

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
