"""GRPO checkpoints carry the game's run state (the Wordle curriculum) with the rest, on a tiny model."""

import logging

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from emoji_rl.games.wordle.reward import Curriculum, CurriculumTracker
from emoji_rl.lm.distributed import follow_schedule
from emoji_rl.rl.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint, snapshot


def _tiny_run():
    """A one-layer random LM with a LoRA adapter, its optimizer and scheduler: seconds, no model files."""
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    policy = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    return policy, optimizer, scheduler


def _save(run_dir, state, policy, optimizer, scheduler, game=None):
    save_checkpoint(run_dir, state, policy, snapshot(policy, optimizer, scheduler, game))


def test_a_checkpoint_restores_the_curriculum_where_it_was(tmp_path):
    tracker = CurriculumTracker(Curriculum(window=4))
    tracker.phase = 1
    for share in (1.0, 0.5):
        tracker.record(share)
    _save(tmp_path, TrainState(step=3, cursor=2), *_tiny_run(), game=tracker)

    restored = CurriculumTracker(Curriculum(window=4))
    policy, _, _ = _tiny_run()
    state = load_checkpoint(latest_checkpoint(tmp_path), policy, game=restored)
    assert state == TrainState(step=3, cursor=2)
    assert restored.state_dict() == {"phase": 1, "recent": [1.0, 0.5]}


def test_a_checkpoint_without_game_state_says_the_game_starts_afresh(tmp_path, caplog):
    _save(tmp_path, TrainState(step=1), *_tiny_run())
    tracker = CurriculumTracker(Curriculum(window=4))
    with caplog.at_level(logging.WARNING):
        load_checkpoint(latest_checkpoint(tmp_path), _tiny_run()[0], game=tracker)
    assert tracker.state_dict() == {"phase": 0, "recent": []}
    assert "holds no game state" in caplog.text


def test_a_longer_resumed_run_follows_its_own_schedule():
    from transformers import get_scheduler

    def run(max_steps: int):
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
        return optimizer, get_scheduler("linear", optimizer, 0, max_steps)

    optimizer, scheduler = run(2)
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.0  # the end of a 2-step linear decay
    longer, longer_scheduler = run(4)
    longer.load_state_dict(optimizer.state_dict())
    longer_scheduler.load_state_dict(scheduler.state_dict())
    follow_schedule(longer, longer_scheduler)
    # Step 3 of 4 trains at 1e-3 x 2/4, as a fresh 4-step run would, and that is what gets logged.
    assert longer.param_groups[0]["lr"] == longer_scheduler.get_last_lr()[0] == 5e-4

    # The same schedule: the rate the checkpoint holds, exactly.
    same, same_scheduler = run(2)
    same.load_state_dict(optimizer.state_dict())
    same_scheduler.load_state_dict(scheduler.state_dict())
    follow_schedule(same, same_scheduler)
    assert same.param_groups[0]["lr"] == 0.0


class Killed(BaseException):
    """The process dying mid-save."""


@pytest.mark.parametrize("killed_in", ["adapter", "trainer_state", "rename", "pointer"])
def test_a_save_cut_short_at_any_point_leaves_the_last_whole_checkpoint(tmp_path, monkeypatch, killed_in):
    """GRPO's (and the Wordle curriculum's) checkpoints: killed at each point of the save of step 4,
    the run resumes from step 2 with its curriculum, and the next save of step 4 goes through."""
    import pathlib

    from emoji_rl.rl import checkpoint

    tracker = CurriculumTracker(Curriculum(window=4))
    tracker.record(1.0)
    _save(tmp_path, TrainState(step=2), *_tiny_run(), game=tracker)
    policy, optimizer, scheduler = _tiny_run()
    real_rename = pathlib.Path.rename

    def die(*args, **kwargs):
        raise Killed

    def half_written(obj, path):
        pathlib.Path(path).write_bytes(b"PK\x03")  # the start of a zip, torch.save's format
        raise Killed

    def rename_then(target_name):
        def rename(self, target):
            if pathlib.Path(target).name == target_name:
                raise Killed
            return real_rename(self, target)

        return rename

    with monkeypatch.context() as patch:
        if killed_in == "adapter":
            patch.setattr(policy, "save_pretrained", die)
        elif killed_in == "trainer_state":
            patch.setattr(checkpoint.torch, "save", half_written)
        else:
            patch.setattr(
                pathlib.Path, "rename", rename_then("step-000004" if killed_in == "rename" else "latest")
            )
        with pytest.raises(Killed):
            _save(tmp_path, TrainState(step=4), policy, optimizer, scheduler, game=tracker)
    restored = CurriculumTracker(Curriculum(window=4))
    assert load_checkpoint(latest_checkpoint(tmp_path), _tiny_run()[0], game=restored) == TrainState(step=2)
    assert restored.state_dict() == {"phase": 0, "recent": [1.0]}
    _save(tmp_path, TrainState(step=4), policy, optimizer, scheduler, game=tracker)
    assert latest_checkpoint(tmp_path).name == "step-000004"


def test_a_full_disk_names_itself_and_the_path_and_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """torch.save writing into /dev/full (ENOSPC on every write, for real) gives torch's own "unexpected
    pos" error; the save says the disk is full, where, and what is left, and removes the half-written
    folder, which would otherwise keep the disk full."""
    import os

    from emoji_rl.errors import UserError
    from emoji_rl.rl import checkpoint

    if not os.path.exists("/dev/full"):
        pytest.skip("needs Linux's /dev/full")
    policy, optimizer, scheduler = _tiny_run()
    _save(tmp_path, TrainState(step=2), policy, optimizer, scheduler)
    real_save = torch.save

    def onto_full_disk(obj, path):
        path.symlink_to("/dev/full")
        real_save(obj, path)

    monkeypatch.setattr(checkpoint.torch, "save", onto_full_disk)
    with pytest.raises(UserError) as caught:
        _save(tmp_path, TrainState(step=4), policy, optimizer, scheduler)
    message = str(caught.value)
    tmp = tmp_path / "checkpoints" / ".step-000004.tmp"
    assert f"writing checkpoint step-000004 at {tmp} failed: no space left on the filesystem" in message
    assert "unexpected pos" in message and "The last whole checkpoint is step-000002" in message
    assert not tmp.exists() and latest_checkpoint(tmp_path).name == "step-000002"
