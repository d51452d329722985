"""The evaluation stages that are no game's evaluation (eval-human, experiment-report, judge-check,
reward-check); a game's evaluation stage lives with the game and runs the path in play/evaluate.py."""
