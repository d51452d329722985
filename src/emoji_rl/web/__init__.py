"""`emoji-rl play-web`: people play the retrieval game in a browser; their answers become a human
evaluation (`emoji-rl eval-human`)."""
