"""The emoji grammar, compiled per tokenizer: for vLLM, for `generate` and for replaying masks.

Byte-level BPE splits one emoji into several tokens, so a bag of allowed ids lets byte fragments
combine into non-emoji characters (the seed's static mask, kept as a baseline in `logits.py`). The
grammar is built from ALPHABET, so it accepts exactly the messages `parse_message` accepts; xgrammar
turns it into a token mask at every step, and the end-of-turn token is allowed only once the message
is complete (docs/DESIGN.md §2). The EBNF holds no end of turn: xgrammar and vLLM add the stop tokens.

Uses: `vllm_structured_outputs` (the request field), `compile_emoji_grammar` (an HF tokenizer) or
`compile_emoji_grammar_raw` (token bytes, e.g. the Qwen tiktoken files), `EmojiLogitsProcessor`
(`logits.py`), and `replay_masks` / `replay_bitmask` (the allowed set at each sampled position, for
log-probs under the same constraint the sampler used: docs/DESIGN.md §6).

A tokenizer that cannot express the grammar fails at compile time with a UserError, never by
hanging or crashing in generation. The rule: it needs an end-of-turn id, and a single-byte token
for every byte that occurs in an alphabet emoji (69 distinct bytes). xgrammar allows a token when
the output stays a prefix of some valid message; with those single bytes every such prefix can be
finished, so the mask is never empty and every generation reaches end of turn within
`max_new_tokens` steps. Byte-level BPE, byte-fallback and tiktoken vocabularies all pass.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import xgrammar as xgr

from emoji_rl.emoji.alphabet import ALPHABET, MAX_EMOJI, MIN_EMOJI, SEPARATOR
from emoji_rl.errors import UserError
from emoji_rl.lm.template import end_of_turn_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_EMOJI_BYTES = max(len(e.encode()) for e in ALPHABET)
_ALPHABET_BYTES = frozenset(b for e in ALPHABET for b in e.encode())
_CACHE: dict[tuple[object, ...], EmojiConstraint] = {}


@dataclass(frozen=True)
class RawVocab:
    """A vocabulary as token bytes by id (specials after the regular tokens), its end-of-turn ids and
    the model's logits width (masks have this width; ids past the bytes are padding)."""

    name: str
    token_bytes: tuple[bytes, ...]
    stop_token_ids: tuple[int, ...]
    logits_width: int


@dataclass(frozen=True, eq=False)
class EmojiConstraint:
    """The emoji grammar compiled against one vocabulary; masks are `vocab_size` wide."""

    compiled: xgr.CompiledGrammar
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    min_emoji: int
    max_emoji: int
    token_bytes: Sequence[bytes] = field(repr=False)
    """Each id's bytes, as the grammar compiler read them."""

    @functools.cached_property
    def support(self) -> torch.Tensor:
        """Sorted int64 ids of every token the grammar can ever allow (`grammar_support`): 240 of
        Qwen3.5's 248,320, so log-probs under the grammar need only these columns of the logits."""
        return torch.tensor(grammar_support(self.token_bytes, self.stop_token_ids), dtype=torch.long)

    @functools.cached_property
    def support_bitmask(self) -> torch.Tensor:
        """The support as one row of xgrammar's packed bitmask: int32 [ceil(V/32)]."""
        return pack_bitmask(self.support, self.vocab_size)

    @property
    def max_new_tokens(self) -> int:
        """A generation budget that always reaches end of turn (see `safe_max_new_tokens`)."""
        return safe_max_new_tokens(self.max_emoji)

    def matcher(self) -> xgr.GrammarMatcher:
        """A fresh matcher at the start of a message."""
        return xgr.GrammarMatcher(self.compiled)


def _check_bounds(min_emoji: int, max_emoji: int) -> None:
    if not 1 <= min_emoji <= max_emoji:
        raise UserError(f"min_emoji={min_emoji}, max_emoji={max_emoji}: need 1 <= min_emoji <= max_emoji")


