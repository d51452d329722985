"""Synthetic SFT chats: everyday messages with hand-picked emoji answers, written as the data stage writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import sender_messages

PAIRS: list[tuple[str, str]] = [
    ("Let's grab pizza and watch a movie tonight", "🍕 🎬 🌙"),
    ("I'm so excited for our beach trip this weekend", "🤩 🏖️ 🚗"),
    ("My cat knocked the birthday cake off the table", "🐱 🎂 💥"),
    ("I failed my driving test again", "😞 🚗 ❌"),
    ("Happy birthday, have a wonderful day", "🎉 🎂 🎁 😊"),
    ("It's raining so I'm staying home with tea", "🌧️ 🏠 🍵"),
    ("We won the football match", "⚽ 🏆 🎉"),
    ("I need coffee before the meeting", "☕ 😴 💼"),
    ("The flight got cancelled because of snow", "✈️ ❌ ❄️"),
    ("Can you walk the dog after work", "🐕 🚶 🕔"),
    ("I love you so much", "❤️ 🥰"),
    ("Let's go hiking in the mountains", "🥾 ⛰️ 🌲"),
    ("My phone battery died", "📱 🔋 💀"),
    ("We are having a baby", "👶 🍼 🎉"),
    ("I just got a new job", "💼 🎉 🙌"),
    ("The concert last night was amazing", "🎸 🎤 🤩"),
    ("I'm cooking pasta for dinner", "🍝 👨‍🍳 🍽️"),
    ("Don't forget to buy milk and bread", "🛒 🥛 🍞"),
    ("I'm sick and staying in bed", "🤒 🛌"),
    ("Our team finished the project on time", "👥 ✅ ⏰"),
    ("Let's meet at the library at noon", "📚 🕛 🤝"),
    ("I lost my keys again", "🔑 ❓ 😩"),
    ("The garden flowers are blooming", "🌷 🌻 🌼"),
    ("I'm studying for my math exam", "📖 ➗ 📝"),
    ("We are moving to a new house", "🏠 📦 🚚"),
    ("The baby finally fell asleep", "👶 😴 🙏"),
    ("Going to the gym after school", "🏋️ 🏫"),
    ("I miss my grandma", "👵 💔"),
    ("The pizza delivery is late", "🍕 🛵 ⏳"),
    ("Let's celebrate with champagne", "🍾 🥂 🎉"),
    ("I burned the toast this morning", "🍞 🔥 🌅"),
    ("Happy new year everyone", "🎆 🥳 🗓️"),
    ("The train is delayed by an hour", "🚆 ⏰ 😤"),
    ("I got a puppy for my birthday", "🐶 🎁 🎂"),
    ("Let's play video games tonight", "🎮 🌙 😄"),
    ("I'm going to the dentist tomorrow", "🦷 👨‍⚕️ 📅"),
    ("The sunset at the beach was beautiful", "🌅 🏖️ 😍"),
    ("We ran out of gas on the highway", "⛽ 🚗 😬"),
    ("I passed all my exams", "📝 ✅ 🎓"),
    ("Thanks for the lovely flowers", "🙏 💐 😊"),
]


def write_chats(path: Path, pairs: list[tuple[str, str]]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i, (target, answer) in enumerate(pairs):
            assert parse_message(answer).ok, (answer, parse_message(answer).reason)
            messages = [*sender_messages(target), {"role": "assistant", "content": answer}]
            out.write(
                json.dumps({"id": f"s{i}", "target": target, "messages": messages}, ensure_ascii=False) + "\n"
            )
    return path


@pytest.fixture
def chats(tmp_path: Path) -> tuple[Path, Path]:
    """(train, test) files: 32 train chats and 8 held-out ones."""
    return write_chats(tmp_path / "train.jsonl", PAIRS[:32]), write_chats(tmp_path / "test.jsonl", PAIRS[32:])
