"""bench/grade_speed.py: the grader-speed benchmark runs the real command and checks its verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_grade_speed_times_each_grader_and_checks_its_verdicts(tmp_path):
    out = tmp_path / "speed.json"
    subprocess.run([sys.executable, "-m", "bench.grade_speed", "--out", str(out), "--math-rows", "12",
                    "--gsm8k-rows", "20", "--repeats", "1", "--tasks", "math,gsm8k"], check=True, cwd=REPO)
    report = json.loads(out.read_text())
    rows = {r["task"]: r for r in report["rows"]}
    assert set(rows) == {"math", "gsm8k"}
    assert rows["gsm8k"]["rows"] == 20 and rows["gsm8k"]["correct"] == 20
    # the first 12 agreement pairs: math-verify agrees with every label there
    assert rows["math"]["rows"] == 12 and rows["math"]["correct"] == rows["math"]["labelled_correct"] > 0
    for row in rows.values():
        assert 0 < row["start_s"] and 0 < row["wall_s"] and row["rows_per_s"] == row["rows"] / row["wall_s"]
