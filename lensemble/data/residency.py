"""Data residency: raw silo trajectories stay in their silo's folder.

Every silo folder carries a marker file, ``RESIDENCY.json``::

    {"schema": 1, "silo": 0, "exportable": false, "contents": "raw silo trajectories"}

A path belongs to the silo of the nearest marker above it (symlinks resolved). The writers call
:func:`guard_silo_write` before writing any raw frames, actions or states of silo ``k``; it raises
:class:`~lensemble.errors.ResidencyViolation` unless the destination lies inside silo ``k``'s
marked folder. :func:`guard_export` is the mirror image for code that ships files *out* (reports,
federation messages): it refuses anything inside a non-exportable folder.

ResidencyViolation is fail-closed: never catch it to carry on.
"""

from __future__ import annotations

import json
from pathlib import Path

from lensemble.errors import ResidencyViolation

MARKER = "RESIDENCY.json"
_SCHEMA = 1


def mark_silo_folder(folder: str | Path, silo: int) -> Path:
    """Create ``folder`` (if needed) and mark it as silo ``silo``'s private data folder.

    Re-marking with the same silo id is a no-op; a folder already marked for another silo, or one
    nested inside another silo's folder, raises ResidencyViolation.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    owner = silo_of(folder / MARKER)
    if owner is not None and owner != int(silo):
        raise ResidencyViolation(
            f"{folder} already belongs to silo {owner}; cannot mark it for silo {silo}",
            remediation="give every silo its own folder (data.root/silo_<k>)",
        )
    marker = folder / MARKER
    if not marker.is_file():
        record = {"schema": _SCHEMA, "silo": int(silo), "exportable": False,
                  "contents": "raw silo trajectories"}
        marker.write_text(json.dumps(record, indent=2) + "\n")
    return marker


def _read_marker(marker: Path) -> dict:
    try:
        record = json.loads(marker.read_text())
        int(record["silo"])
        return record
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # An unreadable marker must not turn a silo folder into a public one.
        raise ResidencyViolation(f"unreadable residency marker {marker}: {exc}",
                                 remediation="restore the silo folder's RESIDENCY.json") from None


def find_marker(path: str | Path) -> Path | None:
    """The nearest ``RESIDENCY.json`` at or above ``path``'s folder, or None."""
    p = Path(path).resolve()
    for folder in (p, *p.parents) if p.is_dir() else p.parents:
        marker = folder / MARKER
        if marker.is_file():
            return marker
    return None


def silo_of(path: str | Path) -> int | None:
    """The silo whose folder contains ``path``, or None for non-silo locations."""
    marker = find_marker(path)
    return None if marker is None else int(_read_marker(marker)["silo"])


def guard_silo_write(dest: str | Path, silo: int) -> None:
    """Refuse (ResidencyViolation) to write silo ``silo``'s raw data anywhere but its own folder."""
    owner = silo_of(dest)
    if owner != int(silo):
        where = "outside any silo folder" if owner is None else f"in silo {owner}'s folder"
        raise ResidencyViolation(
            f"refusing to write raw data of silo {silo} to {dest} ({where})",
            remediation=f"write silo {silo}'s shards only under its marked folder (see RESIDENCY.json)",
            silo=int(silo), dest=str(dest),
        )


def guard_export(path: str | Path) -> None:
    """Refuse (ResidencyViolation) to export a file that lies inside a non-exportable silo folder."""
    marker = find_marker(path)
    if marker is not None and not bool(_read_marker(marker).get("exportable", False)):
        raise ResidencyViolation(
            f"{path} is raw data of silo {_read_marker(marker)['silo']} and may not leave it",
            remediation="export only pseudo-gradients, public-probe embeddings and scalar metrics",
        )