def grammar_ebnf(min_emoji: int = MIN_EMOJI, max_emoji: int = MAX_EMOJI) -> str:
    """xgrammar/vLLM EBNF: `min_emoji`..`max_emoji` alphabet emoji, optionally single-space separated.

    A plain 3,931-way alternation: against the 248K-token Qwen3.5 vocabulary it compiles in ~0.15 s
    of CPU (~0.3 s with building the TokenizerInfo); a codepoint-trie version measured no faster.
    """
    _check_bounds(min_emoji, max_emoji)
    # Literals go in raw: no alphabet emoji holds a quote, a backslash or an ASCII control character.
    assert not any(c in e for e in ALPHABET for c in '"\\\n'), "an alphabet entry needs EBNF escaping"
    body = "emoji" if max_emoji == 1 else f'emoji ("{SEPARATOR}"? emoji){{{min_emoji - 1},{max_emoji - 1}}}'
    alternatives = " | ".join(f'"{e}"' for e in ALPHABET)
    return f"root ::= {body}\nemoji ::= {alternatives}\n"


def vllm_structured_outputs(min_emoji: int = MIN_EMOJI, max_emoji: int = MAX_EMOJI) -> dict[str, str]:
    """The top-level `structured_outputs` field of a vLLM >= 0.12 request (docs/VLLM.md §2, §6)."""
    return {"grammar": grammar_ebnf(min_emoji, max_emoji)}


def safe_max_new_tokens(max_emoji: int = MAX_EMOJI) -> int:
    """A budget within which every constrained generation ends with end of turn: each token but the
    stop adds at least one byte, and a message has at most max_emoji longest emoji plus separators.

    A smaller budget can end before an accepting state: the output is then a prefix of a message (it
    may end mid-emoji, on a space, or short of min_emoji) without the stop token. Only ids that end
    with a stop token are complete; treat the rest as a length violation, not a grammar failure.
    In batched decoding a row leaves the batch once it has ended, so a generous budget costs nothing.
    """
    return max_emoji * MAX_EMOJI_BYTES + (max_emoji - 1) + 1


def _check_stops(stops: tuple[int, ...], width: int, name: str) -> None:
    if not stops:
        raise UserError(
            f"tokenizer {name} has no end-of-turn token (no eos_token): set its eos_token or pass "
            "stop_token_ids, else a constrained message could never end"
        )
    if not all(0 <= i < width for i in stops):
        raise UserError(
            f"stop_token_ids={list(stops)} of tokenizer {name} are not all below vocab_size={width}"
        )


def _check_bytes(decoded_vocab: Sequence[bytes], name: str) -> None:
    missing = _ALPHABET_BYTES - {token[0] for token in decoded_vocab if len(token) == 1}
    if missing:
        unspellable = [e for e in ALPHABET if missing & set(e.encode())]
        raise UserError(
            f"tokenizer {name} cannot express the emoji grammar: it has no single-byte token for "
            f"{len(missing)} of the {len(_ALPHABET_BYTES)} bytes emoji are made of "
            f"({', '.join(f'0x{b:02X}' for b in sorted(missing)[:8])}...), so {len(unspellable)} of "
            f"{len(ALPHABET)} alphabet emoji (e.g. {unspellable[0]}) could dead-end mid-character; "
            "use a byte-level BPE, byte-fallback or tiktoken vocabulary"
        )


def _compile(
    info: xgr.TokenizerInfo, decoded_vocab: Sequence[bytes], min_emoji: int, max_emoji: int, name: str
) -> EmojiConstraint:
    _check_bytes(decoded_vocab, name)
    # More threads than 2 measured no faster on this grammar (0.38 s vs 0.35 s with 4).
    compiled = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False).compile_grammar(
        grammar_ebnf(min_emoji, max_emoji)
    )
    return EmojiConstraint(
        compiled, info.vocab_size, tuple(info.stop_token_ids), min_emoji, max_emoji, decoded_vocab
    )


