"""`emoji-rl eval --game NAME`: any game the registry finds on held-out records, systems side by side
(the built-in games keep their `eval-NAME` spellings: `cli.ALIASES`). Systems x
held-out records, played through the game in each of its modes (`play/loop.py`), each system's row of
the game's own final metrics, and the differences between systems as paired bootstrap intervals; a
table, NAME.json and NAME.png (io/report.py). The game is built by its own setup, the one grpo trains
on (the same judge, similarity and reward weights), from its records in `--data`; its evaluation
(`GameSpec.evaluation`, play/evaluation.py) says how a model system samples and how the report reads.

Differences can be believed because every system plays the same records, in the same batches, each
batch's draws seeded by its first record. Each game is appended to NAME_records.jsonl as its batch
ends, under a first line holding what the games depend on (play/eval_records.py): a rerun with the
same config plays only the games missing there, and one with another config is refused.

    emoji-rl eval --game NAME --help     # the game's fields and its evaluation's
    emoji-rl eval --game NAME --data held_out.jsonl --systems base sft=runs/sft/adapter rl=runs/grpo/adapter
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from emoji_rl.config import peek
from emoji_rl.decode.sampler import HFSampler, Sample, Sampler
from emoji_rl.decode.senders import System, parse_systems
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import AppendLog, Record, write_json
from emoji_rl.io.report import bar_figure, format_table
from emoji_rl.lm import models, template
from emoji_rl.lm.adapters import active_system, load_systems
from emoji_rl.play import registry
from emoji_rl.play.compare import LEVEL, compare_pairs, comparisons, format_comparisons
from emoji_rl.play.eval_records import (
    batch_seed,
    fingerprint,
    logged_records,
    played_indices,
    record_ids,
    system_fingerprint,
    unplayed_batches,
)
from emoji_rl.play.evaluation import EvalConfig, EvalPlan, Evaluation, ModelSender, Report, Scripted
from emoji_rl.play.loop import play
from emoji_rl.play.spec import GameContext, GameSpec, game_config, read_game_records, stage_config
from emoji_rl.play.types import Env


@functools.cache
def config_class(game: str) -> type[EvalConfig]:
    """`eval`'s Config for `game`: every evaluation's fields, the game's and its evaluation's own."""
    spec = registry.load(game)
    hooks = spec.evaluation
    if hooks is None:
        raise UserError(
            f"game {game!r} has no evaluation: its GameSpec holds no `evaluation` (docs/ARCHITECTURE.md, "
            '"Write a game")'
        )
    return stage_config(EvalConfig, spec, hooks.config, doc=hooks.config.__doc__ or spec.description)


def config_for(argv: list[str]) -> type[EvalConfig]:
    """The Config a command line asks for: its `--game`, or its YAML's `game`, or the default."""
    return config_class(peek(argv, "game") or registry.DEFAULT_GAME)


def main(cfg: EvalConfig) -> None:
    evaluate(registry.load(cfg.game), cfg)


