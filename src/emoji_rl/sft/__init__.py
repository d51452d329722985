"""Supervised fine-tuning of the sender: `train` (stage `sft`; its settings and TRL config in
`trl_config`, Trainer `callbacks`, answer-only `loss`, `resume` of a killed run) and `evaluate`
(stage `eval-sft`)."""
