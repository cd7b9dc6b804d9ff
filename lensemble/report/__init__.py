"""Reports a user reads: what a run, an evaluation or a study found, in numbers, figures and words.

- :mod:`~lensemble.report.run_eval` — ``lensemble run``'s closing evaluation
  (:func:`~lensemble.report.run_eval.evaluate_run`);
- :mod:`~lensemble.report.baselines` — ``lensemble run --baselines``: the local models, the
  data-parallel twin and gap recovery ρ over the run's tasks;
- :mod:`~lensemble.report.run_report` — ``runs/<name>/report.md`` / ``.html``
  (:func:`~lensemble.report.run_report.write_run_report`);
- :mod:`~lensemble.report.run_summary` — the evaluation's numbers in ``summary.json``;
- :mod:`~lensemble.report.eval_report` — the report of one ``lensemble evaluate``;
- :mod:`~lensemble.report.answer` — the rules that turn counts and intervals into sentences;
- :mod:`~lensemble.report.figures` — matplotlib helpers (Agg backend, guarded saves, panels);
- :mod:`~lensemble.report.watch` — progress of a running federation, read from its run folder.

It sits beside :mod:`lensemble.study` (it reuses the study's ``atomic_write`` and ``render_html``)
and below the CLI. The package namespace exports nothing, so importing it stays cheap.
"""