def grammar_support(token_bytes: Sequence[bytes], stop_token_ids: Sequence[int]) -> list[int]:
    """The ids whose bytes occur somewhere in a string of alphabet emoji and separators, plus the
    stops: a superset of every set the grammar allows (xgrammar allows a token only while the output
    stays a prefix of a valid message, so a token's bytes always lie inside one).

    A byte automaton over the trie of the alphabet and the separator, entered at any node (a token
    may start mid-emoji) and going back to the root after each whole entry. The message bounds and
    the separator's placement are left out, so the set is a little larger than needed (240 against
    155 ids seen over 400 random Qwen3.5 messages); a superset keeps a softmax over it exact.
    """
    children: list[dict[int, int]] = [{}]
    complete = [False]
    for entry in (*ALPHABET, SEPARATOR):
        node = 0
        for byte in entry.encode():
            if byte not in children[node]:
                children[node][byte] = len(children)
                children.append({})
                complete.append(False)
            node = children[node][byte]
        complete[node] = True
    entered: dict[int, set[int]] = {}  # byte -> the nodes an edge with that byte leads to
    for node in children:
        for byte, child in node.items():
            entered.setdefault(byte, set()).add(child)
    support = set(stop_token_ids)
    for token_id, token in enumerate(token_bytes):
        if not token or not entered.keys() >= set(token):
            continue
        states = entered[token[0]]
        for byte in token[1:]:
            states = {
                child
                for state in states
                for child in (children[state].get(byte), children[0].get(byte) if complete[state] else None)
                if child is not None
            }
            if not states:
                break
        if states:
            support.add(token_id)
    return sorted(support)


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocab_fingerprint(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """(hash of the vocabulary, its width), the cache key's part, once per tokenizer object while its
    size stays the same: reading and hashing the vocabulary took 250-650 ms on a loaded machine, and
    every generate call (every rollout turn) asks for the grammar."""
    size = len(tokenizer)
    memo = _FINGERPRINTS.get(tokenizer)
    if memo is None or memo[0] != size:
        vocab = tokenizer.get_vocab()
        # hash(): an in-process key, stable while the tokenizer is unchanged.
        memo = (size, hash(frozenset(vocab.items())), max(len(vocab), max(vocab.values()) + 1))
        _FINGERPRINTS[tokenizer] = memo
    return memo[1], memo[2]


def compile_emoji_grammar(
    tokenizer: PreTrainedTokenizerBase,
    min_emoji: int = MIN_EMOJI,
    max_emoji: int = MAX_EMOJI,
    *,
    vocab_size: int | None = None,
    stop_token_ids: Sequence[int] | None = None,
    use_cache: bool = True,
) -> EmojiConstraint:
    """The emoji grammar against an HF tokenizer, cached per vocabulary, width, stops and bounds.

    vocab_size: the model's logits width where it differs from the tokenizer's (Qwen pads its
    lm_head); default, the tokenizer's. stop_token_ids: default `end_of_turn_ids(tokenizer)`.
    """
    _check_bounds(min_emoji, max_emoji)
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    stops = tuple(stop_token_ids) if stop_token_ids is not None else end_of_turn_ids(tokenizer)
    vocab_hash, vocab_width = _vocab_fingerprint(tokenizer)
    width = vocab_size or vocab_width
    key = ("hf", type(tokenizer).__name__, vocab_hash, width, stops, min_emoji, max_emoji)
    if use_cache and key in _CACHE:
        return _CACHE[key]
    _check_stops(stops, width, name)
    try:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=width, stop_token_ids=list(stops))
    except ValueError as e:
        raise UserError(f"xgrammar cannot read tokenizer {name} ({type(tokenizer).__name__}): {e}") from e
    constraint = _compile(info, info.decoded_vocab, min_emoji, max_emoji, name)
    _CACHE[key] = constraint
    return constraint


def compile_emoji_grammar_raw(
    vocab: RawVocab, min_emoji: int = MIN_EMOJI, max_emoji: int = MAX_EMOJI, *, use_cache: bool = True
) -> EmojiConstraint:
    """The emoji grammar against raw token bytes (tiktoken files: `qwen_vocab.qwen_raw_vocab`)."""
    _check_bounds(min_emoji, max_emoji)
    key = ("raw", hash(vocab.token_bytes), vocab.stop_token_ids, vocab.logits_width, min_emoji, max_emoji)
    if use_cache and key in _CACHE:
        return _CACHE[key]
    _check_stops(vocab.stop_token_ids, vocab.logits_width, vocab.name)
    info = xgr.TokenizerInfo(
        list(vocab.token_bytes),
        xgr.VocabType.RAW,
        vocab_size=vocab.logits_width,
        stop_token_ids=list(vocab.stop_token_ids),
    )
    constraint = _compile(info, vocab.token_bytes, min_emoji, max_emoji, vocab.name)
    _CACHE[key] = constraint
    return constraint


@functools.cache
def byte_vocab() -> RawVocab:
    """256 single-byte tokens and one end-of-turn token (id 256): the grammar over plain bytes."""
    return RawVocab("bytes", (*(bytes([b]) for b in range(256)), b"<|end|>"), (256,), 257)


