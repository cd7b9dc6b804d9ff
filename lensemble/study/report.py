"""The study report: ``report.md``, ``report.html`` and PNG figures, from the analysis alone.

:func:`write_report` takes the dict :func:`lensemble.study.analysis.analyze` returns (which itself
reads only the registry, the plan and the run summaries), so a report can be rebuilt from the
committed ``docs/results/<study>/`` folder without any checkpoint. The HTML is the Markdown
rendered by markdown-it (the same text, tables and images), with a small stylesheet. The figures
are drawn by :mod:`lensemble.study.figures`.

Every file goes into the study folder, which is meant to be shared: each write first checks
that its destination is not inside a silo's private folder (``guard_export``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from lensemble.config import load_config
from lensemble.errors import ConfigError
from lensemble.observability.progress import format_bytes
from lensemble.study.analysis import analyze
from lensemble.study.figures import _ARM_LABEL, FIG_DIR, FIGURES, write_figures
from lensemble.study.files import atomic_write
from lensemble.study.plan import LADDER
from lensemble.study.registry import diff_paths, load_registry
from lensemble.study.tables import achieved_precision, communication_rows, paired_vs_ladder, rho_table_lines

# ================================================================================== formatting

def replicate_lines(arms: dict, design: dict) -> list[str]:
    """The training replicates of the ladder's arms (only in a study with replicates, docs/study.md)."""
    rows = [(arm, st["replicates"]) for arm, st in arms.items() if st.get("replicates")]
    if not rows:
        return []
    reps = (design.get("replicates") or {}).get("per_seed_and_arm", "?")
    out = ["", f"Training replicates ({reps} per seed and arm; another batch order each): a seed's value above is "
           "the mean of its replicates, and the success and ρ intervals resample seeds, then replicates, then "
           "tasks. Between-replicate SD of success within a seed, pooled over seeds (raw / binomial part "
           "removed / 80 % upper end):", "",
           "| arm | replicates per seed | success of each replicate, per seed | between-replicate SD |",
           "|---|---|---|---|"]
    for arm, r in rows:
        sp = r.get("spread") or {}
        per = "; ".join(f"s{k}: " + ", ".join(_pct(x) for x in v) for k, v in (r.get("per_seed") or {}).items())
        sd = " / ".join(_num(sp.get(k)) if sp.get(k) is not None else "–"
                        for k in ("sd_raw", "sd_moments", "sd_raw_upper80"))
        out.append(f"| {_ARM_LABEL.get(arm, arm)} | {', '.join(str(v) for v in (r.get('n') or {}).values())} | "
                   f"{_esc(per)} | {sd} |")
    return out

def _num(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, int):
        return str(x)
    if abs(x) < 1e-12:  # a mean of differences that cancel exactly prints as 0, not as rounding noise (2.8e-17)
        x = 0.0
    return f"{x:.{digits}g}"


def _ci(ci, digits: int = 3) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    return f" [{_num(ci[0], digits)}, {_num(ci[1], digits)}]"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _stat(s: dict | None, digits: int = 3) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return _num(s["mean"], digits) + _ci(s.get("ci"), digits)


def _verdict(label: str) -> str:
    return f"**{label}**"


def _comp_numbers(r: dict) -> str:
    unit = {"degrees": "°", "rate": "", "dimensions": " dims"}.get(r.get("unit", ""), "")
    if r.get("estimate") is None:
        return f"{r['id']}: not measured ({r.get('missing', 'missing')})"
    p = f", p(no effect) = {_num(r.get('p_value'))}" if r.get("p_value") is not None else ""
    pa = f" [Holm {_num(r.get('p_adjusted'))}]" if r.get("p_adjusted") is not None else ""
    pf = f", p(≥ δ) = {_num(r.get('p_falsify'))}" if r.get("p_falsify") is not None else ""
    pfa = f" [Holm {_num(r.get('p_falsify_adjusted'))}]" if r.get("p_falsify_adjusted") is not None else ""
    pairing = f", paired by {r['pairing']}" if r.get("pairing") else ""
    return (f"{r['id']}: {r['treatment']} − {r['control']} = {r['estimate']:+.3g}{unit}{_ci(r['ci'])}"
            f" (δ = {r['delta']}{unit}, n = {r['n']}{p}{pa}{pf}{pfa}{pairing})")


