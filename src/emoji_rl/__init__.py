"""emoji-rl: teach an LLM to communicate in emoji with SFT and multi-turn GRPO."""

__version__ = "0.1.0"
