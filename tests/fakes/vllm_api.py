"""The OpenAI API surface of the fake vLLM 0.33 server: `/v1/completions` and `/v1/chat/completions`,
validated and answered as vLLM does (docs/VLLM.md §2, §3, §6). `FakeVLLMServer` adds the HTTP
side, auth, routes, readiness and the LoRA endpoints.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tests.fakes.engine_stats import EngineStats
from tests.fakes.fake_lm import FakeLM, LogprobsMode, SamplingParams

from emoji_rl.lm.template import chat_ids

MAX_COMPLETION_PROMPTS = 1024
CONSTRAINT_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
FINGERPRINT = "vllm-0.33.0-fake"

JSONBody = dict[str, Any]


@dataclass
class Adapter:
    path: str
    created: int = field(default_factory=lambda: int(time.time()))


class Reject(Exception):
    """An error answer: status and JSON body."""

    def __init__(self, status: int, body: JSONBody) -> None:
        super().__init__(status, body)
        self.status, self.body = status, body


def error(status: int, message: str, kind: str, param: str | None = None) -> Reject:
    return Reject(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})


def bad_field(name: str, message: str) -> Reject:
    """A pydantic failure: 400 `Bad Request` with the dotted location as param."""
    return error(400, message, "Bad Request", f"body.{name}")


def invalid(message: str, param: str | None = None) -> Reject:
    """vLLM's own validators (VLLMValidationError in 0.33)."""
    return error(400, message, "BadRequestError", param)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _clamp(logprob: float) -> float:
    return max(logprob, -9999.0)


def default_chat_reply(messages: Sequence[JSONBody]) -> str:
    return 'My guess: "We are going to the beach this weekend." 🏖️'


