"""Model mode's exchange plan: timed in every mode, built by the workers, and auto's partition on the cluster."""

from __future__ import annotations

import json

import numpy as np

from dasknn import engine
from dasknn.cli import main


def test_resident_model_mode_reports_its_plan_seconds(client, slice_store, slice_truth, capsys):
    # the plan is built in resident model mode too: its time is reported, not 0
    result = engine.infer(slice_store, client=client, mode="model", partition="block", chunks=1, dtype="float64")
    np.testing.assert_array_equal(result.categories, slice_truth)
    assert result.resident and result.plan_seconds > 0
    code = main(["infer", "--network", str(slice_store), "--mode", "model", "--partition", "block", "--workers", "2",
                 "--dtype", "float64", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["streamed"] is False and report["plan_seconds"] > 0
    # data mode builds no plan
    data = engine.infer(slice_store, client=client, mode="data", chunks=1, dtype="float64")
    assert data.plan_seconds == 0
