"""The evaluation stages (eval-retrieval, eval-wordle, eval-human, experiment-report, judge-check, reward-check) and what only they share: comparisons, bootstrap intervals, the records log."""
