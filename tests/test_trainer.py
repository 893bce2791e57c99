"""The shared training loop's own guarantees, apart from any trainer: the data order it promises and
the settings it refuses. (Each trainer's tests check resuming, process counts and ZeRO stages.)"""
import pytest
import torch
from torch.utils.data import DataLoader

from odqa.common.io import InputError
from odqa.common.settings import OptimArgs
from odqa.common.trainer import permuted_batches, shuffled_batches


@pytest.mark.parametrize("n, batch, seed", [(53, 4, 13), (10, 3, 14), (8, 8, 0)])
def test_permuted_batches_are_the_data_loaders_order(n, batch, seed):
    loader = DataLoader(list(range(n)), batch_size=batch, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    assert permuted_batches(n, batch, seed) == [b.tolist() for b in loader]


def test_an_epochs_order_depends_on_seed_and_epoch_alone():
    assert shuffled_batches(20, 3, 0, 1) == shuffled_batches(20, 3, 0, 1) != shuffled_batches(20, 3, 0, 2)
    batches = shuffled_batches(20, 3, 0, 1)
    assert len(batches) == 6 and len({i for b in batches for i in b}) == 18


@pytest.mark.parametrize("bad, message", [
    ({"accumulation": 0}, "--accumulation must be at least 1"),
    ({"eval_steps": -1}, "--eval-steps must be at least 0"),
    ({"backend": "horovod"}, "--backend must be one of accelerate, deepspeed"),
    ({"zero_stage": 3}, "add --backend deepspeed"),
    ({"precision": "fp8"}, "--precision must be auto, bf16 or fp32"),
])
def test_settings_that_cannot_train_are_refused_before_anything_loads(bad, message):
    with pytest.raises(InputError, match=message):
        OptimArgs(**bad)
