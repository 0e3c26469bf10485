"""The function a long-lived caller launches again and again (bench/callers.py): nothing to
import, nothing to compute, so that what is measured is what the caller keeps per launch."""


def train():
    return {"ok": 1}
