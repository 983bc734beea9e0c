"""Tests for dasknn.partition: the cost functions against brute-force counts, and the partitioners' contracts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dasknn import generate, store
from dasknn import partition as P
from dasknn.partition import hypergraph as PH
from dasknn.partition import metrics as PM
from dasknn.partition import segments as PG
from dasknn.partition import simple as PS
from dasknn.errors import DasknnError
from dasknn.io import read_network
from dasknn.network import Network


# ----------------------------------------------------------------------------------------------- helpers
def random_layers(neurons: int, depth: int, density: float, seed: int) -> list[sp.csc_matrix]:
    """Random square layers; some rows and columns end up empty on purpose (they must cost nothing)."""
    rng = np.random.default_rng(seed)
    return [sp.random(neurons, neurons, density=density, format="csc", random_state=rng) for _ in range(depth)]


def uniform_layers(neurons: int, depth: int, per_column: int, seed: int) -> list[sp.csc_matrix]:
    """Layers with exactly ``per_column`` nonzeros in every column, like the challenge networks."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(depth):
        rows = np.concatenate([rng.choice(neurons, per_column, replace=False) for _ in range(neurons)])
        cols = np.repeat(np.arange(neurons), per_column)
        out.append(sp.csc_matrix((np.ones(len(rows)), (rows, cols)), shape=(neurons, neurons)))
    return out


def block_layers(blocks: int, size: int, depth: int, per_column: int, seed: int, relabel_each_row: bool) -> list[sp.csc_matrix]:
    """Disjoint blocks: block b of row k - 1 feeds only block b of row k, with labels scrambled.

    With ``relabel_each_row`` every row of neurons gets its own random labelling, so the blocks sit at
    different indices in every layer (one owner per index cannot follow them); otherwise one labelling
    is shared by all rows.
    """
    rng = np.random.default_rng(seed)
    n = blocks * size
    labels = [rng.permutation(n)]
    for _ in range(depth):
        labels.append(rng.permutation(n) if relabel_each_row else labels[0])
    out = []
    for k in range(depth):
        rows, cols = [], []
        for b in range(blocks):
            for c in range(size):
                r = rng.choice(size, per_column, replace=False)
                rows.append(labels[k][b * size + r])
                cols.append(np.full(per_column, labels[k + 1][b * size + c]))
        rows_a, cols_a = np.concatenate(rows), np.concatenate(cols)
        out.append(sp.csc_matrix((np.ones(len(rows_a)), (rows_a, cols_a)), shape=(n, n)))
    return out


