"""The Hugging Face Trainer under the guard: a tiny GPT-2 built from a config (no hub download).

A SIGTERM (a real one, to this process) in the middle of ``Trainer.train`` makes the callback save
at that step and stop with exit code 75; a new Trainer resumes from the guard's newest checkpoint
and ends with the weights of an uninterrupted run, bit for bit. An operator checkpoint request is
answered with a checkpoint and an acknowledgement in the progress report.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from runtime_torch_support import callbacks, check_sigterm_stop_and_resume, checkpoints, need

os.environ["HF_HUB_OFFLINE"] = "1"
torch = need("torch")
transformers = need("transformers")

from gpuscaler.runtime import TrainingGuard  # noqa: E402
from gpuscaler.runtime.checkpoint import CheckpointInfo  # noqa: E402
from gpuscaler.runtime.transformers_callback import GuardCallback, payload_path  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 12


def tiny_model() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config)


def data() -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (64, 8), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


class At(transformers.TrainerCallback):  # type: ignore[misc]
    """Does something at one global step (registered before the guard's callback)."""

    def __init__(self, step: int | None, action: Any) -> None:
        self.step, self.action = step, action

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            self.action()


def train(work: Path, *, stop_at: int | None = None, request_at: int | None = None) -> tuple[bytes, GuardCallback]:
    guard = TrainingGuard[Any](work / "ck", load=payload_path, interval_s=None, every_steps=5)
    cb = GuardCallback(guard)
    guard.reporter = _FileProgress(work / "progress.json")
    made = callbacks(cb, At, guard, stop_at=stop_at, request_at=request_at, request_id="req-9")
    args = transformers.TrainingArguments(
        output_dir=str(work / "out"), max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-2,
        save_strategy="no", report_to=[], logging_strategy="no", use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    model = tiny_model()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data(), callbacks=made)
    trainer.train(resume_from_checkpoint=cb.resume_checkpoint())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return flat.numpy().tobytes(), cb


class _FileProgress:
    def __init__(self, path: Path) -> None:
        self.path = path

    def report(self, progress: Any) -> None:
        self.path.write_text(json.dumps(progress.annotations()))

    def checkpointed(self, event: Any, progress: Any) -> None:
        self.report(progress)


def test_trainer_sigterm_checkpoints_stops_75_and_resumes_bitwise_identical(tmp_path: Path) -> None:
    def stopped(cb: GuardCallback, newest: CheckpointInfo) -> None:
        assert (newest.payload_path / "trainer_state.json").exists()
        assert json.loads((tmp_path / "run" / "progress.json").read_text())["gpuscaler.io/runtime-phase"] == "preempted"

    check_sigterm_stop_and_resume(train, tmp_path, stop=7, steps=STEPS, stopped=stopped)


def test_trainer_answers_a_checkpoint_request(tmp_path: Path) -> None:
    _, cb = train(tmp_path, request_at=3)
    assert cb.exit_code == 0
    by_step = checkpoints(tmp_path)
    assert by_step[3].reason == "notice" and by_step[3].request_id == "req-9"
    assert json.loads((tmp_path / "progress.json").read_text())["gpuscaler.io/checkpoint-ack"] == "req-9"
