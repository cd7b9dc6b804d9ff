"""Hash-verified checkpoints (DESIGN.md §8).

A checkpoint is a folder holding ``weights.safetensors`` and ``header.json``. The content hash is
SHA-256 over a domain tag, the structural header fields and the name-sorted tensors (name, dtype,
shape, little-endian bytes), so it does not depend on how safetensors lays the file out. Both files are
written canonically (sorted compact JSON; safetensors' deterministic layout), so loading can demand
that their bytes equal the canonical re-serialisation: together with the hash this makes a single
changed byte anywhere raise :class:`CheckpointIntegrityError`. The schema version is checked first;
nothing is returned before every check passed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from lensemble.artifacts.storage import storage_errors
from lensemble.errors import ArtifactError, CheckpointIntegrityError, SchemaVersionMismatch

SCHEMA_VERSION = 1
_DOMAIN = b"lensemble/checkpoint/v1"
_HASHED_FIELDS = ("schema_version", "kind", "round_index", "parent_hash", "architecture", "config_hash",
                  "extra", "tensors")
_HEADER_KEYS = set(_HASHED_FIELDS) | {"content_hash"}
_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
           torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool"}
WEIGHTS = "weights.safetensors"
HEADER = "header.json"


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: ``tensors`` (name -> CPU tensor) and its ``header`` dict."""

    tensors: dict[str, torch.Tensor]
    header: dict
    path: Path

    @property
    def content_hash(self) -> str:
        return self.header["content_hash"]

    @property
    def round_index(self) -> int:
        return int(self.header["round_index"])

    @property
    def architecture(self) -> dict:
        return self.header["architecture"]


def _canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def content_hash(tensors: dict[str, torch.Tensor], structure: dict) -> str:
    """SHA-256 of the domain tag, the name-sorted tensors and the structural fields.

    Each tensor contributes its UTF-8 name, dtype token, rank, dimensions and its little-endian
    element bytes (bf16 through an int16 view, since numpy has no bfloat16).
    """
    h = hashlib.sha256(_DOMAIN)
    h.update(b"\0tensors\0")
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _DTYPES:
            raise ArtifactError(f"tensor {name!r} has unsupported dtype {t.dtype}")
        token = _DTYPES[t.dtype].encode()
        raw = name.encode()
        h.update(struct.pack("<I", len(raw)) + raw + struct.pack("<B", len(token)) + token)
        h.update(struct.pack("<I", t.dim()) + b"".join(struct.pack("<Q", s) for s in t.shape))
        view = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        arr = view.numpy()
        if arr.dtype.byteorder == ">":  # never on x86/arm, but the hash must not depend on it
            arr = arr.byteswap().view(arr.dtype.newbyteorder("<"))
        h.update(arr.tobytes())
    blob = _canonical_json({k: structure[k] for k in _HASHED_FIELDS})
    h.update(b"\0struct\0" + struct.pack("<I", len(blob)) + blob)
    return h.hexdigest()


def save_checkpoint(
    folder: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    *,
    kind: str,
    round_index: int = 0,
    parent_hash: str | None = None,
    config_hash: str = "",
    architecture: dict | None = None,
    extra: dict | None = None,
) -> str:
    """Write ``tensors`` as a checkpoint folder atomically and return its content hash.

    ``kind`` names what the tensors are (e.g. "world_model", "warmstart"); ``parent_hash`` chains
    this checkpoint to the one it was derived from (None for a root). The folder is written to a
    temporary sibling and renamed, so a crash never leaves a half-written checkpoint.
    """
    folder = Path(folder)
    cpu = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    bad = [k for k, v in cpu.items() if v.dtype not in _DTYPES]
    if bad:
        raise ArtifactError(f"tensors {bad} have unsupported dtypes")
    header = {
        "schema_version": SCHEMA_VERSION,
        "kind": str(kind),
        "round_index": int(round_index),
        "parent_hash": parent_hash,
        "architecture": architecture or {},
        "config_hash": config_hash,
        "extra": extra or {},
        "tensors": {k: {"dtype": _DTYPES[v.dtype], "shape": list(v.shape)} for k, v in sorted(cpu.items())},
    }
    # Round-trip through JSON so what we hash is exactly what a reader will parse.
    header = json.loads(_canonical_json(header))
    digest = content_hash(cpu, header)
    header["content_hash"] = digest
    # a full disk or a read-only folder is named as such (DiskFull / ReadOnlyFolder), not an OSError
    with storage_errors(folder, f"writing checkpoint {folder.name}"):
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            (tmp / WEIGHTS).write_bytes(st_save(cpu))
            (tmp / HEADER).write_bytes(_canonical_json(header) + b"\n")
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a killed process's temporary: remove_stale_temps
            raise
    return digest


def read_header(folder: str | os.PathLike) -> dict:
    """Read and schema-check a checkpoint header without loading its tensors."""
    path = Path(folder) / HEADER
    try:
        raw = path.read_bytes()
        header = json.loads(raw)
    except FileNotFoundError:
        raise ArtifactError(f"no checkpoint at {folder} ({HEADER} missing)",
                            remediation="pass the checkpoint folder (it holds header.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointIntegrityError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("schema_version"), int):
        raise CheckpointIntegrityError(f"{path} has no integer schema_version")
    if header["schema_version"] > SCHEMA_VERSION:
        raise SchemaVersionMismatch(
            f"checkpoint schema {header['schema_version']} is newer than this code's {SCHEMA_VERSION}"
        )
    if set(header) != _HEADER_KEYS:
        raise CheckpointIntegrityError(f"{path} has unexpected fields {sorted(set(header) ^ _HEADER_KEYS)}")
    if raw != _canonical_json(header) + b"\n":
        raise CheckpointIntegrityError(f"{path} is not in canonical form (edited by hand?)")
    return header


def load_checkpoint(folder: str | os.PathLike, *, expected_hash: str | None = None) -> Checkpoint:
    """Load and verify a checkpoint; raise before returning anything if any byte is off."""
    folder = Path(folder)
    header = read_header(folder)
    try:
        blob = (folder / WEIGHTS).read_bytes()
        tensors = st_load(blob)
    except FileNotFoundError:
        raise CheckpointIntegrityError(f"{folder / WEIGHTS} is missing") from None
    except (SafetensorError, ValueError, OSError) as exc:
        raise CheckpointIntegrityError(f"{folder / WEIGHTS} is corrupt: {exc}") from None
    got = content_hash(tensors, header)
    if got != header["content_hash"]:
        raise CheckpointIntegrityError(
            f"content hash mismatch in {folder}: header says {header['content_hash'][:16]}…, "
            f"recomputed {got[:16]}…", expected=header["content_hash"], got=got,
        )
    if st_save(tensors) != blob:
        raise CheckpointIntegrityError(f"{folder / WEIGHTS} differs from its canonical layout")
    listed = {k: {"dtype": _DTYPES[v.dtype], "shape": list(v.shape)} for k, v in tensors.items()}
    if listed != header["tensors"]:
        raise CheckpointIntegrityError(f"{folder} header lists other tensors than the weights hold")
    if expected_hash is not None and got != expected_hash:
        raise CheckpointIntegrityError(
            f"{folder} is checkpoint {got[:16]}…, expected {expected_hash[:16]}…",
            expected=expected_hash, got=got,
        )
    return Checkpoint(tensors=tensors, header=header, path=folder)
