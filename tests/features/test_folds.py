import random
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.features.dataset import family_folds


def fake_samples(families: list[str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(family=f) for f in families]


def test_family_split_never_leaks_over_random_assignments():
    rng = random.Random(1234)
    for trial in range(300):
        n_families = rng.randint(2, 12)
        families = [f"fam{rng.randrange(n_families)}" for _ in range(rng.randint(2, 80))]
        if len(set(families)) < 2:
            continue
        samples = fake_samples(families)
        k = rng.randint(2, 7)
        folds = family_folds(samples, k, seed=trial)
        assert len(folds) == min(k, len(set(families)))
        tested = np.concatenate([test for _, test in folds])
        assert sorted(tested.tolist()) == list(range(len(samples)))  # every sample held out exactly once
        for train, test in folds:
            assert len(test) > 0
            assert set(train.tolist()) | set(test.tolist()) == set(range(len(samples)))
            assert not {families[i] for i in train} & {families[i] for i in test}
        sizes = Counter(families)
        loads = [len(test) for _, test in folds]
        assert max(loads) - min(loads) <= max(sizes.values())  # greedy balance bound


def test_folds_are_deterministic_for_a_seed():
    samples = fake_samples([f"f{i % 9}" for i in range(50)])
    first = family_folds(samples, 4, seed=7)
    again = family_folds(samples, 4, seed=7)
    assert all(np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]) for a, b in zip(first, again))


def test_folds_are_balanced_by_sample_count():
    samples = fake_samples(["big"] * 30 + ["mid"] * 20 + [f"small{i}" for i in range(30)])
    loads = sorted(len(test) for _, test in family_folds(samples, 3))
    assert loads == [25, 25, 30]


def test_a_single_family_cannot_be_split():
    with pytest.raises(PerfmodelError, match="at least 2 families"):
        family_folds(fake_samples(["a", "a"]), 2)
    with pytest.raises(PerfmodelError, match="k >= 2"):
        family_folds(fake_samples(["a", "b"]), 1)
