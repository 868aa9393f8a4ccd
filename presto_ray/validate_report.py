"""validate's report: the rows of both tests per statistic, the verdict, the power against the
fault, the table and the JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from presto_ray.table import format_table
from presto_ray.validate_fault import FEASIBLE_SAMPLES


@dataclass
class ValidationReport:
    config: dict  # the prefetching side's sampler config
    prompts: list[str]
    chains_per_prompt: int
    alpha_level: float
    fault: bool
    rows: list[dict]  # one per statistic
    samples: dict[str, list[dict]]  # per side: one dict of statistics per sample
    wall_time_s: dict[str, float]
    notes: list[str] = field(default_factory=list)
    power: dict | None = None  # FaultPower.to_json(): power against the fault, from the serial side's decisions
    audit: dict | None = None  # DecisionAudit.to_json(): the prefetching side's steps decided again by the config's kernel

    @property
    def audit_agrees(self) -> bool:
        """No step the prefetching side decided disagrees with the config's kernel, and every step was audited."""
        return self.audit is None or (self.audit["disagreements"] == 0 and self.audit["complete"])

    @property
    def equivalent(self) -> bool:
        return self.audit_agrees and all(row["equivalent"] for row in self.rows)

    @property
    def verdict(self) -> str:
        """`equivalent`, `NOT equivalent` (the decision audit disagrees, or some statistic's interval
        lies beyond its margin or its difference test rejects: a difference is shown) or
        `equivalence not shown` (too few samples to tell either)."""
        if self.equivalent:
            return "equivalent"
        if not self.audit_agrees or any(r["verdict"] == "NOT equivalent" for r in self.rows):
            return "NOT equivalent"
        return "equivalence not shown"

    @property
    def reasons(self) -> list[str]:
        """Why the verdict is `NOT equivalent`, one line each (empty otherwise)."""
        out = []
        if not self.audit_agrees and self.audit is not None:
            a = self.audit
            kinds = ", ".join(f"{n} {kind}s" for kind, n in a["disagreements_by_kind"].items())
            out.append(f"the decision audit: the prefetching side's kernel is not the config's ({kinds} differ on the "
                       f"same inputs)" if a["complete"] else
                       f"the decision audit: {a['full_transitions'] + a['early_rejected_steps']} of {a['steps']} steps audited")  # fmt: skip
        out += [f"{r['statistic']}: " + ("a difference is shown (p {:.3g})".format(r["p_difference"]) if r["difference_shown"]
                else f"the interval lies beyond the margin ±{_num(r['margin'])}")
                for r in self.rows if r["verdict"] == "NOT equivalent"]  # fmt: skip
        return out

    def to_json(self) -> dict:
        return {"equivalent": self.equivalent, "verdict": self.verdict, **asdict(self)}

    def table(self) -> str:
        power = (self.power or {}).get("power_by_statistic", {})
        headers = ["statistic", "serial", "prefetch", "difference", f"{1 - 2 * self.alpha_level:.0%} CI", "margin",
                   "p (TOST)", "p (differ)", *(["power vs fault"] if power else []), "verdict"]  # fmt: skip
        body = [
            [
                r["statistic"],
                _num(r["mean_serial"]),
                _num(r["mean_prefetch"]),
                _num(r["difference"], "+"),
                f"[{_num(r['ci_low'], '+')}, {_num(r['ci_high'], '+')}]",
                f"±{_num(r['margin'])} ({r['margin_kind']})",
                f"{r['p_value']:.3g}",
                f"{r['p_difference']:.3g}",
                *([f"{power[r['statistic']]:.2f}" if r["statistic"] in power else "-"] if power else []),
                r["verdict"],
            ]
            for r in self.rows
        ]
        return format_table(headers, body)

    def power_line(self) -> str | None:
        """One line on the power against the fault, or None where it was not measured."""
        if not self.power:
            return None
        p = self.power
        best = max(p["power_by_statistic"], key=p["power_by_statistic"].get)
        needed = p["samples_needed"]
        return (f"power against the fault (length correction dropped): {p['power']:.2f} at {p['samples_per_side']} per side "
                f"(best: {best}); the fault changes {p['flips_per_chain']:.3g} MH decisions per chain here, so no test "
                f"on these samples can exceed {p['power_bound']:.2f}; "
                + (f"about {needed} per side give {p['target']:.0%}" if needed and needed <= FEASIBLE_SAMPLES else
                   f"no feasible run reaches {p['target']:.0%} ({_needed_text(needed)}): on this config the fault barely changes the law"))



def _needed_text(needed: int | None) -> str:
    return "no sample size would" if needed is None else f"about {needed:.2g} samples per side would"


def _num(x: float, sign: str = "") -> str:
    """4 significant digits, without exponents for the small differences a table shows."""
    return f"{x:{sign}.4g}" if x == 0 or abs(x) >= 1e-3 else f"{x:{sign}.5f}"
