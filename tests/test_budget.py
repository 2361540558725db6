"""The ray budget: rays per step that carry about ``--target_samples`` samples (``training.budget``)."""

import pytest
import torch

from hvd_ngp.config import ConfigError, parse_args
from hvd_ngp.training.budget import RayBudget
from hvd_ngp.training.step import StepResult


def _result(samples: float, candidates: float, valid: float) -> StepResult:
    t = lambda v: torch.tensor(float(v))  # noqa: E731
    return StepResult(t(0.1), t(0.1), t(samples), t(candidates), t(valid), False, None, None)


@pytest.mark.parametrize("fill, rays", [(0.95, 896), (1.05, 1024), (2.0, 1856)])
def test_the_fast_path_aims_at_the_fill_share_of_the_target_within_the_marching_buffer(fill, rays):
    """2^16 samples over 1000 rays (65.5 per ray) and twice as many marched: ``fill`` x 1000 rays, but
    never more than 95% of the marching buffer holds (4 x 2^16 slots / 131 per ray: 1900 rays); in
    multiples of 64."""
    budget = RayBudget(4096, target=1 << 16, max_rays=1 << 20, candidate_factor=4.0, fill=fill)
    assert (budget.sample_capacity, budget.candidate_capacity) == (1 << 16, 1 << 18)
    budget.update(_result(1 << 16, 1 << 17, 1000))
    assert budget.n_rays == rays


def test_counts_in_one_tensor_are_taken_as_they_are():
    """The graphed step hands its three counts as one ``[3]`` tensor (no stack kernel): the same ray count."""
    stats = torch.tensor([0.1, 0.1, float(1 << 16), float(1 << 17), 1000.0])
    apart, together = (RayBudget(4096, target=1 << 16, max_rays=1 << 20, candidate_factor=4.0) for _ in range(2))
    apart.update(_result(1 << 16, 1 << 17, 1000))
    together.update(StepResult(stats[0], stats[1], stats[2], stats[3], stats[4], counts=stats[2:5]))
    assert together.n_rays == apart.n_rays == 896


def test_the_reference_path_aims_at_the_target_itself():
    budget = RayBudget(4096, target=1 << 16, max_rays=1 << 20, fill=1.05)  # no fixed buffers: fill unused
    budget.update(_result(1 << 16, 1 << 17, 1000))
    assert budget.n_rays == 960  # 1000 rays, in multiples of 64


@pytest.mark.parametrize("value", ["0", "-1", "2.5"])
def test_a_sample_fill_out_of_range_is_an_error(value):
    with pytest.raises(ConfigError, match=rf"--sample_fill must be in \(0, 2\], got {float(value)}"):
        parse_args(["--sample_fill", value])
