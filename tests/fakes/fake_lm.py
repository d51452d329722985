"""A seeded stand-in for a served causal LM, over a real tokenizer, for the fake vLLM server.

Logits are a pseudo-random function of (model name, last 16 context tokens) plus a bias toward EOS:
outputs depend on the prompt and on which adapter a request names, cost no forward pass (a SmolLM2
step would cost seconds per batch here), and are reproducible from the sampling generator.

Sampling follows vLLM's order (docs/VLLM.md §7): the grammar mask goes on the logits first;
`raw_logprobs` = log_softmax(masked logits); then temperature, top-k, top-p and min-p, and
`processed_logprobs` = log_softmax of what the token was drawn from. Stop tokens as in vLLM 0.33:
a request stops on the EOS, its `stop_token_ids` and every `eos_token_id` of the model's generation
config (`SamplingParams.update_from_generation_config`), and under a grammar all of them are
allowed only in an accepting state (xgrammar's `override_stop_tokens`, XgrammarBackend).
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from emoji_rl.lm.template import generation_eos_ids

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
CONTEXT = 16


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: int | None = None
    logprobs_mode: LogprobsMode = "raw_logprobs"


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    """Of each sampled token, in the server's logprobs mode (may be -inf before clamping)."""
    top: list[list[tuple[int, float]]]
    """Per position, the `logprobs` most likely (id, log-prob), best first."""
    finish_reason: Literal["stop", "length"]
    stop_reason: int | None


@functools.cache
def _compiler(tokenizer: PreTrainedTokenizerBase) -> xgr.GrammarCompiler:
    # Cached per tokenizer: building the TokenizerInfo takes ~0.7 s, a grammar ~0.5 s (cached inside).
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=len(tokenizer), stop_token_ids=[tokenizer.eos_token_id]
    )
    return xgr.GrammarCompiler(info, max_threads=1)


def grammar_is_lark(grammar: str) -> bool:
    """vLLM's rule: EBNF when any line (comments removed) holds `::=`, else Lark."""
    return not any("::=" in re.sub(r"(#|//).*$", "", line) for line in grammar.splitlines())


def lark_to_ebnf(grammar: str) -> str:
    """The Lark subset vLLM converts for xgrammar: `rule: alt | alt`, `| alt` continuation lines,
    single quotes; `start` (else the first rule) becomes the root. Raises ValueError otherwise."""
    rules: list[tuple[str, list[str]]] = []
    for line in grammar.splitlines():
        line = re.sub(r"(#|//).*$", "", line).strip()
        if not line:
            continue
        if match := re.fullmatch(r"\??([A-Za-z_]\w*)\s*:\s*(.*)", line):
            rules.append((match[1], [match[2]]))
        elif line.startswith("|") and rules:
            rules[-1][1].append(line[1:].strip())
        else:
            raise ValueError(f"not a Lark rule: {line!r}")
    if not rules:
        raise ValueError("the grammar has no rules")
    names = [name for name, _ in rules]
    root = "start" if "start" in names else names[0]
    body = [
        f"{name} ::= {' | '.join(a for a in alts if a).replace(chr(39), chr(34))}" for name, alts in rules
    ]
    return "\n".join([f"root ::= {root}", *body]) + "\n"


