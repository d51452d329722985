"""End to end on the embedded SmolLM2: a short LoRA SFT lowers the held-out loss and raises
unconstrained format compliance, and the adapter is one that PeftModel and vLLM load."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tests.launching import read_weights
from tests.trackers import assert_mlflow_keeps_every_name

from emoji_rl.sft import evaluate, train

pytestmark = pytest.mark.slow


def _four_steps(train_path: Path, run: Path, **fields) -> train.Config:
    """Four steps of 8 chats at a rate high enough to show learning in them."""
    return train.Config(
        train_data=str(train_path),
        output_dir=str(run),
        max_steps=4,
        per_device_train_batch_size=8,
        effective_batch_size=8,
        learning_rate=2e-3,
        lora_r=8,
        lora_alpha=16,
        save_steps=4,
        **fields,
    )


def test_short_sft_lowers_held_out_loss_and_raises_compliance(chats, tmp_path):
    train_path, test_path = chats
    run = tmp_path / "run"
    train.main(
        _four_steps(train_path, run, eval_data=str(test_path), max_length=96, logging_steps=1, eval_steps=2)
    )
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Before training, at step 2, and once at the last step: the Trainer's own evaluation there, not
    # a second one after it.
    assert [m["step"] for m in metrics if "eval/loss" in m] == [0, 2, 4]
    eval_losses = [m["eval/loss"] for m in metrics if "eval/loss" in m]
    assert eval_losses[-1] < eval_losses[0] - 0.5, eval_losses
    assert_mlflow_keeps_every_name(run)
    assert (run / "config.yaml").is_file() and (run / "checkpoint-4" / "optimizer.pt").is_file()

    # The form vLLM's --lora-modules takes: LoRA A/B matrices only, no embeddings or lm_head.
    adapter = run / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["modules_to_save"] is None
    with safe_open(adapter / "adapter_model.safetensors", "pt") as weights:
        keys = list(weights.keys())
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys)
    assert not any("embed" in k or "lm_head" in k for k in keys)

    # eval-sft loads it with PeftModel.from_pretrained and compares greedy replies with the base model's.
    evaluate.main(
        evaluate.Config(
            adapter=str(adapter), data=str(test_path), decodings=["none"], temperature=0.0, max_new_tokens=24
        )
    )
    rows = json.loads((run / "eval-sft" / "eval_sft.json").read_text())["results"]
    compliance = {r["system"]: r["compliance"] for r in rows}
    assert compliance["sft"] > compliance["base"], compliance
    assert (run / "eval-sft" / "eval_sft.png").is_file()


def _answer_nll(model, tokenizer, chats) -> float:
    """The mean negative log-likelihood of the answers' tokens, each after its chat's prompt."""
    from emoji_rl.sft.data import encode_record

    total, count = 0.0, 0
    for chat in chats:
        encoded = encode_record(tokenizer, chat)
        ids = torch.tensor([encoded.input_ids])
        with torch.no_grad():
            logp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        answer = slice(encoded.completion_start - 1, len(encoded.input_ids) - 1)
        total -= logp[answer].gather(1, ids[0, answer.start + 1 : answer.stop + 1, None]).sum().item()
        count += answer.stop - answer.start
    return total / count


def test_reader_share_teaches_the_reader_seat_to_answer_with_the_message(chats, tmp_path):
    """The reader's chats in the mix make held-out messages likelier as the answer to their emoji."""
    from peft import PeftModel

    from emoji_rl.lm import models
    from emoji_rl.sft.data import load_chat_records, reader_chats

    train_path, test_path = chats
    cfg = _four_steps(
        train_path,
        tmp_path / "run",
        eval_data=None,
        max_length=512,
        reader_share=1.0,
        sft_overrides=["train_sampling_strategy=group_by_length"],
    )
    train.main(cfg)
    held_out = reader_chats(load_chat_records(test_path), 1.0, "gloss", 0)
    assert len(held_out) == 8
    tokenizer = models.load_tokenizer(cfg.model)
    model = PeftModel.from_pretrained(
        models.load_base_model(cfg.model, models.pick_runtime()), str(tmp_path / "run" / "adapter")
    ).eval()
    with model.disable_adapter():
        before = _answer_nll(model, tokenizer, held_out)
    after = _answer_nll(model, tokenizer, held_out)
    assert after < before - 1.0, (before, after)


class Interrupted(Exception):
    """The process dying."""


