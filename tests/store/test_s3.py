"""Stores at s3:// URLs, against a real S3 API (moto's server on loopback, tests/support/s3.py): every command that
reads or writes a store, the workers opening it themselves, and what goes wrong said in one line, in bounded time."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="the s3:// tests need s3fs (pip install 'dasknn[s3]')")
pytest.importorskip("moto.server", reason="the s3:// tests need moto's server (pip install 'moto[server]')")

from s3 import BUCKET, authentication, environment, moto_server, stalled_endpoint  # noqa: E402

from dasknn import cli, io, locations, store  # noqa: E402
from dasknn.errors import DasknnError  # noqa: E402

SLICE = f"s3://{BUCKET}/slice.zarr"
GENERATED = f"s3://{BUCKET}/generated.zarr"


@pytest.fixture(scope="module")
def s3():
    """The S3 endpoint, with the environment pointing at it (credentials and endpoint only there) for the module."""
    with moto_server() as endpoint, environment(endpoint.environment()):
        yield endpoint


@pytest.fixture(scope="module")
def s3_scheduler(s3):
    """The address of a local cluster started within that environment: its worker processes inherit it, and open
    the stores themselves."""
    from dasknn.cluster import local_client

    with local_client(workers=2, threads_per_worker=1) as client:
        yield client.scheduler.address


def run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    """``dasknn ARGV --json`` in this process: its exit code, its JSON (if it printed one) and its stderr."""
    code = cli.main([*argv, "--json"])
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return code, json.loads(lines[-1]) if lines else None, err


@pytest.fixture(scope="module")
def slice_url(s3, slice_paths, tmp_path_factory):
    """The shipped slice imported to ``s3://nets/slice.zarr`` by the command line, from a fresh working folder
    (which must stay empty: no local folder named after the URL)."""
    here = tmp_path_factory.mktemp("cwd")
    before = os.getcwd()
    os.chdir(here)
    try:
        code = cli.main(["import", str(slice_paths["network"]), "--inputs", str(slice_paths["images"]), "--truth",
                         str(slice_paths["truth"]), "--out", SLICE, "--json"])
    finally:
        os.chdir(before)
    assert code == 0 and list(here.iterdir()) == []
    return SLICE


def test_import_info_and_export_through_s3(slice_url, tmp_path, capsys):
    code, info, _ = run(capsys, "info", slice_url, "--check")
    assert code == 0 and info["store"] == slice_url
    assert (info["neurons"], info["layers"], info["images"], info["truth"]) == (1024, 12, 1000, 249)
    assert info["bytes_on_disk"] > 0
    fs, root = locations.filesystem(slice_url)
    assert fs.isfile(f"{root}/zarr.json") and fs.isdir(f"{root}/layers/12")
    code, _, _ = run(capsys, "export", slice_url, "--out", str(tmp_path))
    assert code == 0
    assert io.read_network(tmp_path / "neuron1024", bias=-0.3).edges == info["edges"]


@pytest.mark.cluster
@pytest.mark.slow
def test_every_mode_from_s3_equals_the_local_run(slice_url, slice_store, s3_scheduler, tmp_path, capsys):
    local = tmp_path / "local.tsv"
    code, _, err = run(capsys, "infer", "--network", str(slice_store), "--scheduler", s3_scheduler, "--mode", "data",
                       "--out", str(local))
    assert code == 0, err
    want = io.read_categories(local)
    runs = {"data": [], "pipeline": [], "model": ["--partition", "block"]}
    for name, extra in runs.items():
        results = f"s3://{BUCKET}/results-{name}.zarr"
        out = tmp_path / f"{name}.tsv"
        code, report, err = run(capsys, "infer", "--network", slice_url, "--scheduler", s3_scheduler, "--mode", name,
                                *extra, "--results", results, "--out", str(out))
        assert code == 0, err
        assert report["matches_truth"] is True and report["mode"] == name
        np.testing.assert_array_equal(io.read_categories(out), want)
        # --results written behind the URL by the workers, chunk by chunk
        written = np.sort(np.concatenate(list(store.read_results(results).values())))
        np.testing.assert_array_equal(written, want)  # both 0-based


@pytest.mark.cluster
def test_the_cost_model_counts_reads_behind_a_url_as_shared_by_a_hosts_workers(slice_url, slice_store, s3_scheduler,
                                                                            capsys):
    # one host's 2 workers share its link to the endpoint: their reads add up to one reader's; a local store's
    # reads add up worker by worker (readers 0). Behind a URL auto weighs the modes that read less (pipeline,
    # model) even where data mode holds the network, a resident mode's prediction counting its load
    code, report, err = run(capsys, "infer", "--network", slice_url, "--scheduler", s3_scheduler, "--batch", "200")
    assert code == 0, err
    assert report["calibration"]["readers"] == 1
    assert {p["mode"] for p in report["predictions"]} == {"data", "model", "pipeline"}
    data = next(p for p in report["predictions"] if p["mode"] == "data")
    assert data["resident"] and data["load_seconds"] > 0
    # the same network local, held in memory: data mode is the only one auto weighs, so it runs it uncalibrated
    code, report, err = run(capsys, "infer", "--network", str(slice_store), "--scheduler", s3_scheduler,
                            "--batch", "200")
    assert code == 0, err
    assert report["mode"] == "data" and not report["streamed"] and "predictions" not in report
    assert "probe" not in report["timings"]
    # streamed, data mode is weighed against the others: its reads counted worker by worker
    code, report, err = run(capsys, "infer", "--network", str(slice_store), "--scheduler", s3_scheduler,
                            "--batch", "200", "--stream")
    assert code == 0, err
    assert report["calibration"]["readers"] == 0 and "probe" in report["timings"]


@pytest.mark.cluster
@pytest.mark.slow
def test_generate_partition_and_train_with_checkpoints_on_s3(s3, s3_scheduler, tmp_path, capsys):
    code, report, err = run(capsys, "generate", "--neurons", "1024", "--layers", "3", "--images", "40", "--truth",
                            "--out", GENERATED)
    assert code == 0 and report["out"] == GENERATED, err
    code, _, err = run(capsys, "partition", GENERATED, "--parts", "2", "--method", "block", "--scheduler",
                       s3_scheduler)
    assert code == 0, err
    saved = store.load_partition(GENERATED, store.partition_name("block", 2))
    assert saved is not None and saved[0].shape == (4, 1024)  # kept next to the layers
    # model mode out of core: the workers write the part plan next to the layers, and read their parts from it
    code, report, err = run(capsys, "infer", "--network", GENERATED, "--scheduler", s3_scheduler, "--mode", "model",
                            "--partition", "block", "--stream")
    assert code == 0 and report["matches_truth"] is True and report["streamed"] is True, err
    assert len(locations.child_names(locations.join(GENERATED, "plans"))) == 1
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((48, 1024)).astype(np.float32), y=rng.integers(0, 4, 48))
    checkpoint = f"s3://{BUCKET}/checkpoint.zarr"
    code, report, err = run(capsys, "train", "--network", GENERATED, "--data", str(tmp_path / "d.npz"), "--epochs",
                            "1", "--batch", "8", "--mode", "model", "--partition", "block", "--workers", "2",
                            "--scheduler", s3_scheduler, "--checkpoint", checkpoint, "--checkpoint-every", "2")
    assert code == 0, err
    from dasknn.train import load_checkpoint

    model, attrs = load_checkpoint(checkpoint)
    assert model.step == report["steps"] and model.step >= 2 and attrs["depth"] == 3
    code, resumed, err = run(capsys, "train", "--network", GENERATED, "--data", str(tmp_path / "d.npz"),
                             "--epochs", "2", "--batch", "8", "--mode", "model", "--partition", "block", "--workers",
                             "2", "--scheduler", s3_scheduler, "--checkpoint", checkpoint, "--resume")
    assert code == 0, err
    assert load_checkpoint(checkpoint)[0].step == model.step + resumed["steps"] > model.step


def test_a_checkpoint_write_cut_short_leaves_the_last_one_to_resume_from(s3, monkeypatch):
    # object stores have no rename: a checkpoint written again must not lose the one before it on the way
    from examples import random_layers, toy_data

    from dasknn import train as tr
    from dasknn.train import checkpoint

    url = f"s3://{BUCKET}/cut-short.zarr"

    def run(steps, **kw):
        return tr.train(random_layers(), toy_data(60), epochs=4, batch=16, lr=0.05, optimizer="adam", mode="single",
                        seed=5, max_steps=steps, checkpoint=url, **kw)

    whole = tr.train(random_layers(), toy_data(60), epochs=4, batch=16, lr=0.05, optimizer="adam", mode="single",
                     seed=5, max_steps=8)
    assert run(4, checkpoint_every=2).steps == 4 and tr.load_checkpoint(url)[0].step == 4
    write = checkpoint._write_checkpoint

    def cut_short(root, model, extra):  # the new checkpoint's data written whole, then the run is gone
        write(root, model, extra)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_write_checkpoint", cut_short)
    with pytest.raises(KeyboardInterrupt):
        run(8, checkpoint_every=2, resume=True)  # cut at step 6's checkpoint
    monkeypatch.undo()
    assert tr.load_checkpoint(url)[0].step == 4
    # a generation a crash left without the switch (written in part) is ignored, and swept by the next write
    stray = locations.join(url, "step-000000006-00000000")
    store.common.open_group(stray, mode="w").create_array("params/0", shape=(2,), dtype="f8")
    rest = run(8, resume=True)
    assert rest.steps == 4 and rest.losses == whole.losses[4:]
    assert tr.load_checkpoint(url)[0].step == 8
    assert "step-000000006-00000000" not in locations.child_names(url)
    assert len(locations.child_names(url, "step-")) == 1


def test_a_checkpoint_of_the_layout_before_generations_is_read_and_replaced(s3):
    # written before issue 45: the checkpoint's arrays and attributes at the URL's root
    from examples import C, random_layers

    from dasknn.train import checkpoint, init_model, load_checkpoint, save_checkpoint

    url = f"s3://{BUCKET}/before-generations.zarr"
    model = init_model(random_layers(), C, seed=3)
    checkpoint._write_checkpoint(store.common.open_group(url, mode="w"), model, {"seed": 3})
    assert checkpoint.has_checkpoint(url) and load_checkpoint(url)[0].step == 0
    model.step = 7
    save_checkpoint(url, model)
    assert load_checkpoint(url)[0].step == 7
    names = locations.child_names(url)
    assert names == ["step-000000007-" + names[0].rsplit("-", 1)[-1], "zarr.json"]  # the old arrays swept


def one_line_error(capsys, *argv: str, within: float) -> str:
    """Run a command that must fail: its one line of stderr, after checking it came within ``within`` seconds."""
    t0 = time.monotonic()
    code = cli.main(list(argv))
    seconds = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("dasknn: error: ") and err.count("\n") == 1, err
    assert seconds < within, (seconds, err)
    return err


def test_wrong_credentials_are_one_line(slice_url, s3, capsys):
    with authentication(s3), environment(s3.environment(AWS_SECRET_ACCESS_KEY="not-the-secret")):
        err = one_line_error(capsys, "info", slice_url, within=10)
    assert "access denied" in err and "AWS_SECRET_ACCESS_KEY" in err


def test_chunk_files_asked_together_are_answered_as_one_at_a_time(slice_url, s3):
    # locations.are_files asks s3fs's asynchronous calls side by side: the answers, and a refused key's one line,
    # are what asking one at a time (locations.is_file) gives
    names = ["zarr.json", "layers/3/values/c/0", "layers/3/values/c/7", "absent/zarr.json"]
    assert locations.are_files(slice_url, names) == [locations.is_file(f"{slice_url}/{n}") for n in names]
    assert locations.are_files(slice_url, names) == [True, True, False, False]
    with authentication(s3), environment(s3.environment(AWS_SECRET_ACCESS_KEY="not-the-secret")):
        with pytest.raises(DasknnError, match="access denied") as refused:
            locations.are_files(slice_url, names)
    assert "\n" not in str(refused.value)


def test_a_missing_bucket_is_one_line(s3, capsys):
    err = one_line_error(capsys, "generate", "--neurons", "1024", "--layers", "1", "--out", "s3://no-bucket/n.zarr",
                         within=10)
    assert "s3://no-bucket/n.zarr" in err and "bucket does not exist" in err
    err = one_line_error(capsys, "info", "s3://no-bucket/n.zarr", within=10)
    assert "no such store" in err


def test_a_missing_key_is_one_line(slice_url, capsys):
    err = one_line_error(capsys, "infer", "--network", f"s3://{BUCKET}/absent.zarr", within=10)
    assert f"s3://{BUCKET}/absent.zarr: no such store" in err
    # a store whose chunk went missing: named, not read as zeros
    fs, root = locations.filesystem(slice_url)
    damaged = f"s3://{BUCKET}/damaged.zarr"
    fs.copy(root, f"{BUCKET}/damaged.zarr", recursive=True)
    fs.rm(f"{BUCKET}/damaged.zarr/layers/3/values/c/0")
    err = one_line_error(capsys, "info", damaged, within=10)
    assert "layer 3: values: chunk 0 is missing" in err


def test_a_stalled_endpoint_is_one_line_within_its_timeouts(s3, monkeypatch, capsys):
    import fsspec.config

    # the user's fsspec settings bound the wait (dasknn's own bound, 10 s a read, is too long for a test)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"connect_timeout": 1, "read_timeout": 1}})
    with stalled_endpoint() as url, environment(s3.environment(AWS_ENDPOINT_URL=url)):
        err = one_line_error(capsys, "info", f"s3://{BUCKET}/slice.zarr", within=15)
    assert "did not answer in time" in err


def test_urls_are_never_local_paths(s3, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "gcsfs", None)  # not installed, wherever the tests run
    err = one_line_error(capsys, "generate", "--neurons", "1024", "--layers", "1", "--out", "gs://nets/n.zarr",
                         within=5)
    assert "pip install 'gcsfs'" in err
    err = one_line_error(capsys, "export", f"s3://{BUCKET}/slice.zarr", "--out", f"s3://{BUCKET}/tsv", within=5)
    assert "must be a local path" in err
    err = one_line_error(capsys, "generate", "--neurons", "1024", "--layers", "1", "--out", f"s3://{BUCKET}/tsv",
                         within=5)
    assert "must be a local path" in err
    err = one_line_error(capsys, "generate", "--neurons", "1024", "--layers", "1", "--out",
                         "https://127.0.0.1:9/n.zarr", within=5)
    assert "https:// is read only" in err
    assert list(tmp_path.iterdir()) == []
