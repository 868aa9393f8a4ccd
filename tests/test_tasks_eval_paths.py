"""`presto-ray eval`'s outputs: the plot defaults to --out with .png, and missing folders are created
(before, `eval --out /tmp/x.json` where there was no out/ folder failed on out/eval.png after all the work)."""

from __future__ import annotations

from pathlib import Path

from presto_ray.cli import main
from presto_ray.cli.check import eval_png_path

TOY = str(Path(__file__).resolve().parent.parent / "configs" / "toy.yaml")


def test_png_defaults_beside_out():
    assert eval_png_path("a/b/run.json", None) == "a/b/run.png"
    assert eval_png_path("run.json", "") is None
    assert eval_png_path("run.json", "p/q.png") == "p/q.png"


def test_eval_creates_missing_output_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no out/ folder here
    out = tmp_path / "deep" / "er" / "x.json"
    argv = ["eval", "--config", TOY, "--n", "1", "--methods", "greedy"]
    assert main([*argv, "--out", str(out)]) == 0
    assert out.exists() and out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "out").exists()
    png = tmp_path / "plots" / "new" / "p.png"
    assert main([*argv, "--out", str(tmp_path / "y.json"), "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
