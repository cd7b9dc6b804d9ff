"""What third-party libraries may print on the console: quiet by default, everything with ``--verbose``.

Where the noise came from, and what handles it:

* Flower's ``flwr`` logger is set to DEBUG by Flower itself. Its own console handler prints INFO
  and above, but opacus (imported by the privacy ledger) calls ``logging.basicConfig`` at import,
  which gives the root logger a handler; every Flower DEBUG record then propagates to it and is
  printed with a timestamp (``12/01/2026 09:21:19:DEBUG:Registered 2 nodes``). This matters where
  Flower runs inside the CLI's process (``--engine flower-inprocess``).
* Flower's deprecated ``run_simulation`` logged a "DEPRECATED FEATURE" banner at WARNING. No
  engine calls it any more (the ``ray`` engine runs ``flwr run`` against a local simulation
  SuperLink and shows only the ServerApp's ``[lensemble]`` lines and errors, see
  :mod:`lensemble.federation.flower.runtime`); the filter below still drops such a banner should
  any Flower code in this process log one.
* Ray warns with a ``FutureWarning`` about accelerator environment variables at ``ray.init``.

:func:`configure_console` (called by the CLI before a command imports the library) handles these
without changing what runs: a filter on the ``flwr`` logger drops DEBUG records and deprecation
banners, ``flwr`` stops propagating to the root handler (no duplicated lines), the ``ray`` loggers
keep ERROR and above, and warnings filters drop Ray's FutureWarning and DeprecationWarnings.
``verbose=True`` undoes all of it; it also sets ``FLWR_LOG_LEVEL=DEBUG`` (unless the user set it),
which Flower reads at import in this process and in the processes the ``ray`` engine starts.
"""

from __future__ import annotations

import logging
import os
import warnings

_FILTER_NAME = "lensemble-quiet"


class QuietFilter(logging.Filter):
    """Drops DEBUG records and Flower's "DEPRECATED FEATURE" banners; keeps everything else."""

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
        flwr.propagate = False  # Flower's own handler shows everything; the root one would double it
        logging.getLogger("ray").setLevel(logging.NOTSET)
        warnings.simplefilter("default")
        _flwr_console_level(logging.DEBUG)
        return
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
