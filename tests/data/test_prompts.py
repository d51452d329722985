import json
import logging
import math
import re
from collections import Counter

import pytest
import torch

from emoji_rl.data import dedup, prompt_sources, prompts
from emoji_rl.data.prompts import Config, Prompt, read_prompts
from emoji_rl.data.text_filters import contains_profanity, personal_data, rejection_reason
from emoji_rl.errors import DataError, UserError
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.lm import models

# ---------------------------------------------------------------- filters and dedup


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("mail me at jo.smith+x@example.co.uk tomorrow", "email"),
        ("the recipe is on https://food.example/pasta", "url"),
        ("have you seen reddit.com lately", "url"),
        ("follow me @sunny_days for more", "handle"),
        ("call me on +1 (555) 123-4567 tonight", "phone"),
        ("we moved to 42 Elm Street last year", "street address"),
        ("I paid 1,200 dollars for my bike in 2018", None),
    ],
)
def test_personal_data_kinds(text, kind):
    assert personal_data(text) == kind


def test_profanity_matches_better_profanity_on_look_alikes():
    from better_profanity import profanity

    for text in [
        "what the hell is this",
        "you are a b1tch",
        "this is sh1t",
        "Scunthorpe is a town",
        "I love my class",
    ]:
        assert contains_profanity(text) == profanity.contains_profanity(text), text


def test_rejection_reasons_in_order():
    assert rejection_reason("hi there", 6, 25) == "too short"
    assert rejection_reason(" ".join(["word"] * 26), 6, 25) == "too long"
    assert rejection_reason("I love this pizza so much 🍕", 6, 25) == "non-text characters"
    assert rejection_reason("I just got back from the beach", 6, 25) is None


def test_exact_duplicates_ignore_case_punctuation_and_spacing():
    texts = ["How are you doing today?", "how are  you doing today", "How are you doing tomorrow?"]
    assert dedup.exact_unique(texts) == [0, 2]


def test_near_unique_keeps_the_first_of_each_cluster():
    vecs = torch.nn.functional.normalize(torch.tensor([[1.0, 0], [0.99, 0.1], [0, 1.0], [0.1, 0.99]]), dim=1)
    assert dedup.near_unique(vecs, 0.9) == [0, 2]
    assert dedup.near_unique(vecs, 1.0) == [0, 1, 2, 3]


def test_deduper_drops_rewordings_but_not_related_messages(embedder):
    texts = [
        "I am going to the beach this weekend with my family",
        "I'm going to the beach this weekend with my family",
        "I AM GOING TO THE BEACH THIS WEEKEND WITH MY FAMILY!",
        "My family is staying home this weekend because of the rain",
    ]
    kept, removed = dedup.Deduper(embedder, 0.9).unique(texts)
    assert kept == [0, 3]
    assert removed == Counter(exact=1, near=1)


# ---------------------------------------------------------------- records


