"""docs/ARCHITECTURE.md, "Write a game", run as written: its module installed as a package (a dist-info
folder on sys.path with the section's entry point, as pip writes it), its two commands run, GRPO made
short and the model tiny by flags added after them (the command line's last value wins)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from emoji_rl import cli
from emoji_rl.play import registry

pytestmark = pytest.mark.slow

SECTION = (Path(__file__).parents[1] / "docs" / "ARCHITECTURE.md").read_text().split("## Write a game")[1]


def block(language: str) -> str:
    (text,) = re.findall(rf"```{language}\n(.*?)```", SECTION, re.DOTALL)
    return text


def test_the_write_a_game_example_installs_trains_and_evaluates(tmp_path, monkeypatch, tiny_qwen):
    points = tomllib.loads(block("toml"))["project"]["entry-points"][registry.ENTRY_POINTS]
    ((name, value),) = points.items()
    module = value.split(":")[0]
    site = tmp_path / "site"
    (site / f"{module}-0.1.dist-info").mkdir(parents=True)
    (site / f"{module}.py").write_text(block("python"))
    (site / f"{module}-0.1.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n"
    )
    (site / f"{module}-0.1.dist-info" / "entry_points.txt").write_text(
        f"[{registry.ENTRY_POINTS}]\n{name} = {value}\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    words = ["apple", "river", "candle", "tiger"]
    for path, chosen in (("words.jsonl", words), ("held_out.jsonl", words[:2])):
        Path(path).write_text("".join(json.dumps({"id": w, "word": w}) + "\n" for w in chosen))

    grpo, evaluation = (shlex.split(line)[1:] for line in block("bash").strip().splitlines())
    tiny = ["--model", str(tiny_qwen), "--max_new_tokens", "6"]
    short = ["--max_steps", "2", "--batch_size", "2", "--group_size", "2", "--lora_r", "4", "--beta", "0"]
    assert cli.main([*grpo, *tiny, *short]) == 0
    assert cli.main([*evaluation, *tiny]) == 0

    report = json.loads(Path(f"reports/{name}/{name}.json").read_text())
    assert [(r["system"], r["n"]) for r in report["rows"]] == [("base", 2), ("rl", 2)]
    assert all(0.0 <= r["said"] <= 1.0 for r in report["rows"])
    assert {(c["a"], c["b"], c["metric"]) for c in report["comparisons"]} == {("rl", "base", "said")}
    assert {r["target"] for r in report["records"]} == set(words[:2])
    assert all(set(r["turns"][0]) == {"reply"} for r in report["records"])
    assert Path(f"reports/{name}/{name}.png").stat().st_size > 0
