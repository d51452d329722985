"""What a resumed sft run keeps of metrics.jsonl: the lines its checkpoint's log history holds, and
after them what it would log again the same rather than redo it."""

from emoji_rl.sft.resume import evaluated_at_start, logged_lines

EVAL_0 = {"step": 0, "eval/loss": 2.0, "eval/runtime": 0.5}
TRAIN = [{"step": s, "train/loss": 1.0 / s} for s in (1, 2)]
SUMMARY = {"step": 2, "train/train_runtime": 12.5, "train/train_loss": 0.75}
FINAL_EVAL = {"step": 2, "eval/loss": 1.5}


def test_without_a_checkpoint_only_the_evaluation_before_training_is_kept():
    assert logged_lines(None, []) == 0 and not evaluated_at_start([])
    assert logged_lines(None, [EVAL_0, *TRAIN]) == 1 and evaluated_at_start([EVAL_0, *TRAIN])
    assert logged_lines(None, TRAIN) == 0 and not evaluated_at_start(TRAIN)  # a run without eval_data


def test_a_run_that_ended_at_its_checkpoint_keeps_its_closing_summary_and_redoes_the_final_evaluation():
    saved = {"global_step": 2, "log_history": [EVAL_0, *TRAIN]}  # saved before the summary
    assert logged_lines(saved, [EVAL_0, *TRAIN, SUMMARY, FINAL_EVAL]) == 4
    assert logged_lines(saved, [EVAL_0, *TRAIN]) == 3  # killed before its summary
    mid_run = {"global_step": 1, "log_history": [EVAL_0, TRAIN[0]]}
    assert logged_lines(mid_run, [EVAL_0, *TRAIN, SUMMARY]) == 2  # a later step's lines are redone
