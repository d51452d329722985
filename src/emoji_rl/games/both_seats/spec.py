"""Both seats (docs/DESIGN.md §15), as `emoji-rl grpo --game both_seats` trains it and `emoji-rl eval --game
both` reports it: the policy writes emoji for each target under the grammar and reads them back in
the judge's guessing chat, while the frozen judge reads the same emoji. Its records are the retrieval
game's (`emoji-rl rl-prompts`: `target`); the teacher's emoji, for the readings of `teacher_share` of
them, come from an SFT split (`teacher_data`), looked up by target, since rl-prompts' records hold the
SFT sender's emoji and not the teacher's. Its fields: the game's length and threshold, the sender's
reward weights and the judge's share of it, the judge, what the reader is shown, the embedder and the
contrast term; its setup builds the judge, the similarity and the rules once, for the training game and
the evaluation's modes (`pair`: every reading of the sender's emoji; `teacher`: of the teacher's, on
the records that have them) alike."""

from __future__ import annotations

from dataclasses import dataclass

from emoji_rl.decode.senders import teacher_answer_map
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.errors import UserError
from emoji_rl.games.both_seats.evaluation import EVALUATION
from emoji_rl.games.both_seats.game import TEACHER, BothSeatsConfig
from emoji_rl.io.jsonl import read_records
from emoji_rl.play.guessing import ReaderViewConfig
from emoji_rl.play.judge_config import JudgeFields
from emoji_rl.play.reward import SenderRewardConfig
from emoji_rl.play.similarity import ContrastConfig, SimilarityConfig
from emoji_rl.play.spec import GameContext, GameSpec, RunSettings
from emoji_rl.play.types import GameSetup, Record


@dataclass
class Config(
    BothSeatsConfig, ReaderViewConfig, JudgeFields, SimilarityConfig, ContrastConfig, SenderRewardConfig
):
    """Both seats' fields: its records hold `target` (emoji-rl rl-prompts), the teacher's emoji come
    from `teacher_data`."""

    def read_records(self, path: str, stage: RunSettings) -> list[Record]:
        """The records at `path`, each the teacher has emoji for (`teacher_data`) holding them as
        TEACHER: both files read before any model loads, and a record carries its teacher's emoji to
        every process and every evaluation that plays it."""
        records = read_records(
            path, "target", "make it with `emoji-rl rl-prompts` (it writes the held-out split too)"
        )
        try:
            teacher = teacher_emoji(self.teacher_data, stage.min_emoji, stage.max_emoji)
        except UserError as err:
            raise UserError(f"teacher_data={self.teacher_data}: {err}") from None
        return [{**r, TEACHER: list(teacher[r["target"]])} if r["target"] in teacher else r for r in records]

    def wait_for_servers(self, wait_s: float) -> None:
        self.wait_for_judge_server(wait_s)


def teacher_emoji(path: str | None, min_emoji: int, max_emoji: int) -> dict[str, tuple[str, ...]]:
    """The teacher's emoji message of every target of the SFT split at `path` (none: no file), those
    that are one under the grammar's bounds."""
    answers = teacher_answer_map(path) if path is not None else {}
    parsed = {
        target: parse_message(answer.strip(), min_emoji, max_emoji) for target, answer in answers.items()
    }
    return {target: p.emoji for target, p in parsed.items() if p.ok}


def setup(cfg: Config, context: GameContext) -> GameSetup:
    from emoji_rl.games.both_seats.game import READER, SENDER, BothSeatsBuilder, BothSeatsRules
    from emoji_rl.play.similarity import GuessScorer

    records = context.records
    judge = cfg.make_judge(context.runtime, context.server_wait_s)
    similarity = cfg.load_similarity(context.runtime)
    background = cfg.background(similarity, [r["target"] for r in records], context.seed)
    rules = BothSeatsRules(
        cfg.max_turns,
        cfg.tau,
        context.min_emoji,
        context.max_emoji,
        cfg.judge_weight,
        cfg.reader_view,
        cfg.reward_weights(cfg.contrast),
    )
    score = GuessScorer(similarity, background)
    builder = BothSeatsBuilder(context.tokenizer, judge, score, rules, cfg.teacher_share, context.seed)
    # The evaluation reads every record both ways, side by side: the pair alone, the teacher's emoji.
    taught = any(TEACHER in r for r in records)
    modes = {"pair": builder.reading(0.0), **({"teacher": builder.reading(1.0)} if taught else {})}
    return GameSetup(
        builder,
        records,
        (SENDER, READER),
        f"both seats, judge {judge.describe()}, judge_weight {cfg.judge_weight}",
        target=lambda record: record["target"],
        headline=("judge", "game/judge_similarity"),
        seconds=lambda: builder.seconds,
        servers={"judge": judge.endpoint} if judge.endpoint else {},
        modes=modes,
    )


GAME = GameSpec(
    "both_seats",
    "the policy writes emoji for a message and reads them back, the frozen judge reading the same emoji; "
    "each seat rewarded on its own",
    Config,
    setup,
    EVALUATION,
)
