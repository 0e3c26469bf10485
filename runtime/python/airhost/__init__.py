"""airhost: run a PyTorch training function or script on every accelerator of a node."""

__version__ = "0.1.0"
