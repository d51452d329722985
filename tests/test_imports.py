"""The package's layers, read from its imports (docs/ARCHITECTURE.md, "Layers"): each folder imports
only its rank or below, folders of one rank never import each other around a loop, nothing below the
stages imports a stage, no two emoji_rl modules import each other (directly or around a loop), a game
never reaches up into the samplers or the trainer, and no module is over 400 lines without a reason.
Read from the source with `ast`, so imports inside functions and under `TYPE_CHECKING` count too: a
lazy or type-only import is still a dependency a reader has to follow."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import emoji_rl

SRC = Path(emoji_rl.__file__).parent


def module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the emoji_rl modules it imports (a package's `__init__` counts as the package)."""
    files = {module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                targets.add(module)
                # `from emoji_rl.play import judge` imports the module emoji_rl.play.judge
                targets.update(f"{module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_are_found_in_a_loop_of_three_and_a_pair():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "a"}, "f": {"a"}}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["d", "e"]]


def test_the_graph_sees_lazy_relative_and_type_only_imports(tmp_path):
    package = tmp_path / "emoji_rl"
    (package / "rl").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("")
    (package / "rl" / "__init__.py").write_text("")
    (package / "rl" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from emoji_rl.rl.b import X\n"
    )
    (package / "rl" / "b.py").write_text("def f():\n    from . import a\n    from .. import low\n")
    graph = import_graph(package)
    assert graph["emoji_rl.rl.a"] == {"emoji_rl.rl.b"}
    assert graph["emoji_rl.rl.b"] == {"emoji_rl.rl", "emoji_rl.rl.a", "emoji_rl", "emoji_rl.low"}
    assert cycles(graph) == [["emoji_rl.rl.a", "emoji_rl.rl.b"]]


def test_no_emoji_rl_modules_import_each_other():
    graph = import_graph()
    assert len(graph) > 50, "the source tree was not found"
    found = cycles(graph)
    assert not found, "modules that import each other (directly or around a loop):\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c)
        for c in found
    )


def test_games_know_the_tokenizer_and_their_partner_not_the_samplers_or_the_trainer():
    """A game is the environment: the player (the turn loop, `play/loop.py`, and the evaluation path
    that drives it, `play/evaluate.py`) samples, the game never does. Partners that decode (the hf
    judge) reach `decode/generate.py`, below the samplers."""
    from emoji_rl import cli

    players = {"emoji_rl.play.loop", "emoji_rl.play.evaluate"} | {
        module for module, _ in cli.STAGES.values()
    }  # a game's stages play it
    graph = import_graph()
    higher = ("emoji_rl.decode.sampler", "emoji_rl.rl.")
    reaching_up = {
        game: sorted(t for t in targets if t.startswith(higher))
        for game, targets in graph.items()
        if game.startswith(("emoji_rl.play.", "emoji_rl.games.")) and game not in players
    }
    assert not any(reaching_up.values()), {game: up for game, up in reaching_up.items() if up}


def game_of(module: str) -> str | None:
    """The game a module belongs to (`emoji_rl.games.reader.game` -> `reader`), or None."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["emoji_rl", "games"] and len(parts) > 2 else None


def test_no_game_imports_another_and_what_games_share_imports_none():
    """What two games share (the guessing chat, similarity, the partners) lives in play/, which every
    game imports and which imports no game: a game removed, or installed on its own, takes nothing
    of another with it."""
    graph = import_graph()
    crossing = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if game_of(t) is not None and (game_of(m) not in (None, game_of(t)) or m.startswith("emoji_rl.play."))
    )
    assert not crossing, "a game reached from another game, or from what games share:\n" + "\n".join(crossing)


def lines_naming_a_game(paths) -> list[str]:
    """Each line of `paths` that names a registered game as a whole word, in code or in words."""
    from emoji_rl.play import registry

    games = re.compile(rf"\b({'|'.join(map(re.escape, registry.names()))})\b", re.IGNORECASE)
    assert {"retrieval", "wordle"} <= set(registry.names())
    return [
        f"{path.relative_to(SRC)}:{number}: {line.strip()}"
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if games.search(line)
    ]


def test_the_trainer_and_the_decoders_name_no_game():
    """rl/ and decode/ hold any game (`play/registry.py`): no module there names one, in code or in
    words, so that a new game needs no edit there and none reads as special."""
    naming = lines_naming_a_game(
        path for folder in ("rl", "decode") for path in sorted((SRC / folder).rglob("*.py"))
    )
    assert not naming, "a game named where every game is played:\n" + "\n".join(naming)


def test_the_evaluation_path_names_no_game():
    """The evaluation path plays any game through its hooks (`GameSpec.evaluation`): a game's
    evaluation is in its own folder, and the path reads as the same for every game."""
    path = ("evaluate", "evaluation", "eval_records", "compare", "intervals")
    naming = lines_naming_a_game(SRC / "play" / f"{module}.py" for module in path)
    assert not naming, "a game named in the evaluation path:\n" + "\n".join(naming)


# The layers, lowest first (docs/ARCHITECTURE.md). A module imports only from its own rank or below;
# a new top-level module or folder fails the test until it is ranked here on purpose.
RANKS = {
    "": 0, "errors": 0, "config": 0, "cli": 0, "io": 0,
    "lm": 1,
    "emoji": 2,
    "decode": 3,
    "play": 4, "games": 4,
    "rl": 5,
    "data": 6, "sft": 6, "web": 6, "chat": 6, "play_game": 6, "pipeline": 6,
    "eval": 7,
    "bench": 8, "selftest": 8, "fault_run": 8,
}  # fmt: skip


def top(module: str) -> str:
    """The top-level module or folder a module lives in: `emoji_rl.rl.rollout.collect` -> `rl`."""
    return module.split(".")[1] if "." in module else ""


def test_every_folder_imports_only_its_rank_or_below():
    graph = import_graph()
    unranked = sorted({top(m) for m in graph} - RANKS.keys())
    assert not unranked, f"rank these in RANKS: {unranked}"
    upward = sorted(
        f"{m} (rank {RANKS[top(m)]}) -> {t} (rank {RANKS[top(t)]})"
        for m, targets in graph.items()
        for t in targets
        if RANKS[top(t)] > RANKS[top(m)]
    )
    assert not upward, "imports that climb a layer:\n" + "\n".join(upward)


def test_folders_of_one_rank_do_not_import_each_other_around_a_loop():
    graph = import_graph()
    folders: dict[str, set[str]] = {}
    for m, targets in graph.items():
        folders.setdefault(top(m), set()).update(top(t) for t in targets if top(t) != top(m))
    assert not cycles(folders), cycles(folders)


def test_below_the_stages_nothing_imports_a_stage():
    """A stage (a module the CLI runs) is a leaf for the layers under it: a helper two stages share
    lives in a lower module, so running one stage never loads another's code by surprise."""
    from emoji_rl import cli

    stages = {module for module, _ in cli.STAGES.values()}
    graph = import_graph()
    reaching = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets & stages
        if RANKS[top(m)] < 6 and t != m
    )
    assert not reaching, reaching


