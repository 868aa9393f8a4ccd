"""The README's headline wall-clock figures are the ones the benchmarks wrote: each sentence's
figure is read out of the README and compared with its row in bench/results/, so a rerun that
changes a figure, or an edit that rounds one differently, fails here until the README says what
was measured."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = " ".join((REPO / "README.md").read_text().split())  # one line: sentences wrap anywhere


def _row(results: str, **match: object) -> dict:
    rows = json.loads((REPO / "bench" / "results" / results).read_text())["rows"]
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"{results}: {len(found)} rows match {match}"
    return found[0]


STREAMING_8_ER = {"sampler": "power_mh", "schedule": "streaming", "budget": 8, "early_rejection": True}


def DEFAULTS_AT(chains: int) -> dict:  # noqa: N802  (reads as a constant in the table below)
    return {"chains": chains, "setting": "streaming + early rejection"}


HEADLINES = [
    # (the README's words around the figure, the figure's group, results file, row, field)
    (r"streaming with it gives the serial chain's samples ([\d.]+)x faster than serial PowerMH without it",
     "vllm_cpu_early_rejection.json", STREAMING_8_ER, "speedup_vs_serial_off"),
    (r"without it, generating ([\d.]+)x serial's tokens", "vllm_cpu_early_rejection.json", STREAMING_8_ER, "tokens_vs_serial_off"),
    (r"the same setting is ([\d.]+)x, with the same samples", "transformers_cpu_schedules.json", STREAMING_8_ER, "speedup_vs_serial_off"),
    (r"samples ([\d.]+)x faster than serial PowerMH at a budget of 8", "vllm_cpu_streaming.json",
     {"schedule": "streaming", "budget": 8}, "speedup_vs_serial"),
    (r"at a budget of 8 \(([\d.]+)x at 16\)", "vllm_cpu_streaming.json", {"schedule": "streaming", "budget": 16}, "speedup_vs_serial"),
    (r"the defaults give serial chains' samples ([\d.]+)x faster at 1 chain", "local_load.json", DEFAULTS_AT(1), "speedup_vs_serial"),
    (r"faster at 1 chain, ([\d.]+)x at 4,", "local_load.json", DEFAULTS_AT(4), "speedup_vs_serial"),
    (r"x at 4, ([\d.]+)x at 16 and", "local_load.json", DEFAULTS_AT(16), "speedup_vs_serial"),
    (r"x at 16 and ([\d.]+)x at 64, where", "local_load.json", DEFAULTS_AT(64), "speedup_vs_serial"),
    (r"run at serial chains' speed there \(([\d.]+)x, the same tokens\)", "local_load.json",
     {"chains": 64, "setting": "rounds"}, "speedup_vs_serial"),
]  # fmt: skip


@pytest.mark.parametrize("words, results, row, field", HEADLINES, ids=[h[1] + ":" + h[3] for h in HEADLINES])
def test_the_readme_says_what_the_benchmark_measured(words, results, row, field):
    said = re.search(words, README)
    assert said, f"the README no longer says {words!r}: update this test with the sentence"
    measured = _row(results, **row)[field]
    assert said.group(1) == f"{measured:.2f}", f"README says {said.group(1)}x, {results} measured {measured:.4f}"


def test_every_headline_file_records_same_samples():
    # a speedup is only a figure if the runs gave serial's samples
    for _, results, row, _ in HEADLINES:
        assert _row(results, **row)["same_as_serial"] is True, results


def test_the_replay_predicts_every_measured_load_speedup_within_3_percent():
    # the README's "predict all twenty speedups within 3%": the replay's rows against the wall-clock run's
    def rows(name: str) -> dict:
        report = json.loads((REPO / "bench" / "results" / name).read_text())
        return {(r["chains"], r["setting"]): r for r in report["rows"]}

    measured, predicted = rows("local_load.json"), rows("local_load_replayed.json")
    assert "within 3% in an eighth of the time" in README and measured.keys() == predicted.keys()
    compared = [key for key in measured if key[1] != "serial"]
    assert len(compared) == 20
    for key in compared:
        error = predicted[key]["speedup_vs_serial"] / measured[key]["speedup_vs_serial"] - 1
        assert abs(error) < 0.03, (key, error)
        assert predicted[key]["same_as_serial"] is True and measured[key]["same_as_serial"] is True
    walls = [json.loads((REPO / "bench" / "results" / name).read_text())["machine"]["bench_wall_time_s"]
             for name in ("local_load.json", "local_load_replayed.json")]  # fmt: skip
    assert walls[1] * 8 <= walls[0]  # "in an eighth of the time": each bench's own wall clock


def test_the_fork_wake_share_figures_in_streaming_md_are_the_measured_ones():
    """docs/streaming.md's fifth pass: its host-time table and its vLLM runs, against the rows
    bench/results/fork_wake_share.json recorded (every run the same samples)."""
    doc = " ".join((REPO / "docs" / "streaming.md").read_text().split())
    report = json.loads((REPO / "bench" / "results" / "fork_wake_share.json").read_text())
    runs = report["host_time_share"]
    assert len({row["digest"] for run in runs for row in run["rows"].values()}) == 1
    for setting in ("streaming", "streaming + early rejection", "serial"):
        side = {s: [run["rows"][setting] for run in runs if run["side"] == s] for s in ("base", "head")}
        cpu = {s: " / ".join(f"{row['cpu_s']:.2f}" for row in rows) for s, rows in side.items()}
        events = " / ".join(f"{side[s][0]['events']:,}" for s in ("base", "head"))
        assert f"| {setting} | {events} | {cpu['base']} | {cpu['head']} |" in doc, setting
        per_token = sorted(row["host_ms_per_token"] for row in side["head"])
        if setting != "serial":
            ratios = " / ".join(f"{b['cpu_s'] / h['cpu_s']:.2f}x" for b, h in zip(side["base"], side["head"]))
            assert f"| {ratios} | {per_token[0]:.3f}-{per_token[-1]:.3f} |" in doc, setting
    vllm = report["vllm_cpu_round_1"]["runs"] + report["vllm_cpu_round_2_64_chains"]["runs"]
    assert len({run["samples"] for run in vllm if run["chains"] == 64}) == 1

    def walls(chains: int, label: str, digits: int) -> str:
        return " / ".join(f"{run['wall_s']:.{digits}f}" for run in vllm if run["chains"] == chains and run["run"] == label)

    assert f"at 4 chains {walls(4, 'share 0', 2)} s against {walls(4, 'share 0.25', 2)} s" in doc
    assert f"{walls(64, 'share 0', 1)} s against {walls(64, 'share 0.25', 1)} s" in doc


def _assert_host_table(doc: str, runs: list[dict], *, with_tokens: bool) -> None:
    """A streaming.md host-time table (base against head, alternated runs of the three settings)
    is the recorded runs', row for row; every run gave the same samples."""
    assert len({row["digest"] for run in runs for row in run["rows"].values()}) == 1
    for setting in ("streaming", "streaming + early rejection", "serial"):
        side = {s: [run["rows"][setting] for run in runs if run["side"] == s] for s in ("base", "head")}
        cpu = {s: " / ".join(f"{row['cpu_s']:.2f}" for row in rows) for s, rows in side.items()}
        counts = [" / ".join(f"{side[s][0][field]:,}" for s in ("base", "head")) for field in ("events", "generated_tokens")]
        ratios = " / ".join(f"{b['cpu_s'] / h['cpu_s']:.2f}x" for b, h in zip(side["base"], side["head"]))
        host = sorted(row["host_ms_per_token"] for row in side["head"])
        control = sorted(row["control_ms_per_token"] for row in side["head"])
        cells = [setting, *(counts if with_tokens else counts[:1]), cpu["base"], cpu["head"], ratios,
                 f"{host[0]:.3f}-{host[-1]:.3f}", f"{control[0]:.3f}-{control[-1]:.3f}"]
        line = "| " + " | ".join(cells) + " |"
        assert line in doc, line


