"""The training step reads nothing back from the device between the batch arriving and the optimizer step.

Every way Python code can read a tensor's value on the host (`.item()`, `.tolist()`, `bool()`, `int()`,
`float()`, `nonzero`, `masked_select`, boolean-mask indexing) is patched to fail while the real loader
(collator-made layouts), train_step and the optimizer step run several steps, for BERT and ALBERT,
padded and unpadded. On CUDA each of these is a device synchronisation.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from bertrain.batch_layout import layout_of
from bertrain.config import DataConfig, ModelConfig, OptimConfig
from bertrain.data.format import open_prepared
from bertrain.data.loader import build_train_loader
from bertrain.model import build_model
from bertrain.train.optim import build_optimizer
from bertrain.train.step import NonFiniteWatch, optimizer_step, train_step
from tests.helpers import OneProcess

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select")


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads():
    """Fail on any read of a tensor's value by the host (see the module docstring)."""
    saved = {name: getattr(torch.Tensor, name) for name in READS + ("__getitem__",)}
    saved_functions = {name: getattr(torch, name) for name in ("nonzero", "masked_select")}

    def refuse(name):
        def method(self, *args, **kwargs):
            raise HostRead(f"Tensor.{name} read a value back to the host")
        return method

    def getitem(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            raise HostRead("boolean-mask indexing (its result's shape needs the mask on the host)")
        return saved["__getitem__"](self, index)

    try:
        for name in READS:
            setattr(torch.Tensor, name, refuse(name))
        torch.Tensor.__getitem__ = getitem
        for name in saved_functions:
            setattr(torch, name, refuse(f"torch.{name}"))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        for name, function in saved_functions.items():
            setattr(torch, name, function)


def test_the_guard_catches_each_kind_of_read():
    t = torch.tensor([1.0, 2.0])
    reads = [lambda: t.sum().item(), lambda: t.tolist(), lambda: bool(t[0]), lambda: int(t[0]),
             lambda: float(t[0]), lambda: t.nonzero(), lambda: t[t > 1], lambda: torch.masked_select(t, t > 1)]
    with no_host_reads():
        for read in reads:
            with pytest.raises(HostRead):
                read()
        t[0], t[1:]  # plain indexing is no read


MODELS = {
    "bert": dict(type="bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "albert": dict(type="albert", embedding_size=16, hidden_size=32, num_hidden_layers=2, num_hidden_groups=1,
                   num_attention_heads=2, intermediate_size=64, hidden_act="gelu_new"),
}


@pytest.mark.parametrize("unpad", ["false", "true"])
@pytest.mark.parametrize("kind, optimizer_name", [("bert", "adamw"), ("albert", "lamb")])  # as the shipped configs
def test_train_steps_read_nothing_back(tiny_data, kind, optimizer_name, unpad):
    prepared = open_prepared(tiny_data)
    data = DataConfig(objective="nsp" if kind == "bert" else "sop", max_seq_length=64)
    config = ModelConfig(vocab_size=prepared.vocab_size, max_position_embeddings=64, unpad=unpad, **MODELS[kind])
    torch.manual_seed(0)
    model = build_model(config).train()
    optimizer = build_optimizer(model, OptimConfig(name=optimizer_name, lr=1e-3), torch.device("cpu"))
    loader = iter(build_train_loader(prepared, data, seed=0, epoch=0, micro_batch_size=4, rank=0, world_size=1))
    watch, before = NonFiniteWatch(), [p.detach().clone() for p in model.parameters()]
    with no_host_reads():
        for _ in range(3):
            result = train_step(model, OneProcess(), [next(loader), next(loader)], max_grad_norm=1.0)
            optimizer_step(optimizer, result, loss_scale=None)
            watch.add(result.finite)
    assert watch.read() == (0, 0)
    metrics = result.read(OneProcess())  # the log-time read, outside the guard
    assert metrics["loss"] > 0 and metrics["grad_norm"] > 0 and 0 <= metrics["mlm_accuracy"] <= 1
    assert result.tokens > 0 and result.predicted > 0 and result.samples == 8
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))  # the updates were applied


@pytest.mark.parametrize("optimizer_name", ["adamw", "lamb"])
def test_a_non_finite_step_is_skipped_without_a_read(tiny_data, optimizer_name):
    prepared = open_prepared(tiny_data)
    config = ModelConfig(vocab_size=prepared.vocab_size, max_position_embeddings=64, **MODELS["bert"])
    model = build_model(config).train()
    optimizer = build_optimizer(model, OptimConfig(name=optimizer_name, lr=1e-3, weight_decay=0.01), torch.device("cpu"))
    loader = iter(build_train_loader(prepared, DataConfig(max_seq_length=64), seed=0, epoch=0, micro_batch_size=4,
                                     rank=0, world_size=1))
    watch = NonFiniteWatch()
    with torch.no_grad():
        model.pooler.weight[0, 0] = float("nan")  # NaN sentence loss and gradients
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with no_host_reads():
        for _ in range(2):
            result = train_step(model, OneProcess(), [next(loader)], max_grad_norm=1.0)
            optimizer_step(optimizer, result, loss_scale=None)
            watch.add(result.finite)
    assert watch.read() == (2, 2) and watch.read() == (0, 2)
    after = model.state_dict()
    for name, value in before.items():  # nothing moved, NaN stayed where it was and spread nowhere
        torch.testing.assert_close(after[name], value, equal_nan=True, atol=0, rtol=0)
    assert not any(s["step"].any() for s in optimizer.state.values())  # Adam's step counts (LAMB's blocks') untouched


def test_layout_from_the_collator_gives_the_same_step_as_one_from_the_tensors(tiny_data):
    """The collator's layout (no reads) and the one built from the tensors (reads) give identical losses."""
    prepared = open_prepared(tiny_data)
    config = ModelConfig(vocab_size=prepared.vocab_size, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, **MODELS["bert"])
    batch = build_train_loader(prepared, DataConfig(max_seq_length=64), seed=0, epoch=0, micro_batch_size=4, rank=0,
                               world_size=1).dataset[0]
    plain = dict(batch, layout=layout_of(batch["attention_mask"], batch["labels"], batch["sentence_label"]))
    for unpad in ("false", "true"):
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(config, unpad=unpad)).train()
        ours = train_step(model, OneProcess(), [batch], max_grad_norm=None).read(OneProcess())
        model.zero_grad(set_to_none=True)
        theirs = train_step(model, OneProcess(), [plain], max_grad_norm=None).read(OneProcess())
        assert ours == theirs
