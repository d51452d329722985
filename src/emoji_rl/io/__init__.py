"""Files and wires below every stage: strict JSONL, metrics, report tables and figures, the vLLM endpoint client."""
