"""Every rank says hello on stdout and stderr, then prints its argv as JSON."""
import json
import sys

from emit import RANK, WORLD_SIZE, say, warn

say(f"hello from rank {RANK} of {WORLD_SIZE}")
warn(f"note from rank {RANK}")
say("argv " + json.dumps(sys.argv))
