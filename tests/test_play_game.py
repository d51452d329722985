from emoji_rl import cli


def test_human_sender_against_the_lexicon_judge(monkeypatch, capsys):
    answers = iter(["I love pizza", "🍕 🍕"])  # the first is rejected and asked again
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    code = cli.main(
        ["play-game", "--role", "sender", "--judge", "lexicon", "--target", "pizza", "--tau", "0.6"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "Communicate this message using only emoji: pizza" in out
    assert "not a valid emoji message: non-emoji character 'I'" in out
    assert "turn 1: 🍕 🍕  ->  pizza  (similarity 1.000)" in out
    assert "reward: +1.250" in out  # 1.0 + 0.5 success - 0.1 turn - 0.3 * (1 - 1/2) repetition
