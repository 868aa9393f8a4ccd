"""presto-ray bench --host-time: it runs, every setting gives the serial samples, and its figures
agree with each other (per token and per event from the same CPU seconds, the engine's share
inside the total)."""

import json

import pytest

from bench.host_time import BASE, SETTINGS, format_report, run_host_time_bench
from presto_ray.cli import main

TINY = BASE.model_copy(update={"block_size": 12, "mh_steps": 4})


def test_every_setting_runs_at_every_chain_count_with_consistent_figures(tmp_path):
    out = tmp_path / "host.json"
    report = run_host_time_bench((1, 3), TINY, out_json=out)
    rows = report["rows"]
    assert [(r["setting"], r["chains"]) for r in rows] == [(s[0], n) for n in (1, 3) for s in SETTINGS]
    for row in rows:
        assert row["same_as_serial"], row["setting"]
        assert row["generated_tokens"] > 0 and row["events"] > 0
        assert 0.0 <= row["engine_s"] <= row["cpu_s"]
        assert row["host_ms_per_token"] == pytest.approx(1000 * row["cpu_s"] / row["generated_tokens"])
        control_s = row["cpu_s"] - row["engine_s"]
        assert row["control_ms_per_token"] == pytest.approx(1000 * control_s / row["generated_tokens"])
        assert row["control_us_per_event"] == pytest.approx(1e6 * control_s / row["events"])
    serial = [r for r in rows if r["setting"] == "serial"]
    assert all(r["control_vs_serial"] == 1.0 for r in serial)
    # the serial chain makes one engine call per event it walks; streaming delivers one event
    # per completion or fork point, so at least one per request it did not abort
    for r in rows:
        if r["setting"] == "serial" and r["chains"] == 1:
            assert r["events"] >= r["transitions"]
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
    assert "streaming + early rejection" in format_report(report)


def test_the_command_writes_its_report_and_profiles(tmp_path, capsys):
    out = tmp_path / "h.json"
    argv = ["bench", "--host-time", "--chain-counts", "1", "--mh-steps", "3", "--block-size", "8", "--profile", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "control ms/token" in printed and "(profile)" in printed
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(SETTINGS)
    for row in rows:
        shares = row["profile_shares"]
        assert set(shares) >= {"planning", "walk", "engine", "books and driver"}
        assert all(share >= 0.0 for share in shares.values())
        assert sum(shares.values()) == pytest.approx(1.0)  # the parts do not overlap
    assert main(["bench", "--host-time", "--chain-counts", "0", "--out", str(out)]) == 2
