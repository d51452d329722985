"""Rollout engines: something that samples sender turns (`Sampler`) and the loop that plays games
with it. `hf` samples in-process; `vllm` asks a vLLM server that hot-loads each new adapter."""
