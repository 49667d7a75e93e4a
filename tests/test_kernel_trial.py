"""kernel_trial.tried_once: a kernel's one trial run leaves the random stream as it was, runs under an evaluation's
inference_mode, and a failure warns once and is remembered."""

from __future__ import annotations

import warnings

import pytest
import torch

from bertrain.kernel_trial import tried_once

CPU = torch.device("cpu")


def test_a_trial_that_draws_random_numbers_leaves_the_generator_as_it_was():
    calls, results = [], {}
    state = torch.get_rng_state()
    assert tried_once(results, "k", CPU, lambda: calls.append(torch.rand(3)), lambda error: "no")
    assert torch.equal(torch.get_rng_state(), state)  # a resumed run's dropout masks stay the uninterrupted run's
    assert tried_once(results, "k", CPU, lambda: calls.append(torch.rand(3)), lambda error: "no")
    assert len(calls) == 1 and results == {"k": True}
    assert torch.equal(torch.rand(3), calls[0])  # the draw the trial made is the run's next one still


@pytest.mark.parametrize("context", [torch.inference_mode, torch.no_grad])
def test_a_trial_builds_a_graph_inside_an_evaluation(context):
    def trial():
        x = torch.ones(3, requires_grad=True)
        (x * 2).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 2.0))

    with context():
        assert tried_once({}, "k", CPU, trial, lambda error: f"failed: {error}")
        assert torch.is_inference_mode_enabled() == (context is torch.inference_mode)  # restored after the trial


def test_a_failed_trial_warns_once_and_is_remembered():
    calls, results = [], {}

    def trial():
        calls.append(1)
        raise RuntimeError("no such instruction on this GPU")

    with pytest.warns(RuntimeWarning, match=r"^kernel k failed \(RuntimeError: no such instruction on this GPU\)$"):
        assert not tried_once(results, "k", CPU, trial, lambda e: f"kernel k failed ({type(e).__name__}: {e})")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not tried_once(results, "k", CPU, trial, lambda e: "again")
    assert calls == [1] and results == {"k": False}
