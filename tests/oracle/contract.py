"""vLLM 0.33.0's own code as the judge of what we send it, print for it and fake of it.

Runs under the contract venv (`make setup-vllm-cpu` builds .venv-vllm-cpu; `make test` builds it
first), never under the project's: `VLLM_TARGET_DEVICE=cpu .venv-vllm-cpu/bin/python contract.py`.
vLLM's engine cannot start on a CPU (the wheel has CUDA kernels only), but its request and response
classes, its `vllm serve` parser, its SamplingParams and its xgrammar backend are plain Python.

It answers JSON lines on stdin with JSON lines on stdout, one per job, so a test session pays the
~9 s import of vLLM once: `{"op": NAME, "args": {...}}` -> `{"result": ...}` or `{"error": traceback}`.
Everything vLLM itself prints goes to stderr. `--check-install` imports what the ops use and exits.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import os
import sys
import traceback
from importlib import metadata
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _vllm() -> SimpleNamespace:
    """Import what the ops use (in one place, so --check-install proves the venv has it all)."""
    import numpy
    import pydantic
    from vllm.config import StructuredOutputsConfig, VllmConfig
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest, ChatCompletionResponse
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponse
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelList
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
    from vllm.tokenizers import get_tokenizer
    from vllm.transformers_utils.config import try_get_generation_config
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend
    from vllm.v1.structured_output.request import get_structured_output_key

    return SimpleNamespace(
        numpy=numpy,
        pydantic=pydantic,
        StructuredOutputsConfig=StructuredOutputsConfig,
        VllmConfig=VllmConfig,
        ServeSubcommand=ServeSubcommand,
        ChatCompletionRequest=ChatCompletionRequest,
        ChatCompletionResponse=ChatCompletionResponse,
        CompletionRequest=CompletionRequest,
        CompletionResponse=CompletionResponse,
        ErrorResponse=ErrorResponse,
        ModelList=ModelList,
        LoadLoRAAdapterRequest=LoadLoRAAdapterRequest,
        UnloadLoRAAdapterRequest=UnloadLoRAAdapterRequest,
        get_tokenizer=get_tokenizer,
        try_get_generation_config=try_get_generation_config,
        FlexibleArgumentParser=FlexibleArgumentParser,
        XgrammarBackend=XgrammarBackend,
        get_structured_output_key=get_structured_output_key,
    )


V: Any = None
REQUESTS: dict[str, str] = {
    "completion": "CompletionRequest",
    "chat": "ChatCompletionRequest",
    "load_lora": "LoadLoRAAdapterRequest",
    "unload_lora": "UnloadLoRAAdapterRequest",
}
RESPONSES = {
    "completion": "CompletionResponse",
    "chat": "ChatCompletionResponse",
    "models": "ModelList",
    "error": "ErrorResponse",
}


def _field_names(value: Any) -> set[str] | None:
    """The keys a pydantic model or dataclass reads; None for anything else."""
    if isinstance(value, V.pydantic.BaseModel):
        fields = type(value).model_fields
        return set(fields) | {f.alias for f in fields.values() if f.alias}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name for f in dataclasses.fields(value)}
    return None


def unknown_keys(value: Any, data: Any, where: str = "") -> list[str]:
    """Keys of `data` that the validated `value` has no field for, at any depth: vLLM's classes
    accept them (extra="allow", or pydantic's default "ignore") and never read them."""
    if isinstance(data, list) and isinstance(value, list | tuple):
        return [
            k
            for i, (v, d) in enumerate(zip(value, data, strict=False))
            for k in unknown_keys(v, d, f"{where}[{i}]")
        ]
    names = _field_names(value)
    if names is None or not isinstance(data, dict):
        return []
    found = [f"{where}.{key}".lstrip(".") for key in data if key not in names]
    for key in data.keys() & names:
        found += unknown_keys(getattr(value, key, None), data[key], f"{where}.{key}")
    return found


def _sampling(request: Any, kind: str, vocab_size: int | None) -> dict[str, Any]:
    """The SamplingParams vLLM's serving code builds from the request (to_sampling_params), which
    runs vLLM's own checks on the values, reported by the fields we rely on. With `vocab_size` (the
    model's logits width), also the checks vLLM's engine runs against the model on the token ids a
    request names (SamplingParams.verify, which needs a whole ModelConfig, calls these)."""
    if kind == "completion":
        max_tokens = request.max_tokens or 16
    else:
        max_tokens = request.max_completion_tokens or request.max_tokens or 16
    params = request.to_sampling_params(max_tokens, {})
    if vocab_size is not None:
        model = SimpleNamespace(get_vocab_size=lambda: vocab_size)
        params._validate_logit_bias(model)
        params._validate_stop_token_ids(model)
    so = params.structured_outputs
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": params.min_p,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "max_tokens": params.max_tokens,
        "logprobs": params.logprobs,
        "stop_token_ids": sorted(params.stop_token_ids or []),
        "seed": params.seed,
        "structured_output_key": None if so is None else [str(k) for k in V.get_structured_output_key(so)],
        "logit_bias": None if params.logit_bias is None else sorted(params.logit_bias.items()),
    }


