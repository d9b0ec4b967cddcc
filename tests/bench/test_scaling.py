"""bench/scaling.py's grid, resumable record file and fitted exponents (no model runs: records are made up)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scaling  # noqa: E402


def test_grid_changes_one_factor_at_a_time_from_the_base():
    points = scaling.grid([48, 128], [8, 32], ["smollm2-shape", "qwen-shape"])
    assert points[0] == scaling.BASE
    assert len(points) == len({json.dumps(p, sort_keys=True) for p in points}) == 4
    for point in points[1:]:
        assert sum(point[k] != scaling.BASE[k] for k in scaling.BASE) == 1


def test_slope_recovers_a_power_law():
    xs = [48, 128, 256]
    assert scaling.slope(xs, [3.0 * x**1.5 for x in xs]) == pytest.approx(1.5)
    assert scaling.slope(xs, [7.0] * 3) == pytest.approx(0.0)


def test_report_fits_each_factor_and_skips_failed_points(tmp_path, monkeypatch):
    def result(cap, batch):
        # generation linear in cap, update quadratic in cap; everything linear in batch
        return {"gen": 0.1 * cap * batch, "score": 0.01 * cap * batch, "update": 1e-3 * cap**2 * batch,
                "total": 0.1 * cap * batch + 0.01 * cap * batch + 1e-3 * cap**2 * batch, "len": float(cap),
                "peak_rss_gb": 1.0 + 0.0 * cap, "rss_loaded_gb": 1.0, "n": 1}

    path = tmp_path / "points.jsonl"
    with path.open("w") as file:
        for cap in (48, 128, 256):
            point = {**scaling.BASE, "cap": cap}
            file.write(json.dumps({"key": scaling.key(point, "ours"), "result": result(cap, 8)}) + "\n")
        for batch in (32, 64):
            point = {**scaling.BASE, "batch": batch}
            file.write(json.dumps({"key": scaling.key(point, "ours"), "result": result(48, batch)}) + "\n")
        point = {**scaling.BASE, "batch": 64}
        file.write(json.dumps({"key": scaling.key(point, "trl"), "result": {"failed": "exit -9: killed"}}) + "\n")
    records = scaling.read_records(path)
    text = scaling.report(records, [48, 128, 256], [8, 32, 64], ["smollm2-shape"])
    cap_row = next(line for line in text.splitlines() if line.startswith("| cap (48, 128, 256) | ours"))
    cells = [c.strip() for c in cap_row.strip("|").split("|")]
    assert float(cells[2]) == pytest.approx(1.0, abs=0.01)  # gen
    assert float(cells[4]) == pytest.approx(2.0, abs=0.01)  # update
    assert cells[-1] == "update"
    batch_row = next(line for line in text.splitlines() if line.startswith("| batch (8, 32, 64) | ours"))
    assert float(batch_row.strip("|").split("|")[5]) == pytest.approx(1.0, abs=0.01)  # total
    assert "failed: exit -9: killed" in text
    assert not any(line.startswith("| batch") and "| trl |" in line for line in text.splitlines())  # one point only
