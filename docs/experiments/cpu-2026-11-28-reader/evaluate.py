"""The reader on held-out messages, base against GRPO, run by hand (docs/experiments/README.md, "The
reader's seat"): every record of an SFT split played through the reader game (game/play.py) by the base
model and by each adapter, greedy, against the run's own sender and embedder; per record, the final
guess's similarity, the first guess's (the teacher's emoji alone) and the reward; paired 95% bootstrap
intervals of (adapter - base) per message (eval/intervals.py).

    PYTHONPATH=src .venv/bin/python docs/experiments/cpu-2026-11-28-reader/evaluate.py \
        --config configs/cpu/grpo.reader.yaml --data RUN/data/sft_test.jsonl \
        --adapter rl=RUN/grpo/adapter --out RUN/eval.json

A stopgap until the evaluation every game shares (game/evaluate.py) lands: the playing is a player's
job, which the layers keep out of games/ (tests/test_imports.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from emoji_rl.config import parse_config
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.eval.intervals import bootstrap_mean, paired_bootstrap
from emoji_rl.game import registry
from emoji_rl.game.play import play
from emoji_rl.game.registry import GameContext
from emoji_rl.lm import models
from emoji_rl.lm.adapters import active_system, load_systems
from emoji_rl.rl.train_config import config_class

FIGURES = ("similarity", "first_similarity", "reward/total")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the grpo --game reader YAML the run trained with")
    parser.add_argument("--data", required=True, help="held-out SFT split (sft_test.jsonl)")
    parser.add_argument("--adapter", action="append", default=[], help="NAME=ADAPTER_DIR, one or more")
    parser.add_argument("--out", required=True, help="JSON of every record's figures and the summary")
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()

    cfg = parse_config(
        config_class("reader"), ["--config", args.config, "--train_data", args.data], "evaluate"
    )
    runtime = models.pick_runtime("cpu")
    tokenizer = models.load_tokenizer(cfg.model)
    systems = {"base": None, **dict(spec.split("=", 1) for spec in args.adapter)}
    model = load_systems(models.load_causal_lm(cfg.model, runtime), systems)
    width = model.get_output_embeddings().weight.shape[0]
    game = registry.load("reader").setup(cfg, GameContext(tokenizer, runtime, width))
    rows: dict[str, list[dict]] = {}
    for name, adapter in systems.items():
        start = time.perf_counter()
        with active_system(model, name, adapter):
            sampler = HFSampler(model, tokenizer, "none", 0.0, cfg.max_new_tokens, args.batch_size)
            episodes = asyncio.run(play([game.make_game(r) for r in game.records], sampler))
        rows[name] = [
            {
                "id": record.get("id"),
                "target": record["target"],
                **{k: episode.turns[-1].result.metrics[k] for k in (*FIGURES, "turns")},
                "guesses": [turn.result.log["guess"] for turn in episode.turns],
                "emoji": [turn.result.log["emoji"] for turn in episode.turns],
            }
            for record, episode in zip(game.records, episodes, strict=True)
        ]
        print(f"{name}: {len(episodes)} records in {time.perf_counter() - start:.0f} s")
    summary = {}
    for name, played in rows.items():
        for figure in FIGURES:
            mean = bootstrap_mean([row[figure] for row in played])
            summary[f"{name} {figure}"] = mean.__dict__
            if name != "base":
                base = [row[figure] for row in rows["base"]]
                diff = paired_bootstrap([row[figure] for row in played], base)
                summary[f"{name} - base {figure}"] = diff.__dict__
    for key, value in summary.items():
        print(f"{key:32s} {value['mean']:+.4f} [{value['low']:+.4f}, {value['high']:+.4f}]")
    Path(args.out).write_text(json.dumps({"summary": summary, "records": rows}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
