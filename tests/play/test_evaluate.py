"""The evaluation path on a game written only here (no model loads): scripted systems play every
record's game their own replies, turn by turn, as games end at different turns; a system that does not
play a mode gets its note; rows, paired comparisons, the records log and the progress bar's headline."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from emoji_rl.decode.generate import Decoding
from emoji_rl.errors import UserError
from emoji_rl.lm import models, template
from emoji_rl.play import evaluate, registry
from emoji_rl.play.evaluation import (
    EvalConfig,
    EvalOptions,
    EvalPlan,
    Evaluation,
    ModelSender,
    Report,
    Scripted,
)
from emoji_rl.play.spec import GameConfig, GameContext, GameSpec, stage_config
from emoji_rl.play.types import Env, GameSetup, StepResult

# Record -> its secret word; each system's replies to it, turn by turn.
SECRETS = {"a": "cat", "b": "dog", "c": "sun"}
GOOD = {"a": ["cat"], "b": ["sky", "sea", "dog"], "c": ["sea", "sun"]}
BAD = {"a": ["owl", "owl", "owl"], "b": ["owl", "owl", "owl"], "c": ["owl", "owl", "owl"]}
MODES = {"short": 1, "long": 3}


class Guess(Env):
    """Say the secret word: won when a reply is it, lost after `turns` replies."""

    def __init__(self, tokenizer, secret: str, turns: int) -> None:
        self.tokenizer, self.secret, self.turns, self.said = tokenizer, secret, turns, 0

    def ids(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def start(self) -> tuple[int, ...]:
        return self.ids("Say the word.")

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        assert action_ids[-1] == template.stop_token_id(self.tokenizer)
        guess = self.tokenizer.decode(action_ids[:-1]).strip()
        self.said += 1
        won = guess == self.secret
        if won or self.said == self.turns:
            metrics = {"won": float(won), "turns": float(self.said)}
            return StepResult(True, float(won), metrics=metrics, log={"guess": guess})
        return StepResult(False, 0.0, self.ids(" No."), log={"guess": guess})


@dataclass
class Options(EvalOptions):
    def system_names(self) -> list[str]:
        return list(self.systems)  # every system here is scripted


def setup(cfg: GameConfig, context: GameContext) -> GameSetup:
    modes = {
        mode: lambda r, t=turns: Guess(context.tokenizer, SECRETS[r["id"]], t)
        for mode, turns in MODES.items()
    }
    return GameSetup(modes["long"], context.records, "none", "guess", target=lambda r: r["id"], modes=modes)


def plan(cfg, game, records, tokenizer) -> EvalPlan:
    return EvalPlan(
        sender=ModelSender(Decoding("none", 0.0, 8)),
        scripted={
            "good": Scripted([GOOD[r["id"]] for r in records]),
            "bad": Scripted(
                [BAD[r["id"]] for r in records], modes=("long",), note="n/a: plays long games only"
            ),
        },
        score=lambda indices, episodes: [
            {"turns": [t.result.log["guess"] for t in e.turns], "won": e.turns[-1].result.metrics["won"]}
            for e in episodes
        ],
        report=Report(
            header={"game": "guess"}, columns=["system", "mode", "n", "won"], figure=["won"], title="guess"
        ),
    )


EVALUATION = Evaluation(
    unit="game",
    compared={"won": lambda record: record["won"]},
    headline="won",
    plan=plan,
    summarize=lambda records, cfg: {"won": sum(r["won"] for r in records) / len(records)},
    config=Options,
)
GAME = GameSpec("guess", "say the word", GameConfig, setup, EVALUATION)
Config = stage_config(EvalConfig, GAME, Options)


@pytest.fixture
def run(tmp_path, monkeypatch, smollm2_tokenizer):
    monkeypatch.setattr(models, "load_tokenizer", lambda spec: smollm2_tokenizer)
    data = tmp_path / "held_out.jsonl"
    data.write_text("".join(json.dumps({"id": key}) + "\n" for key in SECRETS))
    out = tmp_path / "report"
    return Config(systems=["good", "bad"], data=str(data), output_dir=str(out), batch_size=2), out


def test_scripted_systems_play_their_own_replies_to_each_game_as_games_end_at_different_turns(run, capsys):
    cfg, out = run
    evaluate.evaluate(GAME, cfg)
    report = json.loads((out / "guess.json").read_text())
    assert report["game"] == "guess"
    records = {(r["system"], r["mode"], r["id"]): r for r in report["records"]}
    # In batches [a, b] and [c]: a wins at once, c on its second turn while b plays on to its third.
    assert [records["good", "long", key]["turns"] for key in "abc"] == [GOOD[key] for key in "abc"]
    assert [records["good", "short", key]["turns"] for key in "abc"] == [["cat"], ["sky"], ["sea"]]
    assert all(records["bad", "long", key]["turns"] == BAD[key] for key in "abc")
    rows = {(r["system"], r["mode"]): r for r in report["rows"]}
    assert rows["good", "short"] == {"system": "good", "mode": "short", "n": 3, "won": pytest.approx(1 / 3)}
    assert rows["good", "long"]["won"] == 1.0 and rows["bad", "long"]["won"] == 0.0
    assert rows["bad", "short"] == {
        "system": "bad",
        "mode": "short",
        "n": 0,
        "note": "n/a: plays long games only",
    }
    # The default comparison, bad - good, in the one mode both played.
    [compared] = report["comparisons"]
    assert (compared["a"], compared["b"], compared["mode"], compared["n"], compared["mean"]) == (
        "bad",
        "good",
        "long",
        3,
        -1.0,
    )
    logged = [json.loads(line) for line in (out / "guess_records.jsonl").read_text().splitlines()]
    assert logged[0]["config"]["systems"]["good"].startswith("answers sha256:") and len(logged) == 1 + 9
    printed = capsys.readouterr()
    assert "eval-guess: good short-turn: won 0.333 (3 games, 3 played in" in printed.out
    assert "bad - good (long, 3 games) won" in printed.out
    assert "won 0.333" in printed.err  # the progress bar's headline, as the games end


def test_scripted_systems_without_an_adapter_keep_to_the_reference_records(run):
    cfg, out = run
    cfg.reference_examples = 2
    evaluate.evaluate(GAME, cfg)
    report = json.loads((out / "guess.json").read_text())
    assert {r["id"] for r in report["records"]} == {"a", "b"}


def test_a_game_without_an_evaluation_is_named(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})  # registered for this test only
    registry.register(GameSpec("plain", "no evaluation", GameConfig, setup))
    with pytest.raises(UserError, match="game 'plain' has no evaluation"):
        evaluate.config_class("plain")
    with pytest.raises(ValueError, match="headline 'lost' is not a compared metric"):
        Evaluation("game", {"won": float}, "lost")
