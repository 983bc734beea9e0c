"""The dasknn command as a user meets it: outputs, JSON fields, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from dasknn import io
from dasknn.cli import main


#: What the README says ``infer --json`` prints, in its order.
README_FIELDS = ["images", "neurons", "layers", "edges", "categories", "matches_truth", "mismatched", "seconds",
                 "edges_per_second", "workers"]


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.cluster
def test_auto_runs_data_mode_in_one_line_when_the_probe_cannot_fit_a_worker(slice_store, client, capsys,
                                                                           monkeypatch):
    # issue 42: a probe too big for its worker cost four lost workers and the run. Now it is not started: auto
    # runs data mode (no partition, no plan), saying why in one line and in the JSON
    from dasknn import cost

    monkeypatch.setattr(cost, "PROBE_COPIES", 1 << 40)  # not even PROBE_MIN_IMAGES images fit a worker
    # (streamed: data mode is not the only mode auto weighs, so it calibrates)
    code, out, err = run(["infer", "--network", str(slice_store), "--batch", "200", "--scheduler",
                          client.scheduler.address, "--json", "--stream"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["matches_truth"] is True and report["mode"] == "data" and report["recoveries"] == []
    assert "predictions" not in report
    line = "dasknn: the cost model's probe cannot sample 16 images of the 1,024-wide network within a worker's " \
           "memory limit"
    assert [x for x in err.splitlines() if x.startswith("dasknn: the cost model")] == [
        f"dasknn: {report['probe_skipped']}"]
    assert err.count(line) == 1 and report["probe_skipped"].endswith("ran data mode, which needs least memory")


@pytest.mark.cluster
def test_infer_real_slice_from_tsv_float64(slice_paths, capsys, tmp_path):
    code, out, err = run(["infer", "--network", str(slice_paths["network"]), "--inputs", str(slice_paths["images"]),
                          "--truth", str(slice_paths["truth"]), "--dtype", "float64", "--workers", "2", "--json",
                          "--out", str(tmp_path / "c.tsv")], capsys)
    assert code == 0, err
    report = json.loads(out)
    for key in ("images", "neurons", "layers", "edges", "categories", "matches_truth", "mismatched", "seconds",
                "edges_per_second", "workers", "compile_seconds"):
        assert key in report
    # compiling the kernels is part of the untimed load phase, not of the inference's seconds
    assert 0 < report["compile_seconds"] <= report["load_seconds"]
    assert report["matches_truth"] is True and report["mismatched"] == 0
    assert report["images"] == 1000 and report["layers"] == 12 and report["edges"] == 12 * 32768
    assert report["workers"] == 2
    assert report["edges_per_second"] == pytest.approx(1000 * 12 * 32768 / report["seconds"], rel=1e-3)
    np.testing.assert_array_equal(io.read_categories(tmp_path / "c.tsv"), io.read_categories(slice_paths["truth"]))


def test_infer_store_float32_and_batch(slice_store, capsys):
    code, out, err = run(["infer", "--network", str(slice_store), "--batch", "400", "--workers", "1", "--json",
                          "--dtype", "float32"], capsys)
    report = json.loads(out)
    assert report["images"] == 400 and report["mismatched"] <= 5 and report["workers"] == 1
    assert report["dtype"] == "float32"
    # the weights held in memory and the store local: data mode is the only mode auto weighs, so it runs
    # uncalibrated (no probe phase, no predictions)
    assert "probe" not in report["timings"] and "calibration" not in report and "predictions" not in report
    # data mode has no transport between parts: null, not ""
    assert report["mode"] == "data" and report["exchange"] is None
    assert code == (0 if report["mismatched"] == 0 else 1), err
    # streamed, auto weighs every mode: its calibration's rates, the probe's lists of an entry a layer only with
    # --explain
    code, out, err = run(["infer", "--network", str(slice_store), "--batch", "400", "--workers", "1", "--json",
                          "--dtype", "float32", "--stream"], capsys)
    report = json.loads(out)
    assert report["calibration"]["kernel_rate"] > 0 and not {"alive", "message_factor", "distinct"} & set(
        report["calibration"])
    assert report["timings"]["probe"] > 0 and {p["mode"] for p in report["predictions"]} >= {"data"}
    assert code == (0 if report["mismatched"] == 0 else 1), err


@pytest.mark.cluster
def test_infer_model_mode_out_of_core(slice_store, capsys, tmp_path):
    argv = ["infer", "--network", str(slice_store), "--mode", "model", "--partition", "block", "--stream",
            "--plan-store", str(tmp_path / "plan"), "--workers", "2", "--dtype", "float64", "--json"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["matches_truth"] is True and report["streamed"] is True and report["mode"] == "model"
    assert report["plan_seconds"] > 0 and (tmp_path / "plan" / "counts").is_dir()
    # the README's fields first, the long per-layer arrays last, under one key
    assert list(report)[:len(README_FIELDS)] == README_FIELDS
    assert list(report)[-1] == "per_layer" and not [k for k in report if k.endswith("_per_layer")]
    # (model mode counts its layers too: the images alive after each and the columns its steps ran over)
    assert {k: len(v) for k, v in report["per_layer"].items()} == dict.fromkeys(
        ["dense_message_bytes", "exchange_bytes", "alive", "distinct"], report["layers"])
    # reused: the second run makes no plan and reads the same share
    code, out, err = run(argv, capsys)
    again = json.loads(out)
    assert code == 0 and again["matches_truth"] is True and again["bytes_read"] == report["bytes_read"]
    assert again["plan_seconds"] < report["plan_seconds"]


@pytest.mark.cluster
def test_infer_compress_on_and_off(slice_store, capsys):
    reports = {}
    for compress in ("on", "off"):
        code, out, err = run(["infer", "--network", str(slice_store), "--mode", "data", "--workers", "1",
                              "--dtype", "float64", "--compress", compress, "--json"], capsys)
        assert code == 0, err
        reports[compress] = json.loads(out)
    on, off = reports["on"], reports["off"]
    assert on["compress"] is True and off["compress"] is False
    assert on["matches_truth"] is True and off["matches_truth"] is True
    # the per-layer counts last: the same images alive, fewer distinct vectors computed; two rates
    assert list(on)[-1] == "per_layer" and set(on["per_layer"]) == {"alive", "distinct"}
    assert on["per_layer"]["alive"] == off["per_layer"]["alive"] and len(on["per_layer"]["alive"]) == 12
    assert sum(on["per_layer"]["distinct"]) < sum(off["per_layer"]["distinct"])
    assert on["multiplied_per_second"] < on["edges_per_second"]
    code, out, err = run(["infer", "--network", str(slice_store), "--workers", "1", "--compress", "maybe"], capsys)
    assert code == 2 and "--compress" in err


def test_a_refused_scheduler_port_fails_at_once_naming_the_address(slice_store, capsys):
    # issue 42, item 7: a closed port took 24.7 s to fail (the client retries it for its whole timeout)
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    code, out, err = run(["infer", "--network", str(slice_store), "--scheduler", f"tcp://127.0.0.1:{port}"], capsys)
    assert time.perf_counter() - t0 < 3.0
    assert code != 0 and out == ""
    assert err == f"dasknn: error: cannot reach the Dask scheduler at tcp://127.0.0.1:{port} (connection refused)\n"


@pytest.mark.cluster
def test_the_command_reads_the_networks_metadata_once(slice_store, slice_paths, client, capsys, monkeypatch):
    # every layer's metadata was read four times on the client before the run (the command's shape, its check
    # before the cluster, the truth's shape, the engine's check): 4.6 s for a 65,536 x 480 network
    from dasknn.store import NetworkStore

    checks = []
    opened = NetworkStore.__init__

    def counting(self, path, check="auto", hold_bytes=0):
        checks.append(check)
        opened(self, path, check, hold_bytes)

    monkeypatch.setattr(NetworkStore, "__init__", counting)
    code, out, err = run(["infer", "--network", str(slice_store), "--truth", str(slice_paths["truth"]), "--batch",
                          "200", "--mode", "data", "--scheduler", client.scheduler.address, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["matches_truth"] is True
    assert len([c for c in checks if c != "lazy"]) == 1, checks


@pytest.mark.cluster
def test_infer_human_output(slice_store, capsys):
    code, out, _ = run(["infer", "--network", str(slice_store), "--dtype", "float64", "--workers", "1"], capsys)
    assert code == 0
    assert "matches the truth" in out and "edges/s" in out


def test_infer_reports_a_mismatch(slice_store, capsys, tmp_path):
    (tmp_path / "wrong.tsv").write_text("1\n2\n3\n")
    code, out, err = run(["infer", "--network", str(slice_store), "--truth", str(tmp_path / "wrong.tsv"),
                          "--workers", "1", "--json"], capsys)
    assert code == 1  # a check that fails fails the command
    report = json.loads(out)
    assert report["matches_truth"] is False and report["mismatched"] > 0
    assert err == f"dasknn: {report['mismatched']} images differ from the truth\n"


def test_a_few_float32_mismatches_point_to_float64(slice_store, slice_truth, capsys, tmp_path):
    io.write_categories(tmp_path / "short.tsv", slice_truth[1:])  # one image dropped: a near miss
    argv = ["infer", "--network", str(slice_store), "--truth", str(tmp_path / "short.tsv"), "--workers", "1"]
    code, _, err = run(argv + ["--dtype", "float32"], capsys)
    assert code == 1 and err.count("\n") == 1
    assert "differ" in err and "from the truth" in err and "--dtype float64 gives the exact answer" in err
    code, _, err = run(argv + ["--dtype", "float64"], capsys)  # exact: no such hint
    assert code == 1 and err == "dasknn: 1 image differs from the truth\n"


def test_float64_is_the_default_and_says_so(capsys):
    from dasknn.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert commands["infer"].parse_args([]).dtype == "float64"
    assert commands["bench-graphchallenge"].parse_args(["d"]).dtype == "float64"
    for name in ("infer", "bench-graphchallenge"):
        assert "default float64" in " ".join(commands[name].format_help().split())


@pytest.mark.parametrize("value", ["0", "-1"])
@pytest.mark.parametrize("command", [["infer"], ["bench-graphchallenge", "d"], ["train", "--network", "n.zarr"],
                                     ["warm"]])
def test_no_workers_is_refused(command, value, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run([*command, "--workers", value], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("dasknn: error: ")
    assert "--workers" in err and "at least 1" in err


def test_partition_plot_without_matplotlib_names_the_extra(slice_store, capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after a plain pip install .
    code, out, err = run(["partition", str(slice_store), "--parts", "2", "--method", "block",
                          "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 2 and err.count("\n") == 1 and 'pip install "dasknn[plot]"' in err
    assert "Traceback" not in err and not (tmp_path / "p.png").exists()


@pytest.mark.cluster
def test_report_opens_offline(slice_store, client, capsys, tmp_path):
    pytest.importorskip("bokeh", reason="bokeh is not installed: the report needs it")
    report = tmp_path / "r.html"
    code, _, err = run(["infer", "--network", str(slice_store), "--batch", "100", "--scheduler",
                        client.scheduler.address, "--report", str(report), "--json"], capsys)
    assert code == 0, err
    html = report.read_text()
    assert "Bokeh" in html
    # no script loaded from elsewhere (bokeh's own code, inline, names CDNs in strings: only tags count)
    tags = re.findall(r"<script\b[^>]*>", html, flags=re.IGNORECASE)
    assert tags and not [t for t in tags if re.search(r"\bsrc\s*=", t)], [t for t in tags if "src" in t]
    assert len(html) > 500_000  # bokeh's JavaScript is in the page itself
    assert f"dasknn: wrote the performance report to {report}" in err.splitlines()  # where it went


@pytest.mark.cluster
@pytest.mark.subprocess
@pytest.mark.slow
def test_train_ends_without_a_traceback(tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn is not installed: the digits data needs it")
    for argv in (["generate", "--neurons", "1024", "--layers", "2", "--out", str(tmp_path / "x.zarr")],
                 ["train", "--network", str(tmp_path / "x.zarr"), "--data", "digits", "--epochs", "1",
                  "--workers", "2", "--mode", "model"]):
        proc = subprocess.run([sys.executable, "-m", "dasknn", *argv], capture_output=True, text=True, timeout=600,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and "CommClosedError" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["infer", "--network", "nowhere.tar.gz"], "nowhere.tar.gz: no such file or directory"),
    (["infer", "--inputs", "x.tsv"], "--inputs needs --network"),
    (["import", "nowhere", "--out", "x.zarr"], "nowhere: no such file or directory"),
    (["info", "nowhere.zarr"], "nowhere.zarr: no such store"),
    (["generate", "--neurons", "1000", "--layers", "2", "--out", "x.zarr"], "no GraphChallenge bias"),
    (["generate", "--neurons", "1024", "--layers", "0", "--out", "x.zarr"], "--layers must be at least 1"),
    (["infer", "--dtype", "float16"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_errors_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(argv, capsys)
    assert code == 2
    assert message in err and err.startswith("dasknn: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, line", [
    (["train"], "dasknn: error: the following arguments are required: --network (see dasknn train --help)\n"),
    (["infer", "--batch"], "dasknn: error: argument --batch: expected one argument (see dasknn infer --help)\n"),
    ([], "dasknn: error: the following arguments are required: COMMAND (see dasknn --help)\n"),
])
def test_usage_errors_name_the_program_once(argv, line, capsys):
    # the line starts "dasknn: error: "; the command is named once, in the help to read (it was "dasknn: error:
    # dasknn train: ...")
    code, out, err = run(argv, capsys)
    assert code == 2 and err == line


@pytest.mark.subprocess
def test_bad_file_through_the_command_line_names_file_and_line(tmp_path):
    (tmp_path / "n1024-l1.tsv").write_text("1\t1\t0.0625\n1\t2\n")
    proc = subprocess.run([sys.executable, "-m", "dasknn", "infer", "--network", str(tmp_path),
                           "--inputs", "unused.tsv"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"dasknn: error: {tmp_path / 'n1024-l1.tsv'}:2: too few columns (expected 3)"
    assert proc.stdout == ""


@pytest.mark.cluster
@pytest.mark.subprocess
def test_version_and_help():
    proc = subprocess.run([sys.executable, "-m", "dasknn", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("dasknn 0.")
    proc = subprocess.run([sys.executable, "-m", "dasknn", "infer", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--network" in proc.stdout and "--json" in proc.stdout


@pytest.mark.cluster
def test_warm_says_where_each_process_keeps_its_cache(capsys):
    code, out, err = run(["warm", "--workers", "1", "--dtype", "float32", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["dtypes"] == ["float32"] and report["backend"] == "cpu" and len(report["workers"]) == 1
    for one in [report["client"], *report["workers"].values()]:
        assert one["seconds"] >= 0 and one["host"] and one["caches"]
        for cache in one["caches"]:
            # every signature of the warm-up compiled or loaded from this folder
            assert cache["path"] and cache["compiled"] + cache["loaded"] > 0
    assert report["seconds"] == max(w["seconds"] for w in report["workers"].values())
    code, out, err = run(["warm", "--workers", "1", "--dtype", "float32"], capsys)
    assert code == 0 and "keeps its Numba cache" in out and report["client"]["caches"][0]["path"] in out


def test_info(slice_store, capsys):
    code, out, _ = run(["info", str(slice_store), "--json", "--check"], capsys)
    report = json.loads(out)
    assert code == 0 and report["layers"] == 12 and report["images"] == 1000 and report["truth"] == 249
    # the keys scripts read stay as they were
    assert {"store", "neurons", "layers", "edges", "bias", "ymax", "dtype", "source", "images", "truth",
            "bytes_on_disk"} <= set(report)


@pytest.mark.parametrize("terminal", [True, False])
def test_json_is_indented_on_a_terminal_and_one_line_in_a_pipe(slice_store, capsys, monkeypatch, terminal):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    code, out, _ = run(["info", str(slice_store), "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["layers"] == 12
    if terminal:
        assert out == json.dumps(report, indent=2) + "\n" and '\n  "neurons": 1024,\n' in out
    else:
        assert out.count("\n") == 1


def test_train_and_infer_text_count_workers_in_words():
    from dasknn.cli.common import plural
    from dasknn.cli.train import where_trained

    assert [plural(n, "worker") for n in (1, 2, 0)] == ["1 worker", "2 workers", "0 workers"]
    assert where_trained("single", 1) == "single process"
    assert where_trained("model", 1) == "model mode, 1 worker"
    assert where_trained("hybrid", 4) == "hybrid mode, 4 workers"


def test_info_text_tells_storage_from_arithmetic_and_labels_the_truth(slice_store, slice_truth, capsys):
    code, out, _ = run(["info", str(slice_store)], capsys)
    stored = json.loads(run(["info", str(slice_store), "--json"], capsys)[1])["dtype"]
    lines = {k.strip(): v for k, _, v in (line.partition(": ") for line in out.splitlines())}
    assert code == 0
    assert lines["dtype"] == f"stored as {stored} (arithmetic float64 by default; --dtype float32 is faster)"
    assert lines["truth"] == f"{slice_truth.size} categories (images with a nonzero last row)"


@pytest.mark.subprocess
def test_import_does_not_load_cupy_or_the_cluster():
    code = "import sys, dasknn, dasknn.io, dasknn.store; print(sorted(m for m in ('cupy', 'distributed') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


@pytest.mark.cluster
def test_partition_command_saves_and_reports(slice_store, capsys, tmp_path):
    from dasknn.store import load_partition, partition_name

    code, out, err = run(["partition", str(slice_store), "--parts", "4", "--method", "hypergraph", "--json",
                          "--out", str(tmp_path / "p.npy"), "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 0, err
    report = json.loads(out)
    for key in ("method", "parts", "volume_total", "volume_per_layer", "max_part_send", "imbalance_max", "seconds"):
        assert key in report
    owners = np.load(tmp_path / "p.npy")
    assert owners.shape == (13, 1024) and owners.dtype == np.int32 and set(np.unique(owners)) == {0, 1, 2, 3}
    assert (tmp_path / "p.png").stat().st_size > 10_000
    saved, saved_report = load_partition(slice_store, partition_name("hypergraph", 4))
    np.testing.assert_array_equal(saved, owners)
    assert saved_report["volume_total"] == report["volume_total"]
    # random moves far more
    code, out, _ = run(["partition", str(slice_store), "--parts", "4", "--method", "random", "--json"], capsys)
    assert json.loads(out)["volume_total"] > 3 * report["volume_total"]
    # a saved partition drives model-mode inference, when its parts match the workers
    code, _, err = run(["infer", "--network", str(slice_store), "--mode", "model", "--partition",
                        str(tmp_path / "p.npy"), "--workers", "2"], capsys)
    assert code == 2 and "the partition has 4 parts but each group has 2 workers" in err
    assert run(["partition", str(slice_store), "--parts", "2", "--out", str(tmp_path / "p2.npy")], capsys)[0] == 0
    code, out, _ = run(["infer", "--network", str(slice_store), "--mode", "model", "--partition",
                        str(tmp_path / "p2.npy"), "--workers", "2", "--json", "--dtype", "float64"], capsys)
    assert code == 0 and json.loads(out)["matches_truth"] is True


@pytest.mark.parametrize("argv, message", [
    (["--parts", "0"], "parts"),
    (["--parts", "5000"], "parts"),
    (["--parts", "2", "--method", "metis"], "invalid choice"),
])
def test_partition_bad_arguments(slice_store, capsys, argv, message):
    code, _, err = run(["partition", str(slice_store), *argv], capsys)
    assert code == 2 and message in err and err.count("\n") == 1


def test_wrong_shaped_partition_file(slice_store, capsys, tmp_path):
    np.save(tmp_path / "p.npy", np.zeros((5, 1024), dtype=np.int32))
    code, _, err = run(["infer", "--network", str(slice_store), "--mode", "model", "--partition",
                        str(tmp_path / "p.npy"), "--workers", "2"], capsys)
    assert code == 2 and "shape" in err and err.count("\n") == 1


def test_partition_command_runs_on_the_cluster(slice_store, capsys, tmp_path):
    import shutil

    from dasknn.store import load_partition, partition_name

    store = tmp_path / "s.zarr"
    shutil.copytree(slice_store, store, ignore=shutil.ignore_patterns("partitions", "plans"))
    code, out, err = run(["partition", str(store), "--parts", "2", "--method", "fast", "--workers", "2", "--json",
                          "--out", str(tmp_path / "p.npy")], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["parts"] == 2 and report["imbalance_max"] <= 0.03 + 1e-9
    owners = np.load(tmp_path / "p.npy")
    saved, _ = load_partition(store, partition_name("fast", 2))
    np.testing.assert_array_equal(saved, owners)
    assert owners.shape == (13, 1024) and set(np.unique(owners)) == {0, 1}
    # the workers read a store: a network given as files is refused in one line
    code, _, err = run(["partition", str(tmp_path / "none"), "--parts", "2", "--workers", "2"], capsys)
    assert code != 0


@pytest.fixture
def no_cluster(monkeypatch):
    """Any local cluster or client started fails the test: what is refused must be refused before one starts."""
    import distributed

    def started(*args, **kwargs):
        raise AssertionError("a Dask cluster or client was started")

    monkeypatch.setattr(distributed, "LocalCluster", started)
    monkeypatch.setattr(distributed, "Client", started)


@pytest.mark.parametrize("extra, message", [
    (["--network", "nowhere.zarr"], "nowhere.zarr: no such file or directory"),
    (["--network", "nowhere.tar.gz"], "nowhere.tar.gz: no such file or directory"),
    (["--inputs", "nowhere.tsv"], "nowhere.tsv: no such file"),
    (["--truth", "nowhere.tsv"], "nowhere.tsv: no such file"),
    (["--batch", "-1"], "--batch must be between 1 and 1000 (the stored images), not -1"),
    (["--chunks", "0"], "--chunks must be at least 1, not 0"),
    (["--sync-every", "0"], "--sync-every must be at least 1, not 0"),
    (["--keep-layers", "0"], "--keep-layers must be at least 1, not 0"),
    (["--segment", "-2"], "--segment must be at least 1, not -2"),
    (["--activations"], "--activations needs --results"),
])
def test_infer_refuses_bad_arguments_before_a_cluster_starts(extra, message, slice_store, no_cluster, capsys,
                                                               tmp_path, monkeypatch):
    import time

    monkeypatch.chdir(tmp_path)
    argv = ["infer", *(["--network", str(slice_store)] if "--network" not in extra else []), *extra, "--workers", "1"]
    t0 = time.perf_counter()
    code, out, err = run(argv, capsys)
    assert time.perf_counter() - t0 < 2.0
    assert code == 2 and err.startswith("dasknn: error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("argv, message", [
    (["train", "--network", "nowhere.zarr", "--report", "r.html"], "nowhere.zarr: no such store"),
    (["train", "--network", "nowhere.zarr", "--scheduler", "tcp://127.0.0.1:9"], "nowhere.zarr: no such store"),
    (["train", "--network", "STORE", "--batch", "-1", "--scheduler", "tcp://127.0.0.1:9"], "--batch"),
    (["partition", "nowhere.zarr", "--parts", "2", "--workers", "2"], "nowhere.zarr: no such file or directory"),
    (["partition", "STORE", "--parts", "0", "--workers", "2"], "the number of parts must be at least 1"),
    (["partition", "STORE", "--parts", "2", "--epsilon", "-1", "--workers", "2"], "epsilon must be"),
])
def test_train_and_partition_refuse_before_a_cluster_starts(argv, message, slice_store, no_cluster, capsys,
                                                             tmp_path, monkeypatch):
    pytest.importorskip("bokeh", reason="bokeh is not installed: --report needs it")
    monkeypatch.chdir(tmp_path)
    code, out, err = run([str(slice_store) if a == "STORE" else a for a in argv], capsys)
    assert code == 2 and err.startswith("dasknn: error: ") and err.count("\n") == 1 and message in err, err


def test_a_truth_for_another_network_is_refused_before_any_run(slice_store, slice_truth, no_cluster, capsys,
                                                              tmp_path):
    # the 16384 x 120 truth given with a 1024 x 12 network: its name says so
    other = tmp_path / "neuron16384-l120-categories.tsv"
    io.write_categories(other, slice_truth)
    code, _, err = run(["infer", "--network", str(slice_store), "--truth", str(other)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err == (f"dasknn: error: {other}: its name says 16384 neurons x 120 layers, but the network has "
                   f"1024 neurons x 12 layers: a truth for another network\n")
    # a truth whose indices go beyond the stored images, whatever its name: not this batch's
    beyond = tmp_path / "truth.tsv"
    io.write_categories(beyond, np.append(slice_truth, 14593))
    code, _, err = run(["infer", "--network", str(slice_store), "--truth", str(beyond)], capsys)
    line = slice_truth.size + 1
    assert code == 2 and err == f"dasknn: error: {beyond}:{line}: image 14594 is beyond the batch's 1000 images\n"


@pytest.mark.cluster
def test_the_python_entry_checks_the_truth_before_a_cluster(slice_store, slice_truth, no_cluster, tmp_path):
    import dasknn
    from dasknn.errors import DasknnError

    other = tmp_path / "neuron1024-l120-categories.tsv"
    io.write_categories(other, slice_truth)
    with pytest.raises(DasknnError, match="1024 neurons x 120 layers, but the network has 1024 neurons x 12"):
        dasknn.infer(slice_store, truth=other)
    with pytest.raises(DasknnError, match="image index 1000 .* not one of the batch's 1000 images"):
        dasknn.infer(slice_store, truth=np.append(slice_truth, 1000))


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


@pytest.mark.subprocess
def test_sigterm_mid_write_is_an_interrupt_and_leaves_nothing(tmp_path):
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "dasknn", "generate", "--neurons", "16384", "--layers", "1000",
                             "--out", "X.zarr"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while not [p for p in tmp_path.iterdir() if ".partial-" in p.name] and time.monotonic() < deadline:
        time.sleep(0.05)
    [partial] = [p.name for p in tmp_path.iterdir()]
    assert partial.startswith(f".X.zarr.partial-{proc.pid}-")  # the writer's pid is in the name
    time.sleep(0.3)  # layers are being written
    proc.send_signal(signal.SIGTERM)  # as timeout(1) or a batch scheduler sends it
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and out == ""
    # the stage it was in, then one line for the interruption; no traceback
    assert err == "dasknn: generating layers ...\ndasknn: interrupted; nothing partial was kept\n"
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_between_a_coroutines_making_and_its_awaiting_is_still_one_line(capsys):
    # SIGTERM mid-write once landed inside Zarr's sync call, after its coroutine was made and before it was
    # awaited: freed with the interrupt's frames, it warned "never awaited" below the interruption's line
    import warnings

    from dasknn.cli import EXIT_INTERRUPTED, run_guarded

    async def create_group():
        pass

    def sync(coroutine):
        raise KeyboardInterrupt  # (the signal handler's, as Ctrl-C's)

    def writing():
        sync(create_group())

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert run_guarded(writing) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "dasknn: interrupted; nothing partial was kept\n"
    assert not [w for w in seen if "never awaited" in str(w.message)]


def test_sigterm_handler_is_restored_after_a_command(slice_store, capsys):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    assert run(["info", str(slice_store)], capsys)[0] == 0
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.subprocess
@pytest.mark.parametrize("out", ["X.zarr", "tsv"])
def test_a_partial_left_by_a_dead_writer_is_removed_by_the_next_write(out, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # what a SIGKILLed writer leaves: a hidden partial named by its (now dead) pid; and one of a live writer (us)
    target = tmp_path / (out if out.endswith(".zarr") else "tsv/neuron64/n64-l1.tsv")
    target.parent.mkdir(parents=True, exist_ok=True)
    stale = target.with_name(f".{target.name}.partial-{_dead_pid()}-0123abcd")
    live = target.with_name(f".{target.name}.partial-{os.getpid()}-89abcdef")
    for partial in (stale, live):
        partial.mkdir() if out.endswith(".zarr") else partial.write_text("1\t1\t0.5\n")
    code, _, err = run(["generate", "--neurons", "64", "--layers", "2", "--bias", "-0.3", "--out", out], capsys)
    assert code == 0, err
    assert not stale.exists() and live.exists() and target.exists()


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory) -> str:
    """A 4096-wide network of 2 layers (no images)."""
    out = tmp_path_factory.mktemp("wide") / "wide.zarr"
    assert main(["generate", "--neurons", "4096", "--layers", "2", "--out", str(out)]) == 0
    return str(out)


def test_images_named_for_another_width_are_refused_unless_the_user_says_so(wide_store, slice_paths, no_cluster,
                                                                            capsys, tmp_path):
    import shutil

    # the published 1024-wide images against a 4096-wide network: they once ran to "0 categories", exit 0
    images = tmp_path / "sparse-images-1024.tsv.gz"
    shutil.copy(slice_paths["images"], images)
    code, _, err = run(["infer", "--network", wide_store, "--inputs", str(images)], capsys)
    assert code == 2 and err == (f"dasknn: error: {images}: its name says 1024 neurons, but the network has 4096: "
                                 f"images for another network (--any-name reads it anyway)\n")
    # import checks them the same way (a 4096-named batch with the 1024-wide slice)
    wide = tmp_path / "sparse-images-4096.tsv.gz"
    shutil.copy(slice_paths["images"], wide)
    code, _, err = run(["import", str(slice_paths["network"]), "--inputs", str(wide), "--out",
                        str(tmp_path / "x.zarr")], capsys)
    assert code == 2 and err == (f"dasknn: error: {wide}: its name says 4096 neurons, but the network has 1024: "
                                 f"images for another network (--any-name reads it anyway)\n")
    assert run(["import", str(slice_paths["network"]), "--inputs", str(wide), "--out", str(tmp_path / "x.zarr"),
                "--any-name"], capsys)[0] == 0
    # the user's word (--any-name), or a name that says nothing: read, with one line saying they look narrow
    warning = (f"dasknn: warning: {{}}: no image has a nonzero beyond the first 1024 of the network's 4096 neurons: "
               f"images for a narrower network?\n")
    renamed = tmp_path / "batch.tsv.gz"
    shutil.copy(slice_paths["images"], renamed)
    for argv, path in ((["--inputs", str(images), "--any-name"], images), (["--inputs", str(renamed)], renamed)):
        with pytest.raises(AssertionError, match="a Dask cluster or client was started"):
            run(["infer", "--network", wide_store, *argv], capsys)
        assert capsys.readouterr().err == warning.format(path)


def test_a_file_name_is_checked_against_the_network_in_one_place(slice_paths, tmp_path):
    from dasknn.errors import DasknnError

    path = tmp_path / "sparse-images-1024.tsv"
    io.write_images(path, io.read_images(slice_paths["images"])[:3])
    with pytest.raises(DasknnError, match="its name says 1024 neurons, but the network has 2048: images"):
        io.read_images(path, neurons=2048)
    assert io.read_images(path, neurons=2048, any_name=True).shape == (3, 2048)
    assert io.read_images(path).shape == (3, 1024)  # the width from the name
    # the truth's check is the same helper, with its own override
    truth = tmp_path / "neuron1024-l120-categories.tsv"
    truth.write_text("1\n")
    with pytest.raises(DasknnError, match="1024 neurons x 120 layers, but the network has 1024 neurons x 12 layers"):
        io.checked_truth(truth, 3, 1024, 12)
    assert list(io.checked_truth(truth, 3, 1024, 12, any_name=True)) == [0]


def test_info_lists_the_partitions_and_check_says_what_it_read(fresh_store, capsys):
    from dasknn.store import save_partition

    code, out, _ = run(["info", str(fresh_store)], capsys)
    lines = {k.strip(): v for k, _, v in (line.partition(": ") for line in out.splitlines())}
    assert code == 0 and lines["partitions"] == "none" and "check" not in lines
    save_partition(fresh_store, "block-k2-s0-e0.03", np.zeros((13, 1024), dtype=np.int32) + [0, 1] * 512)
    code, out, _ = run(["info", str(fresh_store), "--check"], capsys)
    lines = {k.strip(): v for k, _, v in (line.partition(": ") for line in out.splitlines())}
    assert code == 0 and lines["partitions"] == "block-k2-s0-e0.03 (2 parts)"
    assert lines["check"] == ("passed: read and checked every value of the 12 layers (393,216 entries) and the "
                              "1,000 images and their truth")
    report = json.loads(run(["info", str(fresh_store), "--check", "--json"], capsys)[1])
    assert report["partitions"] == [{"name": "block-k2-s0-e0.03", "parts": 2}]
    assert report["check"] == {"passed": True, "layers": 12, "entries": 393216, "images": 1000, "truth": True}


@pytest.mark.subprocess
def test_import_says_what_it_does_in_a_pipe_at_once(slice_paths, tmp_path):
    import time

    proc = subprocess.Popen([sys.executable, "-m", "dasknn", "import", str(slice_paths["network"]), "--out",
                             str(tmp_path / "x.zarr")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    first = proc.stderr.readline()  # flushed as it starts, not at the end
    seconds = time.perf_counter() - t0
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert first == "dasknn: importing layers ...\n" and seconds < 5
    assert out.startswith("wrote ")


@pytest.mark.parametrize("missing", ["--inputs", "--network"])
def test_a_missing_file_is_worded_one_way(missing, slice_store, slice_paths, no_cluster, capsys, tmp_path):
    gone = tmp_path / ("sparse-images-1024.tsv" if missing == "--inputs" else "neuron1024.tar.gz")
    argv = ["infer", "--network", str(slice_store), missing, str(gone)]
    code, _, err = run(argv, capsys)
    assert code == 2 and err == f"dasknn: error: {gone}: no such file or directory\n"