def test_the_plan_min_reach_figures_in_streaming_md_are_the_measured_ones():
    """docs/streaming.md's sixth pass: its host-time table against the runs
    bench/results/plan_min_reach.json recorded (every run the same samples), and its virtual-clock
    claims against the rows recorded there."""
    doc = " ".join((REPO / "docs" / "streaming.md").read_text().split())
    report = json.loads((REPO / "bench" / "results" / "plan_min_reach.json").read_text())
    _assert_host_table(doc, report["host_time"]["runs"], with_tokens=False)

    def speed(rows: list[dict]) -> dict[tuple, float]:
        return {(r["prefetch_budget"], r["mh_steps"], r["fixed_length"], r["early_rejection"]): r["speedup_vs_serial"] for r in rows}

    clock = report["virtual_clock"]["rows"]
    before, after = speed(clock["0.0"]), speed(clock["0.01"])
    assert all(r["same_as_serial"] for rows in clock.values() for r in rows)
    for budget, words in ((8, "worst -{:.1f}%"), (20, "{:.1f}% at worst")):
        ratios = [after[k] / before[k] for k in before if k[0] == budget]
        assert len(ratios) == 12 and words.format(100 * (1 - min(ratios))) in doc, budget
    worst = min((after[k] / before[k], k) for k in before)[1]
    assert f"{before[worst]:.2f}x -> {after[worst]:.2f}x" in doc
    load = report["virtual_clock_load"]["rows"]
    times = {r: [row["time"] for row in rows] for r, rows in load.items()}
    assert len(times["0.0"]) == 40 and all(a <= b + 1e-9 for a, b in zip(times["0.01"], times["0.0"]))
    replay = report["vllm_replay"]
    assert len(replay["base"]) == 24 and replay["base"] == replay["head"]


