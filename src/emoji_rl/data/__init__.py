"""Data pipeline: prompts, teacher emoji answers (SFT data), RL prompts; JSONL files with a documented schema."""
