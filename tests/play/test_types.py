from emoji_rl.play.types import Episode, EpisodeGroup, StepResult, Turn


def _turn(obs, act, reward=0.0, done=False):
    return Turn(tuple(obs), tuple(act), tuple(-1.0 for _ in act), StepResult(done=done, reward=reward))


def test_episode_is_one_sequence_with_mask_over_actions():
    episode = Episode((_turn([1, 2, 3], [10, 11]), _turn([4, 5], [12], reward=0.7, done=True)))
    assert episode.token_ids() == (1, 2, 3, 10, 11, 4, 5, 12)
    assert episode.loss_mask() == (0, 0, 0, 1, 1, 0, 0, 1)
    assert episode.reward == 0.7


def test_group_rewards_in_episode_order():
    group = EpisodeGroup("p1", tuple(Episode((_turn([1], [2], reward=r, done=True),)) for r in (0.1, 0.5)))
    assert group.rewards == (0.1, 0.5)