def grammar_accepts(text: str, min_emoji: int = MIN_EMOJI, max_emoji: int = MAX_EMOJI) -> bool:
    """Whether the grammar accepts `text` and then end of turn: the decoder's side of the contract
    that it and `parse_message` accept the same language (property-tested)."""
    constraint = compile_emoji_grammar_raw(byte_vocab(), min_emoji, max_emoji)
    matcher = constraint.matcher()
    end_of_turn = constraint.stop_token_ids[0]
    return all(matcher.accept_token(b) for b in text.encode()) and matcher.accept_token(end_of_turn)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's packed int32 bitmask [..., ceil(V/32)] (bit j%32 of word j//32 = token j) as bool [..., V]."""
    assert sys.byteorder == "little", "the int32 -> bytes view below assumes a little-endian machine"
    as_bytes = bitmask.contiguous().view(torch.uint8)
    bits = (as_bytes.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def pack_bitmask(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Distinct token `ids` as one row of xgrammar's packed bitmask, int32 [ceil(V/32)]."""
    words = torch.zeros(-(-vocab_size // 32), dtype=torch.int64)
    words.index_add_(0, ids >> 5, 1 << (ids & 31))  # distinct ids: adding their bits sets them
    # Bit 31 becomes the int32 sign bit, as xgrammar stores it.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def bits_at(bitmask: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Bool [..., len(ids)]: the bits of xgrammar's packed bitmask [..., ceil(V/32)] at token `ids`
    (int64), read where they lie, without unpacking the rest."""
    words = bitmask.index_select(-1, ids >> 5)  # 0.2 ms at [128, 7760]; `bitmask[..., ids >> 5]` took 8
    # `>>` on int32 copies bit 31 (the sign) down; `& 1` keeps only the bit shifted to position 0.
    return ((words >> (ids & 31).to(torch.int32)) & 1).bool()


def replay_bitmask(constraint: EmojiConstraint, token_ids: Sequence[int]) -> torch.Tensor:
    """xgrammar's packed int32 bitmask [T, ceil(V/32)] before each of `token_ids`, replayed from
    scratch: 32x smaller than `replay_masks`, and `xgr.apply_token_bitmask_inplace(logits_T_V,
    bitmask.to(logits.device))` masks logits with it on CPU or GPU."""
    matcher = constraint.matcher()
    bitmask = xgr.allocate_token_bitmask(len(token_ids), constraint.vocab_size)
    for t, token_id in enumerate(token_ids):
        if matcher.is_terminated():
            raise ValueError(
                f"token {token_id} at position {t} follows end of turn: pass one row's ids up to and "
                "including its end-of-turn token, without padding"
            )
        matcher.fill_next_token_bitmask(bitmask, t)
        if not matcher.accept_token(token_id):
            raise ValueError(
                f"token {token_id} at position {t} is not allowed by the emoji grammar after "
                f"{list(token_ids[:t])}: these ids were not sampled under this constraint"
            )
    return bitmask


def support_masks(constraint: EmojiConstraint, token_ids: Sequence[int]) -> torch.Tensor:
    """Bool [T, S]: `replay_masks` read at `constraint.support`'s S ids only, in their order: a few
    hundred bytes a token where the full mask takes the vocabulary's width (248 KB for Qwen3.5).

    Checks that the grammar allowed nothing outside the support, since a softmax over the support
    equals the masked one over the vocabulary only then."""
    bitmask = replay_bitmask(constraint, token_ids)
    outside = bitmask & ~constraint.support_bitmask
    if outside.any():
        position, token_id = unpack_bitmask(outside, constraint.vocab_size).nonzero()[0].tolist()
        raise RuntimeError(
            f"the grammar allowed token {token_id} at position {position} of {list(token_ids)}, "
            "outside its support: grammar_support missed a token"
        )
    return bits_at(bitmask, constraint.support)


def replay_masks(constraint: EmojiConstraint, token_ids: Sequence[int]) -> torch.Tensor:
    """Bool [T, V]: the tokens the grammar allowed before each of `token_ids`, replayed from scratch.

    Pass one row's generated ids, up to and including end of turn (strip padding); an id the grammar
    does not allow there is a ValueError. Log-probs under the constraint set the logits outside
    these masks to -inf before log-softmax (docs/DESIGN.md §6).
    """
    return unpack_bitmask(replay_bitmask(constraint, token_ids), constraint.vocab_size)
