"""The built-in games, one folder each: its rules, reward, partner, config fields, data stage and
evaluation. The trainer finds them by name (`emoji_rl.play.registry`)."""
