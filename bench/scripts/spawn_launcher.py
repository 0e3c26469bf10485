"""torch.multiprocessing.spawn as a launcher, the way a script that launches itself uses it:

    python spawn_launcher.py N

The parent imports torch first (torch.multiprocessing is part of torch), which is part of
what mp.spawn costs. Each child is a fresh interpreter (start method "spawn") that imports
this file again, hence torch, then runs worker(): its first line after `import torch` is
the time stamp, as in startup.py."""
import os
import sys

import torch.multiprocessing as mp


def worker(index: int) -> None:
    import torch  # noqa: F401  (done already by the import of this module in the child)
    import time; t = time.time()  # noqa: E401,E702

    from _stamp import stamp

    stamp("torch", index, t=t)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    mp.spawn(worker, nprocs=int(sys.argv[1]), join=True)
