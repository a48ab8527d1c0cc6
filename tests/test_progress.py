"""The vectorised bank trainer moves its progress bar while a block of models trains."""
from __future__ import annotations

import pytest
import torch

from bnmem_utils.jobs.config import RunConfig


class _Recorder:
    """A stand-in for tqdm that records the bar's position after every update."""

    instances: list = []

    def __init__(self, *args, total=None, initial=0, **kwargs):
        self.total, self.n, self.positions = total, initial, []
        _Recorder.instances.append(self)

    def update(self, k=1):
        self.n += k
        self.positions.append(self.n)

    def close(self):
        pass


@pytest.mark.slow
def test_bank_bar_moves_during_training(monkeypatch, tmp_path):
    import tqdm.auto

    from bnmem_utils.jobs import bank
    from bnmem_utils.jobs import bank_models as members

    torch.set_num_threads(1)
    monkeypatch.setattr(tqdm.auto, "tqdm", _Recorder)
    _Recorder.instances.clear()
    cfg = RunConfig.bank(dataset="digits", arch="mlp", norm="bn", n_models=4, epochs=3,
                          train_size=120, test_size=60, population_size=40)
    saved_at: list[int] = []
    calls: list[dict] = []

    class Spy(members.MemberTrainer):
        def __call__(self, *args, on_progress=None, **kwargs):
            calls.append({**kwargs, "on_progress": on_progress})
            return super().__call__(*args, on_progress=on_progress, **kwargs)

    spy = Spy(vectorised=True)
    bar_of = lambda: _Recorder.instances[-1]  # noqa: E731
    b = bank.train_bank(cfg, tmp_path, device="cpu", progress=True, trainer=spy,
                        on_model_done=lambda i: saved_at.append(bar_of().n))
    bar = bar_of()
    assert b.n_models == 4 and bar.total == 4 * 3
    assert calls[0]["on_progress"] is not None
    # before the first model of the block was saved, the bar had already moved epoch by epoch
    before = [p for p in bar.positions if p < saved_at[0]]
    assert len(before) >= 2 and 0 < before[0] < bar.total
    assert bar.positions == sorted(bar.positions) and bar.n == bar.total


def test_train_models_calls_on_epoch_after_each_epoch():
    from bnmem_utils.jobs.config import TrainConfig
    from bnmem_utils.models import nets as models
    from bnmem_utils.training import vectorised as vtrain

    torch.manual_seed(0)
    x, y = torch.randn(40, 1, 8, 8), torch.randint(0, 10, (40,))
    nets = [models.build_model("mlp", "bn", in_channels=1, num_classes=10, image_size=8)
            for _ in range(2)]
    seen = []
    vtrain.train_models(nets, x, y, [torch.arange(20), torch.arange(20, 40)],
                        config=TrainConfig(epochs=3, batch_size=10, augment=False), seeds=[0, 1],
                        on_epoch=seen.append)
    assert seen == [1, 2, 3]
