"""Training in pipeline mode (issue 34) beside single, data and model mode: steps per second and the bubble.

Run: ``python benchmarks/bench_train_pipeline.py [--steps 60] [--rounds 2] [--runs NAME,...]
[--pipeline-schedules gpipe,1f1b]`` (needs scikit-learn for the digits; ``--runs`` picks among the names of ``RUNS``;
with several ``--pipeline-schedules`` every pipeline run is made once per order, in turn, its name suffixed).
Prints one JSON object. One generated 1024 x 4 network, the digits, Adam, batch 64, one cluster of 2 single-threaded
worker processes for every distributed run; a short run of every mode first (the kernels compiled, the workers
warm), then ``--rounds`` timed rounds of every mode in turn. ``seconds`` is the steps alone (``train`` times them
after its warm-up; its ``compile_seconds`` apart).

The bubble: with K stages of equal work and M micro-batches, the fill and drain (GPipe's, and 1F1B's with a flush
every step, which the runner uses: the same bubble, fewer activations held) leave each stage idle
(K - 1) / (M + K - 1) of a step. Measured here, per stage, as ``1 - busy / seconds``, busy being the seconds its
forward, backward and update tasks ran: that idle share holds the bubble and everything else a stage waits for
(the scheduler, the transfers between stages, the client between chunks), so on a small network it is an upper
bound of the bubble. ``ideal_gpipe_seconds`` is the time GPipe's schedule would take with the stages' measured busy
time and nothing else: (M + K - 1) / M times the busiest stage's (where a replica's stages have their own workers);
``ideal_over_measured`` is its share of the measured time. ``allreduce_values_over_dense`` (2 replicas x 2 stages) is the all-reduce's values over a
dense all-reduce's (N^2 per layer plus the head), both sent the same number of times; ``allreduce_bytes`` measures
it on a second cluster of 4 workers (each stage instance on its own worker): the bytes per step of 2 replicas x 2
stages less those of one pipeline of 2 stages (the same activations cross one stage boundary, forward and back),
against a dense all-reduce's 2 x 8 B x (L N^2 + head) per step (up the tree and back).
"""

from __future__ import annotations

import argparse
import json
import statistics

from dasknn import generate
from dasknn import train as tr
from dasknn.cluster import local_client

N, L, CLASSES = 1024, 4, 10
#: (name, mode, workers, group size, micro-batches)
RUNS = [("single", "single", 1, None, 4), ("data_2", "data", 2, None, 4), ("model_2", "model", 2, None, 4),
        ("pipeline_K2_M4", "pipeline", 2, None, 4), ("pipeline_K2_M8", "pipeline", 2, None, 8),
        ("pipeline_K4_M8_on_2_workers", "pipeline", 4, None, 8),
        ("pipeline_2_replicas_x_K2_M4_on_2_workers", "pipeline", 4, 2, 4)]


def one(net, client, mode: str, workers: int, group_size, micro: int, steps: int, order: str = "auto"):
    extra = {"pipeline_schedule": order} if mode == "pipeline" and order != "auto" else {}
    return tr.train(net, "digits", batch=64, lr=1e-3, optimizer="adam", mode=mode, workers=workers,
                    group_size=group_size, micro_batches=micro, client=None if mode == "single" else client, seed=0,
                    max_steps=steps, partition="random", chunk=steps, **extra)


def figures(r) -> dict:
    out = {"steps_per_second": r.steps / r.seconds, "seconds": r.seconds, "compile_seconds": r.compile_seconds,
           "bytes_sent_per_step": r.bytes_sent_per_step}
    if r.mode == "pipeline":
        k, m = r.stages, r.micro_batches
        idle = {key: 1 - busy / r.seconds for key, busy in sorted(r.stage_busy_seconds.items())}
        # a replica's stages on their own workers, with nothing but their tasks' busy time: GPipe's step is
        # (M + K - 1) micro-batch slots of the slowest stage; the rest of the measured time is overhead
        ideal = max(r.stage_busy_seconds.values()) * (m + k - 1) / m
        out.update(stages=k, micro_batches=m, bubble_predicted=(k - 1) / (m + k - 1),
                   stage_busy_seconds=r.stage_busy_seconds, idle_share_measured=idle,
                   idle_share_mean=statistics.mean(idle.values()), ideal_gpipe_seconds=ideal,
                   ideal_over_measured=ideal / r.seconds,
                   # (None on a tree before 1F1B, which did not count them)
                   stage_held_micro_batches=getattr(r, "stage_held_micro_batches", None),
                   pipeline_schedule=getattr(r, "pipeline_schedule", None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--layers", type=int, default=L, help=f"the generated network's depth (default {L})")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", default=",".join(name for name, *_ in RUNS),
                    help="which of the runs, comma-separated (default all)")
    ap.add_argument("--pipeline-schedules", default="auto",
                    help="each pipeline run once per order, comma-separated: auto, gpipe, 1f1b (default auto)")
    a = ap.parse_args()
    orders = a.pipeline_schedules.split(",")
    runs = [(f"{name}_{order}" if mode == "pipeline" and len(orders) > 1 else name, mode, workers, g, micro, order)
            for name, mode, workers, g, micro in RUNS if name in a.runs.split(",")
            for order in (orders if mode == "pipeline" else ["auto"])]
    net = generate.network(N, a.layers, seed=0)
    res: dict = {"network": f"generated {N} x {a.layers}", "data": "digits", "batch": 64, "optimizer": "adam",
                 "steps": a.steps, "rounds": {}}
    with local_client(workers=2, threads_per_worker=1) as c:
        for name, mode, workers, g, micro, order in runs:  # warm-up: every mode once, not timed
            one(net, c, mode, workers, g, micro, 4, order)
        for i in range(a.rounds):
            res["rounds"][i] = {name: figures(one(net, c, mode, workers, g, micro, a.steps, order))
                                for name, mode, workers, g, micro, order in runs}
        single = one(net, None, "single", 1, None, 4, 2)
    values = sum(p.size for p in single.model.params)
    dense = a.layers * N * N + N * CLASSES + CLASSES
    res["allreduce_values_over_dense"] = values / dense
    with local_client(workers=4, threads_per_worker=1) as c:
        one(net, c, "pipeline", 4, 2, 4, 2)  # (warm-up)
        pipe = one(net, c, "pipeline", 2, None, 4, 20).bytes_sent_per_step
        both = one(net, c, "pipeline", 4, 2, 4, 20).bytes_sent_per_step
    res["allreduce_bytes"] = {"one_pipeline_K2_per_step": pipe, "two_replicas_x_K2_per_step": both,
                              "allreduce_per_step": both - pipe, "dense_allreduce_per_step": 2 * 8 * dense,
                              "ratio_to_dense": (both - pipe) / (2 * 8 * dense)}
    res["median_steps_per_second"] = {name: statistics.median(r[name]["steps_per_second"]
                                                              for r in res["rounds"].values())
                                      for name, *_ in runs}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
