"""One rank of the multi-rank VolumeDataset tests (run by airhost): reads a dataset for some
epochs through a DataLoader and writes what it was handed to <out>/rank-N.json.

    read_ranks.py SOURCE OUT --workers W0,W1,... [--epochs E] [--shuffle] [--cache-dir D]
                  [--drop-last-epoch]

--workers gives each rank's DataLoader num_workers (rank N takes the Nth). A source URL
countfile:///dir is the local directory read through CountingFileSystem, a real fsspec
filesystem that appends every path it opens for reading to $OPEN_LOG, from whichever rank or
worker process opens it, so a test can count copies into the cache.
"""
from __future__ import annotations

import argparse
import json
import os

import fsspec
import torch.distributed as dist
from fsspec.implementations.local import LocalFileSystem
from torch.utils.data import DataLoader

from airhost.data import VolumeDataset


class CountingFileSystem(LocalFileSystem):
    protocol = "countfile"

    def _open(self, path, mode="rb", **kwargs):
        if "r" in mode:
            with open(os.environ["OPEN_LOG"], "a") as log:
                log.write(f"{os.getpid()} {path}\n")
        return super()._open(path, mode, **kwargs)


fsspec.register_implementation("countfile", CountingFileSystem, clobber=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("--workers", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--cache-dir")
    parser.add_argument("--drop-last-epoch", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    workers = int(args.workers.split(",")[rank])
    cached = args.cache_dir is not None
    ds = VolumeDataset(args.source, shuffle=args.shuffle, seed=7, cache=cached or None, cache_dir=args.cache_dir)
    report = {"rank": rank, "world": dist.get_world_size(), "workers": workers, "len": len(ds),
              "epochs": [], "cache_dir": ds.cache_dir}
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        report["epochs"].append([str(p) for p in loader])
        dist.barrier()  # no rank starts the next epoch while another still copies this one's files
    if args.drop_last_epoch:
        even = VolumeDataset(args.source, shuffle=True, seed=3, drop_last=True)
        even.set_epoch(args.epochs)
        report["len_drop_last"] = len(even)
        report["drop_last"] = [str(p) for p in DataLoader(even, batch_size=None, num_workers=workers)]
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