def _validated(classes: dict[str, str], item: dict[str, Any]) -> tuple[Any, str | None]:
    """(vLLM's model of item["body"], None), or (None, pydantic's message)."""
    try:
        return getattr(V, classes[item["kind"]]).model_validate(item["body"]), None
    except V.pydantic.ValidationError as err:
        return None, str(err)


def op_requests(items: list[dict[str, Any]], vocab_size: int | None = None) -> list[dict[str, Any]]:
    """Validate each {kind, body} with vLLM's request class for that route (and `_sampling`)."""
    out = []
    for item in items:
        request, error = _validated(REQUESTS, item)
        if error:
            out.append({"error": error, "unknown": [], "sampling": None})
            continue
        sampling = None
        if item["kind"] in ("completion", "chat"):
            try:
                sampling = _sampling(request, item["kind"], vocab_size)
            except Exception as err:  # vLLM's own validators raise ValueError subclasses
                out.append({"error": f"to_sampling_params: {err!r}", "unknown": [], "sampling": None})
                continue
        out.append({"error": None, "unknown": unknown_keys(request, item["body"]), "sampling": sampling})
    return out


def _serve_parser() -> Any:
    """The parser `vllm serve` builds (entrypoints/cli/main.py + ServeSubcommand.subparser_init)."""
    parser = V.FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    V.ServeSubcommand().subparser_init(subparsers)
    return parser


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return repr(value)