def test_the_speculation_gain_refit_in_streaming_md_is_the_measured_one():
    """docs/streaming.md's refit of speculation_gain: how many streaming rows spend more tokens
    than rounds at each gain, and the speed against 3.2's, as bench/results/speculation_gain_refit.json
    recorded."""
    doc = " ".join((REPO / "docs" / "streaming.md").read_text().split())
    rows = json.loads((REPO / "bench" / "results" / "speculation_gain_refit.json").read_text())["rows"]

    def key(row: dict) -> tuple:
        return row["prefetch_budget"], row["mh_steps"], row["fixed_length"], row["early_rejection"]

    rounds = {key(r): r["tokens_vs_serial"] for r in rows["3.2"] if r["schedule"] == "rounds"}
    reference = {key(r): r["speedup_vs_serial"] for r in rows["3.2"] if r["schedule"] == "streaming"}
    words = {"2.4": "at 2.4 {over} rows spend more, {mean:.2f}x faster", "4.0": "at 4.0 {over} (budget 20",
             "4.8": "at 4.8 {over} at {mean:.2f}x (worst {worst:.2f}x)", "3.2": "at 3.2 {over} rows still spend more than rounds"}
    names = {0: "none", 1: "one", 5: "five", 10: "ten"}
    for gain, template in words.items():
        streaming = [r for r in rows[gain] if r["schedule"] == "streaming"]
        assert len(streaming) == 24 and all(r["same_as_serial"] for r in rows[gain])
        over = sum(r["tokens_vs_serial"] > rounds[key(r)] for r in streaming)
        ratios = [r["speedup_vs_serial"] / reference[key(r)] for r in streaming]
        mean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        assert template.format(over=names[over], mean=mean, worst=min(ratios)) in doc, gain


def test_the_events_per_advance_figures_in_streaming_md_are_the_measured_ones():
    """docs/streaming.md's seventh pass: its host-time table, plan counts, virtual-clock claims and
    vLLM runs against bench/results/events_per_advance.json (every run the same samples)."""
    doc = " ".join((REPO / "docs" / "streaming.md").read_text().split())
    report = json.loads((REPO / "bench" / "results" / "events_per_advance.json").read_text())
    runs = report["host_time"]["runs"]
    assert [run["side"] for run in runs].count("base") == [run["side"] for run in runs].count("head") == 5
    _assert_host_table(doc, runs, with_tokens=True)
    plans = report["plans"]
    assert (f"{plans['head']['streaming']['steps_with_events']:,} chain steps with events instead of "
            f"{plans['base']['streaming']['steps_with_events']:,} and {plans['head']['streaming']['trees']:,} trees "
            f"instead of {plans['base']['streaming']['trees']:,}") in doc

    def key(row: dict) -> tuple:
        return row["prefetch_budget"], row["mh_steps"], row["fixed_length"], row["early_rejection"]

    clock = report["virtual_clock"]["rows"]
    before = {key(r): r for r in clock["base"]}
    assert len(before) == 24 and all(r["same_as_serial"] for rows in clock.values() for r in rows)
    for budget, words in ((8, "at budget 8 a geometric mean of {mean:.4f}x base's speed (worst -{worst:.1f}%"),
                          (20, "at budget 20 {mean:.4f}x (worst -{worst:.1f}%)")):
        ratios = [r["speedup_vs_serial"] / before[key(r)]["speedup_vs_serial"] for r in clock["head"] if r["prefetch_budget"] == budget]
        mean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        assert words.format(mean=mean, worst=100 * (1 - min(ratios))) in doc, budget
    fewer = sum(r["tokens_vs_serial"] < before[key(r)]["tokens_vs_serial"] for r in clock["head"])
    assert f"with fewer tokens in {fewer} of the 24 rows" in doc
    load = report["virtual_clock_load"]["rows"]
    speed = {s: [b["time"] / h["time"] for b, h in zip(load["base"], load["head"]) if b["schedule"] == s] for s in ("serial", "rounds", "streaming")}
    assert all(len(v) == 40 for v in speed.values()) and speed["serial"] == speed["rounds"] == [1.0] * 40
    mean = math.exp(sum(math.log(x) for x in speed["streaming"]) / 40)
    assert f"geometric mean of {mean:.4f}x, worst -{100 * (1 - min(speed['streaming'])):.1f}%" in doc
    vllm = report["vllm_cpu"]

    def walls(runs: list[dict], side: str) -> str:
        return " / ".join(f"{run['wall_s']:.2f}" for run in runs if run["side"].startswith(side))

    for runs in (vllm["runs_64_chains"], vllm["runs_4_chains"]):
        assert len({run["digest"] for run in runs}) == 1
        assert f"{walls(runs, 'base')} s at base against {walls(runs, 'head')} s" in doc or \
            f"{walls(runs, 'base')} s against {walls(runs, 'head')} s" in doc