def test_prompt_records_are_validated_with_their_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    good = {
        "id": "corpus-abc",
        "text": "hello there my old friend",
        "category": "statement",
        "source": "corpus",
    }
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "bad id!"}) + "\n")
    with pytest.raises(DataError, match=r"prompts.jsonl:2: id 'bad id!' must be"):
        read_prompts(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "text": ""}) + "\n")
    with pytest.raises(DataError, match=r":2: field 'text' must be a non-empty string"):
        read_prompts(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(UserError, match="repeated: corpus-abc"):
        read_prompts(path)


def test_prompt_ids_are_stable_and_batch_safe():
    a = prompts.prompt_id("claude", "Let's grab pizza tonight!")
    assert a == prompts.prompt_id("claude", "let's grab pizza tonight")
    assert re.fullmatch(r"claude-[0-9a-f]{12}", a)


def test_quotas_follow_weights_and_sum_to_n():
    for n in (1, 17, 300, 30_000):
        q = prompt_sources.quotas(n)
        assert sum(q.values()) == n
    q = prompt_sources.quotas(100)
    assert q["everyday"] == 14 and q["idioms"] == 8


# ---------------------------------------------------------------- corpus source


@pytest.fixture(scope="module")
def corpus():
    return prompt_sources.corpus_texts()


def test_corpus_is_read_offline_from_the_package(corpus):
    assert len(corpus) == 258_145
    assert "How are you doing today?" in corpus[:5]


def test_corpus_stage_writes_schema_and_summary(tmp_path, corpus, embedder, monkeypatch):
    monkeypatch.setattr(models, "load_embedder", lambda spec: embedder)
    monkeypatch.setattr(prompt_sources, "corpus_texts", lambda: corpus)
    cfg = Config(source="corpus", n=40, out=str(tmp_path / "prompts.jsonl"))
    prompts.main(cfg)
    written = read_prompts(cfg.out)
    assert len(written) == 40
    for p in written:
        assert p.source == "corpus" and p.category in {"statement", "question", "exclamation"}
        assert 6 <= len(p.text.split()) <= 25 and rejection_reason(p.text, 6, 25) is None
    assert len({dedup.normalize(p.text) for p in written}) == 40
    summary = json.loads((tmp_path / "prompts.summary.json").read_text())
    assert summary["prompts"] == 40 and sum(summary["by_category"].values()) == 40
    assert summary["by_source"] == {"corpus": 40} and set(summary["duplicates_removed"]) == {"exact", "near"}
    # Seeded: the same config gives the same prompts.
    prompts.main(cfg)
    assert read_prompts(cfg.out) == written


# ---------------------------------------------------------------- claude source


@pytest.fixture(scope="module")
def distinct_messages(corpus, embedder) -> list[str]:
    """Real chat messages, none a duplicate of another, that pass the filters: what the fake Claude writes."""
    passing = [t for t in corpus[:1000] if rejection_reason(t, 6, 25) is None][:160]
    kept, _ = dedup.Deduper(embedder, 0.9).unique(passing)
    return [passing[i] for i in kept]


@pytest.fixture
def server(anthropic_api, distinct_messages):
    """A fake Claude that writes the requested number of messages, each one new."""
    pool = iter(distinct_messages)

    def reply(body: dict) -> str:
        k = int(re.search(r"Write (\d+) different", body["messages"][0]["content"])[1])
        return json.dumps({"messages": [next(pool) for _ in range(k)]})

    return anthropic_api(reply)


def message_posts(server) -> int:
    return server.calls.count(("POST", "/v1/messages"))


def run_claude(cfg: Config, server, embedder) -> list[Prompt]:
    sample = prompt_sources.claude_sample(cfg, server.client(), dedup.Deduper(embedder, cfg.dedup_threshold))
    return prompts.make_prompts("claude", sample)


def test_claude_source_fills_each_category_quota(tmp_path, server, embedder):
    cfg = Config(source="claude", n=18, per_request=3, out=str(tmp_path / "p.jsonl"))
    made = run_claude(cfg, server, embedder)
    assert Counter(p.category for p in made) == Counter(prompt_sources.quotas(18))
    assert {p.source for p in made} == {"claude"}
    # Each category asks for its quota plus 25%, in requests of 3 messages.
    expected = sum(math.ceil(q * 1.25 / 3) for q in prompt_sources.quotas(18).values())
    assert message_posts(server) == expected


def test_claude_source_retries_a_429_then_succeeds(tmp_path, server, embedder):
    server.statuses = [429]
    cfg = Config(source="claude", n=18, per_request=3, concurrency=1, out=str(tmp_path / "p.jsonl"))
    assert len(run_claude(cfg, server, embedder)) == 18
    expected = sum(math.ceil(q * 1.25 / 3) for q in prompt_sources.quotas(18).values())
    assert message_posts(server) == expected + 1


def test_claude_source_resumes_and_asks_only_for_what_is_missing(tmp_path, server, embedder):
    small = Config(source="claude", n=18, per_request=3, out=str(tmp_path / "p.jsonl"))
    first = run_claude(small, server, embedder)
    requests_before = message_posts(server)
    raw = read_jsonl(tmp_path / "p.raw.jsonl")
    have = Counter(r["category"] for r in raw)
    big = Config(source="claude", n=54, per_request=3, out=str(tmp_path / "p.jsonl"))
    second = run_claude(big, server, embedder)
    expected = sum(
        math.ceil(max(0, want - have[name]) * 1.25 / 3) for name, want in prompt_sources.quotas(54).items()
    )
    assert message_posts(server) - requests_before == expected
    assert len(second) == 54 and {p.id for p in first} <= {p.id for p in second}
    # Nothing is missing any more: a third run makes no request.
    requests_before = message_posts(server)
    assert run_claude(big, server, embedder) == second
    assert message_posts(server) == requests_before


def test_claude_source_gives_up_clearly_when_every_request_fails(tmp_path, server, embedder):
    server.statuses = [529] * 100
    cfg = Config(source="claude", n=9, per_request=3, max_retries=0, out=str(tmp_path / "p.jsonl"))
    with pytest.raises(UserError, match=r"all \d+ prompt requests failed.*rerun to resume"):
        run_claude(cfg, server, embedder)


def test_claude_source_stops_at_a_request_the_api_refuses(tmp_path, server, embedder):
    server.statuses = [400]
    cfg = Config(source="claude", n=9, per_request=3, concurrency=1, out=str(tmp_path / "p.jsonl"))
    with pytest.raises(UserError, match=r"HTTP 400.*check the model name"):
        run_claude(cfg, server, embedder)


def test_missing_key_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setattr(
        models, "load_embedder", lambda spec: pytest.fail("loaded a model before the key check")
    )
    with pytest.raises(UserError) as err:
        prompts.main(Config(source="claude", out=str(tmp_path / "p.jsonl")))
    assert "ANTHROPIC_API_KEY" in str(err.value) and "--source corpus" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_the_key_never_reaches_files_or_logs(tmp_path, server, embedder, caplog):
    caplog.set_level(logging.DEBUG)
    server.statuses = [429]
    run_claude(Config(source="claude", n=9, per_request=3, out=str(tmp_path / "p.jsonl")), server, embedder)
    assert server.api_key not in caplog.text
    for path in tmp_path.iterdir():
        assert server.api_key not in path.read_text()
