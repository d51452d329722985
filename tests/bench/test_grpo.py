"""The pieces of the GRPO bench rows that can be checked in seconds: the toy reward, and the synthetic
episodes the memory probe trains on (which the grammar replay must accept, or the probe dies in its
subprocess). The rows themselves load models and TRL, minutes on 2 cores: `make bench` runs them."""

import pytest
import torch

from emoji_rl.bench.grpo import MAX_EMOJI, MAX_NEW_TOKENS, emoji_episodes
from emoji_rl.bench.grpo_vs_trl import distinct_share
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.constraint import compile_emoji_grammar, replay_masks
from emoji_rl.lm.template import stop_token_id


@pytest.mark.parametrize(("text", "share"), [("", 0.0), ("abc", 1.0), ("aab", 2 / 3), ("🍕🍕", 0.5)])
def test_distinct_share(text, share):
    assert distinct_share(text) == pytest.approx(share)


def test_emoji_episodes_are_valid_turns_with_reward_spread_in_each_group(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    episodes = emoji_episodes(tokenizer, count=8, group_size=4)
    constraint = compile_emoji_grammar(tokenizer, 2, MAX_EMOJI)
    for episode in episodes:
        [turn] = episode.turns
        assert turn.action_ids[-1] == stop_token_id(tokenizer)
        assert parse_message(tokenizer.decode(turn.action_ids[:-1]), 2, MAX_EMOJI).ok
        assert replay_masks(constraint, turn.action_ids).shape[0] == len(turn.action_ids)
        assert len(turn.action_ids) <= MAX_NEW_TOKENS  # as long as a sampled turn can be
    rewards_P_G = torch.tensor([e.reward for e in episodes]).view(2, 4)
    assert (rewards_P_G.max(dim=1).values > rewards_P_G.min(dim=1).values).all()
    # One prompt per group, as GRPO plays them.
    assert episodes[0].turns[0].observation_ids == episodes[3].turns[0].observation_ids
    assert episodes[3].turns[0].observation_ids != episodes[4].turns[0].observation_ids
