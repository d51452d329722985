"""Supervised fine-tuning of the sender: `train` (stage `sft`) and `evaluate` (stage `eval-sft`)."""
