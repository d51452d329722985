"""The proof of the game registry: Twenty Questions, written only here (the game and its evaluation are
under 100 lines), found through an installed package's entry point (a dist-info folder on sys.path,
as pip writes it) by `emoji-rl grpo --game twenty-questions`, which trains it 2 GRPO steps in-process
and one against the fake vLLM server one version behind, and by `emoji-rl eval --game
twenty-questions`, which evaluates it. No file outside this one knows it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.vllm_server import FakeVLLMServer

from emoji_rl import cli
from emoji_rl.config import override
from emoji_rl.io.jsonl import read_records
from emoji_rl.io.metrics import read_metrics
from emoji_rl.play import registry
from emoji_rl.play.chat import ChatEnv
from emoji_rl.play.evaluation import Evaluation
from emoji_rl.play.spec import GameConfig, GameContext, GameSpec
from emoji_rl.play.types import GameSetup, StepResult

pytestmark = pytest.mark.slow

# --- the game ------------------------------------------------------------------------------------

PROPERTIES = {"cat": {"animal", "pet", "fur"}, "apple": {"fruit", "red", "food"}, "car": {"wheels", "drive"}}
ASK = "I am thinking of a thing. Ask me one yes/no question about it, or name it."


@dataclass
class Config(GameConfig):
    """Twenty Questions: train_data holds `word`."""

    max_turns: int = override(GameConfig, "max_turns", 3, help="questions before the answerer tells")

    def read_records(self, path, stage):
        return read_records(path, "word", "write it by hand")


def answer(word: str, question: str) -> str:
    """The scripted answerer: it knows the word and its properties, and reads words, not grammar."""
    words = set(question.lower().replace("?", " ").split())
    return "yes" if word in words or words & PROPERTIES[word] else "no"


class TwentyQuestions(ChatEnv):
    """The policy asks; a question earns 0.1, a yes 0.3, naming the word 1 and ends the game."""

    def __init__(self, tokenizer, word: str, max_turns: int) -> None:
        super().__init__(tokenizer, [{"role": "user", "content": ASK}])
        self.word, self.max_turns, self.score, self.asked = word, max_turns, 0.0, 0

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        text, _ = self.read(action_ids)
        self.asked += 1
        said = answer(self.word, text)
        won = said == "yes" and self.word in text.lower()
        self.score += 0.1 * text.strip().endswith("?") + 0.3 * (said == "yes") + 1.0 * won
        log = {"question": text, "answer": said}
        if won or self.asked == self.max_turns:
            return StepResult(
                True, self.score, metrics={"won": float(won), "questions": float(self.asked)}, log=log
            )
        observation = self.reply(
            text, action_ids, {"role": "user", "content": f"{said.capitalize()}. Ask again."}
        )
        return StepResult(False, 0.0, observation, log=log)


def setup(cfg: Config, context: GameContext) -> GameSetup:
    return GameSetup(
        lambda record: TwentyQuestions(context.tokenizer, record["word"], cfg.max_turns),
        context.records,
        "none",
        "twenty questions, scripted answerer",
        target=lambda record: record["word"],
        headline=("won", "game/won"),
    )


# Each system's row: its share of words found and the questions it asked, compared word by word.
EVALUATION = Evaluation(
    unit="word",
    compared={"won": lambda r: r["metrics"]["won"], "questions": lambda r: r["metrics"]["questions"]},
    headline="won",
)
GAME = GameSpec(
    "twenty-questions", "the policy asks yes/no questions to find a word", Config, setup, EVALUATION
)

# --- the proof -----------------------------------------------------------------------------------

KEY_ENV = "EMOJI_RL_TEST_POLICY_KEY"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """This module as an installed package's game: an entry point in a dist-info folder on sys.path."""
    info = tmp_path / "site" / "twenty_questions-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: twenty-questions\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\ntwenty-questions = {__name__}:GAME\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    data = tmp_path / "words.jsonl"
    data.write_text("".join(json.dumps({"id": w, "word": w}) + "\n" for w in PROPERTIES))
    return data


def grpo(data: Path, args: list[str], out: Path) -> list[dict]:
    game = ["--game", "twenty-questions", "--train_data", str(data), "--batch_size", "2", "--group_size", "2"]
    common = ["--max_new_tokens", "12", "--lora_r", "4", "--per_device_train_batch_size", "4", "--beta", "0"]
    assert cli.main(["grpo", *game, *args, *common, "--output_dir", str(out)]) == 0
    return read_metrics(out)


def test_a_game_written_only_here_trains_in_process_and_one_version_behind_a_server_and_evaluates(
    installed, tmp_path, monkeypatch
):
    assert (
        "twenty-questions" in registry.names()
        and registry.load("twenty-questions").name == "twenty-questions"
    )
    metrics = grpo(installed, ["--max_steps", "2", "--save_steps", "2"], tmp_path / "hf")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all({"game/won", "game/questions", "reward/mean"} <= m.keys() for m in metrics)
    episodes = [json.loads(line) for line in (tmp_path / "hf" / "rollouts.jsonl").read_text().splitlines()]
    assert {e["target"] for e in episodes} <= set(PROPERTIES)
    turns = [t for e in episodes for t in e["turns"]]
    assert all(t["answer"] == answer(e["target"], t["question"]) for e in episodes for t in e["turns"])
    assert len(turns) > len(episodes)  # some episodes went on after a first question
    assert (tmp_path / "hf" / "adapter" / "adapter_model.safetensors").is_file()

    # The evaluation: the base model and the adapter just trained ask about each word, side by side.
    report = tmp_path / "report"
    systems = ["--systems", "base", f"rl={tmp_path / 'hf' / 'adapter'}", "--max_new_tokens", "12"]
    assert (
        cli.main(
            [
                "eval",
                "--game",
                "twenty-questions",
                "--data",
                str(installed),
                *systems,
                "--output_dir",
                str(report),
            ]
        )
        == 0
    )
    evaluated = json.loads((report / "twenty-questions.json").read_text())
    assert [(r["system"], r["mode"], r["n"]) for r in evaluated["rows"]] == [
        ("base", "multi", 3),
        ("rl", "multi", 3),
    ]
    base = [r for r in evaluated["records"] if r["system"] == "base"]
    assert evaluated["rows"][0]["questions"] == pytest.approx(
        sum(r["metrics"]["questions"] for r in base) / 3
    )
    assert all(t["answer"] == answer(r["target"], t["question"]) for r in base for t in r["turns"])
    assert {(c["a"], c["b"], c["metric"]) for c in evaluated["comparisons"]} == {
        ("rl", "base", "won"),
        ("rl", "base", "questions"),
    }
    assert (report / "twenty-questions.png").stat().st_size > 0

    monkeypatch.setenv(KEY_ENV, "test-key")
    from emoji_rl.lm import models

    with FakeVLLMServer(
        FakeLM(models.load_tokenizer(models.SMOLLM2)), logprobs_mode="processed_logprobs"
    ) as fake:
        served = ["--engine", "vllm", "--vllm_url", fake.url, "--vllm_api_key_env", KEY_ENV]
        async_args = [*served, "--max_off_policy_steps", "1", "--max_steps", "1", "--save_steps", "1"]
        metrics = grpo(installed, async_args, tmp_path / "vllm")
        assert [m["step"] for m in metrics] == [1] and metrics[0]["async/version_lag"] == 0.0
        assert (
            fake.bodies("/v1/completions") and "structured_outputs" not in fake.bodies("/v1/completions")[0]
        )
