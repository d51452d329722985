"""`make bench` (`python -m emoji_rl.bench`) and `make bench-scale` (`python -m emoji_rl.bench.scale`): speed and memory measured side by side, printed as ratios."""
