"""Reinforcement learning: the retrieval game, judges, reward, rollouts and the GRPO trainer."""
