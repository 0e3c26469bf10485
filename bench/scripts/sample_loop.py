"""Beside a benchmark run: `airhost stacks --sample` back to back on the run's live airhost
until it ends, so that its ranks are sampled (a round every 100 ms) for as much of their
loop as can be. Started together with the launcher; waits for the run to be up; prints how
many samplings it made and how long they covered. Exits 0 unless no sampling was made at all.

    python sample_loop.py AIRHOST SECONDS_PER_SAMPLING"""
import subprocess
import sys
import time

airhost, length = sys.argv[1], sys.argv[2]
done, covered, started = 0, 0.0, time.monotonic()
while time.monotonic() - started < 600:
    t0 = time.monotonic()
    r = subprocess.run([airhost, "stacks", "--sample", f"{length}s"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if r.returncode == 0:
        done += 1
        covered += time.monotonic() - t0
        continue
    if done and ("has ended" in r.stderr or "no live run" in r.stderr or "gave no sample" in r.stderr
                 or "does not answer" in r.stderr):
        break  # the run is over
    time.sleep(0.02)  # not up yet (no run.json, or its ranks still starting)
print(f"samplings={done} covered_s={covered:.2f}", flush=True)
sys.exit(0 if done else 1)
