"""The fake vLLM server answers with vLLM 0.33's own response classes: each JSON answer it gave our
clients (and the error answers the test draws out) validates against vLLM's class for that route
and equals what vLLM's route would send for it, `model_validate(...).model_dump()`: same keys, nulls
included, nothing vLLM does not send."""

from __future__ import annotations

import pytest
from tests.fakes.traffic import key_paths

ROUTES = {"/v1/completions": "completion", "/v1/chat/completions": "chat", "/v1/models": "models"}


def _kind(exchange) -> str | None:
    answer = exchange.answer
    if not isinstance(answer, dict):
        return None  # LoRA success: plain text, as vLLM's
    if exchange.status >= 400:
        # 401 {"error": "Unauthorized"} and 404 {"detail": ...} come from vLLM's auth middleware and
        # FastAPI, not from ErrorResponse; every other error is the envelope.
        return "error" if isinstance(answer.get("error"), dict) else None
    return ROUTES[exchange.path]


@pytest.fixture(scope="module")
def checked(traffic, vllm_oracle):
    answers = [(x, kind) for x in traffic if (kind := _kind(x)) is not None]
    items = [{"kind": kind, "body": x.answer} for x, kind in answers]
    return list(zip(answers, vllm_oracle("responses", items=items), strict=True))


def test_every_route_and_error_is_covered(checked):
    kinds = {kind for (_, kind), _ in checked}
    assert kinds == {"completion", "chat", "models", "error"}
    statuses = sorted({x.status for (x, kind), _ in checked if kind == "error"})
    assert statuses == [400, 404]


def test_each_answer_is_what_vllm_would_send(checked):
    wrong = []
    for (exchange, kind), answer in checked:
        if answer["error"]:
            wrong.append((kind, exchange.path, answer["error"]))
        elif answer["unknown"]:  # extra="allow" keeps them in the dump: name them instead
            wrong.append((kind, exchange.path, {"not in vLLM": answer["unknown"]}))
        elif exchange.answer != answer["dump"]:
            missing = sorted(key_paths(answer["dump"]) - key_paths(exchange.answer))
            extra = sorted(key_paths(exchange.answer) - key_paths(answer["dump"]))
            wrong.append(
                (
                    kind,
                    exchange.path,
                    {"missing": missing, "not in vLLM": extra, "values differ": not (missing or extra)},
                )
            )
    assert not wrong, wrong


def test_the_check_sees_a_missing_null_and_a_field_vllm_lacks(vllm_oracle):
    error = {"error": {"message": "m", "type": "NotFoundError", "code": 404, "detail": "x"}}
    [answer] = vllm_oracle("responses", items=[{"kind": "error", "body": error}])
    assert answer["unknown"] == ["error.detail"] and answer["dump"]["error"]["param"] is None
