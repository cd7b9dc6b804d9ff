"""Statistics for honest comparisons (DESIGN.md §7, "study discipline").

Everything here works on small arrays of scalars (per-seed or per-episode numbers), never on
tensors, and every random draw comes from a seeded ``numpy.random.Generator`` so an analysis is
reproducible from its inputs and its seed.

What lives where (every public name is re-exported here: import from ``lensemble.eval.stats``):

* :mod:`~lensemble.eval.stats.core`: the :class:`Interval` result type, the ``Direction`` and
  ``Alternative`` literals, and the input checks :func:`as_rng`, :func:`check_alpha`, :func:`as_1d`;
* :mod:`~lensemble.eval.stats.bootstrap`: bootstrap intervals, BCa by default
  (:func:`bootstrap_ci`, :func:`paired_difference`);
* :mod:`~lensemble.eval.stats.paired_tests`: the sign-flip permutation test
  (:func:`paired_permutation_pvalue`) and the registered paired t test (:func:`paired_t_test`);
* :mod:`~lensemble.eval.stats.hierarchical`: episode-level tools over per-seed lists of paired
  episode differences (:func:`hierarchical_bootstrap`, :func:`stratified_permutation_pvalue`);
* :mod:`~lensemble.eval.stats.proportions`: rates and two proportions, independent or paired
  (:func:`wilson_interval`, :func:`compare_proportions`, :func:`paired_table`,
  :func:`mcnemar_exact`, :func:`compare_paired_proportions`);
* :mod:`~lensemble.eval.stats.multiplicity`: Holm's step-down correction (:func:`holm`);
* :mod:`~lensemble.eval.stats.power`: minimum detectable effects and units needed
  (:func:`mde_two_proportions`, :func:`mde_paired`, :func:`units_for_paired`);
* :mod:`~lensemble.eval.stats.verdicts`: the registered decision rules (:func:`verdict`,
  :func:`test_verdict`).

Imports flow one way: every submodule builds on ``core``, and ``bootstrap`` also on
``paired_tests``; nothing else imports a sibling.
"""

from __future__ import annotations

from lensemble.eval.stats.bootstrap import PairedDifference as PairedDifference
from lensemble.eval.stats.bootstrap import bootstrap_ci, paired_difference
from lensemble.eval.stats.core import Alternative as Alternative
from lensemble.eval.stats.core import Direction as Direction
from lensemble.eval.stats.core import Interval as Interval
from lensemble.eval.stats.core import as_1d as as_1d
from lensemble.eval.stats.core import as_rng as as_rng
from lensemble.eval.stats.core import check_alpha as check_alpha
from lensemble.eval.stats.hierarchical import hierarchical_bootstrap, stratified_permutation_pvalue
from lensemble.eval.stats.multiplicity import MultipleTestResult as MultipleTestResult
from lensemble.eval.stats.multiplicity import holm
from lensemble.eval.stats.paired_tests import PairedTTest, paired_permutation_pvalue, paired_t_test
from lensemble.eval.stats.power import mde_paired, mde_two_proportions, units_for_paired
from lensemble.eval.stats.proportions import (
    McNemarResult,
    compare_paired_proportions,
    compare_proportions,
    mcnemar_exact,
    paired_table,
    wilson_interval,
)
from lensemble.eval.stats.proportions import ProportionComparison as ProportionComparison
from lensemble.eval.stats.verdicts import Verdict as Verdict
from lensemble.eval.stats.verdicts import test_verdict, verdict

__all__ = [
    "PairedTTest",
    "bootstrap_ci",
    "compare_paired_proportions",
    "compare_proportions",
    "hierarchical_bootstrap",
    "holm",
    "McNemarResult",
    "mcnemar_exact",
    "mde_paired",
    "mde_two_proportions",
    "paired_table",
    "paired_difference",
    "paired_permutation_pvalue",
    "paired_t_test",
    "stratified_permutation_pvalue",
    "test_verdict",
    "units_for_paired",
    "verdict",
    "wilson_interval",
]
