"""The torch callbacks load data only: a checkpoint that would run code is refused before it runs.

``torch_load`` is ``torch.load(weights_only=True)``; ``dcp_callbacks`` vet a DCP checkpoint's
``.metadata`` (which torch.distributed.checkpoint unpickles as is) with a restricted unpickler.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from runtime_torch_support import RunsCode, need

torch = need("torch")

from gpuscaler.runtime import TrainingGuard, UnsafeCheckpointError  # noqa: E402
from gpuscaler.runtime.checkpoint import CheckpointStore  # noqa: E402
from gpuscaler.runtime.distributed import check_dcp_metadata, dcp_callbacks, torch_load, torch_save  # noqa: E402


def test_torch_load_refuses_a_payload_that_would_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2), "evil": RunsCode(marker)}, tmp_path / "p")
    with pytest.raises(UnsafeCheckpointError, match="weights_only"):
        torch_load(tmp_path / "p")
    assert not marker.exists()
    torch_save({"w": torch.arange(3.0)}, tmp_path / "ok")
    assert torch.equal(torch_load(tmp_path / "ok")["w"], torch.arange(3.0))


def test_dcp_round_trip_and_a_tampered_metadata_is_refused(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    save, load = dcp_callbacks(lambda: {"model": torch.nn.Linear(3, 2).state_dict()})
    guard = TrainingGuard[dict[str, object]](tmp_path / "ck", save=save, load=load, handle_signals=False)
    guard.resume({})
    info = guard.checkpoint({"model": model.state_dict()})
    assert info is not None
    check_dcp_metadata(info.payload_path)  # genuine DCP metadata passes
    back = TrainingGuard[dict[str, object]](tmp_path / "ck", save=save, load=load, handle_signals=False)
    state, step = back.resume({})
    assert step == 0 and torch.equal(state["model"]["weight"], model.weight)  # type: ignore[index]
    marker = tmp_path / "pwned"
    (info.payload_path / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"(posix|os)\.system"):
        check_dcp_metadata(info.payload_path)
    assert not marker.exists()
    # the manifest's checksum catches this edit too; the vetting matters against a writer who
    # rewrites the manifest as well (a checksum is not a signature):
    assert CheckpointStore(tmp_path / "ck", writer=False).latest() is None
    forged = CheckpointStore(tmp_path / "ck").save(1, lambda p: shutil.copytree(info.payload_path, p))
    assert CheckpointStore(tmp_path / "ck", writer=False).verify(forged.path).step == 1  # checksums pass
    victim = TrainingGuard[dict[str, object]](tmp_path / "ck", save=save, load=load, handle_signals=False)
    with pytest.raises(UnsafeCheckpointError, match=r"DCP metadata refers to (posix|os)\.system"):
        victim.resume({})
    assert not marker.exists()
