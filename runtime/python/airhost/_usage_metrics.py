"""What each rank used, as MLflow system metrics: the samples the host keeps every 5 s in
<run_dir>/metrics/ranks.jsonl (host/launch/rank_usage.hpp), logged per rank, at most 2000 points
a series. One source for both callers: the Python API imports it (_tracking.py), and the CLI's
MLflow helper, which runs with the ranks' Python where airhost may not be importable, has it
compiled in (host/cli/tracking.cpp, through CMake). Needs the standard library and mlflow only."""
import json

# At most this many points a series: a 3-day run's (50,000 samples a rank) stays quick to log.
MAX_POINTS = 2000


def log_rank_usage(client, run_id, path):
    """Logs the samples in `path` into MLflow run `run_id`; nothing when there is no such file (a
    run under 5 s). Raises what MLflow raises."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return
    from mlflow.entities import Metric

    by_rank = {}
    for line in lines:
        try:
            u = json.loads(line)
            by_rank.setdefault(int(u["rank"]), []).append((int(float(u["t"]) * 1000), u))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a full disk
    metrics = []
    for r, series in by_rank.items():
        stride = max(1, -(-len(series) // MAX_POINTS))
        for k, (ts, u) in enumerate(series[::stride]):
            def add(name, value):
                metrics.append(Metric("system/rank_%d/%s" % (r, name), float(value), ts, k))

            if u.get("cpu_percent") is not None:
                add("cpu_utilization_percentage", u["cpu_percent"])
            add("memory_rss_megabytes", u.get("rss_bytes", 0) / 2**20)
            if u.get("gpu_util_percent") is not None:
                add("gpu_utilization_percentage", u["gpu_util_percent"])
            if u.get("gpu") is not None:
                add("gpu_memory_megabytes", u.get("gpu_memory_bytes", 0) / 2**20)
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
