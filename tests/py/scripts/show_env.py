"""Prints NAME=value for each variable named in argv (<unset> when absent)."""
import os
import sys

from emit import say

for name in sys.argv[1:]:
    say(f"{name}={os.environ.get(name, '<unset>')}")