class FakeLM:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_bias: float = 8.0) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.eos_token_id: int = tokenizer.eos_token_id
        # +8 on unit-variance logits: once the grammar allows EOS it wins about 2 times in 3, so
        # emoji messages stay short; free text ends after ~30 tokens.
        self.stop_bias = stop_bias

    def compile(self, kind: str, spec: object) -> xgr.CompiledGrammar:
        """A structured-outputs constraint compiled for this vocabulary; ValueError when invalid."""
        compiler = _compiler(self.tokenizer)
        try:
            if kind == "grammar":
                assert isinstance(spec, str)
                return compiler.compile_grammar(lark_to_ebnf(spec) if grammar_is_lark(spec) else spec)
            if kind == "regex":
                assert isinstance(spec, str)
                return compiler.compile_regex(spec)
            if kind == "choice":
                assert isinstance(spec, list)
                return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in spec))
            if kind == "json":
                return compiler.compile_json_schema(spec if isinstance(spec, str) else json.dumps(spec))
            if kind == "json_object":
                return compiler.compile_builtin_json_grammar()
        except (RuntimeError, AssertionError) as err:
            raise ValueError(str(err)) from err
        raise ValueError(f"the fake server does not implement structured_outputs.{kind}")

    def logits(self, model: str, context: Sequence[int]) -> torch.Tensor:
        seed = zlib.crc32(repr((model, tuple(context[-CONTEXT:]))).encode())
        logits = torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(seed))
        logits[self.eos_token_id] += self.stop_bias
        return logits

    def generate(
        self,
        model: str,
        prompt: Sequence[int],
        params: SamplingParams,
        grammar: xgr.CompiledGrammar | None,
        generator: torch.Generator,
    ) -> Generation:
        # One intra-op thread: on 49K-wide vectors and 2 shared cores, torch's thread pool made each
        # step ~20x slower. The caller's setting is restored; the test thread waits on HTTP meanwhile.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._generate(model, prompt, params, grammar, generator)
        finally:
            torch.set_num_threads(threads)

    def _generate(
        self,
        model: str,
        prompt: Sequence[int],
        params: SamplingParams,
        grammar: xgr.CompiledGrammar | None,
        generator: torch.Generator,
    ) -> Generation:
        # The generation config's ids stop a request like its stop_token_ids (stop_reason set).
        stops = params.stop_token_ids | set(generation_eos_ids(self.tokenizer.name_or_path)) - {
            self.eos_token_id
        }
        matcher = (
            xgr.GrammarMatcher(grammar, override_stop_tokens=sorted({self.eos_token_id, *stops}))
            if grammar is not None
            else None
        )
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        context, ids, logprobs, top = list(prompt), [], [], []
        finish: Literal["stop", "length"] = "length"
        stop_reason = None
        while len(ids) < params.max_tokens:
            logits = self.logits(model, context).unsqueeze(0)
            if matcher is not None:
                matcher.fill_next_token_bitmask(bitmask)
                xgr.apply_token_bitmask_inplace(logits, bitmask)
            logits = logits[0]
            processed = _process(logits, params).log_softmax(-1)
            if params.temperature == 0:
                token = int(logits.argmax())
            else:
                # Gumbel-max: an exact draw from `processed`, ~10x cheaper than multinomial at this width.
                gumbel = -torch.empty_like(processed).exponential_(generator=generator).log()
                token = int((processed + gumbel).argmax())
            reported = processed if params.logprobs_mode == "processed_logprobs" else logits.log_softmax(-1)
            logprobs.append(float(reported[token]))
            k = self.vocab_size if params.logprobs == -1 else params.logprobs or 0
            values, indices = reported.topk(k)
            top.append(list(zip(indices.tolist(), values.tolist(), strict=True)))
            if matcher is not None:
                assert matcher.accept_token(token), (token, ids)
            ids.append(token)
            context.append(token)
            # The primary EOS is checked first, so stopping on it leaves stop_reason null (vLLM's check_stop).
            if token == self.eos_token_id:
                finish = "stop"
                break
            if token in stops:
                finish, stop_reason = "stop", token
                break
        return Generation(ids, logprobs, top, finish, stop_reason)


def _process(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p: the distribution a token is drawn from."""
    scaled = logits / (params.temperature or 1.0)
    if 0 < params.top_k < scaled.numel():
        scaled = scaled.masked_fill(scaled < scaled.topk(params.top_k).values[-1], float("-inf"))
    if params.top_p < 1.0:
        probs, order = scaled.softmax(-1).sort(descending=True)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest prefix reaching top_p
        scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    if params.min_p > 0:
        probs = scaled.softmax(-1)
        scaled = scaled.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return scaled
