"""The emoji alphabet (what counts as an emoji message) and constrained decoding built from it."""

from emoji_rl.emoji.alphabet import ALPHABET, ParseResult, emoji_name, gloss, parse_message

__all__ = ["ALPHABET", "ParseResult", "emoji_name", "gloss", "parse_message"]