MAX_LINES = 400


def test_no_module_is_over_400_lines_without_a_reason_at_its_top():
    """A module a newcomer can read in one sitting; one that must be longer says why in its docstring's
    first paragraph ("Over 400 lines: ...")."""
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if lines > MAX_LINES and "Over 400 lines:" not in docstring.split("\n\n")[0]:
            too_long.append(f"{path.relative_to(SRC)}: {lines} lines")
    assert not too_long, "split these, or say at their top why not:\n" + "\n".join(too_long)


MAX_PARAMETERS = 8


def parameter_counts(tree: ast.Module) -> dict[str, int]:
    """`qualified name -> parameters` of every function in a module: positional and keyword-only,
    without a method's `self` or `cls` (a staticmethod has neither); `*args` and `**kwargs` pass
    along what another function takes and are not counted."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                args = child.args
                count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in child.decorator_list)
                counts[prefix + child.name] = count - (in_class and not static and count > 0)
                visit(child, f"{prefix}{child.name}.", False)
            else:
                visit(child, prefix, in_class)

    visit(tree, "", False)
    return counts


def test_parameters_are_counted_as_a_caller_passes_them():
    source = (
        "class A:\n"
        "    def method(self, a, /, b, *args, c, **kwargs): ...\n"
        "    @classmethod\n"
        "    def make(cls, a): ...\n"
        "    @staticmethod\n"
        "    def pure(a, b): ...\n"
        "async def outer(a, b=1, *, c):\n"
        "    def inner(x): ...\n"
    )
    assert parameter_counts(ast.parse(source)) == {
        "A.method": 3,
        "A.make": 1,
        "A.pure": 2,
        "outer": 3,
        "outer.inner": 1,
    }


def test_no_function_of_the_trainer_or_the_decoders_takes_more_than_8_parameters():
    """Settings travel as objects (`Decoding`, `UpdateSettings`, `Snapshot`, a `Trainer`), not as
    loose arguments that every caller repeats in its own order."""
    crowded = [
        f"{path.relative_to(SRC)}: {name} takes {count}"
        for folder in ("rl", "decode")
        for path in sorted((SRC / folder).rglob("*.py"))
        for name, count in parameter_counts(ast.parse(path.read_text())).items()
        if count > MAX_PARAMETERS
    ]
    assert not crowded, f"more than {MAX_PARAMETERS} parameters: group them\n" + "\n".join(crowded)
