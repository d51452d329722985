"""What every game shares, to be played: the RL contract (`types`), the registry of games, the turn loop, the chat
episode base (`ChatEnv`), the micro-batcher, the frozen-LLM completer and sentence similarity. The games themselves
are in emoji_rl/games/."""
