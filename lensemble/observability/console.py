"""What third-party libraries may print on the console: quiet by default, everything with ``--verbose``.

The simulation engine (Flower on Ray) is chatty on a plain run:

* Flower's ``flwr`` logger is set to DEBUG by Flower itself. Its own console handler prints INFO
  and above, but opacus (imported by the privacy ledger) calls ``logging.basicConfig`` at import,
  which gives the root logger a handler, so every Flower DEBUG record propagates to it and is
  printed with a timestamp (``12/01/2026 09:21:19:DEBUG:Registered 2 nodes``).
* ``flwr.simulation.run_simulation`` logs a "DEPRECATED FEATURE" banner at WARNING on every call
  (docs/federation.md says why the engine still calls it).
* Ray warns with a ``FutureWarning`` about accelerator environment variables at ``ray.init``.

:func:`configure_console` (called by every CLI command before it imports the library) handles
these without changing what runs: a filter on the ``flwr`` logger drops DEBUG records and the
deprecation banner, ``flwr`` stops propagating to the root handler (no duplicated lines), the
``ray`` loggers keep ERROR and above, and a warnings filter drops Ray's FutureWarning.
``verbose=True`` undoes all of it and turns Flower's console handler down to DEBUG.

Ray actors are separate processes: their Flower logger reads ``FLWR_LOG_LEVEL`` when it is
imported there, so that variable (set here unless the user set it) quiets them too.
"""

from __future__ import annotations

import logging
import os
import warnings

_FILTER_NAME = "lensemble-quiet"


class QuietFilter(logging.Filter):
    """Drops DEBUG records and Flower's "DEPRECATED FEATURE" banner; keeps everything else."""

    def __init__(self):
        super().__init__(_FILTER_NAME)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return False
        msg = record.msg if isinstance(record.msg, str) else str(record.msg)
        return not msg.lstrip().startswith("DEPRECATED FEATURE")


def _remove_quiet_filters(logger: logging.Logger) -> None:
    for f in list(logger.filters):
        if isinstance(f, QuietFilter):
            logger.removeFilter(f)


def configure_console(verbose: bool = False) -> None:
    """Quiet (default) or verbose console for Flower, Ray and Python warnings; idempotent."""
    flwr = logging.getLogger("flwr")
    _remove_quiet_filters(flwr)
    if verbose:
        os.environ.setdefault("FLWR_LOG_LEVEL", "DEBUG")
        flwr.propagate = True
        for name in ("ray", "ray.data", "ray.tune", "ray.serve"):
            logging.getLogger(name).setLevel(logging.NOTSET)
        warnings.simplefilter("default")
        _flwr_console_level(logging.DEBUG)
        return
    # Warnings and errors of Flower's ClientApp actors still reach the console; INFO does not.
    os.environ.setdefault("FLWR_LOG_LEVEL", "WARNING")
    flwr.addFilter(QuietFilter())
    flwr.propagate = False  # Flower has its own console handler; the root one only duplicates
    logging.getLogger("ray").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray(\.|$)")
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def _flwr_console_level(level: int) -> None:
    # Only when Flower is already imported: importing it here would slow every command.
    import sys

    logger_mod = sys.modules.get("flwr.supercore.logger")
    if logger_mod is not None:
        logger_mod.update_console_handler(level=level, timestamps=True)


__all__ = ["QuietFilter", "configure_console"]
