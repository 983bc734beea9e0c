"""Mt-KaHyPar's ``DEFAULT`` preset without community detection: the context of the ``hypergraph`` method's rows.

Measured on a 65536-wide generated layer (K = 2, the previous row fixed): the Louvain community detection that
the preset runs before coarsening took about 40 % of Mt-KaHyPar's time and changed nothing in the result; on the
challenge network at K = 16 the default method still sends 0.079 of random (2026-12-01). The Python binding
sets that switch only through a configuration file, and a file replaces every option (the defaults behind an
absent option are not the preset's), so this is the whole preset, as Mt-KaHyPar's ``config/default_preset.ini``
writes it, with ``p-enable-community-detection=false``. An Mt-KaHyPar that names its options otherwise refuses
the file; :func:`~dasknn.partition.hypergraph.lean_context` then falls back to the ``DEFAULT`` preset.
"""

#: The lean context, in Mt-KaHyPar's ``.ini`` syntax.
LEAN_INI = """\
mode=direct
preset-type=default
maxnet-removal-factor=0.01
smallest-maxnet-threshold=50000
maxnet-ignore=1000
num-vcycles=0
s-use-localized-random-shuffle=false
s-static-balancing-work-packages=128
p-enable-community-detection=false
p-louvain-edge-weight-function=hybrid
p-max-louvain-pass-iterations=5
p-louvain-min-vertex-move-fraction=0.01
p-vertex-degree-sampling-threshold=200000
c-type=multilevel_coarsener
c-use-adaptive-edge-size=true
c-min-shrink-factor=1.01
c-max-shrink-factor=2.5
c-s=1
c-t=160
c-vertex-degree-sampling-threshold=200000
c-rating-score=heavy_edge
c-rating-heavy-node-penalty=no_penalty
c-rating-acceptance-criterion=best_prefer_unmatched
i-mode=rb
i-runs=20
i-use-adaptive-ip-runs=true
i-min-adaptive-ip-runs=5
i-perform-refinement-on-best-partitions=true
i-remove-degree-zero-hns-before-ip=true
i-fm-refinement-rounds=1
i-lp-maximum-iterations=20
i-lp-initial-block-size=5
i-r-refine-until-no-improvement=false
i-r-lp-type=label_propagation
i-r-lp-maximum-iterations=5
i-r-lp-rebalancing=true
i-r-lp-he-size-activation-threshold=100
i-r-fm-type=kway_fm
i-r-fm-multitry-rounds=5
i-r-fm-rollback-parallel=true
i-r-fm-rollback-balance-violation-factor=1
i-r-fm-seed-nodes=25
i-r-fm-obey-minimal-parallelism=false
i-r-fm-release-nodes=true
i-r-fm-time-limit-factor=0.25
i-r-fm-iter-moves-on-recalc=true
i-r-flow-algo=do_nothing
r-rebalancer-type=advanced_rebalancer
r-refine-until-no-improvement=false
r-lp-type=label_propagation
r-lp-unconstrained=true
r-lp-maximum-iterations=5
r-lp-rebalancing=false
r-lp-he-size-activation-threshold=100
r-lp-relative-improvement-threshold=0.001
r-fm-type=unconstrained_fm
r-fm-multitry-rounds=10
r-fm-unconstrained-rounds=8
r-fm-rollback-parallel=true
r-fm-rollback-balance-violation-factor=1.0
r-fm-threshold-border-node-inclusion=0.7
r-fm-imbalance-penalty-min=0.2
r-fm-imbalance-penalty-max=1.0
r-fm-seed-nodes=25
r-fm-release-nodes=true
r-fm-min-improvement=-1.0
r-fm-unconstrained-min-improvement=0.002
r-fm-obey-minimal-parallelism=true
r-fm-time-limit-factor=0.25
r-fm-iter-moves-on-recalc=true
r-flow-algo=do_nothing
one-to-one-mapping-strategy=greedy_mapping
mapping-use-local-search=true
mapping-use-two-phase-approach=false
mapping-max-steiner-tree-size=4
mapping-largest-he-fraction=0.0
mapping-min-pin-coverage=0.05
"""