def test_the_lockstep_figures_in_streaming_md_are_the_measured_ones():
    """docs/streaming.md's eighth pass and benchmarks.md's latest paragraph: the host-time table,
    the toy's CPU, its calls and the plan's node counts against bench/results/toy_lockstep.json
    (every run the same samples, the fingerprint unchanged)."""
    doc = " ".join((REPO / "docs" / "streaming.md").read_text().split())
    latest = " ".join((REPO / "docs" / "benchmarks.md").read_text().split())
    report = json.loads((REPO / "bench" / "results" / "toy_lockstep.json").read_text())
    runs = report["host_time"]["runs"]
    assert [run["side"] for run in runs] == ["base", "head"] * 5
    _assert_host_table(doc, runs, with_tokens=True)
    fingerprint = report["fingerprint"]
    assert fingerprint["base"] == fingerprint["head"] and f"gives {fingerprint['head']} before and after" in doc

    def spread(setting: str, side: str, value) -> str:
        values = sorted(value(run["rows"][setting]) for run in runs if run["side"] == side)
        return f"{values[0]:.2f}-{values[-1]:.2f}"

    def engine(row: dict) -> float:
        return row["engine_s"]

    def control(row: dict) -> float:
        return row["cpu_s"] - row["engine_s"]

    def cpu(row: dict) -> float:
        return row["cpu_s"]

    for setting, words in (("streaming", "streaming {base} s at base against {head} s"),
                           ("streaming + early rejection", "with early rejection {base} against {head} s"),
                           ("serial", "serial {base} against {head} s")):  # fmt: skip
        assert words.format(base=spread(setting, "base", engine), head=spread(setting, "head", engine)) in doc, setting
    assert f"(streaming {spread('streaming', 'base', control)} s at base, {spread('streaming', 'head', control)} s at head)" in doc
    assert (f"take {spread('streaming', 'head', engine)} s instead of {spread('streaming', 'base', engine)} s, and streaming runs in "
            f"{spread('streaming', 'head', cpu)} s") in latest
    assert f"with early rejection {spread('streaming + early rejection', 'head', cpu)} s" in latest
    calls = report["calls"]
    streaming, with_rejection = calls["streaming"], calls["streaming + early rejection"]
    assert (f"the {streaming['requests']:,} requests now go in {streaming['model_calls']} calls ({streaming['lockstep_batches']} of "
            f"them decoded in lockstep, the largest {streaming['largest_batch']} requests); with early rejection "
            f"{with_rejection['requests']:,} in {with_rejection['model_calls']}") in doc
    assert (f"{streaming['tokens_computed']:,} tokens for {streaming['tokens_generated']:,} generated "
            f"({with_rejection['tokens_computed']:,} for {with_rejection['tokens_generated']:,} with early rejection)") in doc
    nodes = report["plan_nodes"]
    assert f"create {nodes['created_in_updates']:,} nodes per run ({nodes['of_which_next_event_with_the_same_facts']:,} of them" in doc
    stops = report["stop_length"]["runs"]
    assert [run["side"] for run in stops] == ["base", "head"] * 3
    for field, words in (("engine_s", "{base} s at dc0e1fe against {head} s (three"), ("cpu_s", "{base} against {head} s, moves")):
        base, head = (" / ".join(f"{run[field]:.2f}" for run in stops if run["side"] == side) for side in ("base", "head"))
        assert words.format(base=base, head=head) in doc, field