def _lines(run):
    """metrics.jsonl without what depends on the clock: the summary line's speeds, and the time an
    evaluation before any training step in its process takes to prepare the model."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    clock = ("runtime", "per_second", "preparation_time")
    return [{k: v for k, v in r.items() if not any(s in k for s in clock)} for r in rows]


def _tiny_run(tmp_path) -> dict:
    """Config fields for tiny chats (no system prompt), about a second a step: for checkpoint tests."""
    data = tmp_path / "tiny.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"say {e}"}, {"role": "assistant", "content": f"{e} {e}"}]}
        for e in ["🍕", "🎉", "🐱", "🌧️"]
    ]
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return dict(
        train_data=str(data),
        eval_data=str(data),
        per_device_train_batch_size=2,
        effective_batch_size=2,
        lora_r=4,
        logging_steps=1,
        save_steps=2,
    )


def test_wandb_and_trackio_get_metrics_jsonl_at_its_steps_and_a_resume_continues_their_run(tmp_path):
    """`report_to` reaches the stage's own writer, not TRL's callbacks: each tracker's points are
    metrics.jsonl's lines at its step numbers (wandb merges the lines of one step into one row), each
    metric once a step; the resumed run logs into the same wandb run and trackio run, each step once."""
    from tests.trackers import trackio_rows, wandb_runs

    from emoji_rl.io.trackers import TrackerRun, WandbWriter

    # A stage before, in this process, with a run directory of its own: wandb must not keep to it.
    WandbWriter(TrackerRun("before00", "emoji-rl", "before"), tmp_path / "before", {}).close()
    run = tmp_path / "run"
    common = dict(_tiny_run(tmp_path), output_dir=str(run), report_to=["tensorboard", "wandb", "trackio"])
    train.main(train.Config(max_steps=2, **common))
    tracker = json.loads((run / "trackers.json").read_text())
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    def values(point):
        return {k: v for k, v in point.items() if k not in ("step", "timestamp") and not k.startswith("_")}

    by_step: dict[int, dict] = {}
    for line in lines:
        by_step.setdefault(line["step"], {}).update(values(line))
    [(first_id, first)] = wandb_runs(run)
    assert first_id == tracker["id"] and {p["_step"]: values(p) for p in first} == by_step
    # trackio keeps each log as a row: a line's metrics but those the step's lines before it sent
    # (the training line's train/epoch, again in the summary and the final evaluation's lines).
    sent: dict[int, set] = {}
    expected = []
    for line in lines:
        held = sent.setdefault(line["step"], set())
        expected.append((line["step"], {k: v for k, v in values(line).items() if k not in held}))
        held.update(values(line))
    points = trackio_rows(tracker["project"], tracker["name"])
    assert [(p["step"], values(p)) for p in points] == expected
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1

    train.main(train.Config(max_steps=4, resume=True, **common))
    (_, first), (second_id, second) = wandb_runs(run)
    assert second_id == first_id
    assert [p["_step"] for p in first + second if "train/loss" in p] == [1, 2, 3, 4]
    points = trackio_rows(tracker["project"], tracker["name"])
    assert [p["step"] for p in points if "train/loss" in p] == [1, 2, 3, 4]
    # TensorBoard: one log directory, the resumed run appending to it.
    assert (run / "tensorboard").is_dir() and not (run / "runs").exists()


def test_resume_with_more_steps_follows_the_new_schedule(tmp_path):
    common = dict(_tiny_run(tmp_path), output_dir=str(tmp_path / "run"), learning_rate=1e-3, resume=True)
    # --resume true with no checkpoint, as a pipeline passes it on a first run: it evaluates first.
    train.main(train.Config(max_steps=2, **common))
    assert "eval/loss" in _lines(tmp_path / "run")[0] and _lines(tmp_path / "run")[0]["step"] == 0
    train.main(train.Config(max_steps=4, **common))
    rates = {
        r["step"]: r["train/learning_rate"] for r in _lines(tmp_path / "run") if "train/learning_rate" in r
    }
    # Linear decay over 4 steps from 1e-3, as a fresh 4-step run: step 3 trains at 1e-3 x 2/4, not at
    # the 2-step schedule's end (0), which the restored optimizer held.
    assert rates == pytest.approx({1: 1e-3, 2: 5e-4, 3: 5e-4, 4: 2.5e-4})


@pytest.mark.parametrize("killed_in", ["_save_optimizer_and_scheduler", "_save_rng_state", "save_to_json"])
def test_a_save_cut_short_is_set_aside_and_the_run_goes_on_from_the_checkpoint_before(
    tmp_path, monkeypatch, killed_in
):
    """The process dies at each point of the Trainer's second save (the adapter written, then the
    optimizer, the RNG state, the trainer state half-written): a resume goes on from checkpoint-2."""
    from transformers import Trainer, TrainerState

    owner = TrainerState if killed_in == "save_to_json" else Trainer
    real = getattr(owner, killed_in)

    def die_at_step_4(self, path, *args):
        state = self if owner is TrainerState else self.state
        if state.global_step == 4:
            if owner is TrainerState:
                Path(path).write_text('{"global_step": 4, "log_hist')
            raise Interrupted
        return real(self, path, *args)

    common = dict(_tiny_run(tmp_path), output_dir=str(tmp_path / "run"), max_steps=4)
    with monkeypatch.context() as patch, pytest.raises(Interrupted):
        patch.setattr(owner, killed_in, die_at_step_4)
        train.main(train.Config(**common))
    run = tmp_path / "run"
    assert (run / "checkpoint-4").is_dir() and not (run / "adapter").exists()
    train.main(train.Config(resume=True, **common))
    assert json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4
    assert (run / "incomplete-save-4").is_dir() and (run / "adapter" / "adapter_config.json").is_file()
    assert [r["step"] for r in _lines(run) if "train/loss" in r] == [1, 2, 3, 4]


def _to_the_end(tmp_path) -> dict:
    """3 steps, checkpoints 2 and 3, at a constant rate: a step too many would change the adapter (a
    linear rate ends at 0)."""
    return dict(_tiny_run(tmp_path), max_steps=3, lr_scheduler_type="constant")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run every killed one must end as: its metrics lines and adapter weights."""
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    train.main(train.Config(output_dir=str(tmp_path / "full"), **_to_the_end(tmp_path)))
    weights, _ = read_weights(tmp_path / "full" / "adapter" / "adapter_model.safetensors")
    return _lines(tmp_path / "full"), weights


