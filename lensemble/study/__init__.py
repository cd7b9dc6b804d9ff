"""The pre-registered study: baselines, the ablation ladder and sweeps, planned, run and reported.

One purpose per module, imports flowing down this list (each module imports only those below it):

* :mod:`~lensemble.study.runner`: :func:`run_study` (plan, register, run what is missing,
  ``jobs`` at a time, report), :func:`run_ablation_ladder`, :func:`lambda_anc_sweep`;
* :mod:`~lensemble.study.report`: ``report.md``, ``report.html`` and the figures;
  :func:`rebuild_report` from a study folder alone;
* :mod:`~lensemble.study.analysis`: the registered claims decided from the run summaries;
* :mod:`~lensemble.study.gap`: gap recovery ρ with its paired bootstrap;
* :mod:`~lensemble.study.registry`: the pre-registration ``registry.yaml`` and its amendments;
* :mod:`~lensemble.study.plan`: arms, sweeps and Hydra override helpers; :func:`plan_study`;
* :mod:`~lensemble.study.spec`: the preset (:class:`StudySpec`), :func:`load_study_spec`;
* :mod:`~lensemble.study.files`: atomic, residency-checked writes and the run summaries.

Scoring one checkpoint is :mod:`lensemble.eval`'s job; the study calls it and never the reverse.
This package module imports nothing, so importing one of its modules loads only what that module
needs; the public functions are exported lazily by the top package (``lensemble.run_study``,
``lensemble.rebuild_report``, ``lensemble.run_ablation_ladder``, ``lensemble.lambda_anc_sweep``,
``lensemble.gap_recovery``).
"""