def _rho_numbers(res: dict) -> str:
    if not res:
        return "–"
    ref = res.get("reference", "central")
    if res.get("rho") is None:
        den = res.get("denominator")
        tail = f"; S_{ref} − S_local = {_num(den)}{_ci(res.get('denominator_ci'))}" if den is not None else ""
        return f"ρ undefined (n = {res.get('n', 0)}){tail}"
    return (f"ρ = {res['rho']:.3g}{_ci(res.get('rho_ci'))} vs threshold {res['threshold']} "
            f"(n = {res['n']}; gap S_{ref} − S_local = {_num(res.get('denominator'))}{_ci(res.get('denominator_ci'))})")


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _privacy_cost(group: dict) -> list[str]:
    """Report lines with the ε each DP arm of a sweep group spent (``dp/epsilon`` after its last
    round, over seeds) and the mechanism's parameters from the config the point selects; none for
    a group without DP."""
    out = []
    for value, cell in group.items():
        for arm, s in cell["arms"].items():
            eps = (s.get("curves") or {}).get("dp/epsilon")
            if not eps or not eps["mean"] or not eps["mean"][-1]:
                continue
            try:
                priv = load_config([f"{cell['key']}={value}"]).privacy
                mech = (f" at δ = {priv.delta:g} (Gaussian noise σ = {priv.noise_multiplier:g} × clip norm "
                        f"{priv.clip_norm:g} on each update; target ε {_num(priv.target_epsilon)})")
            except ConfigError:
                mech = ""
            out.append(f"Privacy cost, {value} / {_ARM_LABEL.get(arm, arm)}: ε = {_num(eps['mean'][-1])} "
                       f"(range {_num(eps['low'][-1])}–{_num(eps['high'][-1])} over {eps['n'][-1]} seeds) after "
                       f"{len(eps['mean'])} rounds{mech}; the accountant bounds the silo that may have released most "
                       "(docs/federation.md, Privacy). Its cost in success: the difference to the ladder's same arm, above.")
    return ["", *out] if out else []


def _short(value, limit: int = 90) -> str:
    text = _esc(value if isinstance(value, str) else json.dumps(value, default=str))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _amendment_changes(changes: list[dict], shown: int = 8) -> str:
    """The registry paths an amendment changed, leaf by leaf, each value cut to a readable length."""
    leaves = [leaf for c in changes for leaf in diff_paths(c.get("old"), c.get("new"), c["path"], into_lists=True)]
    text = "; ".join(f"`{x['path']}`: {_short(x['old'])} → {_short(x['new'])}" for x in leaves[:shown])
    return text + (f"; … {len(leaves) - shown} more" if len(leaves) > shown else "")


# ================================================================================== markdown
def _same_runs(groups: dict, group: str, point: str, arm: str) -> bool:
    """Whether the sweep point's arm *is* the ladder's on every seed it has (a sweep value equal to
    the ladder's own setting plans no new run)."""
    ladder = ((groups.get(LADDER) or {}).get("default") or {}).get("runs", {}).get(arm) or {}
    mine = (((groups.get(group) or {}).get(point) or {}).get("runs") or {}).get(arm) or {}
    return bool(mine) and all(ladder.get(s) == ids for s, ids in mine.items())