def test_the_ninth_pass_figures_in_the_docs_are_the_measured_ones():
    """docs/streaming.md's ninth pass and benchmarks.md's latest paragraph and 4-chain bullet:
    the host-time table, the instruction counts, the plan's counts and the replayed 4-chain
    speedups against bench/results/host_time_ninth_pass.json (every run the same samples, the
    fingerprint unchanged)."""
    doc = " ".join((REPO / "docs" / "streaming.md").read_text().split())
    bench = " ".join((REPO / "docs" / "benchmarks.md").read_text().split())
    report = json.loads((REPO / "bench" / "results" / "host_time_ninth_pass.json").read_text())
    runs = report["host_time"]["runs"]
    assert [run["side"] for run in runs] == ["head", "base", "base", "head"] * 3
    _assert_host_table(doc, runs, with_tokens=True)
    assert report["fingerprint"]["base"] == report["fingerprint"]["head"] == "de19c34957d36bd1"
    assert f"gives {report['fingerprint']['head']} before and after every commit" in doc

    def cpu(setting: str, side: str) -> str:
        values = sorted(run["rows"][setting]["cpu_s"] for run in runs if run["side"] == side)
        return f"{values[0]:.2f}-{values[-1]:.2f}"

    rejection = "streaming + early rejection"
    per_token = sorted(run["rows"][rejection]["host_ms_per_token"] for run in runs if run["side"] == "head")
    assert (f"took {cpu(rejection, 'head')} s ({per_token[0]:.3f}-{per_token[-1]:.3f} ms per generated token) against "
            f"base's {cpu(rejection, 'base')} s") in bench
    assert f"base's runs with early rejection took {cpu(rejection, 'base')} s here" in doc
    instructions = report["instructions"]
    start = instructions["startup"]

    def run_instructions(setting: str, side: str) -> float:
        return (instructions["total"][setting][side] - start[side]) / 1e9

    for setting, words in ((rejection, "streaming with early rejection {b:.2f} -> {h:.2f} billion ({c:+.1f}%)"),
                           ("streaming", "streaming {b:.2f} -> {h:.2f} billion ({c:+.1f}%)"),
                           ("serial", "serial {b:.2f} -> {h:.2f} billion ({c:+.1f}%)")):  # fmt: skip
        b, h = run_instructions(setting, "base"), run_instructions(setting, "head")
        assert words.format(b=b, h=h, c=100 * (h / b - 1)) in doc, setting
    assert f"{100 * (1 - run_instructions(rejection, 'head') / run_instructions(rejection, 'base')):.1f}% fewer instructions" in bench
    nodes = report["plan_counts"]
    for setting, words in ((rejection, "{b:,} -> {h:,} with early rejection"), ("streaming", "({b:,} -> {h:,} without)")):
        exact = nodes[setting]
        assert words.format(b=exact["base"]["created, exact state"], h=exact["head"]["created, exact state"]) in doc, setting
    walks = nodes[rejection]
    key = "_propagate calls (fork-point and reach walks)"
    assert f"fell from {walks['base'][key]:,} to {walks['head'][key]:,}" in doc
    replay = report["speculation_batch_replay"]["rows"]
    defaults = {batch: rows[rejection] for batch, rows in replay.items()}
    assert f"from {defaults['30']['speedup_vs_serial']:.2f}x (30, the CPU default) to {defaults['16']['speedup_vs_serial']:.2f}x (16: " \
           f"{defaults['16']['tokens']:,} tokens, {defaults['16']['steps']} steps) and {defaults['8']['speedup_vs_serial']:.2f}x (8: " \
           f"{defaults['8']['tokens']:,} tokens, {defaults['8']['steps']} steps)" in bench
    rounds = {batch: rows["rounds + early rejection"]["speedup_vs_serial"] for batch, rows in replay.items()}
    assert f"({rounds['30']:.2f}x -> {rounds['8']:.2f}x with early rejection)" in bench
