"""Footprint probe: a rank that imports nothing heavy, says it is there, and sleeps, so the
supervising process is measured in its steady state."""
import os
import time

from _stamp import rank, stamp

stamp("sleep", rank(), t=time.time())
time.sleep(float(os.environ.get("AIRHOST_BENCH_SLEEP", "2")))
