"""The global a participant keeps from the summary ask for the train ask (federation/global_cache.py)."""

import numpy as np
import pytest
from flwr.app import ArrayRecord

from lensemble.errors import RoundError
from lensemble.federation.flower.records import arrays_to_record, record_to_arrays
from lensemble.federation.flower.transport import global_for
from lensemble.federation.global_cache import (
    DIGEST_KEY,
    HOLDERS_KEY,
    cache_config,
    cached_global,
    global_digest,
    holders,
    keep_global,
    resolve_global,
)


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"b.weight": rng.normal(size=(3, 4)).astype(np.float32), "a.bias": rng.normal(size=4).astype(np.float32),
            "bn.num_batches_tracked": np.asarray(7, dtype=np.int64)}


def test_the_digest_is_the_content_through_a_flower_record():
    a = _arrays()
    wire = record_to_arrays(arrays_to_record(a))
    assert wire["bn.num_batches_tracked"].shape == (1,)  # Flower's 0-d -> (1,), same bytes
    assert global_digest(wire) == global_digest(a)
    changed = dict(a, **{"a.bias": a["a.bias"].copy()})
    changed["a.bias"][2] = np.nextafter(changed["a.bias"][2], np.float32(np.inf))
    assert global_digest(changed) != global_digest(a)
    assert global_digest(dict(a, **{"a.bias": a["a.bias"].astype(np.float64)})) != global_digest(a)
    renamed = {("c.bias" if k == "a.bias" else k): v for k, v in a.items()}
    assert global_digest(renamed) != global_digest(a)


def test_keep_and_load_verified(tmp_path):
    a = _arrays()
    digest = keep_global(tmp_path, 3, a)
    assert digest == global_digest(a)
    got = cached_global(tmp_path, 3, digest)
    assert global_digest(got) == digest and sorted(got) == sorted(a)
    # keeping the next round's replaces it: one global on disk at a time
    d4 = keep_global(tmp_path, 4, _arrays(1))
    assert [p.name for p in tmp_path.glob("global-*")] == [f"global-00004-{d4[:16]}.npz"]
    with pytest.raises(RoundError, match=rf"round 3: .*digest {digest[:16]}.*holds none"):
        cached_global(tmp_path, 3, digest)


def test_a_damaged_kept_global_is_refused_naming_both_digests(tmp_path):
    a, b = _arrays(0), _arrays(1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    da, db = keep_global(tmp_path / "a", 0, a), keep_global(tmp_path / "b", 0, b)
    # the right name, other content
    (tmp_path / "b" / f"global-00000-{db[:16]}.npz").replace(tmp_path / "a" / f"global-00000-{da[:16]}.npz")
    with pytest.raises(RoundError, match=rf"has digest {db[:16]}.*names {da[:16]}"):
        cached_global(tmp_path / "a", 0, da)


def test_resolve_and_holders(tmp_path):
    a = _arrays()
    digest = keep_global(tmp_path, 2, a)
    rc = {"round": 2, **cache_config(digest, ["silo-1", "silo-0"])}
    assert rc[HOLDERS_KEY] == "silo-0,silo-1" and holders(rc) == {"silo-0", "silo-1"}
    assert holders({"round": 2}) == frozenset() and holders({HOLDERS_KEY: "silo-0"}) == frozenset()
    assert global_digest(resolve_global(tmp_path, rc, {})) == digest  # nothing sent: the kept one
    sent = _arrays(5)
    assert resolve_global(tmp_path, rc, sent) is sent  # a full global is used as sent
    assert resolve_global(tmp_path, {"round": 2}, {}) == {}  # no digest: nothing to resolve
    rec = arrays_to_record(a)
    assert len(global_for("silo-0", rc, rec)) == 0 and global_for("silo-2", rc, rec) is rec
    assert global_for(None, rc, rec) is rec  # a node whose participant is unknown gets the global
    assert global_for("silo-0", {DIGEST_KEY: "", HOLDERS_KEY: "silo-0"}, rec) is rec
    assert isinstance(global_for("silo-0", rc, rec), ArrayRecord)
