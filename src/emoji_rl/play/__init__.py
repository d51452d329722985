"""What every game shares: the RL contract (`types`), the registry of games, the turn loop, the chat
game base, the micro-batcher, the frozen-LLM completer and sentence similarity. The games themselves
are in emoji_rl/games/."""
