"""The emoji alphabet (what counts as an emoji message) and constrained decoding built from it:
`alphabet` (the language and its parser), `constraint` (the grammar, compiled per tokenizer; the
vLLM request field; replayed masks), `logits` (the HF logits processors), `qwen_vocab`."""

from emoji_rl.emoji.alphabet import ALPHABET, ParseResult, emoji_name, gloss, parse_message

__all__ = ["ALPHABET", "ParseResult", "emoji_name", "gloss", "parse_message"]
