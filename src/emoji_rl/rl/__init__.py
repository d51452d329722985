"""The GRPO trainer: its math (`grpo`), collate and log-probs (`batch`), the update, the policy and its reference, checkpoints, the run's wiring, and the rollout engines (`rollout/`)."""
