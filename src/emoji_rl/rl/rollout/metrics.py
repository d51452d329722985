"""What a GRPO step's rollouts report: aggregated numbers for `metrics.jsonl` (`reward/`, `game/`,
`group/`, `tokens/`, and `emoji/` where the game sends emoji) and one record per episode for
`rollouts.jsonl` (read by `emoji-rl debug-rollout`).
The two stay apart: numbers to plot, text to read."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from emoji_rl.emoji.stats import reply_stats
from emoji_rl.io.jsonl import AppendLog
from emoji_rl.play.types import POLICY, EpisodeGroup, Turn
from emoji_rl.rl.rollout.collect import StepGroups

ROLLOUTS_FILE = "rollouts.jsonl"


def seat_metric(name: str, seat: str | None) -> str:
    """`name` of one seat's rows, where the policy plays several (`reward/mean` -> `reward/SEAT/mean`);
    `seat` None: `name` itself, as a game of one seat logs it."""
    if seat is None:
        return name
    head, _, tail = name.partition("/")
    return f"{head}/{seat}/{tail}"


def rollout_metrics(played: Sequence[EpisodeGroup], kept: Sequence[EpisodeGroup]) -> dict[str, float]:
    """Reward (mean, spread, each group's best) and the groups kept, per seat where the policy plays
    several (`seat_metric`); group and token counts over every played episode, and the mean of each
    metric the games report on their last turn (`reward/<term>` -> `reward/<term>/mean`, others ->
    `game/<key>`)."""
    seats = list(dict.fromkeys(g.seat for g in played))
    seated = seats != [POLICY]
    prompts = [g for g in played if g.seat == seats[0]]  # each episode once
    episodes = [e for g in prompts for e in g.episodes]
    final = [e.turns[-1].result.metrics for e in episodes]
    keys = sorted({k for m in final for k in m})
    metrics: dict[str, float] = {}
    for seat in seats:
        mine = [g for g in played if g.seat == seat]
        rewards = torch.tensor([r for g in mine for r in g.rewards], dtype=torch.float)
        name = functools.partial(seat_metric, seat=seat if seated else None)
        metrics[name("reward/mean")] = rewards.mean().item()
        metrics[name("reward/std")] = rewards.std().item() if len(rewards) > 1 else 0.0
        # Each group's best episode beside the mean: how far above its usual answer the policy already
        # reaches, the room the group's advantages have to move it (flat groups learn little).
        metrics[name("reward/group_best")] = sum(max(g.rewards) for g in mine) / len(mine)
        metrics[name("group/frac_zero_std")] = 1.0 - sum(g.seat == seat for g in kept) / len(mine)
    metrics["group/played"] = float(len(prompts))
    for seat in seats:
        metrics[seat_metric("group/kept", seat if seated else None)] = float(
            sum(g.seat == seat for g in kept)
        )
    metrics["tokens/sampled"] = float(sum(len(t.action_ids) for e in episodes for t in e.turns))
    for key in keys:
        values = [m[key] for m in final if key in m]
        name = f"{key}/mean" if key.startswith("reward/") else f"game/{key}"
        metrics[name] = sum(values) / len(values)
    # Collapse to a few generic emoji shows here first (seed 001's SFT did): over every turn's message.
    sent = [t.result.log["emoji"] for e in episodes for t in e.turns if "emoji" in t.result.log]
    if sent:
        stats = reply_stats(sent)
        metrics["emoji/distinct"] = float(stats.distinct_emoji)
        metrics["emoji/entropy_bits"] = stats.entropy_bits
        metrics["emoji/per_message"] = stats.emoji_per_message
    return metrics


def step_metrics(rollouts: StepGroups, services: dict[str, float]) -> dict[str, float]:
    """What the step's rollouts report, over every process's (gathered) `StepGroups`, and times
    (`services`: seconds per service) of the slowest process, which the step waits for."""
    metrics = rollout_metrics(rollouts.played, rollouts.kept)
    for key, seconds in services.items():
        metrics[f"time/{key}_s"] = seconds
    metrics["time/rollout_s"] = rollouts.seconds
    metrics["throughput/tokens_per_s"] = metrics["tokens/sampled"] / max(rollouts.seconds, 1e-9)
    return metrics


def log_rollouts(
    log_file: AppendLog, step: int, groups: Sequence[EpisodeGroup], ranks: Sequence[int]
) -> list[dict]:
    """One record per episode (per episode and seat, where the policy plays several: its `seat`), appended
    and returned: the target its group played for, the process that played it (`ranks`, one per group:
    over several processes each plays its share of the step), its reward, the advantage it trained with
    (`group.advantages`; 0 in a group with no spread), and every turn's log and metrics (the seat's),
    with the adapter version that sampled it on a server."""
    records = [
        {
            "step": step,
            "rank": rank,
            "prompt_id": group.prompt_id,
            **({} if group.seat == POLICY else {"seat": group.seat}),
            "target": group.target,
            "rollout": g,
            "reward": reward,
            "advantage": advantage,
            "turns": [_turn_record(turn) for turn in row.turns],
        }
        for group, rank in zip(groups, ranks, strict=True)
        for g, (row, reward, advantage) in enumerate(
            zip(group.rows(), group.rewards, group.advantages, strict=True)
        )
    ]
    for record in records:
        log_file.append(record)
    return records


EPISODE_COLUMNS = ["step", "target", "rollout", "turns", "reward", "advantage", "sampler_version"]


def episode_table(records: Sequence[dict], limit: int | None) -> list[list]:
    """The first `limit` (None: all) of a step's rollout records as rows of EPISODE_COLUMNS, for a
    person to read in a tracker: each turn on a line of its game's own log (`key: value`), the version
    that sampled the episode's last turn (blank in process); a record of one seat of several says
    which beside its rollout (`3 (SEAT)`)."""

    def turn_line(number: int, turn: dict) -> str:
        fields = (f"{k}: {_short(v)}" for k, v in turn.items() if k != "sampler_version")
        return f"{number}. " + "; ".join(fields)

    return [
        [
            r["step"],
            r["target"],
            f"{r['rollout']} ({r['seat']})" if "seat" in r else r["rollout"],
            "\n".join(turn_line(i, t) for i, t in enumerate(r["turns"], 1)),
            r["reward"],
            r["advantage"],
            r["turns"][-1].get("sampler_version", "") if r["turns"] else "",
        ]
        for r in records[:limit]
    ]


def _short(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _turn_record(turn: Turn) -> dict[str, object]:
    record: dict[str, object] = {**turn.result.log, **turn.result.metrics}
    if turn.sampler_version is not None:
        record["sampler_version"] = turn.sampler_version
    return record
