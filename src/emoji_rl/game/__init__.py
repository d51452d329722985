"""The games: the RL contract (`types`), the judges and their config, similarity and reward, the retrieval game and Wordle."""
