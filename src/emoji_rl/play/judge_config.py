"""The judge a stage asks for: the `judge_*` fields (`JudgeFields`, which the retrieval game's config
holds), the same with the wait for a judge server for the stages that ask a judge outside the game
(`JudgeConfig`), and `make_judge`, which builds any kind from them (`judge.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from emoji_rl.config import Checked, override
from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import SERVER_WAIT_S, Endpoint, ServerWaitConfig, wait_for_server
from emoji_rl.lm import models
from emoji_rl.play.guessing import JudgeView
from emoji_rl.play.judge import (
    BATCH_SIZE,
    TEMPERATURE,
    HFJudge,
    Judge,
    JudgeKind,
    LexiconJudge,
    OpenAIJudge,
)

JUDGE_URL = "http://127.0.0.1:8001"  # launch/serve_judge.sh's default host and port
JUDGE_API_KEY_ENV = "JUDGE_API_KEY"
JUDGE_START_HINT = (
    "start it with make serve-judge (launch/serve_judge.sh; --dry-run prints its vllm serve command, "
    "JUDGE_HOST and JUDGE_PORT), or point --judge_url at the one running"
)


def check_view(kind: JudgeKind, view: JudgeView) -> None:
    """The lexicon judge reads emoji names, so only the gloss view describes what it sees."""
    if kind == "lexicon" and view != "gloss":
        raise UserError(
            f"judge_view={view} does not apply to judge=lexicon, which reads emoji names: "
            "use judge_view=gloss with it, or an LLM judge (hf, openai) for raw emoji"
        )


def make_judge(
    kind: JudgeKind,
    view: JudgeView = "gloss",
    model_spec: str = models.SMOLLM2,
    *,
    runtime: models.Runtime | None = None,
    batch_size: int = BATCH_SIZE,
    url: str = JUDGE_URL,
    api_key_env: str | None = JUDGE_API_KEY_ENV,
    wait_s: float = SERVER_WAIT_S,
    temperature: float = TEMPERATURE,
) -> Judge:
    """Build a judge once, for the game or a check to hold; `model_spec` and `view` serve LLM judges.
    For `openai`, `model_spec` is the served model name at `url` (launch/serve_judge.sh: `judge`),
    waited for up to `wait_s` seconds."""
    check_view(kind, view)
    if kind == "lexicon":
        return LexiconJudge()
    if kind == "hf":
        model = models.load_causal_lm(model_spec, runtime)
        tokenizer = models.load_tokenizer(model_spec)
        return HFJudge(
            model, tokenizer, view, name=str(model_spec), batch_size=batch_size, temperature=temperature
        )
    if kind == "openai":
        wait_for_server(url, "the judge server", wait_s, JUDGE_START_HINT)
        return OpenAIJudge(Endpoint(url, api_key_env), model_spec, view, temperature=temperature)
    raise UserError(f"judge kind {kind!r} is unknown; kinds: lexicon, hf, openai")


@dataclass
class JudgeFields(Checked):
    """The judge fields of every stage that asks a judge (the retrieval game in grpo and eval,
    rl-prompts, judge-check, eval-sft, play-game): configs inherit them, so the flags, defaults and
    help texts are the same everywhere. A stage whose default differs overrides that field (eval-sft:
    no judge)."""

    judge: JudgeKind = field(
        default="hf",
        metadata={
            "help": "judge kind: hf (an LLM in this process), openai (an OpenAI-compatible server such as "
            "vLLM, launch/serve_judge.sh) or lexicon (the emoji names, no LLM: seconds, and the floor an "
            "LLM judge should beat)"
        },
    )
    judge_view: JudgeView = field(
        default="gloss",
        metadata={
            "help": "what an LLM judge is shown: gloss (each emoji with its name; SmolLM2-135M needs it, "
            "issue 8) or raw (emoji alone: for judges that read emoji, the gpu default)"
        },
    )
    judge_model: str = field(
        default=models.SMOLLM2,
        metadata={
            "help": "hf judge: model spec (hub id, path or embedded:NAME); openai: the served model name"
        },
    )
    judge_temperature: float = field(
        default=TEMPERATURE,
        metadata={
            "help": "an LLM judge's sampling temperature; 0 = greedy, the same guess for the same emoji "
            "(evaluation's default: a sampled judge moves a 60-message score by ~0.02 on its own)",
            "min": 0.0,
        },
    )
    judge_url: str = field(
        default=JUDGE_URL, metadata={"help": "base URL of an openai judge (launch/serve_judge.sh)"}
    )
    judge_api_key_env: str | None = field(
        default=JUDGE_API_KEY_ENV,
        metadata={"help": "env var holding the openai judge server's key; unset sends none"},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_view(self.judge, self.judge_view)

    def wait_for_judge_server(self, wait_s: float) -> None:
        """For `openai`, wait for the judge server (up to `wait_s`) before the stage loads any model: a
        wrong --judge_url must be named in seconds, not after minutes of loading."""
        if self.judge == "openai":
            wait_for_server(self.judge_url, "the judge server", wait_s, JUDGE_START_HINT)

    def make_judge(
        self, runtime: models.Runtime | None, wait_s: float, batch_size: int = BATCH_SIZE
    ) -> Judge:
        """The judge these fields describe; `runtime` places an hf judge, `wait_s` bounds the wait for
        an openai judge's server, `batch_size` is an hf judge's chunk."""
        return make_judge(
            self.judge,
            self.judge_view,
            self.judge_model,
            runtime=runtime,
            batch_size=batch_size,
            url=self.judge_url,
            api_key_env=self.judge_api_key_env,
            wait_s=wait_s,
            temperature=self.judge_temperature,
        )

    @property
    def judge_reads_names(self) -> bool:
        """Whether the judge sees emoji names (lexicon, or the gloss view): reports add NAMES_CAVEAT."""
        return self.judge == "lexicon" or self.judge_view == "gloss"


@dataclass
class JudgeConfig(JudgeFields, ServerWaitConfig):
    """The judge fields of a stage that asks a judge outside a game (rl-prompts, judge-check, eval-sft,
    play-game, play-web), with how long it waits for the judge's server."""

    def wait_for_judge(self) -> None:
        """Before the stage loads any model (`cli.main` calls it)."""
        self.wait_for_judge_server(self.server_wait_s)

    def build_judge(self, runtime: models.Runtime | None, batch_size: int = BATCH_SIZE) -> Judge:
        """The judge these fields describe; `runtime` places an hf judge, `batch_size` is its chunk."""
        return self.make_judge(runtime, self.server_wait_s, batch_size)


def greedy_judge_temperature() -> float:
    """`judge_temperature` as an evaluation's Config declares it: greedy by default, so that every
    system's emoji are read the same way and a difference between systems is theirs."""
    return override(
        JudgeFields,
        "judge_temperature",
        0.0,
        help="the judge's sampling temperature; 0 = greedy, deterministic",
    )
