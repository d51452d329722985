"""The sender's prompts, shared by the data, SFT and RL stages so that the model is trained and
played with the same words (docs/DESIGN.md §3)."""

from __future__ import annotations

SENDER_SYSTEM = (
    "You communicate exclusively in emoji. Reply with 2 to 8 emoji and nothing else: "
    "no words, no letters, no digits, no punctuation."
)
SENDER_FIRST_TURN = "Communicate this message using only emoji: {target}"
SENDER_CORRECTION_TURN = (
    'The receiver guessed: "{guess}"\n'
    'The original message was: "{target}"\n'
    "Send emoji to correct what they got wrong."
)


def sender_messages(target: str) -> list[dict[str, str]]:
    """The chat a sender sees on turn 1, without the answer."""
    return [
        {"role": "system", "content": SENDER_SYSTEM},
        {"role": "user", "content": SENDER_FIRST_TURN.format(target=target)},
    ]


def correction_message(guess: str, target: str) -> dict[str, str]:
    """The user turn a sender sees on turn t >= 2."""
    return {"role": "user", "content": SENDER_CORRECTION_TURN.format(guess=guess, target=target)}