def brute_force(layers: list[sp.csc_matrix], owners: np.ndarray, parts: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Volumes, sends and work counted entry by entry, straight from the definitions."""
    depth, n = len(layers), layers[0].shape[0]
    volumes = []
    sends = np.zeros((depth, parts), dtype=np.int64)
    work = np.zeros((depth, parts), dtype=np.int64)
    for k, w in enumerate(layers):
        dense = w.toarray()
        total = 0
        for i in range(n):
            needed = {int(owners[k, i])} | {int(owners[k + 1, j]) for j in range(n) if dense[i, j] != 0}
            total += len(needed) - 1
            sends[k, owners[k, i]] += len(needed) - 1
        volumes.append(total)
        for j in range(n):
            work[k, owners[k + 1, j]] += int(np.count_nonzero(dense[:, j]))
    return volumes, sends, work


@pytest.fixture(scope="module", autouse=True)
def _two_threads() -> None:
    PH._mtk(2)  # Mt-KaHyPar's pool is per process; this machine has 2 cores


# ----------------------------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("dense_limit", [PM._DENSE_CELLS, 0], ids=["dense-marks", "sorted-keys"])
@pytest.mark.parametrize("parts", [1, 2, 5])
@pytest.mark.parametrize("shape", [(6, 1), (17, 3), (40, 2)], ids=lambda s: f"n{s[0]}-l{s[1]}")
@pytest.mark.parametrize("density", [0.05, 0.3])
@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_match_brute_force(
    monkeypatch: pytest.MonkeyPatch, dense_limit: int, parts: int, shape: tuple[int, int], density: float, seed: int
) -> None:
    monkeypatch.setattr(PM, "_DENSE_CELLS", dense_limit)
    n, depth = shape
    layers = random_layers(n, depth, density, seed)
    owners = np.random.default_rng(seed + 100).integers(0, parts, size=(depth + 1, n)).astype(np.int32)
    volumes, sends, work = brute_force(layers, owners, parts)

    assert P.layer_volumes(layers, owners, parts=parts).tolist() == volumes
    np.testing.assert_array_equal(P.part_sends(layers, owners, parts=parts), sends)
    np.testing.assert_array_equal(P.part_work(layers, owners, parts=parts), work)
    mean = work.mean(axis=1)
    expected_imb = [float(work[k].max() / mean[k] - 1) if mean[k] > 0 else 0.0 for k in range(depth)]
    np.testing.assert_allclose(P.layer_imbalance(layers, owners, parts=parts), expected_imb, rtol=0, atol=1e-12)

    report = P.partition_report(layers, owners, "given", 1.5, parts=parts)
    assert report["method"] == "given" and report["parts"] == parts and report["seconds"] == 1.5
    assert report["volume_per_layer"] == volumes
    assert report["volume_total"] == sum(volumes)
    assert report["max_part_send"] == int(sends.sum(axis=0).max())
    assert report["imbalance_max"] == pytest.approx(max(expected_imb), abs=1e-12)


def test_metrics_accept_a_network_and_infer_parts() -> None:
    layers = random_layers(12, 2, 0.3, 3)
    owners = np.array([[0, 1, 2] * 4] * 3, dtype=np.int64)
    volumes, _, _ = brute_force(layers, owners, 3)
    assert P.layer_volumes(Network(layers, bias=0.0), owners).tolist() == volumes


def test_all_in_one_part_sends_nothing() -> None:
    layers = random_layers(20, 3, 0.3, 4)
    owners = np.zeros((4, 20), dtype=np.int32)
    assert P.layer_volumes(layers, owners).tolist() == [0, 0, 0]


# ----------------------------------------------------------------------------------------------- partitioners
@pytest.mark.parametrize("method", P.METHODS)
@pytest.mark.parametrize("parts", [1, 2, 3, 7, 23])
@pytest.mark.parametrize("depth, density", [(3, 0.15), (1, 0.15), (2, 0.0)], ids=["three-layers", "one-layer", "empty"])
def test_every_method_returns_valid_owners(method: str, parts: int, depth: int, density: float) -> None:
    layers = random_layers(23, depth, density, 5)
    owners = P.partition_network(layers, parts, method)
    assert owners.shape == (depth + 1, 23)
    assert owners.dtype == np.int32
    assert owners.min() >= 0 and owners.max() < parts


@pytest.mark.parametrize("method", ["hypergraph", "hypergraph-layered"])
@pytest.mark.parametrize("seed", [0, 1])
def test_disjoint_blocks_cost_nothing_even_when_relabelled_per_layer(method: str, seed: int) -> None:
    layers = block_layers(blocks=4, size=8, depth=4, per_column=3, seed=seed, relabel_each_row=True)
    owners = P.partition_network(layers, 4, method)
    assert P.layer_volumes(layers, owners).tolist() == [0, 0, 0, 0]
    assert P.layer_imbalance(layers, owners).max() <= 0.03


@pytest.mark.parametrize("seed", [0, 1])
def test_disjoint_blocks_cost_nothing_with_one_owner_per_index(seed: int) -> None:
    layers = block_layers(blocks=4, size=8, depth=4, per_column=3, seed=seed, relabel_each_row=False)
    owners = P.partition_network(layers, 4, "hypergraph-shared")
    assert (owners == owners[0]).all()
    assert P.layer_volumes(layers, owners).tolist() == [0, 0, 0, 0]
    assert P.layer_imbalance(layers, owners).max() <= 0.03


@pytest.mark.parametrize("method", P.METHODS)
@pytest.mark.parametrize("parts", [2, 4, 8])
def test_uniform_columns_are_balanced_in_every_layer(method: str, parts: int) -> None:
    layers = uniform_layers(64, 3, 4, seed=parts)
    owners = P.partition_network(layers, parts, method)
    assert P.layer_imbalance(layers, owners).max() <= 0.03


@pytest.mark.parametrize("parts", [2, 4])
def test_layered_balances_uneven_columns_per_layer(parts: int) -> None:
    rng = np.random.default_rng(parts)
    # Column counts differ inside a layer and between layers; every layer must still be within epsilon.
    layers = []
    for k in range(3):
        counts = rng.integers(1, 8, size=60)
        rows = np.concatenate([rng.choice(60, c, replace=False) for c in counts])
        layers.append(sp.csc_matrix((np.ones(len(rows)), (rows, np.repeat(np.arange(60), counts))), shape=(60, 60)))
    owners = P.partition_network(layers, parts, "hypergraph", epsilon=0.1)
    assert P.layer_imbalance(layers, owners).max() <= 0.1


def test_hypergraph_beats_random_by_far_on_a_local_network() -> None:
    layers = block_layers(blocks=4, size=16, depth=3, per_column=4, seed=7, relabel_each_row=True)
    # Leak a little between blocks so that the optimum is not zero.
    noise = [sp.csc_matrix(w + sp.random(64, 64, density=0.005, format="csc", random_state=k)) for k, w in enumerate(layers)]
    good = P.layer_volumes(noise, P.partition_network(noise, 4)).sum()
    bad = P.layer_volumes(noise, P.partition_network(noise, 4, "random")).sum()
    assert good * 5 <= bad


def test_block_is_the_same_for_every_row_and_random_is_seeded() -> None:
    layers = random_layers(30, 2, 0.2, 8)
    block = P.partition_network(layers, 3, "block")
    assert (block == block[0]).all()
    assert (np.diff(block[0]) >= 0).all()
    a = P.partition_network(layers, 3, "random", seed=4)
    b = P.partition_network(layers, 3, "random", seed=4)
    c = P.partition_network(layers, 3, "random", seed=5)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


# ----------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("parts", [0, -1, 21, 2.0, True, "4"])
@pytest.mark.parametrize("method", ["block", "hypergraph"])
def test_bad_parts_is_a_user_error(parts: object, method: str) -> None:
    with pytest.raises(DasknnError):
        P.partition_network(random_layers(20, 2, 0.2, 0), parts, method)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs", [{"method": "metis"}, {"epsilon": -0.1}, {"epsilon": float("nan")}, {"threads": 0}, {"sweeps": -1}], ids=str
)
def test_bad_options_are_user_errors(kwargs: dict) -> None:
    with pytest.raises(DasknnError):
        P.partition_network(random_layers(20, 2, 0.2, 0), 2, **kwargs)


def test_layers_must_be_square_and_alike() -> None:
    with pytest.raises(DasknnError):
        P.partition_network([sp.csc_matrix((4, 5))], 2, "block")
    with pytest.raises(DasknnError):
        P.partition_network([sp.csc_matrix((4, 4)), sp.csc_matrix((5, 5))], 2, "block")
    with pytest.raises(DasknnError):
        P.partition_network([], 2, "block")


@pytest.mark.parametrize(
    "owners",
    [
        np.zeros((3, 10), dtype=np.int32),  # one row short (row 0 is the inputs)
        np.zeros((4, 9), dtype=np.int32),
        np.zeros(40, dtype=np.int32),
        np.zeros((4, 10), dtype=np.float64),
        np.zeros((4, 10), dtype=np.bool_),
        np.full((4, 10), -1, dtype=np.int32),
        np.full((4, 10), 5, dtype=np.int64),
        np.array(["a"] * 40).reshape(4, 10),
    ],
    ids=["rows", "cols", "flat", "float", "bool", "negative", "too-big", "strings"],
)
def test_validate_partition_rejects(owners: np.ndarray) -> None:
    with pytest.raises(DasknnError):
        P.validate_partition(owners, 3, 10, parts=5)


def test_validate_partition_returns_int32() -> None:
    good = P.validate_partition([[0, 1, 2]] * 3, 2, 3, parts=3)
    assert good.dtype == np.int32 and good.shape == (3, 3)
    big = P.validate_partition(np.full((3, 3), 7, dtype=np.uint64), 2, 3)
    assert big.dtype == np.int32 and (big == 7).all()


# ----------------------------------------------------------------------------------------------- plot
def test_plot_partition_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    layers = uniform_layers(32, 3, 3, seed=1)
    owners = P.partition_network(layers, 4, "hypergraph")
    out = tmp_path / "partition.png"
    P.plot_partition(layers, owners, "hypergraph", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("method", ["hypergraph", "hypergraph-shared", "hypergraph-layered"])
def test_zero_epsilon_means_exact_balance(method: str) -> None:
    layers = uniform_layers(48, 3, 3, seed=2)
    owners = P.partition_network(layers, 4, method, epsilon=0.0)
    assert P.layer_imbalance(layers, owners).max() == 0.0


@pytest.mark.parametrize("cap", [10, 12, 20])
def test_rebalance_brings_every_part_under_its_cap(cap: int) -> None:
    weights = np.array([1, 2, 3, 4, 5, 6, 7, 8, 0, 4], dtype=np.int64)  # total 40, four parts
    row = np.zeros(10, dtype=np.int32)  # everything in part 0
    fixed = PS._rebalance(row, weights, 4, cap)
    assert np.bincount(fixed, weights=weights, minlength=4).max() <= cap


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("layers", ["uniform", "blocks"])
def test_default_keeps_the_smaller_of_layered_and_shared(layers: str, seed: int) -> None:
    ws = (uniform_layers(96, 4, 6, seed) if layers == "uniform"
          else block_layers(4, 24, 4, 6, seed, relabel_each_row=False))
    kw = dict(seed=seed, preset="deterministic")
    default = P.layer_volumes(ws, P.partition_network(ws, 4, "hypergraph", **kw)).sum()
    # the default's own layered pass: the forward pass on the lean (hub) hypergraph
    layered = P.layer_volumes(ws, PH._layered(ws, 4, 0.03, seed, 0, "deterministic", lean=True)).sum()
    shared_owners = P.partition_network(ws, 4, "hypergraph-shared", **kw)
    candidates = [layered]
    if P.layer_imbalance(ws, shared_owners).max() <= 0.03 + 1e-12:
        candidates.append(P.layer_volumes(ws, shared_owners).sum())
    assert default == min(candidates)


class _Counting(Sequence):
    """Layers handed out one at a time, counting the reads."""

    def __init__(self, layers):
        self._ws, self.reads = layers, 0

    def __len__(self):
        return len(self._ws)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        self.reads += 1
        return self._ws[i].copy()


@pytest.mark.parametrize("method", ["block", "random", "hypergraph-layered"])
def test_layers_read_on_demand_give_the_same_partition(tmp_path, method):
    net = generate.network(256, 5, seed=1, bias=-0.3)
    path = store.write_network(tmp_path / "n.zarr", net)
    lazy = store.open_store(path).lazy_layers()
    want = P.partition_network(net.layers, 2, method, seed=3, preset="deterministic")
    np.testing.assert_array_equal(P.partition_network(lazy, 2, method, seed=3, preset="deterministic"), want)
    counting = _Counting(net.layers)
    np.testing.assert_array_equal(P.partition_network(counting, 2, method, seed=3, preset="deterministic"),
                                  want)
    assert counting.reads >= len(net.layers)  # read from the sequence, not copied out of it up front


def test_default_method_on_demand_is_the_forward_pass():
    # out of core the shared owner (every layer's nets at once) is not tried
    net = generate.network(256, 4, seed=2, bias=-0.3)
    got = P.partition_network(_Counting(net.layers), 2, "hypergraph", seed=1, preset="deterministic")
    want = PH._layered(net.layers, 2, 0.03, 1, 0, "deterministic", lean=True)  # the default's forward pass
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------------------------- fast, segments
SLICE = Path(__file__).resolve().parents[1] / "data" / "neuron1024-l12.tar.gz"


@pytest.mark.parametrize("method", ["fast", "fast-segments"])
@pytest.mark.parametrize("network", ["generated", "slice"])
def test_fast_methods_are_valid_balanced_and_beat_random(method: str, network: str) -> None:
    ws = generate.network(1024, 12, seed=3).layers if network == "generated" else read_network(SLICE).layers
    owners = P.partition_network(ws, 8, method, seed=1)
    P.validate_partition(owners, len(ws), ws[0].shape[0], 8)
    assert P.layer_imbalance(ws, owners, parts=8).max() <= 0.03 + 1e-12
    vol = P.layer_volumes(ws, owners, parts=8).sum()
    rnd = P.layer_volumes(ws, P.partition_network(ws, 8, "random", seed=1), parts=8).sum()
    assert vol * 3 <= rnd  # clearly better than no locality


@pytest.mark.parametrize("seed", [0, 1])
def test_fast_puts_disjoint_blocks_in_their_own_parts(seed: int) -> None:
    layers = block_layers(blocks=4, size=8, depth=4, per_column=3, seed=seed, relabel_each_row=True)
    owners = P.partition_network(layers, 4, "fast", seed=seed)
    # row 1 by Mt-KaHyPar finds the blocks; every later row follows its inputs' owners
    assert P.layer_volumes(layers, owners).tolist() == [0, 0, 0, 0]


def test_match_parts_finds_the_permutation_of_a_relabelled_row() -> None:
    rng = np.random.default_rng(0)
    reference = rng.integers(0, 5, size=200).astype(np.int32)
    relabel = np.array([3, 0, 4, 1, 2])  # row's part q is reference's relabel[q]
    inverse = np.argsort(relabel)
    row = inverse[reference]
    row[:20] = rng.integers(0, 5, size=20)  # a few neurons placed differently: the matching still holds
    np.testing.assert_array_equal(PG.match_parts(reference, row, 5), relabel)


def test_stitch_relabels_the_segment_and_takes_the_shared_row() -> None:
    previous_last = np.array([0, 0, 1, 1, 2, 2], dtype=np.int32)
    # the segment named the same three groups 2, 0, 1 and placed neuron 5 elsewhere in its own row 0
    segment = np.array([[2, 2, 0, 0, 1, 0], [2, 0, 0, 1, 1, 2]], dtype=np.int32)
    out = PG.stitch(previous_last, segment, 3)
    np.testing.assert_array_equal(out[0], previous_last)
    np.testing.assert_array_equal(out[1], [0, 1, 1, 2, 2, 0])


def test_segments_cover_every_layer_once() -> None:
    assert PG.bounds(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert PG.bounds(2, 4) == [(0, 1), (1, 2)]


def test_an_interrupted_partition_save_leaves_nothing_that_loads(tmp_path, monkeypatch):
    from dasknn import generate, store
    from dasknn.store import partitions as saved

    path = tmp_path / "n.zarr"
    store.write_network(path, generate.network(64, 2, bias=-0.3))
    first, second = np.zeros((3, 64), dtype=np.int32), np.ones((3, 64), dtype=np.int32)

    def interrupted(*args):
        raise KeyboardInterrupt

    for where in ("codecs", "_publish"):  # while the owners are written; once written, before they are in place
        monkeypatch.setattr(saved, where, interrupted)
        with pytest.raises(KeyboardInterrupt):
            store.save_partition(path, "p", first)
        assert store.load_partition(path, "p") is None  # nothing loads
        monkeypatch.undo()
    store.save_partition(path, "p", first)
    monkeypatch.setattr(saved, "_publish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.save_partition(path, "p", second)
    np.testing.assert_array_equal(store.load_partition(path, "p")[0], first)  # the earlier one, whole
    monkeypatch.undo()
    store.save_partition(path, "p", second)  # a later save replaces it and clears what was left
    np.testing.assert_array_equal(store.load_partition(path, "p")[0], second)
    assert sorted(p.name for p in (path / "partitions").iterdir()) == ["p", "zarr.json"]


def test_the_partition_plot_is_readable(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.ticker import MaxNLocator

    from dasknn import generate, partition

    net = generate.network(64, 6, bias=-0.3)
    owners = partition.partition_network(net.layers, 4, "block")
    fig = partition.plot_partition(net.layers, owners, "block", tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    volume, load, sends = fig.axes
    # the layer and part axes count whole things
    for ax in (volume, load):
        assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator)
        assert all(float(t).is_integer() for t in ax.get_xticks())
    assert volume.get_xlabel() == "layer" and load.get_xlabel() == "part"
    assert "per image" in volume.get_ylabel() and "per image" in sends.get_ylabel() and "nonzeros" in load.get_ylabel()
    # lines that coincide stay apart: each its own style and marker
    lines = volume.get_lines()
    assert len(lines) == 2 and len({(ln.get_linestyle(), ln.get_marker()) for ln in lines}) == 2


def test_equal_volumes_do_not_hide_each_other():
    # block and random with the same volume on every layer (as on some networks): both must show
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from dasknn import partition

    rng = np.random.default_rng(0)
    same = rng.integers(1, 500, size=12)
    series = {"hypergraph": rng.integers(0, 50, size=12), "block": same, "random": same.copy()}
    ax = Figure().subplots()
    partition.draw_volumes(ax, series)
    lines = ax.get_lines()
    assert [ln.get_label().split(" (")[0] for ln in lines] == list(series)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [ln.get_label() for ln in lines]
    assert len({ln.get_linestyle() for ln in lines}) == len({ln.get_marker() for ln in lines}) == 3
    # the markers of coinciding lines fall on different layers, and the one underneath is the wider line
    block, random_ = lines[1], lines[2]
    np.testing.assert_array_equal(block.get_ydata(), random_.get_ydata())

    def marked(line) -> set[float]:
        start, step = line.get_markevery()
        return set(np.asarray(line.get_xdata())[start::step].tolist())

    assert marked(block) and marked(random_) and not marked(block) & marked(random_)
    assert block.get_linewidth() > random_.get_linewidth() and block.get_zorder() < random_.get_zorder()
    assert all(ln.get_alpha() is not None and ln.get_alpha() < 1 for ln in lines)