class ScriptedSender:
    """A scripted system's sampler for the games of the records `batch`: each game's replies in turn,
    encoded as a model's turn ends (the stop token). Games are asked for in order on their first turn;
    after that each is known by its sample of the turn before, which carries its place in its script."""

    def __init__(self, tokenizer: Any, replies: Sequence[Sequence[str] | None], batch: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.stop = template.stop_token_id(tokenizer)
        self.scripts = [replies[i] for i in batch]
        self.started = 0

    async def sample(
        self, prompts: Sequence[tuple[int, ...]], previous: Sequence[Sample | None] | None = None
    ) -> list[Sample]:
        places = []
        for before in previous or [None] * len(prompts):
            if before is None:
                places.append((self.started, 0))
                self.started += 1
            else:
                game, turn = before.resume
                places.append((game, turn + 1))
        samples = []
        for game, turn in places:
            script = self.scripts[game] if game < len(self.scripts) else None
            if script is None or turn >= len(script):
                raise RuntimeError(
                    f"a scripted system was asked for turn {turn + 1} of game {game + 1}, past its replies"
                )
            ids = self.tokenizer(script[turn], add_special_tokens=False)["input_ids"]
            samples.append(Sample((*ids, self.stop), (), resume=(game, turn)))
        return samples


def model_sampler(model: torch.nn.Module, tokenizer: Any, sender: ModelSender, batch_size: int) -> Sampler:
    """A model system's sampler (one for all of them: the adapter is switched under it)."""
    return HFSampler(model, tokenizer, replace(sender.decoding, batch_size=batch_size), sender.unconditional)


def named_systems(cfg: EvalConfig, scripted: Mapping[str, Scripted]) -> dict[str, System | Scripted]:
    """Every system by name, in the report's order: the game's scripted ones, and models for the rest."""
    senders = parse_systems([s for s in cfg.systems if s.partition("=")[0] not in scripted])
    systems: dict[str, System | Scripted] = {}
    for name in cfg.system_names():
        if name in scripted:
            systems[name] = scripted[name]
        elif name not in senders:
            raise ValueError(
                f"system {name!r}: the config names it, but it is no model and the game's setup made no "
                f"scripted system of that name (it made {sorted(scripted)})"
            )
        else:
            path = senders[name]
            systems[name] = System(name, "base" if path is None else "adapter", path)
    return systems


def replies(system: System | Scripted) -> Sequence[object] | None:
    return system.replies if isinstance(system, Scripted) else None


def evaluate(spec: GameSpec, cfg: EvalConfig) -> None:
    """Play every system on the held-out records in every mode of `spec`'s game; write the report."""
    hooks = spec.evaluation
    assert hooks is not None, spec.name  # config_class refuses a game without one
    stage = f"eval-{spec.name}"
    rules = game_config(spec, cfg)
    held_out = read_game_records(rules, "data", cfg.data, cfg)  # before any model loads
    rules.wait_for_servers(cfg.server_wait_s)
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(cfg.model)
    # The game plays the held-out `data`; no policy server: every model system samples in process.
    built = spec.setup(rules, GameContext.of(cfg, tokenizer, runtime, held_out))
    records = built.records[: cfg.max_examples or None]
    ids = record_ids(records, cfg.data)
    plan = hooks.prepare(cfg, built, records, tokenizer)
    modes = {mode: built.games()[mode] for mode in plan.modes or built.games()}
    systems = named_systems(cfg, plan.scripted)
    pairs = compare_pairs(cfg.compare, systems)
    to_play = {
        (name, mode): played_indices(system, replies(system), len(records), cfg.reference_examples)
        for name, system in systems.items()
        for mode in modes
        if not isinstance(system, Scripted) or system.modes is None or mode in system.modes
    }
    depends = fingerprint(
        [ids, [built.target(r) for r in records]],
        {name: system_fingerprint(system, replies(system)) for name, system in systems.items()},
        {key: getattr(cfg, key) for key in cfg.result_fields},
    )
    with AppendLog(Path(cfg.output_dir) / f"{spec.name}_records.jsonl") as log:
        run = Run(cfg, hooks, plan, modes, records, ids, log, logged_records(log, depends))
        reused = sum(
            run.logged_key(name, mode, i) in run.logged
            for (name, mode), played in to_play.items()
            for i in played
        )
        if reused:
            print(f"{stage}: reusing {reused} records from {log.path}, playing the rest", flush=True)
        senders = {name: s.path for name, s in systems.items() if isinstance(s, System)}
        model = load_systems(models.load_causal_lm(cfg.model, runtime), senders) if senders else None
        sampler = model_sampler(model, tokenizer, plan.sender, cfg.batch_size) if model is not None else None
        rows: list[Record] = []
        kept: list[Record] = []
        for name, system in systems.items():
            for mode in modes:
                if (name, mode) not in to_play:
                    assert isinstance(system, Scripted)
                    rows.append({"system": name, "mode": mode, "n": 0, "note": system.note})
                    continue
                start = time.perf_counter()
                indices = to_play[name, mode]
                if isinstance(system, Scripted):
                    played = run.play(name, mode, indices, partial(ScriptedSender, tokenizer, system.replies))
                else:
                    assert model is not None and sampler is not None
                    with active_system(model, name, system.path):
                        played = run.play(name, mode, indices, lambda b: sampler)
                mine = [run.logged[run.logged_key(name, mode, i)] for i in indices]
                kept.extend(mine)
                rows.append({"system": name, "mode": mode, "n": len(mine), **hooks.row(mine, cfg)})
                print(
                    f"{stage}: {name} {mode}-turn: {hooks.headline} {rows[-1][hooks.headline]:.3f} "
                    f"({len(mine)} {hooks.unit}s, {played} played in {time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
    compared = comparisons(kept, pairs, hooks.compared, cfg.resamples, cfg.seed)
    write_report(Path(cfg.output_dir), spec.name, hooks, plan.report, rows, compared, kept)


@dataclass
class Run:
    """One evaluation's games as they are played: what the log holds, and how more are added to it."""

    cfg: EvalConfig
    hooks: Evaluation
    plan: EvalPlan
    games: Mapping[str, Callable[[Record], Env]]
    records: Sequence[Record]
    ids: Sequence[str]
    log: AppendLog
    logged: dict[tuple[str, str, str], Record]

    def logged_key(self, name: str, mode: str, index: int) -> tuple[str, str, str]:
        return name, mode, self.ids[index]

    def play(
        self, name: str, mode: str, indices: Sequence[int], sender: Callable[[Sequence[int]], Sampler]
    ) -> int:
        """Play the games of one system in one mode that the log lacks, a batch at a time (`sender`
        gives a batch's sampler) under a progress bar that shows the game's headline; each batch's
        records go to the log as it ends. Returns how many games the log lacked."""
        done = {i for i in indices if self.logged_key(name, mode, i) in self.logged}
        batches = unplayed_batches(indices, self.cfg.batch_size, done)
        headline = self.hooks.compared[self.hooks.headline]
        values = [headline(self.logged[self.logged_key(name, mode, i)]) for i in sorted(done)]
        with tqdm(total=sum(map(len, batches)), desc=f"{name} {mode}-turn", unit=self.hooks.unit) as bar:
            for batch in batches:
                torch.manual_seed(batch_seed(self.cfg.seed, batch[0]))
                games = [self.games[mode](self.records[i]) for i in batch]
                episodes = asyncio.run(play(games, sender(batch)))
                for i, fields in zip(batch, self.plan.score(batch, episodes), strict=True):
                    key = self.logged_key(name, mode, i)
                    # A batch cut short by a crash is replayed whole; what it logged stands.
                    if key not in self.logged:
                        self.logged[key] = {"system": name, "mode": mode, "id": key[2], **fields}
                        self.log.append(self.logged[key])
                    values.append(headline(self.logged[key]))
                bar.update(len(batch))
                bar.set_postfix_str(f"{self.hooks.headline} {sum(values) / len(values):.3f}")
        return len(indices) - len(done)


def write_report(
    out: Path,
    name: str,
    hooks: Evaluation,
    report: Report,
    rows: list[Record],
    compared: list[Record],
    played: list[Record],
) -> None:
    path = out / f"{name}.json"
    write_json(path, {**report.header, "rows": rows, "comparisons": compared, "records": played})
    figure = bar_figure(
        rows,
        report.figure,
        group=report.group,
        series="system",
        title=report.title,
        path=out / f"{name}.png",
    )
    print(f"\n{report.heading}\n" if report.heading else "")
    print(format_table([report.cells(r) for r in rows], report.columns) + "\n")
    if compared:
        print(f"differences, mean over the same {hooks.unit}s with {LEVEL:.0%} paired bootstrap intervals:")
        print(format_comparisons(compared, hooks.unit) + "\n")
    if report.note:
        print(report.note)
    print(f"report: {path}\nplot:   {figure}")
