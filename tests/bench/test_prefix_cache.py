"""`make bench`'s engine_prefix_cache episodes and what an exact cache could reuse of them, built here
(the engine run is the benchmark)."""

from emoji_rl.bench.prefix_cache import GROUP, TURNS, episodes, reusable
from emoji_rl.bench.shapes import step_episodes


def test_episodes_are_groups_sharing_an_opening_with_the_gpu_profiles_message_lengths():
    played, im_end = episodes(targets=3)
    assert len(played) == 3 * GROUP
    openings = [tuple(e.opening) for e in played]
    # A GRPO group shares its prompt; groups differ after the sender's system prompt they share.
    assert len(set(openings)) == 3 and all(
        len(set(openings[i : i + GROUP])) == 1 for i in range(0, 12, GROUP)
    )
    assert len(set(openings[::GROUP])) == 3 and openings[0][:20] == openings[GROUP][:20]
    # The game's turns: one after each sender turn but the last, each ending where a reply starts.
    assert all(len(e.corrections) == TURNS - 1 for e in played)
    assert all(c[-3:] == e.opening[-3:] for e in played for c in e.corrections)  # "<|im_start|>assistant\n"
    assert im_end not in played[0].opening[-3:]
    # Replies as long as the emoji messages of bench.shapes' episodes, without their <|im_end|>.
    assert [e.replies for e in played] == [
        [len(t.action_ids) - 1 for t in e.turns] for e in step_episodes(len(played), TURNS, 0)
    ]


def test_a_smaller_vocabulary_keeps_lengths_and_shared_prefixes():
    wide, _ = episodes(targets=2)
    narrow, im_end = episodes(targets=2, vocab_size=1000)
    assert im_end < 1000 and max(max(e.opening) for e in wide) >= 1000
    for w, n in zip(wide, narrow, strict=True):
        assert all(t < 1000 for t in n.opening) and len(n.opening) == len(w.opening)
        assert [len(c) for c in n.corrections] == [len(c) for c in w.corrections]
    assert narrow[0].opening == narrow[1].opening != narrow[GROUP].opening


def test_reusable_is_each_prompts_longest_prefix_computed_before_less_its_last_token():
    computed = [[1, 2, 3, 4, 5]]
    prompts = [
        [1, 2, 3, 4, 5, 6, 7],  # extends what was computed: 5
        [1, 2, 3, 9],  # shares 3 with it
        [1, 2, 3, 9, 8],  # shares 4 with the prompt before it, sent in the same turn
        [1, 2],  # all of it is cached, but its last token is computed: 1
        [7, 7],  # nothing
    ]
    assert reusable(prompts, computed) == 5 + 3 + 4 + 1 + 0
    assert reusable([[1, 2, 3]], []) == 0
