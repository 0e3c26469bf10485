"""The scheduler's warning, as a training loop meets it.

Slurm sends SIGUSR1 some time before a job's time limit or a preemption (`airhost submit`
asks for it 90 s before: `--signal=USR1@90`); each node's airhost passes it to every rank,
where airhost's handler records it. The loop asks, checkpoints and stops:

    for step in range(start, steps):
        if airhost.preemption_requested():      # every rank, at the same point of the loop
            save_checkpoint(step)
            raise airhost.Preempted(f"checkpointed at step {step}")
        train_step(step)

Submitted with `--requeue`, the job is then requeued by Slurm and starts again with the same
run id and directory; the script resumes from its latest checkpoint
(airhost.data.latest_checkpoint), and TORCHELASTIC_RESTART_COUNT has gone up.
"""
from __future__ import annotations


class Preempted(Exception):
    """Raised by a rank that checkpointed and stopped after the scheduler's warning: the run
    ends `preempted` (and, submitted with --requeue, the job is requeued to resume)."""


Preempted.__module__ = "airhost"


def _warned_here() -> bool:
    try:
        import _airhost_rank  # the rank's embedded module: only inside an airhost rank
    except ImportError:
        return False
    return bool(getattr(_airhost_rank, "warning_signal", 0))


def preemption_requested(agree: bool = True) -> bool:
    """True once the scheduler's warning reached this rank. The signal reaches the ranks at
    slightly different moments, so with `agree` (the default) and torch.distributed initialized
    the ranks agree on it: the answer is True on every rank if it is True on any (one small
    all_reduce; call it at the same point of the loop on every rank). `agree=False` answers for
    this rank alone, without communication."""
    warned = _warned_here()
    if not agree:
        return warned
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return warned
    dist = torch.distributed
    if dist.get_world_size() == 1:
        return warned
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if warned else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
