"""Training a bank member copies nothing to the host per step, checked on the CPU.

On a GPU, every value read back to the host (``.item()``, ``float(t)``, ``bool(t)``, a boolean
mask's ``nonzero``) waits for the device to finish what it was given: one such read per step
keeps the GPU idle between steps. Here each such operation is counted (at the dispatcher,
where a CPU run goes through the same calls as a GPU run) while a bank trains and queries its
members on a pool of one size and on one with four times the steps: the count must not grow
with the steps. A fixed number per epoch (the epoch's loss row) and per call is allowed; so
are reads of tensors that live on the host on a GPU too (a batch plan drawn on the CPU), which
a CPU run cannot tell apart: their number does not grow with the steps either.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bnmem_utils.jobs import bank as B
from bnmem_utils.jobs import bank_models as MB
from bnmem_utils.jobs.config import RunConfig
from bnmem_utils.models.nets import build_model
from bnmem_utils.training.loop import TrainConfig, train_model

#: The operations that read a device's values back to the host (a host sync on a GPU); an
#: index by a boolean mask too (:data:`MASKED`), which a GPU turns into indices first.
READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2",
         "unique_consecutive", "is_nonzero", "equal"}
MASKED = {"index", "index_put", "index_put_", "_index_put_impl_"}


class HostReads(TorchDispatchMode):
    """Counts, by operation, the :data:`READS` dispatched while the mode is on."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in READS:
            self.counts[name] += 1
        elif name in MASKED and any(getattr(i, "dtype", None) == torch.bool for i in args[1]):
            self.counts[f"{name} by a mask"] += 1
        return func(*args, **(kwargs or {}))


def reads_while(fn, *args, **kw) -> dict:
    """The :data:`READS` of ``fn(*args, **kw)``, by operation."""
    with HostReads() as mode:
        fn(*args, **kw)
    return dict(mode.counts)


def test_the_counter_sees_a_host_read():
    x = torch.arange(6.0)
    assert reads_while(lambda: x.sum().item()) == {"_local_scalar_dense": 1}
    assert reads_while(lambda: x[x > 2]) == {"index by a mask": 1}
    assert reads_while(lambda: x.nonzero()) == {"nonzero": 1}
    assert reads_while(lambda: x.index_put_((x > 2,), torch.tensor(0.0))) == {
        "index_put_ by a mask": 1}
    assert reads_while(lambda: x * 2) == {}


def test_train_model_reads_back_per_epoch_not_per_step():
    def run(size: int):
        torch.manual_seed(0)
        x, y = torch.randn(size, 1, 8, 8), torch.randint(0, 10, (size,))
        model = build_model("lenet", "bn", in_channels=1, num_classes=10, image_size=8)
        config = TrainConfig(epochs=2, batch_size=16, lr=0.05, augment=True)
        return lambda: train_model(model, x, y, config=config, seed=0, device="cpu")

    few, many = reads_while(run(64)), reads_while(run(256))            # 4 and 16 steps
    assert few == many and sum(few.values()) <= 4, (few, many)


@pytest.mark.parametrize("vectorised", [False, True], ids=["one_after_another", "vectorised"])
@pytest.mark.parametrize("recipe", ["plain", "augmented_penalised"])
def test_a_bank_member_trains_and_is_queried_without_a_read_per_step(vectorised, recipe):
    counts = []
    for train_size in (96, 96, 384):       # the first: warm-up (layers cache their index maps)
        config = RunConfig.bank(n_models=4, train_size=train_size, test_size=64,
                                population_size=32, epochs=2, batch_size=16,
                                queries=("identity", "mirror"))
        if recipe != "plain":
            config = config.replace(augment=True, penalty={"lam": 1.0, "form": "square"})
        data = MB.prepare_data(config, "cpu")
        keep = B.keep_matrix(4, data.n_samples, config.seed)
        seeds = B.member_seeds(config.seed, 4)
        members = [0, 1] if vectorised else [0]
        counts.append(reads_while(MB.train_members, config, keep, members, data, seeds=seeds,
                                  device="cpu", vectorised=vectorised, block=2))
    few, many = counts[1:]
    assert few == many, f"host reads grow with the steps: {few} at 1x, {many} at 4x"