def render_markdown(analysis: dict, registry: dict, figures: list[str]) -> str:
    st = analysis["status"]
    an = registry["analysis"]
    design = registry["design"]
    lines = [f"# Study `{analysis['study']}`: claims, ablation ladder and sweeps", ""]
    stopped = st.get("stopped") if not st["complete"] else None
    state = ("complete" if st["complete"] else
             f"**stopped** at {st['done']} of {st['planned']} runs" if stopped else
             f"**partial**: {st['done']} of {st['planned']} runs done")
    lines += [
        f"Generated {analysis['generated_at']} from the run summaries in `runs/` (registry "
        f"`{(analysis.get('registry_hash') or '')[:12]}`, {len(analysis.get('amendments', []))} amendment(s)). "
        f"Status: {state}.",
        "",
    ]
    if stopped:
        lines += [f"> **Stopped** (registry amendment): {_esc(stopped)} Comparisons that needed the "
                  f"{st['planned'] - st['done']} runs not run are inconclusive.", ""]
    elif not st["complete"]:
        lines += ["> Missing runs make their comparisons inconclusive; rerun the same command to finish "
                  "(finished runs are skipped).", ""]
    if registry.get("description"):
        lines += [registry["description"], ""]
    superseded = analysis.get("superseded") or []
    if superseded:
        lines += ["> **Superseded by design.** This study ran before the instruments were corrected "
                  "(docs/study.md, \"Re-analysis of the CPU study\"):", ">"]
        lines += [f"> - {_esc(x)}" for x in superseded]
        lines += [">", "> Its numbers are recomputed below under the corrected rules where its summaries "
                  "allow; what they cannot support is said in the notes.", ""]
    if analysis.get("notes"):
        lines += ["Analysis notes:", ""] + [f"- {_esc(x)}" for x in analysis["notes"]] + [""]

    lines += ["## Claims", "",
              "Each claim was registered in `registry.yaml` before any run. Every comparison is decided by two "
              "one-sided paired t tests over seeds, Holm-adjusted over every component of its family: *confirmed* "
              "when H0 'no effect' is rejected at α and the estimate reaches δ; *falsified* when H0 'an effect of δ "
              "or more' is rejected at α; *inconclusive* otherwise. A claim with several parts (intersection-union) "
              "is confirmed when every part is, falsified when any part is. Intervals: 95% Student t over seeds. "
              "Achieved MDE: what the registered test could detect with 80 % power at the first Holm step, from "
              "the comparison's own per-seed SD and n; an inconclusive part whose interval is narrower than 2δ "
              "still says that no effect as large as δ was present.", "",
              "| claim | verdict | deciding numbers | achieved MDE; 95 % interval width against 2δ | why |",
              "|---|---|---|---|---|"]
    holm_k = max(len(an.get("confirmatory_components") or []), 1)
    side = 1.0 if an.get("alternative", "one-sided") == "one-sided" else 0.5
    a_first = side * an["alpha"] / holm_k

    def precision(r: dict) -> str:
        q = achieved_precision(r, alpha=a_first, power=an["power"])
        unit = {"degrees": "°", "rate": "", "dimensions": " dims"}.get(r.get("unit", ""), "")
        if q["achieved_mde"] is None and q["ci_width"] is None:
            return f"{r['id']}: –"
        flag = "" if q["narrower_than_2delta"] is None else (" < 2δ" if q["narrower_than_2delta"] else " ≥ 2δ")
        return (f"{r['id']}: MDE {_num(q['achieved_mde'])}{unit}; width {_num(q['ci_width'])}{unit}{flag} "
                f"(2δ = {_num(2 * r['delta'])}{unit})")

    for c in analysis["claims"]:
        prec = "–"
        if c["id"] in ("C1", "C2"):
            nums = "<br>".join(_esc(_comp_numbers(r)) for r in c["components"])
            prec = "<br>".join(_esc(precision(r)) for r in c["components"])
        elif c["id"] == "C3":
            nums = _esc(_rho_numbers(c.get("rho")))
        else:
            pts = c.get("points", [])
            nums = "<br>".join(
                _esc(f"{p['sweep']}={p['value']}: C2 {p['C2']['label'] if p.get('C2') else '–'}, "
                     f"C3 {p['C3']['label']} ({_rho_numbers(p['C3'])})") for p in pts) or "no sweep points"
        if c["id"] == "C3" and None not in ((c.get("rho") or {}).get("rho_ci") or [None]):
            lo, hi = c["rho"]["rho_ci"]
            prec = _esc(f"ρ interval width {_num(hi - lo)}")
        lines.append(f"| {c['id']} {_esc(c['title'])} | {_verdict(c['label'])} | {nums} | {prec} | {_esc(c['reason'])} |")
    lines.append("")
    lines += rho_table_lines(analysis.get("rho_table") or [], lambda a: _ARM_LABEL.get(a, a), _rho_numbers)

    arms = analysis["groups"].get(LADDER, {}).get("default", {}).get("arms", {})
    lines += ["## Ablation ladder and baselines", "",
              f"Seeds {design['seeds']}; {design['evaluation']['episodes']} evaluation episodes per model "
              f"({design['evaluation']['split']} split, {design['evaluation']['planner']} "
              f"{design['evaluation']['num_samples']}×{design['evaluation']['iterations']}). "
              f"Step budget: {design['step_budget'].get('statement', '')} "
              f"({design['step_budget'].get('rounds')} rounds × {design['step_budget'].get('inner_steps')} steps = "
              f"{design['step_budget'].get('participant_steps')} per participant; centralized "
              f"{design['step_budget'].get('central_steps')}).", "",
              "| arm | seeds | success (mean, 95% CI over seeds) | pooled success [Wilson] | route-valid success | "
              "final drift ° | mean drift ° | final subspace drift ° | mean subspace drift ° | effective dim | "
              "latent std | probe R² | pixel-PCA R² |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, s in arms.items():
        pooled = s.get("pooled_success")
        pooled_txt = (f"{pooled['successes']}/{pooled['episodes']} = {_pct(pooled['rate'])} "
                      f"[{_pct(pooled['wilson'][0])}, {_pct(pooled['wilson'][1])}]") if pooled else "–"
        rv = _stat(s.get("route_valid_success")) if (s.get("route_valid_success") or {}).get("mean") is not None \
            else "not recorded"
        lines.append(f"| {_ARM_LABEL.get(arm, arm)} | {s['n_seeds']} | {_stat(s.get('success'))} | {pooled_txt} | {rv} | "
                     f"{_stat(s.get('drift_final'))} | {_stat(s.get('drift_mean'))} | "
                     f"{_stat(s.get('drift_subspace_final'))} | {_stat(s.get('drift_subspace_mean'))} | "
                     f"{_stat(s.get('effective_dim'))} | "
                     f"{_stat(s.get('latent_std'))} | {_stat(s.get('probe_r2'))} | {_stat(s.get('pixel_pca_r2'))} |")
        if arm == "local" and s.get("success_best"):
            lines.append(f"| {_ARM_LABEL['local_best']} | {s['n_seeds']} | {_stat(s.get('success_best'))} | – | – | – | – "
                         f"| – | – | – | – | – | – |")
    lines += replicate_lines(arms, design)
    lines += ["", "Probe R²: the linear position probe on the arm's latents; pixel-PCA R²: the same probe on a "
              "64-component PCA of the raw pixels of the same frames (a latent space below it has discarded "
              "position; docs/evaluation.md).", "",
              "Final / mean drift: `gauge/drift_angle_deg`, the geodesic angle of the rotation mapping each "
              "participant's *unaligned* probe frame onto the new global model's, averaged over participants "
              "(final round / all rounds). For the backstop rung this includes the rotation the backstop removes "
              "before averaging; the between-participant angle and what the backstop leaves are in the figure "
              "below.", ""]
    for fig, cap in (("drift_rounds.png", "Frame drift against round for each rung"),
                     ("success.png", "Success per rung and baseline"),
                     ("effective_dim.png", "Effective dimension"), ("latent_std.png", "Latent standard deviation")):
        lines += [f"![{cap}]({FIG_DIR}/{fig})", ""]

    homes = analysis.get("home_split")
    if homes:
        lines += ["### Success on each silo's tasks", "",
                  "Every held-out task belongs to the silo whose home values hold its factor value. A local model "
                  "on its own silo's tasks against the other silos'; every other arm on its worst and its best "
                  "silo's tasks (mean over seeds; descriptive, `lensemble.study.homes`).", "",
                  "| arm | seeds | split | success |", "|---|---|---|---|"]
        for arm, h in homes.items():
            lines.append(f"| {_ARM_LABEL.get(arm, arm)} | {h['n_seeds']} | {h['labels'][0]} / {h['labels'][1]} | "
                         f"{_num(h['values'][0])} / {_num(h['values'][1])} |")
        lines.append("")

    if analysis["ladder_comparisons"]:
        lines += ["### Each rung against naive FedAvg (Holm across the ladder)", "",
                  "| comparison | estimate [95% CI] | n | pairing | p (no effect) | Holm | p (≥ δ) | Holm | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in analysis["ladder_comparisons"]:
            est = "–" if r.get("estimate") is None else f"{r['estimate']:+.3g}{_ci(r['ci'])}"
            lines.append(f"| {r['id']} ({r['metric']}, {r['direction']} ≥ {r['delta']}) | {est} | {r.get('n', 0)} | "
                         f"{r.get('pairing', '–')} | {_num(r.get('p_value'))} | {_num(r.get('p_adjusted'))} | "
                         f"{_num(r.get('p_falsify'))} | {_num(r.get('p_falsify_adjusted'))} | {r['label']} |")
        lines.append("")

    sweeps = {g: v for g, v in analysis["groups"].items() if g != LADDER}
    if sweeps:
        lines += ["## Sweeps", ""]
    for g, group in sweeps.items():
        key = next(iter(group.values()))["key"]
        lines += [f"### {g} (`{key}`)", "",
                  "| value | arm | seeds | success | final drift ° | final subspace drift ° | effective dim |",
                  "|---|---|---|---|---|---|---|"]
        for value, cell in group.items():
            for arm, s in cell["arms"].items():
                lines.append(f"| {value} | {_ARM_LABEL.get(arm, arm)} | {s['n_seeds']} | {_stat(s.get('success'))} | "
                             f"{_stat(s.get('drift_final'))} | {_stat(s.get('drift_subspace_final'))} | "
                             f"{_stat(s.get('effective_dim'))} |")
        vs = [(value, arm, paired_vs_ladder(analysis["groups"], g, value, arm)) for value, cell in group.items()
              for arm in cell["arms"]]
        vs = [(v, a, r) for v, a, r in vs if r and r["n"] and not _same_runs(analysis["groups"], g, v, a)]
        if vs:
            lines += ["", "Against the ladder's same arm on the same seeds (success, per-seed paired difference, "
                      "95 % t interval; descriptive, no multiplicity correction):", "",
                      "| value | arm | seeds | point − ladder |", "|---|---|---|---|"]
            lines += [f"| {v} | {_ARM_LABEL.get(a, a)} | {r['n']} | {_num(r['mean'])}{_ci(r['ci'])} |" for v, a, r in vs]
        lines += _privacy_cost(group)
        rows = analysis["sweeps"].get(g, [])
        if any(r.get("rho") and r["rho"].get("n") for r in rows):
            lines += ["", "| value | ρ | verdict vs threshold |", "|---|---|---|"]
            for r in rows:
                lines.append(f"| {r['value']} | {_esc(_rho_numbers(r['rho']))} | {r['rho']['label']} |")
        lines.append("")
        if g == "severity":
            lines += [f"![Gap recovery against severity]({FIG_DIR}/rho_severity.png)", ""]
        if g == "lambda_anc":
            lines += [f"![The λ_anc sweep]({FIG_DIR}/lambda_anc.png)", ""]
        else:
            lines += [f"![{g}]({FIG_DIR}/sweep_{g}.png)", ""]

    comm = communication_rows(analysis["groups"])
    if comm:
        lines += ["## Communication", "",
                  "Bytes one federated run put on the wire (`fed/comm_bytes` summed over its rounds, mean over "
                  "seeds), against per-step synchronisation: the same payload exchanged after each of the "
                  "participant's rounds × H steps (H × the run's bytes). The last column compares with per-step "
                  "synchronisation of the ladder's naive float32 payload (same model and participant count only).", "",
                  "| group | value | arm | H | rounds | participants | bytes per round | bytes per run | "
                  "per-step synchronisation | reduction | vs float32 per-step | success |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in comm:
            lines.append(f"| {r['group']} | {r['point']} | {_ARM_LABEL.get(r['arm'], r['arm'])} | {r['inner_steps']} | "
                         f"{r['rounds']} | {r['participants']} | {format_bytes(r['bytes_per_round'])} | "
                         f"{format_bytes(r['total'])} | {format_bytes(r['per_step_sync'])} | "
                         f"{_num(r['reduction'])}× | {'–' if r['reduction_vs_float32'] is None else _num(r['reduction_vs_float32']) + '×'} | "
                         f"{_num(r['success'])} |")
        lines.append("")

    pw = an["power_analysis"]
    now = analysis.get("power_at_analysis") or {}
    comps = now.get("components") or pw["components"]
    lines += ["## Registry, power and minimum detectable effects", "",
              f"α = {an['alpha']} ({an['alternative']}), power {an['power']}, unit = seed, {pw['n_seeds']} seeds × "
              f"{pw['n_episodes_per_arm_and_seed']} episodes per arm. Pairing: {design['pairing']}. "
              f"Warm start: {design['warmstart']['scope']}-level, public data only, "
              f"{design['warmstart']['steps']} steps. Holm families: confirmatory {an['confirmatory_family']}; "
              f"ladder {len(an['ladder_family'])} comparisons.", "",
              f"Registered test: {_esc(an.get('paired_test', ''))}. "
              + ("" if now.get("source") == "registry" else
                 f"The power below is that of the corrected test, {_esc(now.get('source', ''))}."), "",
              "| metric | δ (registered) | SD of paired difference (assumed) | power at δ (first Holm step) | "
              "MDE at α | MDE at the first Holm step | seeds needed for δ | method |", "|---|---|---|---|---|---|---|---|"]
    for m, c in comps.items():
        lines.append(f"| {m} ({c['unit']}) | {c['delta']} | {_num(c['sd_paired_difference'])} | "
                     f"{_num(c.get('power_at_delta_first_holm_step'))} | {_num(c['mde_at_alpha'])} | "
                     f"{_num(c['mde_at_first_holm_step'])} | {c['seeds_for_delta'] or '–'} | {_esc(c.get('method', 'normal/t approximation'))} |")
    fams = {k: v for k, v in now.items() if isinstance(v, dict) and "size" in v}
    if fams:
        lines += ["", "| family | hypotheses | first Holm threshold | can confirm | powered at δ | MDE at the first step |",
                  "|---|---|---|---|---|---|"]
        for name, f in fams.items():
            mdes = ", ".join(f"{k} {_num(v)}" for k, v in f["mde_first_holm_step"].items())
            lines.append(f"| {name} | {f['size']} | {_num(f['first_holm_threshold'])} | {'yes' if f['can_confirm'] else 'no'} | "
                         f"{', '.join(f['powered_at_delta']) or 'none'} | {mdes} |")
    lines += ["", f"Success MDE with episodes pooled over seeds (no seed variance, a floor): "
              f"{_num(comps['success'].get('mde_episode_floor'))}. Simulated coverage, level and power of the "
              "analysis: `benchmarks/study_stats_simulation.py` (docs/study.md).", ""]
    if pw.get("limitations"):
        lines += ["Known limitations of the design, registered before the runs:", ""]
        lines += [f"- {_esc(x)}" for x in pw["limitations"]]
        lines.append("")

    if analysis.get("amendments"):
        lines += ["## Amendments to the registry", ""]
        for a in analysis["amendments"]:
            lines.append(f"- {a['at']}, after {a['runs_done']} runs: {_esc(a['reason'])} "
                         f"({_amendment_changes(a.get('changes', []))})")
        lines.append("")

    cost = analysis.get("cost", {})
    lines += ["## Runs and cost", "",
              f"{st['done']} of {st['planned']} runs done; {cost.get('total_seconds', 0) / 3600:.2f} h of recorded "
              "run time.", "", "| kind:arm | runs | mean seconds per run |", "|---|---|---|"]
    for k, v in cost.get("per_run_seconds", {}).items():
        lines.append(f"| {k} | {v['n']} | {v['mean']} |")
    if st.get("failed"):
        lines += ["", "Failed runs (retried on the next call):", ""]
        lines += [f"- `{k}`: {_esc(v)}" for k, v in st["failed"].items()]
    lines += ["", "## Reproduce", "",
              "```bash",
              f"lensemble study --name {analysis['study']}            # run what is missing, then this report",
              f"lensemble study --name {analysis['study']} --report-only   # rebuild from docs/results alone",
              "```", "",
              "Each `runs/<run_id>.json` holds the run's overrides, config/manifest/checkpoint/warm-start/probe "
              "hashes, the code commit, per-round metrics and its EvalReport; `analysis.json` holds every number "
              "above.", ""]
    prov = analysis.get("provenance") or {}
    if prov:
        lines += ["| provenance | value | runs |", "|---|---|---|"]
        for label, key in (("code commit", "git_sha"), ("warm start", "warmstart_hash"), ("probe", "probe_hash")):
            for value, n in (prov.get(key) or {}).items():
                lines.append(f"| {label} | `{value}` | {n} |")
        lines.append("")
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;
vertical-align:top}th{background:#f2f2f2}img{max-width:100%}code{background:#f4f4f4;padding:1px 3px}
pre{background:#f4f4f4;padding:0.8em}blockquote{border-left:4px solid #e0a000;margin:0;padding:0.3em 1em}"""


def render_html(markdown_text: str, title: str) -> str:
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown_text)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{_CSS}</style></head><body>\n{body}</body></html>\n")


def write_report(study_dir: str | Path, analysis: dict) -> Path:
    """Write figures, ``report.md`` and ``report.html`` into the study folder; return report.md."""
    study_dir = Path(study_dir)
    registry = load_registry(study_dir)
    figures = write_figures(study_dir, analysis)
    md = render_markdown(analysis, registry, figures)
    atomic_write(study_dir / "report.md", md)
    atomic_write(study_dir / "report.html", render_html(md, f"Study {analysis['study']}"))
    return study_dir / "report.md"


def rebuild_report(study_dir: str | Path, *, progress: bool = True) -> tuple[dict, Path]:
    """Analysis and report from a study folder alone (registry, plan and run summaries); returns
    (the analysis dict, the path of report.md)."""
    study_dir = Path(study_dir)
    for need in ("registry.yaml", "plan.json"):
        if not (study_dir / need).exists():
            raise ConfigError(f"{study_dir} holds no {need}", remediation="run the study first")
    analysis = analyze(study_dir)
    report = write_report(study_dir, analysis)
    if progress:
        Console(stderr=True).print(f"report: {report}")
    return analysis, report


__all__ = ["FIGURES", "rebuild_report"]
