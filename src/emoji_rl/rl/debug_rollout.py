"""`emoji-rl debug-rollout`: logged GRPO episodes, pretty-printed: per group its target; per turn what
the game logged (its text: what the policy wrote, what its partner answered; its numbers); per episode
the reward and its advantage in the group. Any game's episodes read the same way: the fields are the
game's own (`StepResult.log` and `.metrics`, as rollouts.jsonl holds them).

    emoji-rl debug-rollout --run runs/grpo --step 5
    emoji-rl debug-rollout --run runs/grpo --step -1 --sort worst --limit 4
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Literal

from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import read_jsonl


@dataclass
class Config:
    """Pretty-print logged GRPO episodes."""

    run: str = field(default="runs/grpo", metadata={"help": "GRPO run directory (holds rollouts.jsonl)"})
    step: int = field(default=-1, metadata={"help": "step to show; -1 = the last logged step"})
    prompt_id: str | None = field(default=None, metadata={"help": "show only this prompt's group"})
    sort: Literal["group", "best", "worst"] = field(
        default="group", metadata={"help": "order: by group, or by reward (best or worst first)"}
    )
    limit: int = field(default=0, metadata={"help": "show at most this many episodes (0 = all)"})


def target_line(record: dict) -> str:
    # Logs written before the target was logged have none: say so rather than fail.
    return f"target {record['target']!r}" if record.get("target") else "target not logged"


def format_episode(record: dict, with_target: bool = True) -> str:
    """One episode; `with_target`: its target on its own line (episodes sorted by reward, out of
    their groups, each need theirs)."""
    seat = f" ({record['seat']})" if "seat" in record else ""  # one seat of a game of several
    lines = [
        f"prompt {record['prompt_id']} rollout {record['rollout']}{seat}: "
        f"reward {record['reward']:+.3f}  advantage {record['advantage']:+.3f}"
    ]
    if with_target:
        lines.append(f"  {target_line(record)}")
    for t, turn in enumerate(record["turns"], start=1):
        numbers = {key: value for key, value in turn.items() if isinstance(value, int | float)}
        shown = "  ".join(f"{key} {value:.3f}" for key, value in numbers.items())
        lines.append(f"  turn {t}: {shown}".rstrip())
        lines.extend(f"    {key}: {value}" for key, value in turn.items() if key not in numbers)
    return "\n".join(lines)


def select(records: list[dict], cfg: Config) -> list[dict]:
    steps = sorted({r["step"] for r in records})
    step = steps[-1] if cfg.step == -1 else cfg.step
    if step not in steps:
        raise UserError(f"step {cfg.step} is not in the log; logged steps: {steps[0]}..{steps[-1]}")
    chosen = [r for r in records if r["step"] == step and cfg.prompt_id in (None, r["prompt_id"])]
    if cfg.sort != "group":
        chosen.sort(key=lambda r: r["reward"], reverse=cfg.sort == "best")
    return chosen[: cfg.limit] if cfg.limit else chosen


def main(cfg: Config) -> None:
    path = Path(cfg.run) / "rollouts.jsonl"
    records = read_jsonl(path, hint="it is written by `emoji-rl grpo` in its output_dir")
    chosen = select(records, cfg)
    print(f"{path}: step {chosen[0]['step'] if chosen else '-'}, {len(chosen)} episodes\n")
    for prompt_id, episodes in groupby(chosen, key=lambda r: r["prompt_id"]):
        group = list(episodes)
        if cfg.sort == "group":
            print(f"=== group {prompt_id}: {target_line(group[0])}")
        for record in group:
            print(format_episode(record, with_target=cfg.sort != "group"))
        print()
