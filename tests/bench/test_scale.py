"""`make bench-scale`'s cheap parts: the real-shape model it cuts, the step's episodes in Qwen3.5's
tokens (which the grammar must accept), and the rows that run in seconds. The memory rows take
minutes and ~10 GB: `make bench-scale` runs them."""

from __future__ import annotations

import torch

from emoji_rl.bench import scale, shapes
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.constraint import support_masks
from emoji_rl.emoji.qwen_vocab import qwen_tokenizer


def test_the_cut_model_has_qwen3_5_4bs_shapes_on_the_meta_device() -> None:
    with torch.device("meta"):
        model = shapes.cut_qwen3_5_4b(4)
    config = model.config
    assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert model.get_output_embeddings().weight.shape == (248320, 2560)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied, as in 4B
    gdn = model.model.layers[0].linear_attn
    assert (gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim) == (16, 32, 128, 128)
    attention = model.model.layers[3].self_attn
    assert attention.head_dim == 256 and config.num_key_value_heads == 4


def test_the_step_episodes_are_emoji_turns_the_grammar_replays() -> None:
    episodes = shapes.step_episodes(count=6, turns=3)
    tokenizer = qwen_tokenizer("qwen3.5")
    grammar = shapes.qwen_grammar()
    for episode in episodes:
        assert len(episode.turns) == 3 and episode.turns[-1].result.done
        assert episode.turns[1].observation_ids == episodes[0].turns[1].observation_ids  # the correction
        for turn in episode.turns:
            assert turn.action_ids[-1] == tokenizer.im_end_id
            assert parse_message(tokenizer.decode(list(turn.action_ids[:-1])), 2, 8).ok
            assert support_masks(grammar, turn.action_ids).shape == (len(turn.action_ids), 240)


def test_the_quick_rows_print(capsys) -> None:
    scale.main(["--only", "turn_prefill", "grammar_step"])
    out = capsys.readouterr().out
    assert "prefill tokens, one 5-turn episode: continued / re-read" in out
    assert "grammar's host work per decode step, 128 rows: support / whole bitmask" in out
