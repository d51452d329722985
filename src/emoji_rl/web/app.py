"""`emoji-rl play-web`: people play the retrieval game in a browser, against trained senders.

    emoji-rl play-web --systems base sft=runs/sft/adapter rl=runs/grpo/adapter --data data/rl_eval.jsonl
    make play-web

Then open http://127.0.0.1:8000. Every answer goes to `db` (SQLite); `emoji-rl eval-human` reports on
it. The server is a Starlette app on uvicorn and a static page (docs/PLAY_WEB.md says why); the models
load once and run on one worker thread, so pages answer while they generate.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field

from emoji_rl.config import override
from emoji_rl.decode.generate import MAX_NEW_TOKENS
from emoji_rl.errors import UserError
from emoji_rl.games.retrieval.game import RetrievalConfig
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.lm import models
from emoji_rl.play.judge_config import JudgeConfig
from emoji_rl.play.similarity import SimilarityConfig
from emoji_rl.web.rounds import TURN_LIMIT, Rounds, target_ids
from emoji_rl.web.runners import LoadedModels
from emoji_rl.web.server import is_loopback, make_server
from emoji_rl.web.store import Store

log = logging.getLogger(__name__)


@dataclass
class Config(JudgeConfig, RetrievalConfig, SimilarityConfig, models.ModelConfig):
    """Serve the retrieval game to people in a browser; their answers are the human evaluation."""

    systems: list[str] = field(
        default_factory=lambda: ["base"],
        metadata={"help": "senders, assigned blind and balanced: `base`, or NAME=ADAPTER_DIR"},
    )
    data: str = field(
        default="data/rl_eval.jsonl",
        metadata={"help": "held-out targets, JSONL with `target` (a quarter go to send mode)"},
    )
    db: str = field(default="runs/play-web/answers.db", metadata={"help": "SQLite file of every answer"})
    host: str = field(
        default="127.0.0.1", metadata={"help": "address to listen on; anything but loopback is warned about"}
    )
    port: int = field(default=8000, metadata={"help": "TCP port (0 picks a free one)"})
    max_turns: int = override(RetrievalConfig, "max_turns", 3, help="turns a person may ask the sender for")
    temperature: float = field(default=0.7, metadata={"help": "sender sampling temperature"})
    max_new_tokens: int = field(default=MAX_NEW_TOKENS, metadata={"help": "token budget of one sender turn"})
    seed: int = field(default=0, metadata={"help": "seed of the assignment and the sampling"})
    threads: int = field(
        default=1,
        metadata={
            "help": "torch CPU threads of this process. 1: a batch of one gains little from more, and on a "
            "busy machine two threads wait on each other (a sender turn took 57-114 s with 2, 3 s with 1, "
            "2 cores at load 9)"
        },
    )

    def __post_init__(self) -> None:
        from emoji_rl.decode.senders import parse_systems

        super().__post_init__()
        parse_systems(self.systems)
        if not 1 <= self.max_turns <= TURN_LIMIT:
            raise ValueError(f"max_turns={self.max_turns} must be 1 to {TURN_LIMIT}")
        if self.threads < 1:
            raise ValueError(f"threads={self.threads} must be >= 1")


def load_game(cfg: Config) -> Rounds:
    """Every model once: the base with each sender's adapter, the judge, the embedder; then one turn
    of each, so the first person waits for a turn, not for the grammar compile and first calls."""
    import torch

    from emoji_rl.decode.senders import parse_systems
    from emoji_rl.lm.adapters import load_systems

    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    records = read_jsonl(cfg.data, hint="make it with `emoji-rl rl-prompts` (it writes the held-out split)")
    senders = parse_systems(cfg.systems)
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(cfg.model)
    model = load_systems(models.load_causal_lm(cfg.model, runtime), senders)
    loaded = LoadedModels(
        model,
        tokenizer,
        senders,
        cfg.build_judge(runtime, batch_size=1),
        cfg.load_similarity(runtime),
        cfg.temperature,
        cfg.max_new_tokens,
    )
    loaded_s = time.perf_counter() - start
    times = loaded.warm_up()
    log.info(
        "play-web: models loaded in %.1f s, warmed in %.1f s (%s)",
        loaded_s,
        sum(times.values()),
        ", ".join(f"{what} {s:.1f} s" for what, s in times.items()),
    )
    return Rounds(
        Store(cfg.db),
        loaded,
        senders,
        target_ids(records, cfg.data),
        max_turns=cfg.max_turns,
        tau=cfg.tau,
        seed=cfg.seed,
    )


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(cfg: Config) -> None:
    # SIGTERM (kill, systemd, a container's stop) stops the server as Ctrl-C does, closing the store
    # and cutting short the model turn in flight. It also works where SIGINT cannot: a process
    # started in the background by a script inherits SIGINT ignored, and Python then keeps it so.
    signal.signal(signal.SIGTERM, _stop)
    if not is_loopback(cfg.host):
        log.warning(
            "play-web listens on %s: anyone who reaches this address can play and write to %s "
            "(no login, no TLS). Use 127.0.0.1 unless you mean it.",
            cfg.host,
            cfg.db,
        )
    game = load_game(cfg)
    try:
        server = make_server(game, cfg.host, cfg.port)
    except OSError as err:
        raise UserError(f"play-web cannot listen on {cfg.host}:{cfg.port}: {err} (try --port 0)") from err
    host, port = server.server_address
    print(f"play-web: http://{host}:{port}/  (answers in {cfg.db}; Ctrl-C or SIGTERM stops)", flush=True)
    try:
        server.serve_forever()  # on a signal, uvicorn stops, then raises it again: KeyboardInterrupt
    except KeyboardInterrupt:
        log.info("play-web: stopping")
    finally:
        server.server_close()
        game.close()
    print(f"play-web: stopped; every answer is in {cfg.db}", flush=True)
