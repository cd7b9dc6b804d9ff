"""`lensemble run` as a user runs it (a real subprocess, output captured as a log file would be):
it ends with the answer and a report whose numbers are those of summary.json and the EvalReports,
and its console carries no DEBUG line and no deprecation banner."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lensemble.eval.reports import EvalReport
from lensemble.federation.stability import stability_sentence
from lensemble.report.answer import compare_success, paired_outcomes, success_sentence
from lensemble.report.run_report import ARM_LABEL, ARM_TEXT, ARMS, FIGURES

LENSEMBLE = Path(sys.executable).with_name("lensemble")
PNG = b"\x89PNG\r\n\x1a\n"


def lensemble(*args, cwd) -> tuple[int, list[str]]:
    """Run the installed CLI; stdout and stderr merged in order, as in a log file."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("LENSEMBLE_PROGRESS", "FLWR_LOG_LEVEL"):
        env.pop(key, None)
    proc = subprocess.run([str(LENSEMBLE), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)
    return proc.returncode, proc.stdout.splitlines()


def assert_clean(lines):
    bad = [line for line in lines if "DEPRECATED" in line or "DEBUG" in line or "FutureWarning" in line]
    assert not bad, "\n".join(bad)


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run-report")
    args = ["run", "--engine", "inprocess", "--eval-episodes", "2", "experiment=micro",
            f"data.root={root / 'data'}", f"run_dir={root / 'run'}"]
    rc, lines = lensemble(*args, cwd=root)
    assert rc == 0, "\n".join(lines)
    return root, root / "run", lines, args


def table(md: str, header_start: str) -> list[list[str]]:
    """The rows (cells stripped) of the Markdown table whose header row starts with ``header_start``."""
    block = md[md.index(header_start):].split("\n\n")[0].splitlines()
    return [[c.strip() for c in row.strip("|").split("|")] for row in block[2:]]


def test_console_is_clean_and_ends_with_the_answer(micro_run):
    _, run_dir, lines, _ = micro_run
    assert_clean(lines)
    assert lines[-1] == (f"Report: {run_dir / 'report.md'} (also report.html; figures in {run_dir / 'figures'}/).")
    md = (run_dir / "report.md").read_text()
    answer = [line[2:] for line in md.split("## The answer\n\n")[1].split("\n\n")[0].splitlines()]
    assert lines[-4:-1] == answer and len(answer) == 3
    assert lines[-5].startswith("Run `micro`: 2 rounds, 2 participants, engine inprocess; final model ")
    # progress readable in a log: plain lines with an ETA for the warm start and the evaluation
    assert "[lensemble] warm start 0/60, started" in lines
    assert any(line.startswith("[lensemble] warm start 30/60 (50 %)") and "ETA" in line for line in lines)
    assert any(line.startswith("[lensemble] evaluate mpc heldout 2/2 (100 %)") for line in lines)


def test_report_files_and_figures(micro_run):
    _, run_dir, _, _ = micro_run
    md = (run_dir / "report.md").read_text()
    html = (run_dir / "report.html").read_text()
    for name in FIGURES:
        png = run_dir / "figures" / name
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000, name
        assert f"](figures/{name})" in md and f'src="figures/{name}"' in html
    for arm in ARMS:
        assert (run_dir / "eval" / f"{arm}.json").is_file()


def test_success_numbers_are_the_eval_reports(micro_run):
    _, run_dir, lines, _ = micro_run
    md = (run_dir / "report.md").read_text()
    reports = {arm: EvalReport.from_json((run_dir / "eval" / f"{arm}.json").read_text()) for arm in ARMS}
    summary = json.loads((run_dir / "summary.json").read_text())
    # one task set for all three, the checkpoints the summary records
    assert len({r.goal_spec_hash for r in reports.values()}) == 1
    assert reports["federated"].checkpoint_hash == reports["random"].checkpoint_hash == summary["final_hash"]
    assert reports["warmstart"].checkpoint_hash == summary["warmstart_hash"]
    assert reports["random"].planner == "random" and all(r.n_episodes == 2 for r in reports.values())
    assert reports["federated"].goal_spec_hash[:16] in md
    rows = {r[0]: r for r in table(md, "| model | successes |")}
    for arm, rep in reports.items():
        row = rows[ARM_LABEL[arm]]
        lo, hi = rep.success_ci
        assert row[1] == f"{rep.n_successes}/{rep.n_episodes}"
        assert row[2] == f"{100 * rep.success_rate:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"
        assert row[5] == f"`{rep.checkpoint_hash[:12]}…`"
    # the run's arms recorded their episodes on one task set: every comparison is paired over the tasks
    assert "| comparison | difference [95 % Newcombe, paired] | reading |" in md
    comparisons = table(md, "| comparison |")
    for (a, b), row in zip([("federated", "random"), ("federated", "warmstart"), ("warmstart", "random")],
                           comparisons, strict=True):
        pair = paired_outcomes(reports[a], reports[b])
        assert pair is not None
        c = compare_success(a, reports[a].n_successes, 2, b, reports[b].n_successes, 2, outcomes=pair)
        assert c.interval == summary["evaluation"]["comparisons"][f"{a}-vs-{b}"]["interval"] == "newcombe-paired"
        assert row[0] == f"{ARM_LABEL[a]} − {ARM_LABEL[b]}"
        assert row[1] == f"{100 * c.difference:+.1f} points [{100 * c.ci[0]:+.1f}, {100 * c.ci[1]:+.1f}]"
        assert row[2] == {"better": "better", "worse": "worse"}.get(c.reading, "not distinguishable at this n")
    counts = {ARM_TEXT[a]: (r.n_successes, r.n_episodes) for a, r in reports.items()}
    outcomes = {ARM_TEXT[a]: [e.success for e in sorted(r.episodes, key=lambda e: e.index)]
                for a, r in reports.items()}
    expected = success_sentence(ARM_TEXT["federated"], counts, [ARM_TEXT["random"], ARM_TEXT["warmstart"]],
                                outcomes)
    # the answer's first line: the success sentence, then the run's watch for coming apart with its numbers
    watch = stability_sentence(summary["stability"])
    assert watch and f"{expected} {watch}" in lines


def test_round_numbers_are_summary_json(micro_run):
    _, run_dir, _, _ = micro_run
    md = (run_dir / "report.md").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = summary["rounds"]
    assert len(rounds) == summary["rounds_completed"] == 2
    # every gauge/* key the run recorded, each round's value
    gauge = {row[0].strip("`"): row for row in table(md, "| key | meaning |")}
    recorded = {k for r in rounds for k, v in r.items() if k.startswith("gauge/") and isinstance(v, (int, float))}
    assert set(gauge) == recorded and "gauge/drift_angle_deg" in recorded
    for key, row in gauge.items():
        assert row[2:] == [format(float(r[key]), ".4g") for r in rounds], key
    # losses
    for row, r in zip(table(md, "| round | `loss/pred`"), rounds, strict=True):
        assert row[1] == format(r["loss/pred"], ".4g")
    # bytes against per-step synchronisation (H x the round's bytes)
    h = 3  # experiment=micro: federation.inner_steps
    for row, r in zip(table(md, "| round | bytes"), rounds, strict=True):
        assert row[1:3] == [str(r["fed/comm_bytes"]), str(h * r["fed/comm_bytes"])]
    # drift per participant from drift/round-XXXX.json, the global against the warm start from summary.json;
    # the variance-weighted columns lead, the full-space angle and ‖Q − I‖_F come last
    drift_rows = table(md, "| round | who |")
    head = [c.strip() for c in md[md.index("| round | who |"):].splitlines()[0].strip("|").split("|")]
    col = {name: head.index(label) for name, label in (
        ("subspace_angle_deg", "subspace_angle_deg"), ("rotation_share", "rotation_share"),
        ("angle_deg", "angle_deg"), ("residual", "residual"))}
    assert col["subspace_angle_deg"] == 2 and col["rotation_share"] == 3 and col["angle_deg"] > 3
    assert "How to read the columns" in md and "full-space geodesic angle" in md
    for t, r in enumerate(rounds):
        rep = json.loads((run_dir / "drift" / f"round-{t:04d}.json").read_text())
        mine = [row for row in drift_rows if row[0] == str(t + 1)]
        for row in mine[:-1]:
            who = row[1].split(" → ")[0]
            for field, i in col.items():
                value = rep["drift_from_global"][who].get(field)
                assert row[i] == ("–" if value is None else f"{value:.2f}"), field
            assert row[-1] == f"{rep['effective_dim'][who]:.2f}"
        assert mine[-1][1] == "global → warm start"
        assert mine[-1][col["angle_deg"]] == f"{r['gauge/angle_to_warmstart_deg']:.2f}"
        assert len(mine) == len(rep["participants"]) + 1
    assert f"`{summary['final_hash']}`" in md and f"`{summary['config_hash']}`" in md


def test_a_second_run_reuses_rounds_and_evaluation(micro_run):
    root, run_dir, first, args = micro_run
    weights = (run_dir / "rounds" / "round-0001" / "model" / "weights.safetensors").read_bytes()
    rc, lines = lensemble(*args, cwd=root)
    assert rc == 0, "\n".join(lines)
    assert_clean(lines)
    assert any("reused eval/federated.json, eval/warmstart.json, eval/random.json" in line for line in lines)
    assert not any("warm start 0/60" in line or "evaluate mpc" in line for line in lines)
    assert lines[-5:] == first[-5:]
    assert (run_dir / "rounds" / "round-0001" / "model" / "weights.safetensors").read_bytes() == weights


def test_no_eval_still_reports(tmp_path, micro_run):
    root, _, _, _ = micro_run
    rc, lines = lensemble("run", "--engine", "inprocess", "--no-eval", "experiment=micro",
                          f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert rc == 0, "\n".join(lines)
    assert_clean(lines)
    assert lines[-4].startswith("Planning success was not measured (--no-eval)")
    assert not (tmp_path / "run" / "eval").exists()
    md = (tmp_path / "run" / "report.md").read_text()
    assert "Not evaluated (`--no-eval`)." in md and (tmp_path / "run" / "figures" / "overview.png").is_file()


@pytest.mark.slow
def test_flower_on_ray_console(tmp_path):
    """The Ray engine (flwr run on a local simulation SuperLink): no banner, no DEBUG line by
    default; --verbose streams Flower's own lines, DEBUG included."""
    base = ["run", "--no-eval", "experiment=micro", "federation.rounds=1", f"data.root={tmp_path / 'data'}"]
    rc, lines = lensemble(*base, f"run_dir={tmp_path / 'quiet'}", cwd=tmp_path)
    assert rc == 0, "\n".join(lines)
    assert_clean(lines)
    assert not any("Manually terminating" in line for line in lines), "\n".join(lines)
    rc, lines = lensemble(*base, "--verbose", f"run_dir={tmp_path / 'verbose'}", cwd=tmp_path)
    assert rc == 0, "\n".join(lines)
    assert any("DEBUG" in line for line in lines), "\n".join(lines)
    assert re.match(r"Report: .*report\.md", lines[-1])
