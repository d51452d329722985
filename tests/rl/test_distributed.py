"""Multi-process GRPO on CPU: the real `accelerate launch` of the stage over 2 processes (gloo), as a GPU
box runs it over N GPUs. The ranks split each step's `batch_size` prompts, hold the same LoRA weights
after every step, the main process logs the whole step once and checkpoints, and `--resume` goes on.

Run as a script (the slow test does, under `accelerate launch`), this file is `emoji-rl` plus two
records per rank: the prompts it played and the adapter it holds after each checkpointed step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tests.launching import accelerate_launch, cli_args, read_weights

from emoji_rl.io.metrics import read_metrics
from emoji_rl.rl.checkpoint import TrainState
from emoji_rl.rl.rollout.collect import PromptStream

TARGETS = [
    "let's get pizza tonight",
    "I missed the bus again",
    "happy birthday to my sister",
    "the cat is sleeping on my laptop",
    "we won the football match",
    "it's raining all day",
    "I need coffee before work",
    "our flight got cancelled",
]
RANKS, B, G = 2, 2, 2  # B: the step's prompts over both ranks, one each
SETTINGS = dict(
    game="retrieval",
    judge="lexicon",
    batch_size=B,
    group_size=G,
    max_turns=1,
    max_emoji=3,
    max_new_tokens=24,
    lora_r=4,
    learning_rate=1e-3,
    beta=0.0,  # no reference pass: the KL term is tested in one process (test_train.py)
    save_steps=1,
    seed=0,
)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expected_prompts(records: list[dict], steps: int) -> list[list[list[str]]]:
    """step -> rank -> prompt ids: one shared order, each step's B prompts split in rank order."""
    stream = PromptStream(records, seed=0, state=TrainState())
    share = B // RANKS
    out = []
    for _ in range(steps):
        ids = [r["id"] for r in stream.take(B)]
        out.append([ids[r * share : (r + 1) * share] for r in range(RANKS)])
    return out


def test_processes_draw_disjoint_prompts_from_one_order_and_keep_one_cursor():
    records = [{"id": f"p{i}"} for i in range(5)]
    order = [r["id"] for r in PromptStream(records, seed=0, state=TrainState()).take(10)]
    # Round 1: rank 0 asks for 2, rank 1 for 3; round 2 (dynamic sampling): rank 0 is full, rank 1
    # asks for 1 more. Each process sees every process's request (the gather, faked here).
    states, got = [TrainState(), TrainState()], [[], []]
    for counts in ([2, 3], [0, 1]):
        for rank in range(RANKS):
            stream = PromptStream(records, 0, states[rank], rank, lambda n, counts=counts: counts)
            got[rank] += [r["id"] for r in stream.take(counts[rank])]
    assert got == [order[0:2], order[2:6]]
    # both cursors past the 6 drawn prompts: the next epoch's second one, which the checkpoint keeps
    assert states[0] == states[1] == TrainState(epoch=1, cursor=1)


def test_micro_batch_weights_split_the_whole_step_between_processes():
    from emoji_rl.rl.batch import Batch
    from emoji_rl.rl.train_config import grpo_config
    from emoji_rl.rl.update import _shares

    # This process: 2 episodes of 3 and 1 sender tokens; the other process holds 4 more: 8 in all.
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    zeros = torch.zeros(2, 4)
    batch = Batch(zeros.long(), zeros.long(), mask, zeros, torch.zeros(2), [])
    dapo = grpo_config(per_device_train_batch_size=1, loss_type="dapo").update_settings()
    assert [w for _, w in _shares(batch, dapo, total=8.0)] == [3 / 8, 1 / 8]
    # grpo weighs episodes: 2 here of 5 in all
    grpo = grpo_config(per_device_train_batch_size=1, loss_type="grpo").update_settings()
    assert [w for _, w in _shares(batch, grpo, total=5.0)] == [1 / 5, 1 / 5]


