"""A function target: `airhost train_fn.py:main` calls main() on every rank and keeps its
return value in <run_dir>/results/rank-N.pkl."""
import os
import sys

from emit import RANK, say

say(f"imported on rank {RANK} as {__name__}")


def main():
    say(f"main() on rank {RANK}")
    return {
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "name": __name__,
        "argv": list(sys.argv),
        "square": int(os.environ["RANK"]) ** 2,
    }


if __name__ == "__main__":
    say("run as __main__")
