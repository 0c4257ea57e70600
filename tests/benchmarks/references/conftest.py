"""What the reference adapters' tests share: the pinned frameworks fetched once, and a small batch of sampler ratios
whose geometric means, products and tokens fall on either side of the bands the tests use."""

import pytest
import torch

from benchmarks.references import install


def t(rows) -> torch.Tensor:
    """A float64 tensor: the reference checks' dtype."""
    return torch.tensor(rows, dtype=torch.float64)


@pytest.fixture(scope="session")
def frameworks():
    install.install(["verl", "openrlhf", "skyrl", "ms-swift"], log=lambda line: None)


@pytest.fixture
def ratios():
    """(old_logps, sampling_logps, mask) with pi_old / pi_sampler per token: row 0 (1.02, 0.98), row 1 (1.02, 1.02),
    row 2 (1.005, a padded 5.0)."""
    return torch.zeros(3, 2, dtype=torch.float64), -torch.log(t([[1.02, 0.98], [1.02, 1.02], [1.005, 5.0]])), t(
        [[1, 1], [1, 1], [1, 0]])
