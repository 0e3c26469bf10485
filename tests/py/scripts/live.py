"""Output that is not whole lines, as progress bars and prompts write it (issue 17):
`live.py MODE [STEPS SECONDS]`. Everything goes through emit.py, so the test can compare the
logs with exactly what was written.

  bar     a plain `\\r` bar on stderr, STEPS redraws over SECONDS, then its newline
  tqdm    the same drawn by tqdm (ascii, redrawn at every step)
  prompt  rank 0 writes a partial line, rank 1 a whole line while rank 0 waits, then rank 0
          ends its line (the ranks start together)
  size    prints the terminal size a rank is told, and the width of a tqdm bar
"""
import os
import sys
import time

from emit import RANK, WORLD_SIZE, err, out


def barrier():
    """Returns once every rank got here, so the ranks' timings overlap as the test expects."""
    where = os.path.join(os.getcwd(), "barrier")
    os.makedirs(where, exist_ok=True)
    open(os.path.join(where, str(RANK)), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(where)) < WORLD_SIZE and time.monotonic() < deadline:
        time.sleep(0.01)


class Stderr:
    """A file for tqdm that writes through emit.err."""

    def write(self, text):
        err(text)

    def flush(self):
        pass


def main(mode, steps="15", seconds="3"):
    steps, seconds = int(steps), float(seconds)
    if mode == "bar":
        barrier()
        for i in range(steps + 1):
            err(f"\rrank {RANK} step {i:02d}/{steps}")
            if i < steps:
                time.sleep(seconds / steps)
        err("\n")
    elif mode == "tqdm":
        from tqdm import tqdm

        barrier()
        for _ in tqdm(range(steps), file=Stderr(), mininterval=0, miniters=1, ascii=True, desc=f"rank{RANK}"):
            time.sleep(seconds / steps)
    elif mode == "prompt":
        barrier()
        if RANK == 0:
            out("Password: ")
            time.sleep(3)
            out("ok\n")
        else:
            time.sleep(1.5)
            out(f"hello from rank {RANK}\n")
    elif mode == "size":
        import io
        import shutil

        from tqdm import tqdm

        bar = io.StringIO()
        t = tqdm(total=10, file=bar, ascii=True, mininterval=0)
        t.update(5)
        t.close()
        drawn = max(len(part) for part in bar.getvalue().replace("\n", "\r").split("\r"))
        env = {k: os.environ.get(k) for k in ("COLUMNS", "LINES", "TQDM_NCOLS")}
        out(f"size {env['COLUMNS']} {env['LINES']} {env['TQDM_NCOLS']} {shutil.get_terminal_size().columns} "
            f"{drawn} isatty {sys.stdout.isatty()}\n")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(*sys.argv[1:])