@pytest.mark.slow
def test_grpo_over_two_cpu_processes_shares_the_batch_and_the_weights(tiny_qwen, tmp_path):
    records = [{"id": f"t{i}", "target": t} for i, t in enumerate(TARGETS)]
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = tmp_path / "run"
    # The tiny model: what is tested is how the ranks share a step, which no model size changes.
    args = ["grpo", *cli_args({**SETTINGS, "model": tiny_qwen, "train_data": data, "output_dir": run})]

    first = accelerate_launch(__file__, [*args, "--max_steps", "1"])
    assert first.returncode == 0, first.stderr[-4000:]
    # Info lines come from the main process only: once, not once per rank.
    assert first.stderr.count("distributed: MULTI_CPU, 2 process(es)") == 1, first.stderr[-4000:]
    resumed = accelerate_launch(__file__, [*args, "--max_steps", "2", "--resume", "true"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr and "at step 1" in resumed.stderr

    # batch_size counts the step's prompts over both ranks: each rank played one of the B = 2, not B of
    # its own, and not the other's, from one order: step 2 (after the resume) goes on where step 1 stopped.
    played = {
        (r["rank"], r["step"]): r["prompts"] for rank in range(RANKS) for r in _jsonl(run / f"prompts{rank}")
    }
    assert all(len(ids) == 1 for ids in played.values()), played
    assert all(played[0, step] != played[1, step] for step in (1, 2)), played
    expected = _expected_prompts(records, 2)
    assert played == {(rank, s + 1): expected[s][rank] for s in range(2) for rank in range(RANKS)}

    # The main process logged each step once, over both ranks: B = 2 groups of 2, and the reward mean of
    # all 4 episodes in rollouts.jsonl (written by the main process alone).
    metrics = read_metrics(run)
    rollouts = _jsonl(run / "rollouts.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        episodes = [r for r in rollouts if r["step"] == m["step"]]
        assert len(episodes) == B * G and m["group/played"] == B
        assert {r["prompt_id"] for r in episodes} == {i for ids in expected[m["step"] - 1] for i in ids}
        assert m["reward/mean"] == pytest.approx(sum(r["reward"] for r in episodes) / len(episodes))
    assert any(m["optim/skipped"] == 0 for m in metrics), "no step updated: the weights would not tell"

    # Gradients are all-reduced: after every step both ranks hold the same adapter, and it trained.
    for step in (1, 2):
        rank0, _ = read_weights(run / f"rank0-step{step}.safetensors")
        rank1, _ = read_weights(run / f"rank1-step{step}.safetensors")
        assert rank0.keys() == rank1.keys() and all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    lora_b = [k for k in rank0 if "lora_B" in k]
    assert lora_b and any(rank0[k].abs().max() > 0 for k in lora_b), "nothing trained"

    # One checkpoint per step, written by the main process with both ranks' RNG states, and the final
    # adapter holds the weights the ranks hold.
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-000001", "step-000002"]
    saved = torch.load(checkpoints / "step-000002" / "trainer_state.pt", weights_only=False)
    assert len(saved["rng"]) == RANKS and not torch.equal(saved["rng"][0]["torch"], saved["rng"][1]["torch"])
    adapter, _ = read_weights(run / "adapter" / "adapter_model.safetensors")
    assert adapter.keys() == {k.replace(".default", "") for k in rank0}
    assert all(torch.equal(adapter[k.replace(".default", "")], v) for k, v in rank0.items())


@pytest.mark.slow
def test_a_batch_size_the_processes_cannot_split_fails_before_training(tmp_path):
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "target": t}) + "\n" for i, t in enumerate(TARGETS)))
    run = tmp_path / "run"
    settings = {**SETTINGS, "batch_size": 3, "train_data": data, "output_dir": run}
    done = accelerate_launch(__file__, ["grpo", *cli_args(settings), "--max_steps", "1"])
    assert done.returncode != 0
    assert (
        "batch_size=3 (prompts per step over all processes) does not divide among 2 processes" in done.stderr
    )
    # Before anything ran: no model loaded, no config written, no step played.
    assert "runtime:" not in done.stderr and not run.exists(), done.stderr[-4000:]


@pytest.mark.slow
def test_publishing_under_fsdp_sends_the_whole_adapter_not_a_shard(tmp_path, monkeypatch, smollm2_tokenizer):
    # accelerate 1.15 enables FSDP only on GPUs (fsdp.yaml runs DDP on a CPU), so the ranks shard a
    # tiny PEFT model with torch's FSDP2 themselves, over gloo, and publish it as the trainer does.
    from tests.fakes.fake_lm import FakeLM
    from tests.fakes.vllm_server import FakeVLLMServer

    monkeypatch.setenv("EMOJI_RL_TEST_POLICY_KEY", "test-key")
    with FakeVLLMServer(FakeLM(smollm2_tokenizer)) as server:
        done = accelerate_launch(__file__, ["fsdp-publish", server.url, str(tmp_path)])
        loads = server.bodies("/v1/load_lora_adapter")
    assert done.returncode == 0, done.stderr[-4000:]
    # The ranks held halves (the script checks), the main process published once, both sample from it.
    [name] = [load["lora_name"] for load in loads]
    assert re.fullmatch(r"policy-[0-9a-f]{8}-v1", name), name
    assert [(tmp_path / f"sampler{rank}").read_text() for rank in range(RANKS)] == [name] * RANKS
    published, _ = read_weights(Path(loads[0]["lora_path"]) / "adapter_model.safetensors")
    full, _ = read_weights(tmp_path / "full.safetensors")
    assert published.keys() == full.keys() and all(torch.equal(published[k], full[k]) for k in full)