class OpenAIAPI:
    """Completions and chat over `FakeLM`; the server sets these attributes."""

    lm: FakeLM
    served: tuple[str, ...]
    adapters: dict[str, Adapter]
    max_model_len: int
    max_logprobs: int
    logprobs_mode: LogprobsMode
    length_rule: str
    chat_reply: Callable[[Sequence[JSONBody]], str]
    stats: EngineStats
    _generator: torch.Generator

    def _resolve(self, name: object) -> tuple[str, str]:
        """(the name the answer echoes, the key the fake model's logits use)."""
        if name is None or name in self.served:
            return self.served[0], f"base:{self.served[0]}"
        if isinstance(name, str) and name in self.adapters:
            return name, f"lora:{name}:{self.adapters[name].path}"
        raise error(
            404,
            f"The model `{name}` does not exist. Valid aliases: {', '.join(self.served)}.",
            "NotFoundError",
            "model",
        )

    # --- completions -----------------------------------------------------------------------------

    def _prompts(self, body: JSONBody) -> list[list[int]]:
        prompt = body.get("prompt")
        if prompt is None:
            raise invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        if isinstance(prompt, str):
            return [self.lm.tokenizer(prompt)["input_ids"]]
        if not isinstance(prompt, list) or not prompt:
            raise bad_field("prompt", "Input should be a valid string or a non-empty list")
        if all(isinstance(p, str) for p in prompt):
            return [self.lm.tokenizer(p)["input_ids"] for p in prompt]
        batch = prompt if all(isinstance(p, list) for p in prompt) else [prompt]
        for ids in batch:
            bad = next((i for i, t in enumerate(ids) if not (_is_int(t) and t >= 0)), None)
            if bad is not None and batch[0] is prompt:
                # The engine's param names the first offending id's place (checked against it).
                raise bad_field(f"prompt.{bad}", "Input should be an integer >= 0")
            if not ids or bad is not None:
                raise bad_field("prompt", "Input should be a non-empty list of integers >= 0")
            for token in ids:
                if token >= self.lm.vocab_size:
                    raise invalid(f"Token id {token} is out of vocabulary", "prompt")
        if len(batch) > MAX_COMPLETION_PROMPTS:
            raise invalid(
                f"Too many prompts ({len(batch)}): at most {MAX_COMPLETION_PROMPTS} per request "
                "(VLLM_MAX_COMPLETION_PROMPTS)",
                "prompt",
            )
        return batch

    def _number(
        self, body: JSONBody, name: str, default: float, ok: Callable[[float], bool], rule: str
    ) -> float:
        value = body.get(name)
        if value is None:
            return default
        if not _is_number(value):
            raise bad_field(name, "Input should be a valid number")
        if not ok(value):
            raise invalid(f"{name} {rule}, got {value}.", name)
        return float(value)

    def _int(self, body: JSONBody, name: str, default: int | None) -> int | None:
        value = body.get(name)
        if value is None:
            return default
        if not _is_int(value):
            raise bad_field(name, "Input should be a valid integer")
        return int(value)

    def _logprobs(self, body: JSONBody) -> int | None:
        value = body.get("logprobs")
        if value is None:
            return None
        if not _is_int(value):
            raise invalid(f"logprobs must be an integer, got {value!r}", "logprobs")
        if value == -1 and self.max_logprobs == -1:
            return -1
        if value < 0 or (self.max_logprobs != -1 and value > self.max_logprobs):
            raise invalid(
                f"Requested sample logprobs of {value}, which is greater than max allowed: "
                f"{self.max_logprobs} (parameter=logprobs, value={value})",
                "logprobs",
            )
        return value

    def _grammar(self, body: JSONBody) -> Any:
        # `guided_*` fields are ignored on purpose: vLLM >= 0.12 only logs a warning (§2).
        spec = body.get("structured_outputs")
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise bad_field("structured_outputs", "Input should be a valid dictionary")
        given = [key for key in CONSTRAINT_KEYS if spec.get(key) is not None]
        if len(given) != 1:
            raise invalid(
                "You must use one kind of structured outputs constraint"
                if not given
                else f"You can only use one kind of structured outputs constraint but multiple are specified: {given}"
            )
        kind, value = given[0], spec[given[0]]
        if kind == "grammar" and (not isinstance(value, str) or not value.strip()):
            raise invalid("structured_outputs.grammar cannot be an empty string")
        try:
            return self.lm.compile(kind, value)
        except ValueError as err:
            raise invalid(f"Invalid grammar specification. ({err})") from err

    def _max_tokens(self, requested: int | None, prompt_len: int) -> int:
        limit = self.max_model_len
        if prompt_len > limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                f"{prompt_len} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={prompt_len})",
                "input_tokens",
            )
        if requested is None:
            return limit - prompt_len
        if requested > limit:
            raise invalid(
                f"max_tokens={requested} cannot be greater than max_model_len={limit}.", "max_tokens"
            )
        if self.length_rule == "0.22" and prompt_len + requested > limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens. However, you requested {requested} "
                f"output tokens and your prompt contains {prompt_len} input tokens, for a total of "
                f"{prompt_len + requested} tokens.",
                "input_tokens",
            )
        if prompt_len == limit:
            raise invalid("max_tokens must be at least 1, got 0.", "max_tokens")
        # 0.33 clamps silently; the output then ends with finish_reason "length".
        return min(requested, limit - prompt_len)

    def _completions(self, body: JSONBody) -> JSONBody:
        prompts = self._prompts(body)
        echoed, lm_key = self._resolve(body.get("model"))
        max_tokens = self._int(body, "max_tokens", 16)
        assert max_tokens is not None
        if max_tokens < 1:
            raise invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        temperature = self._number(body, "temperature", 1.0, lambda t: t >= 0, "must be non-negative")
        top_p = self._number(body, "top_p", 1.0, lambda p: 0 < p <= 1, "must be in (0, 1]")
        min_p = self._number(body, "min_p", 0.0, lambda p: 0 <= p <= 1, "must be in [0, 1]")
        top_k = self._int(body, "top_k", 0) or 0
        if top_k < -1:
            raise invalid(f"top_k must be -1 (disable), or at least 1, got {top_k}.", "top_k")
        n = self._int(body, "n", 1)
        assert n is not None
        if n < 1:
            raise invalid(f"n must be at least 1, got {n}.", "n")
        seed = self._int(body, "seed", None)
        logprobs = self._logprobs(body)
        stops = body.get("stop_token_ids") or []
        if not isinstance(stops, list) or not all(_is_int(t) for t in stops):
            raise bad_field("stop_token_ids", "Input should be a valid list of integers")
        return_ids = body.get("return_token_ids") or False
        skip_special = body.get("skip_special_tokens", True) is not False
        grammar = self._grammar(body)
        choices, completion_tokens = [], 0
        for p, prompt in enumerate(prompts):
            params = SamplingParams(
                max_tokens=self._max_tokens(max_tokens, len(prompt)),
                temperature=temperature,
                top_p=top_p,
                top_k=max(top_k, 0),
                min_p=min_p,
                stop_token_ids=frozenset(stops),
                logprobs=logprobs,
                logprobs_mode=self.logprobs_mode,
            )
            for j in range(n):
                # A seeded request: every prompt draws from the same seed (sample j from seed + j),
                # so identical prompts get identical samples. Otherwise the server's own stream.
                generator = torch.Generator().manual_seed(seed + j) if seed is not None else self._generator
                self.stats.prefill(lm_key, prompt)
                gen = self.lm.generate(lm_key, prompt, params, grammar, generator)
                self.stats.cache(lm_key, [*prompt, *gen.token_ids])
                completion_tokens += len(gen.token_ids)
                text_ids = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
                choices.append(
                    {
                        "index": p * n + j,
                        "text": self.lm.tokenizer.decode(text_ids, skip_special_tokens=skip_special),
                        "logprobs": self._logprob_block(gen.token_ids, gen.logprobs, gen.top)
                        if logprobs is not None
                        else None,
                        "finish_reason": gen.finish_reason,
                        "stop_reason": gen.stop_reason,
                        "token_ids": gen.token_ids if return_ids else None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt if return_ids else None,
                        "routed_experts": None,
                        "weight_versions": None,
                    }
                )
        prompt_tokens = sum(map(len, prompts))
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": echoed,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": self._usage(prompt_tokens, completion_tokens),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _logprob_block(
        self, ids: list[int], logprobs: list[float], top: list[list[tuple[int, float]]]
    ) -> JSONBody:
        tokens = [self.lm.tokenizer.decode([t]) for t in ids]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        # Keys are decoded strings, sampled token first; ids that decode alike merge, as in vLLM.
        top_dicts = [
            {self.lm.tokenizer.decode([t]): _clamp(v) for t, v in [(token, lp), *step]}
            for token, lp, step in zip(ids, logprobs, top, strict=True)
        ]
        return {
            "text_offset": offsets,
            "token_logprobs": [_clamp(lp) for lp in logprobs],
            "tokens": tokens,
            "top_logprobs": top_dicts,
        }

    @staticmethod
    def _usage(prompt_tokens: int, completion_tokens: int) -> JSONBody:
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }

    # --- chat --------------------------------------------------------------------------------------

    def _chat(self, body: JSONBody) -> JSONBody:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_field("messages", "Field required: a non-empty list of messages")
        for m in messages:
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)
            ):
                raise bad_field("messages", f"Each message needs a string role and content, got {m!r}")
        echoed, lm_key = self._resolve(body.get("model"))
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise bad_field("chat_template_kwargs", "Input should be a valid dictionary")
        for key in ("chat_template", "tokenize"):
            if key in kwargs:
                raise invalid(
                    f"Found unexpected chat template kwargs from request: {key!r}", "chat_template_kwargs"
                )
        self._number(body, "temperature", 1.0, lambda t: t >= 0, "must be non-negative")
        # The template ignores kwargs it does not declare; SmolLM2's declares none.
        prompt = chat_ids(self.lm.tokenizer, messages)
        prompt_len = len(prompt)
        self.stats.prefill(lm_key, prompt)
        requested = self._int(body, "max_completion_tokens", None)
        if requested is None:
            requested = self._int(body, "max_tokens", None)
        limit = self._max_tokens(requested, prompt_len)
        ids = [
            *self.lm.tokenizer(self.chat_reply(messages), add_special_tokens=False)["input_ids"],
            self.lm.eos_token_id,
        ]
        finish = "stop" if len(ids) <= limit else "length"
        ids = ids[:limit]
        self.stats.cache(lm_key, [*prompt, *ids])
        content = self.lm.tokenizer.decode(ids[:-1] if finish == "stop" else ids, skip_special_tokens=True)
        message = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": echoed,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": None,
                    "routed_experts": None,
                    "weight_versions": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": self._usage(prompt_len, len(ids)),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