def test_resume_after_a_crash_logs_each_step_once(tmp_path, monkeypatch, uninterrupted):
    common = _to_the_end(tmp_path)

    # The first attempt dies right after logging step 3, before its checkpoint: the last is step 2's.
    def log_then_die(writer):
        callback = real_callback(writer)
        log = callback.on_log

        def on_log(args, state, control, logs=None, **kwargs):
            log(args, state, control, logs=logs, **kwargs)
            if state.global_step == 3:
                raise Interrupted

        callback.on_log = on_log
        return callback

    real_callback = train.metrics_callback
    run = tmp_path / "split"
    with monkeypatch.context() as patch, pytest.raises(Interrupted):
        patch.setattr(train, "metrics_callback", log_then_die)
        train.main(train.Config(output_dir=str(run), **common))
    assert [r["step"] for r in _lines(run)] == [0, 1, 2, 3]  # eval at the start, then one line a step
    assert not (run / "checkpoint-3").exists()

    train.main(train.Config(output_dir=str(run), resume=True, **common))
    state = json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    # Steps 1 and 2 are not trained again, step 3's line from the dead attempt is gone, and no second
    # eval at the checkpoint: the lines are the uninterrupted run's.
    assert [r["step"] for r in _lines(run) if "train/loss" in r] == [1, 2, 3]
    assert _lines(run) == uninterrupted[0]


@pytest.mark.parametrize("killed", ["before the summary", "before the pipeline's marker"])
def test_a_run_killed_after_its_last_checkpoint_trains_no_step_more(
    tmp_path, monkeypatch, killed, uninterrupted
):
    """The Trainer looks at max_steps only after a step, so a run resumed from the checkpoint of its
    last step would train one more; it must end as the uninterrupted run did instead."""
    from transformers import Trainer

    common = _to_the_end(tmp_path)
    run = tmp_path / "split"
    if killed == "before the summary":
        with monkeypatch.context() as patch, pytest.raises(Interrupted):
            patch.setattr(Trainer, "_finalize_training", lambda *args: (_ for _ in ()).throw(Interrupted))
            train.main(train.Config(output_dir=str(run), **common))
        assert (run / "checkpoint-3").is_dir() and not (run / "adapter").exists()
    else:
        train.main(train.Config(output_dir=str(run), **common))

    train.main(train.Config(output_dir=str(run), resume=True, **common))
    assert not (run / "checkpoint-4").exists()
    lines, want = uninterrupted
    assert _lines(run) == lines  # no step 4, one summary, train_loss over steps 1-3
    got, _ = read_weights(run / "adapter" / "adapter_model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_gradient_checkpointing_recomputes_every_layer_and_trains(tiny_qwen, tmp_path, monkeypatch):
    """`gradient_checkpointing` reaches the model that TRL wraps in LoRA, and LoRA still learns through
    the recomputed layers (the frozen embeddings give their output no gradient of its own)."""
    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    seen = {"layer runs with gradients": 0}

    def count_run(*_):
        seen["layer runs with gradients"] += torch.is_grad_enabled()

    def watching(writer):
        callback = real_callback(writer)

        def on_train_begin(args, state, control, model=None, **kwargs):
            layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
            seen["checkpointed layers"] = [layer.gradient_checkpointing for layer in layers]
            # The layer's first module: once in the forward pass, again when the backward pass recomputes it.
            layers[0].input_layernorm.register_forward_pre_hook(count_run)

        callback.on_train_begin = on_train_begin
        return callback

    real_callback = train.metrics_callback
    monkeypatch.setattr(train, "metrics_callback", watching)
    run = tmp_path / "run"
    # The tiny Qwen3.5: both kinds of decoder layer, as on the gpu profile. 2 steps of one forward each.
    settings = dict(_tiny_run(tmp_path), model=str(tiny_qwen), eval_data=None, max_steps=2)
    train.main(train.Config(output_dir=str(run), gradient_checkpointing=True, **settings))
    assert seen == {"layer runs with gradients": 4, "checkpointed layers": [True] * 4}
    losses = [row["train/loss"] for row in _lines(run) if "train/loss" in row]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    weights, _ = read_weights(run / "adapter" / "adapter_model.safetensors")
    lora_b = [w for name, w in weights.items() if ".lora_B." in name]
    assert lora_b and any(b.abs().max() > 0 for b in lora_b), "nothing trained"  # LoRA B starts at 0
