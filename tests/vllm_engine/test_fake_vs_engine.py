"""The fake server, checked against the engine it stands in for: our clients play the same run against
both (tests/fakes/traffic.py) and every exchange is compared, request for request: the status, the
error's `param` (what our clients branch on), the keys of every JSON answer, the text of the LoRA
routes' plain answers. Where they differed, the engine won and the fake was corrected (docs/VLLM.md §8)."""

from __future__ import annotations

import shutil

import pytest
from tests.fakes.fake_lm import FakeLM
from tests.fakes.traffic import RecordingProxy, RecordingServer, key_paths, play_clients
from tests.vllm_engine.conftest import KEY, KEY_ENV, MAX_LORA_RANK, MAX_MODEL_LEN, lora_adapter

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.vllm import VLLMSampler
from emoji_rl.io.endpoint import Endpoint
from emoji_rl.rl.rollout.vllm import AdapterSync

pytestmark = pytest.mark.vllm_engine


@pytest.fixture(scope="module")
def exchanges(engine, smollm2_tokenizer, smollm2_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("fake-vs-engine")
    adapter = lora_adapter(smollm2_model, root / "adapter", seed=0)

    def save(path):
        shutil.copytree(adapter, path)

    auth = {"Authorization": f"Bearer {KEY}"}
    lm = FakeLM(smollm2_tokenizer)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, KEY)
        # Adapters other tests left loaded would add unloads to the engine's side only.
        sampler = VLLMSampler(Endpoint(engine.url, api_key_env=KEY_ENV), "policy", 0, Decoding())
        AdapterSync(sampler, root / "earlier", "policy").clear_stale()
        with RecordingProxy(engine.url, auth) as policy, RecordingProxy(engine.url, auth) as judge:
            real = play_clients(policy, judge, smollm2_tokenizer, root / "engine-run", save, KEY_ENV)
        with (
            RecordingServer(
                lm,
                served_model_names=("policy", "judge"),
                api_key=KEY,
                logprobs_mode="processed_logprobs",
                max_model_len=MAX_MODEL_LEN,
                max_lora_rank=MAX_LORA_RANK,
            ) as policy,
            RecordingServer(lm, served_model_names=("policy", "judge"), api_key=KEY) as judge,
        ):
            fake = play_clients(policy, judge, smollm2_tokenizer, root / "fake-run", save, KEY_ENV)
    return fake, real


def _shape(answer):
    """The answer's key paths, a top-log-probs entry's keys (token strings: data) left out."""
    return {p for p in key_paths(answer) if ".top_logprobs[]." not in p}


def _param(answer):
    return (
        answer["error"].get("param")
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict)
        else None
    )


def _differences(fake, real):
    wrong = []
    for f, r in zip(fake, real, strict=True):
        where = (f.source, f.path, str(f.body)[:120])
        assert (f.source, f.path) == (r.source, r.path), (where, r.path)
        if f.status != r.status:
            wrong.append((where, {"status": (f.status, r.status), "engine": str(r.answer)[:300]}))
        elif _param(f.answer) != _param(r.answer):
            wrong.append((where, {"param": (_param(f.answer), _param(r.answer))}))
        elif isinstance(r.answer, dict) != isinstance(f.answer, dict):
            wrong.append((where, {"answer": (str(f.answer)[:120], str(r.answer)[:120])}))
        elif isinstance(r.answer, dict):
            missing, extra = (
                _shape(r.answer) - _shape(f.answer),
                _shape(f.answer) - _shape(r.answer),
            )
            if missing or extra:
                wrong.append(
                    (where, {"missing in the fake": sorted(missing), "not in the engine": sorted(extra)})
                )
        elif f.status < 400 and f.answer != r.answer:
            wrong.append((where, {"text": (f.answer, r.answer)}))
    return wrong


def test_the_run_and_the_probes_were_played_alike(exchanges):
    fake, real = exchanges
    assert [(x.source, x.path) for x in fake] == [(x.source, x.path) for x in real]
    assert {x.path for x in real} >= {
        "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
    }  # fmt: skip
    assert sorted({x.status for x in real}) == [200, 400, 404]


def test_the_fake_answers_every_request_as_the_engine_does(exchanges):
    fake, real = exchanges
    wrong = _differences(fake, real)
    assert not wrong, "\n".join(map(str, wrong))