def op_serve(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Parse each argv (what follows the `vllm` executable) as `vllm serve` does, then run the checks
    it runs before it looks for the model (ServeSubcommand.validate). Building the engine args
    (AsyncEngineArgs.from_cli_args) already resolves the model on the hub, so it is not run here."""
    out = []
    for argv in argvs:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                args = _serve_parser().parse_args(argv)
            if args.subparser != "serve":
                raise ValueError(f"not a `vllm serve` command: {argv[:1]}")
            V.ServeSubcommand().validate(args)
        except SystemExit:
            out.append({"error": stderr.getvalue().strip().splitlines()[-1:], "args": None})
            continue
        except Exception as err:
            out.append({"error": [repr(err)], "args": None})
            continue
        fields = {k: _plain(v) for k, v in vars(args).items() if k != "dispatch_function"}
        fields["structured_outputs_backend"] = args.structured_outputs_config.backend
        out.append({"error": None, "args": fields})
    return out


def op_responses(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each {kind, body} through vLLM's response class, dumped as its routes send it
    (`JSONResponse(content=model.model_dump())`)."""
    out = []
    for item in items:
        model, error = _validated(RESPONSES, item)
        if error:
            out.append({"error": error, "dump": None, "unknown": []})
            continue
        dump = json.loads(json.dumps(model.model_dump()))
        out.append({"error": None, "dump": dump, "unknown": unknown_keys(model, item["body"])})
    return out


def op_grammar(
    model_dir: str, vocab_size: int, request: dict[str, Any], sequences: list[list[int]]
) -> dict[str, Any]:
    """What vLLM's xgrammar backend allows at each position of each sequence, for this completion
    request against the model in `model_dir`:

    - the stop set: the request's SamplingParams updated from the model's generation config as
      v1/engine/input_processor.py does (`update_from_generation_config(generation_config_fields,
      tokenizer eos)`; the fields come from ModelConfig.try_get_generation_config, which reads the
      model directory's generation_config.json for --generation-config auto and vllm alike);
    - the grammar: XgrammarBackend (vLLM's class, built with the tokenizer vLLM loads and the
      model's logits width) compiles the request's structured_outputs key with
      `stop_token_ids=all_stop_token_ids`, as StructuredOutputManager._create_grammar does;
    - the masks: XgrammarGrammar.fill_bitmask then accept_tokens, one token at a time, as the
      scheduler does.

    Allowed ids per position are base64 int32 arrays."""
    tokenizer = V.get_tokenizer(model_dir)
    generation = V.try_get_generation_config(model_dir, trust_remote_code=False)
    fields = generation.to_diff_dict() if generation is not None else {}
    params = V.CompletionRequest.model_validate(request).to_sampling_params(
        request.get("max_tokens") or 16, {}
    )
    params.update_from_generation_config(fields, tokenizer.eos_token_id)
    stops = set(params.all_stop_token_ids)
    config = V.VllmConfig(structured_outputs_config=V.StructuredOutputsConfig(backend="xgrammar"))
    backend = V.XgrammarBackend(vllm_config=config, tokenizer=tokenizer, vocab_size=vocab_size)
    kind, spec = V.get_structured_output_key(params.structured_outputs)
    grammar = backend.compile_grammar(kind, spec, stop_token_ids=stops)
    bitmask = backend.allocate_token_bitmask(1)
    masks, accepted, terminated = [], [], []
    for sequence in sequences:
        grammar.reset()
        allowed, count = [], 0
        for token in sequence:
            grammar.fill_bitmask(bitmask, 0)
            bits = V.numpy.unpackbits(bitmask[0].numpy().view(V.numpy.uint8), bitorder="little")
            ids = V.numpy.flatnonzero(bits[:vocab_size]).astype(V.numpy.int32)
            allowed.append(base64.b64encode(ids.tobytes()).decode())
            if not grammar.accept_tokens("oracle", [token]):
                break
            count += 1
        masks.append(allowed)
        accepted.append(count)
        terminated.append(grammar.is_terminated())
    return {
        "stop_token_ids": sorted(stops),
        "eos_token_id": tokenizer.eos_token_id,
        "generation_eos": fields.get("eos_token_id"),
        "masks": masks,
        "accepted": accepted,
        "terminated": terminated,
    }


def op_import_kernels(avx512: bool, avx512_bf16: bool) -> list[str]:
    """The kernel libraries vLLM's `CpuPlatform.import_kernels` imports on this x86 machine when torch's
    CPU probes answer so. Nothing is loaded: each `vllm._C*` import is recorded and refused."""
    import importlib.abc

    import torch
    from vllm.platforms.cpu import CpuPlatform

    tried: list[str] = []

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> None:
            if name.startswith("vllm._C"):
                tried.append(name)
                raise ImportError(f"{name} refused by the oracle")

    loaded = {name: sys.modules.pop(name) for name in list(sys.modules) if name.startswith("vllm._C")}
    finder = Refuse()
    sys.meta_path.insert(0, finder)
    with contextlib.ExitStack() as undo:
        undo.callback(sys.modules.update, loaded)
        undo.callback(sys.meta_path.remove, finder)
        for probe, answer in (("_is_avx512_supported", avx512), ("_is_avx512_bf16_supported", avx512_bf16)):
            undo.callback(setattr, torch.cpu, probe, getattr(torch.cpu, probe))
            setattr(torch.cpu, probe, lambda answer=answer: answer)
        CpuPlatform.import_kernels()
    return tried


OPS = {
    "requests": op_requests,
    "serve": op_serve,
    "responses": op_responses,
    "grammar": op_grammar,
    "import_kernels": op_import_kernels,
}


def main() -> None:
    global V
    if sys.argv[1:] == ["--check-install"]:
        V = _vllm()
        versions = ", ".join(f"{name} {metadata.version(name)}" for name in ("vllm", "xgrammar", "torch"))
        print(f"contract venv: {versions}: ok")
        return
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's logging and prints go to stderr; stdout carries only the answers
    sys.stdout = sys.stderr
    V = _vllm()
    answers.write(json.dumps({"ready": metadata.version("vllm")}) + "\n")
    answers.flush()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            reply = {"result": OPS[job["op"]](**job["args"])}
        except Exception:
            reply = {"error": traceback.format_exc()}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
