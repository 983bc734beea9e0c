"""Training figures (issue 6): memory of compressed state, data-, model- and hybrid-mode traffic, steps per second.

Run: ``python benchmarks/bench_train.py [--steps 20]`` (needs scikit-learn for the digits). Prints one JSON
object. Traffic is measured from Dask's ``transfer_outgoing_bytes_total`` on every worker, before and after.

Model-mode traffic compares partitions of one network, one batch sequence and one cluster, side by side. The
Mt-KaHyPar partitions use its deterministic preset: with the default preset and 2 threads the owners (and so the
traffic) change from run to run; ``default_preset_volumes`` records that spread for the default method.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import scipy.sparse as sp

from dasknn import generate
from dasknn import partition as P
from dasknn import train as tr
from dasknn.cluster import local_client

N, L, CLASSES = 1024, 4, 10
#: (name, method, sweeps): model-mode partitions compared side by side; random last (the baseline).
PARTITIONS = [("hypergraph", "hypergraph", None), ("hypergraph_layered_2_sweeps", "hypergraph-layered", 2),
              ("hypergraph_shared", "hypergraph-shared", None), ("random", "random", None)]


def pruned_layers(sparsity: float, seed: int = 0) -> list[sp.csc_matrix]:
    """90 %-sparse layers: random dense weights pruned by magnitude (a uniform random pattern)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(L):
        a = rng.standard_normal((N, N))
        a[np.abs(a) < np.quantile(np.abs(a), sparsity)] = 0
        out.append(sp.csc_matrix(a))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sparsity", type=float, default=0.9)
    a = ap.parse_args()
    res: dict = {}
    layers = pruned_layers(a.sparsity)
    m = tr.init_model(layers, CLASSES, optimizer="adam")
    res["memory"] = {
        "sparsity": a.sparsity, "nnz": int(sum(w.nnz for w in layers)),
        "state_bytes": m.state_bytes(), "dense_masked_state_bytes": m.dense_masked_state_bytes(),
        "formula": "compressed: (weights+grads+2 Adam moments) x 8 B x (nnz + head) + pattern (indices 4 B/nnz, "
                   "indptr 8 B/(N+1) per layer); dense+mask: 4 arrays x 8 B x N^2 per layer + 1 B mask x N^2 + head",
        "reduction": 1 - m.state_bytes() / m.dense_masked_state_bytes(),
    }
    challenge = generate.network(N, L, seed=0)
    with local_client(workers=2) as c:
        run = dict(epochs=3, batch=64, lr=1e-3, optimizer="adam", client=c, seed=0, max_steps=a.steps)
        d = tr.train(layers, "digits", mode="data", workers=2, **run)
        values = sum(p.size for p in d.model.params)
        dense_values = L * N * N + N * CLASSES + CLASSES
        # with 2 replicas the tree all-reduce sends the flat gradient once up and once back: 2 messages
        res["data_traffic"] = {
            "bytes_sent_per_step": d.bytes_sent_per_step, "values_per_message": values,
            "dense_allreduce_bytes_per_step": 2 * dense_values * 8,
            "ratio_to_dense": d.bytes_sent_per_step / (2 * dense_values * 8),
            "steps_per_second": d.steps / d.seconds,
        }
        res["model_traffic"] = mt = {}
        for name, method, sweeps in PARTITIONS:
            owners = P.partition_network(challenge, 2, method, seed=0, sweeps=sweeps, preset="deterministic")
            r = tr.train(challenge, "digits", mode="model", workers=2, partition=owners, **run)
            mt[name] = {"volume": int(P.layer_volumes(challenge, owners, parts=2).sum()),
                        "bytes_sent_per_step": r.bytes_sent_per_step, "steps_per_second": r.steps / r.seconds}
        for name, _, _ in PARTITIONS[:-1]:
            mt[f"{name}_over_random"] = mt[name]["bytes_sent_per_step"] / mt["random"]["bytes_sent_per_step"]
        mt["default_preset_volumes"] = [int(P.layer_volumes(challenge, P.partition_network(challenge, 2, seed=0),
                                                           parts=2).sum()) for _ in range(5)]
        one = tr.train(challenge, "digits", mode="model", workers=1, **run)
        res["steps_per_second"] = {"model_1_worker": one.steps / one.seconds,
                                   "model_2_workers": mt["hypergraph"]["steps_per_second"],
                                   "data_2_workers_90pct": res["data_traffic"]["steps_per_second"]}
    # hybrid: 4 workers, 2 groups x 2 parts (the same partition in both); the groups all-reduce values only
    with local_client(workers=4) as c:
        owners = P.partition_network(challenge, 2, seed=0, preset="deterministic")
        h = tr.train(challenge, "digits", mode="hybrid", workers=4, group_size=2, partition=owners, client=c,
                     epochs=3, batch=64, lr=1e-3, optimizer="adam", seed=0, max_steps=a.steps)
        values = sum(p.size for p in h.model.params)
        res["hybrid_traffic"] = {
            "workers": 4, "groups": 2, "parts": 2, "bytes_sent_per_step": h.bytes_sent_per_step,
            "allreduce_values_bytes_per_step": 2 * values * 8,
            "model_mode_2_workers_bytes_per_step": res["model_traffic"]["hypergraph"]["bytes_sent_per_step"],
            "steps_per_second": h.steps / h.seconds,
        }
    single = tr.train(challenge, "digits", mode="single", epochs=3, batch=64, lr=1e-3, optimizer="adam", seed=0,
                      max_steps=a.steps)
    res["steps_per_second"]["single_process"] = single.steps / single.seconds
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