def _publish_under_fsdp(url: str, out: Path) -> int:
    """Shard a tiny PEFT model over the ranks with FSDP2, then `publish_weights` it to the server at `url`;
    the main process writes the unsharded adapter to `out/full.safetensors` first, for the test."""
    from accelerate import PartialState
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import LlamaConfig, LlamaForCausalLM

    from emoji_rl.decode.generate import Decoding
    from emoji_rl.decode.vllm import VLLMSampler
    from emoji_rl.io.endpoint import Endpoint
    from emoji_rl.rl.rollout.schedule import publish_weights
    from emoji_rl.rl.rollout.vllm import AdapterSync

    processes = PartialState(cpu=True)
    torch.manual_seed(0)  # the same model on every rank
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    # init_lora_weights=False: lora_B random too, so a zero shard could not pass for a whole one.
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(LlamaForCausalLM(config), lora)
    if processes.is_main_process:
        save_file(
            {k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()},
            str(out / "full.safetensors"),
        )
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    lora_params = [p for name, p in model.named_parameters() if "lora_" in name]
    assert lora_params and all(
        isinstance(p, DTensor) and p.to_local().numel() < p.numel() for p in lora_params
    ), "the adapter is not sharded: the test would not tell a gathered save from a local one"
    sampler = VLLMSampler(
        Endpoint(url + "/v1", api_key_env="EMOJI_RL_TEST_POLICY_KEY"), "policy", 0, Decoding()
    )
    publish_weights(AdapterSync(sampler, out, "policy"), processes, model, 1)
    (out / f"sampler{processes.process_index}").write_text(sampler.model)
    # Leave the group before exiting: a gloo thread still running when the interpreter exits aborts
    # the rank ("terminate called without an active exception", once in CI on a loaded machine).
    processes.wait_for_everyone()
    torch.distributed.destroy_process_group()
    return 0


def _run_stage_recording_each_rank() -> int:
    """`emoji-rl` with two records per rank: `prompts<rank>` (the ids each step played) and
    `rank<rank>-step<step>.safetensors` (the adapter it holds at each checkpoint)."""
    import sys

    import torch.distributed as dist
    from safetensors.torch import save_file

    from emoji_rl import cli
    from emoji_rl.lm.distributed import adapter_state_dict
    from emoji_rl.rl.rollout import schedule
    from emoji_rl.rl.trainer import Trainer

    run = Path(sys.argv[sys.argv.index("--output_dir") + 1])
    collect, save = schedule.collect, Trainer.save

    async def collect_and_record(stream, *args, **kwargs):
        rollouts = await collect(stream, *args, **kwargs)
        line = {"rank": dist.get_rank(), "step": stream.state.step + 1}
        line["prompts"] = [g.prompt_id for g in rollouts.played]
        with open(run / f"prompts{dist.get_rank()}", "a") as f:
            f.write(json.dumps(line) + "\n")
        return rollouts

    def save_and_record(trainer, run_dir, state, *args):
        weights = {k: v.contiguous() for k, v in adapter_state_dict(trainer.model).items()}
        rank = trainer.accelerator.process_index
        save_file(weights, str(run_dir / f"rank{rank}-step{state.step}.safetensors"))
        save(trainer, run_dir, state, *args)

    schedule.collect, Trainer.save = collect_and_record, save_and_record
    return cli.main()


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "fsdp-publish":
        raise SystemExit(_publish_under_fsdp(sys.argv[2], Path(sys.argv[3])))
    raise SystemExit(_run_stage_recording_each_rank())


def test_fsdp_asked_for_but_not_run_is_said(monkeypatch, caplog):
    import logging

    from emoji_rl.lm.distributed import warn_if_fsdp_ignored

    logger = logging.getLogger("emoji_rl.stage")
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    warn_if_fsdp_ignored("MULTI_CPU", logger)  # plain DDP, as asked
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # fsdp.yaml
    warn_if_fsdp_ignored("FSDP", logger)  # as asked, on GPUs
    assert not caplog.records
    warn_if_fsdp_ignored("MULTI_CPU", logger)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("emoji_rl.stage", "FSDP was asked for, but accelerate runs MULTI_CPU here: no sharding")
    ]
