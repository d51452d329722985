"""`python -m emoji_rl.selftest [--field value ...]`: the same as `emoji-rl selftest`."""

import sys

from emoji_rl.cli import main

sys.exit(main(["selftest", *sys.argv[1:]]))
