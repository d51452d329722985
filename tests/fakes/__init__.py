"""Stand-ins for external services in tests: a vLLM 0.33 server (`vllm_server`) over a seeded model."""
