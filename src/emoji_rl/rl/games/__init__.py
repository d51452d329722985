"""Games the GRPO trainer plays; each implements `emoji_rl.rl.types.Game`."""
