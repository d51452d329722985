import json

import pytest

from emoji_rl.data import rl_prompts
from emoji_rl.data.prompts import Prompt
from emoji_rl.data.rl_prompts import Config, RoundTrip, candidates, round_trips, write_outputs
from emoji_rl.decode.generate import Reply
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.play.judge import LexiconJudge
from emoji_rl.play.similarity import Similarity


def prompt(i: int, text: str) -> Prompt:
    return Prompt(f"p-{i:02d}", text, "statement", "corpus")


def reply(text: str, stopped: bool = True) -> Reply:
    return Reply(text, (1, 2, 3), stopped, (-0.1, -0.2, -0.3))


def test_candidates_leave_out_the_sft_test_split_and_odd_lengths(tmp_path):
    prompts = [
        prompt(0, "let's grab pizza and watch a movie tonight"),
        prompt(1, "my cat knocked the birthday cake off the table"),
        prompt(2, "Let's grab pizza and watch a movie tonight!"),  # the same text as a test target
        prompt(3, "too short"),
        prompt(4, "I failed my driving test again and I feel terrible"),
    ]
    sft_test = [{"id": "p-01", "target": "my cat knocked the birthday cake off the table"}]
    sft_test.append({"id": "other", "target": "let's grab pizza and watch a movie tonight"})
    kept, dropped = candidates(prompts, sft_test, Config(output_dir=str(tmp_path)))
    assert [p.id for p in kept] == ["p-04"]
    assert dropped == {"in the SFT test split": 3, "out of length bounds": 1}


def test_max_prompts_takes_a_seeded_sample(tmp_path):
    prompts = [prompt(i, f"message number {i} about a day at the beach") for i in range(30)]
    cfg = Config(output_dir=str(tmp_path), max_prompts=10)
    kept, dropped = candidates(prompts, [], cfg)
    assert len(kept) == 10 and dropped == {"beyond max_prompts": 20}
    assert candidates(prompts, [], cfg)[0] == kept
    assert candidates(prompts, [], Config(output_dir=str(tmp_path), max_prompts=10, seed=1))[0] != kept


def test_round_trips_score_valid_replies_and_mark_invalid_ones(embedder):
    targets = ["Let's grab pizza and watch a movie tonight"] * 2 + [
        "My cat knocked the cake off the table"
    ] * 2
    replies = [reply("🍕 🎬 🌙"), reply("🧲 🦷 🪣"), reply("🐈 🎂 💥", stopped=False), reply("cat 🐈")]
    trips = round_trips(targets, replies, LexiconJudge(), Similarity(embedder), 2, 8)
    assert trips[0].emoji == ("🍕", "🎬", "🌙") and trips[0].guess.startswith("pizza")
    assert trips[0].similarity > trips[1].similarity + 0.2  # fitting emoji beat random ones
    assert trips[2] == trips[3] == RoundTrip((), "", -1.0)  # cut off; not emoji


def test_outputs_keep_the_threshold_and_split_train_from_eval(tmp_path):
    chosen = [prompt(i, f"message {i} about the beach today") for i in range(20)]
    trips = [RoundTrip(("🏖️", "☀️"), "beach, sun", i / 20) for i in range(20)]
    stats = write_outputs(Config(output_dir=str(tmp_path)), chosen, trips, {}, {"judge": "lexicon"})
    train, held = read_jsonl(tmp_path / rl_prompts.TRAIN_FILE), read_jsonl(tmp_path / rl_prompts.EVAL_FILE)
    assert (len(train), len(held)) == (11, 1)  # similarity 0.40 .. 0.95 kept, 10% held out
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert all(r["similarity"] >= 0.4 and r["emoji"] == "🏖️ ☀️" and r["target"] for r in train + held)
    assert stats["below_threshold"] == 8 and stats["similarity_histogram"]["0.9"] == 2
    assert json.loads((tmp_path / rl_prompts.STATS_FILE).read_text()) == stats


def test_nothing_kept_is_a_clear_error(tmp_path):
    trips = [RoundTrip(("🏖️", "☀️"), "beach", 0.1)]
    with pytest.raises(UserError, match=r"no prompt reached similarity 0\.4"):
        write_outputs(Config(output_dir=str(tmp_path)), [prompt(0, "a day at the beach")], trips, {}, {})


def test_a_missing_adapter_says_how_to_make_one(tmp_path):
    (tmp_path / "prompts.jsonl").write_text(
        json.dumps(prompt(0, "a long day at the beach with friends").to_record())
    )
    (tmp_path / "sft_test.jsonl").write_text('{"id": "x", "target": "y", "messages": []}\n')
    cfg = Config(
        prompts=str(tmp_path / "prompts.jsonl"),
        sft_test=str(tmp_path / "sft_test.jsonl"),
        adapter=str(tmp_path / "nope"),
        output_dir=str(tmp_path),
    )
    with pytest.raises(UserError, match="train one with `emoji-rl sft`, or pass --adapter none"):
        rl_prompts.main(cfg)


@pytest.mark.slow
def test_stage_end_to_end_on_the_embedded_sender(tmp_path):
    texts = ["I'm so excited for our beach trip this weekend", "Let's grab pizza and watch a movie tonight"]
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps(prompt(i, t).to_record()) + "\n" for i, t in enumerate(texts))
    )
    (tmp_path / "sft_test.jsonl").write_text('{"id": "x", "target": "y", "messages": []}\n')
    cfg = Config(
        prompts=str(tmp_path / "prompts.jsonl"),
        sft_test=str(tmp_path / "sft_test.jsonl"),
        output_dir=str(tmp_path),
        adapter=None,
        judge="lexicon",
        min_similarity=-1.0,
    )
    rl_prompts.main(cfg)
    kept = read_jsonl(tmp_path / rl_prompts.TRAIN_FILE, allow_empty=True) + read_jsonl(
        tmp_path / rl_prompts.EVAL_FILE
    )
    stats = json.loads((tmp_path / rl_prompts.STATS_FILE).read_text())
    assert len(kept) == stats["kept"] == 2 - stats["invalid_replies"]
