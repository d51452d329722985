"""Every id that ends a message on a vLLM 0.33 server ends it here too (issue 14, point 4): vLLM adds
each `eos_token_id` of the model's generation_config.json to a request's stop set and to the
grammar's stop tokens, so a rollout may end on one that is neither the EOS nor `<|im_end|>`. Here:
SmolLM2's tokenizer in a model directory whose generation config lists `<|im_end|>` and
`<|endoftext|>`, as the Qwen chat models' do."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from emoji_rl.decode.sampler import Sample
from emoji_rl.emoji.constraint import compile_emoji_grammar, replay_masks
from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalRules
from emoji_rl.lm import models, template
from emoji_rl.play.judge import LexiconJudge
from emoji_rl.play.loop import play
from emoji_rl.rl.batch import collate, support_columns

IM_END, ENDOFTEXT = 2, 0  # SmolLM2's ids


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("model")
    smollm2_tokenizer.save_pretrained(model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, ENDOFTEXT]}))
    return models.load_tokenizer(str(model_dir))


class Overlap:
    def similarity(self, targets, guesses):
        return [0.0 for _ in targets]


class EndsOn:
    """Answers every turn with one emoji message, ended by `end`."""

    def __init__(self, tokenizer, end):
        self.ids = (*tokenizer("🍕 🎬", add_special_tokens=False)["input_ids"], end)
        self.prompts = []

    async def sample(self, prompts, previous=None):
        self.prompts.append(prompts)
        return [Sample(self.ids, tuple(-1.0 for _ in self.ids)) for _ in prompts]


def test_the_generation_configs_eos_ids_end_a_message(tokenizer, smollm2_tokenizer):
    assert template.end_of_turn_ids(tokenizer) == (IM_END, ENDOFTEXT)
    assert template.end_of_turn_ids(smollm2_tokenizer) == (IM_END,)  # its own config lists only 2
    assert set(compile_emoji_grammar(tokenizer).stop_token_ids) == {IM_END, ENDOFTEXT}


def test_a_rollout_ending_on_another_eos_id_is_played_and_replayed(tokenizer):
    builder = RetrievalBuilder(tokenizer, LexiconJudge(), Overlap(), RetrievalRules(max_turns=2, tau=0.99))
    sampler = EndsOn(tokenizer, ENDOFTEXT)
    [episode] = asyncio.run(play([builder({"target": "Pizza and a movie tonight"})], sampler))
    assert [turn.result.metrics.get("format_violation") for turn in episode.turns] == [None, 0.0]
    # The next turn's context closes the message as the chat template does, after the sampled id.
    second_prompt = sampler.prompts[1][0]
    first_end = len(sampler.prompts[0][0]) + len(sampler.ids)
    assert second_prompt[first_end - 1 : first_end + 1] == (ENDOFTEXT, IM_END)
    constraint = compile_emoji_grammar(tokenizer)
    batch = collate([episode], torch.zeros(1), IM_END, constraint)
    [allowed] = batch.allowed_N_S
    assert allowed.shape[0] == 2 * len(sampler.ids)
    ends = support_columns(batch.support, torch.tensor([IM_END, ENDOFTEXT]))
    assert allowed[len(sampler.ids) - 1, ends].all()  # both may end it, as on vLLM
    assert replay_masks(constraint, sampler.ids).shape[0] == len(sampler.ids)
