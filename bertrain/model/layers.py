"""Blocks BERT and ALBERT share. Shapes: B batch, T length, H hidden, E embedding (E = H for BERT),
I intermediate, V vocabulary, N predicted positions."""

from __future__ import annotations

import collections
import contextlib
import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertrain.batch_layout import Packing, buckets_of
from bertrain.model.weight_cast import CastCopies, ParameterCopies, half_copies


def activation(name: str):
    """The feed-forward activation by its transformers name."""
    if name == "gelu":  # exact (erf) GELU, BERT
        return F.gelu
    if name == "gelu_new":  # tanh approximation, ALBERT / Google's BERT code
        return functools.partial(F.gelu, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unknown activation {name!r}")


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    # Skipping the call at p = 0 saves a full-size copy per sublayer in training.
    return F.dropout(x, p, training) if training and p > 0 else x


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose output under autocast is in autocast's half type, its statistics still in float32 (as
    Megatron-LM's): the residual stream between sublayers then moves half the bytes and no linear casts its input.
    float32_residual: float32 output, as CUDA's autocast (so transformers) gives. Without autocast: nn.LayerNorm."""

    def __init__(self, size: int, eps: float, float32_residual: bool = False):
        super().__init__(size, eps=eps)
        self.float32_residual = float32_residual

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, dropout_prob: float = 0.0) -> torch.Tensor:
        """LN(x), or LN(residual + dropout(x)) when a residual is given. weight, bias: this module's parameters as
        EncoderLayer.weights gives them (None: the parameters)."""
        weight = self.weight if weight is None else weight
        bias = self.bias if bias is None else bias
        if residual is not None:
            x = residual + dropout(x, dropout_prob, self.training)
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)
        half = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):  # autocast's own choice differs by device (CPU keeps the input's)
            if self.float32_residual or x.dtype != half:  # a float32 input (the embeddings' sum) is normalized as is
                y = F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)
                return y if self.float32_residual else y.to(half)
            return F.layer_norm(x, self.normalized_shape, weight.to(half), bias.to(half), self.eps)


class Embeddings(nn.Module):
    """Word + learned absolute position + token type embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, size: int, max_positions: int, type_vocab_size: int,
                 layer_norm_eps: float, dropout_prob: float, float32_residual: bool = False):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, size)
        self.position_embeddings = nn.Embedding(max_positions, size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, size)
        self.layer_norm = LayerNorm(size, layer_norm_eps, float32_residual)
        self.dropout_prob = dropout_prob

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, sparse_grad: bool = False,
                packing: Packing | None = None) -> torch.Tensor:
        """[B, T] ids → [B, T, E], or the packed tokens only → [N, E] (same sums in the same order).
        sparse_grad: the word-embedding gradient as rows instead of a dense [V, E] tensor (see ForwardPlan)."""
        width = input_ids.shape[1] if packing is None else packing.width
        if width > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {width} exceeds max_position_embeddings "
                             f"({self.position_embeddings.num_embeddings})")
        if packing is None:
            positions = self.position_embeddings.weight[:width]
        else:
            input_ids = input_ids.reshape(-1).index_select(0, packing.token_index)
            token_type_ids = token_type_ids.reshape(-1).index_select(0, packing.token_index)
            positions = self.position_embeddings(packing.positions)
        x = F.embedding(input_ids, self.word_embeddings.weight, sparse=sparse_grad)
        x = x + self.token_type_embeddings(token_type_ids) + positions
        return dropout(self.layer_norm(x), self.dropout_prob, self.training)


Pair = tuple[torch.Tensor, torch.Tensor]  # a module's (weight, bias)


class LayerWeights(NamedTuple):
    """An encoder layer's (weight, bias) pairs, as EncoderLayer.weights gives them to its forward."""

    qkv: Pair
    output: Pair
    up: Pair
    down: Pair
    attention_norm: Pair
    output_norm: Pair


class SelfAttention(nn.Module):
    """Multi-head self-attention (SDPA), padded or packed, then the output projection. Q, K, V are one fused
    [3H, H] projection (one GEMM); hf.py splits it."""

    def __init__(self, hidden_size: int, num_heads: int, attention_dropout_prob: float):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.qkv.row_blocks = 3  # three weights stacked: LAMB gives each its trust ratio (optim.row_blocks_of)
        self.output = nn.Linear(hidden_size, hidden_size)
        # > 0 forces SDPA's slower math path on CPU (the fused kernel has no dropout there).
        self.attention_dropout_prob = attention_dropout_prob

    def forward(self, x: torch.Tensor, where: torch.Tensor | Packing | None, rows: torch.Tensor | None,
                qkv: Pair, output: Pair) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention output, the residual it is added to), both at `rows` only when given. `where`: the padded
        batch's SDPA mask (x [B, T, H], rows [B, K]) or the Packing (x [N, H], rows [R]). qkv, output: the
        projections' (weight, bias) as EncoderLayer.weights gives them."""
        p = self.attention_dropout_prob if self.training else 0.0
        if isinstance(where, Packing):
            mixed = packed_attention(F.linear(x, *qkv), where, self.num_heads, p)  # [N, H]
            if rows is not None:  # the output projection and what follows only where the losses look
                mixed, x = mixed.index_select(0, rows), x.index_select(0, rows)
            return F.linear(mixed, *output), x
        B, T, H = x.shape
        heads = self.num_heads
        if rows is None:
            residual = x
            q, k, v = split_heads(F.linear(x, *qkv), 3, heads)  # 3 × [B, heads, T, d]
        else:  # queries at the rows only; keys and values from all of x
            residual = x.gather(1, rows[..., None].expand(-1, -1, H))  # [B, K, H]
            weight, bias = qkv
            q, = split_heads(F.linear(residual, weight[:H], bias[:H]), 1, heads)
            k, v = split_heads(F.linear(x, weight[H:], bias[H:]), 2, heads)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=where, dropout_p=p)  # [B, heads, T or K, d]
        return F.linear(y.transpose(1, 2).reshape(B, -1, H), *output), residual


class SplitHeads(torch.autograd.Function):
    """[B, T, parts * H] projection → parts × [B, heads, T, d] views. The backward writes the parts' gradients
    straight into [B, T, parts * H]: one copy, where autograd's unbind stacks them as [parts, B, heads, T, d] and
    then copies again to reorder (bert-large: two passes over a [B, T, 3H] gradient per layer)."""

    @staticmethod
    def forward(ctx, projected: torch.Tensor, parts: int, heads: int) -> tuple[torch.Tensor, ...]:
        B, T, width = projected.shape
        return projected.view(B, T, parts, heads, width // parts // heads).permute(2, 0, 3, 1, 4).unbind(0)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        B, heads, T, d = grads[0].shape
        parts = [g.transpose(1, 2) for g in grads]  # parts × [B, T, heads, d]
        if torch.compiler.is_compiling():  # inductor lays out the copy (under it out= kept a strided grad's strides)
            return torch.stack(parts, dim=2).reshape(B, T, -1), None, None
        # out=: a stack may take its input's strides, and a strided gradient would cost autograd another copy
        whole = grads[0].new_empty(B, T, len(grads), heads, d)
        torch.stack(parts, dim=2, out=whole)
        return whole.flatten(2), None, None  # [B, T, parts * H]


def split_heads(projected: torch.Tensor, parts: int, heads: int) -> tuple[torch.Tensor, ...]:
    """[B, T, parts * H] → parts × [B, heads, T, d] (queries, keys and values, or some), views of `projected`."""
    return SplitHeads.apply(projected, parts, heads)


def packed_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float) -> torch.Tensor:
    """[N, 3H] fused query/key/value rows → [N, H]; each row attends only to the real tokens of its own
    sequence: on a GPU in half precision one variable-length flash kernel; else one dense SDPA per length
    bucket (its fused kernel; nested tensors and FlexAttention were slower or lack a CPU backward, see the
    README's unpadded-encoder notes)."""
    if varlen_flash_available(qkv, num_heads):
        return varlen_attention(qkv, packing, num_heads, dropout_p)
    return bucket_attention(qkv, packing, num_heads, dropout_p)


@torch.compiler.disable  # eager under torch.compile: the buckets' count and shapes change at every step
def bucket_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float) -> torch.Tensor:
    """packed_attention as one dense SDPA per length bucket."""
    H = qkv.shape[1] // 3
    outputs = []
    for bucket in buckets_of(packing):
        b, width = bucket.shape
        if bucket.gather is None:
            slots = qkv[bucket.start:bucket.start + bucket.size]                  # a view: no copy
        else:
            slots = qkv.index_select(0, bucket.gather)                           # [b*width, 3H]
        q, k, v = split_heads(slots.view(b, width, 3 * H), 3, num_heads)       # 3 × [b, heads, width, d]
        with without_cudnn_attention(qkv):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bucket.key_mask, dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(b * width, H)
        outputs.append(y if bucket.inside is None else y.index_select(0, bucket.inside))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)             # [N, H]


def varlen_flash_available(qkv: torch.Tensor, num_heads: int) -> bool:
    """Whether flash attention's variable-length kernel runs here: a CUDA GPU of compute capability 8.0 or newer,
    fp16 or bf16, a head size that is a multiple of 8 up to 256."""
    d = qkv.shape[1] // 3 // num_heads
    return (qkv.is_cuda and qkv.dtype in (torch.float16, torch.bfloat16) and d % 8 == 0 and d <= 256
            and torch.cuda.get_device_capability(qkv.device) >= (8, 0))


def varlen_attention(qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float) -> torch.Tensor:
    """[N, 3H] → [N, H] through one flash kernel over the sequences that packing.sequence_starts bound."""
    N, H = qkv.shape[0], qkv.shape[1] // 3
    q, k, v = qkv.view(N, 3, num_heads, H // num_heads).unbind(1)               # 3 × [N, heads, d]
    starts, longest = packing.sequence_starts, packing.longest
    y = torch.ops.aten._flash_attention_forward(q, k, v, starts, starts, longest, longest, dropout_p, False, False)[0]
    return y.reshape(N, H)


def without_cudnn_attention(x: torch.Tensor):
    """On a GPU, SDPA without its cuDNN backend: torch picks cuDNN for masked half-precision attention, and cuDNN
    builds a plan for every new shape, which bucket shapes are at every step (H200: 789 ms a bert-base step at
    seq 128 x 256, 59 ms without cuDNN, 57 ms with one fixed shape; benchmarks/gpu_packed.py)."""
    if not x.is_cuda:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class FeedForward(nn.Module):
    """hidden → intermediate → activation → hidden."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.down = nn.Linear(intermediate_size, hidden_size)
        self.act = activation(act)

    def forward(self, x: torch.Tensor, up: Pair, down: Pair) -> torch.Tensor:
        """up, down: the projections' (weight, bias) as EncoderLayer.weights gives them."""
        return F.linear(self.act(F.linear(x, *up)), *down)


class EncoderLayer(nn.Module):
    """Post-LayerNorm transformer layer (BERT): x = LN(x + drop(attn(x))); x = LN(x + drop(ffn(x))).
    The one place of a layer's math: the padded, pruned and packed paths all run it."""

    def __init__(self, config):
        super().__init__()
        H = config.hidden_size
        self.attention = SelfAttention(H, config.num_attention_heads, config.attention_probs_dropout_prob)
        float32_residual = getattr(config, "float32_residual", False)
        self.attention_norm = LayerNorm(H, config.layer_norm_eps, float32_residual)
        self.feed_forward = FeedForward(H, config.intermediate_size, config.hidden_act)
        self.output_norm = LayerNorm(H, config.layer_norm_eps, float32_residual)
        self.dropout_prob = config.hidden_dropout_prob
        self.fused_weight_cast = True  # False: autocast casts each weight (PreTrainingModel's option, for comparison)

    def parameter_list(self) -> list[torch.Tensor]:
        """The weights and biases in LayerWeights' order, read from the modules' own dicts: through nn.Module's
        __getattr__ this took 22-29 us a forward instead of 2 (2-core AMD EPYC), host time in a host-bound loop."""
        layer, attention, feed_forward = self._modules, self._modules["attention"]._modules, \
            self._modules["feed_forward"]._modules
        modules = (attention["qkv"], attention["output"], feed_forward["up"], feed_forward["down"],
                   layer["attention_norm"], layer["output_norm"])
        return [tensor for module in modules for tensor in (module._parameters["weight"], module._parameters["bias"])]

    def weight_copies(self) -> list[torch.Tensor] | None:
        """Under autocast, half_copies of the parameters this layer computes with in half precision: the linears',
        and the LayerNorms' but for float32_residual's (float32, with float32 parameters). None without autocast, or
        where fused_weight_cast is off (autocast then casts each weight)."""
        if not self.casts_weights():
            return None
        dtype = torch.get_autocast_dtype(self.attention.qkv.weight.device.type)
        return half_copies(self.parameter_list()[:self.cast_count()], dtype)

    def casts_weights(self) -> bool:
        """Whether this forward copies the weights to autocast's half type itself (weight_copies' condition)."""
        return self.fused_weight_cast and torch.is_autocast_enabled(self.attention.qkv.weight.device.type)

    def cast_count(self) -> int:
        """How many of parameter_list() are copied: all but float32_residual's LayerNorm parameters."""
        return 8 if self.attention_norm.float32_residual else 12

    def weights(self, copies: list[torch.Tensor] | None = None) -> LayerWeights:
        """The parameters as this application uses them: under autocast, `copies` (run_steps' weight_copies() of a
        shared layer) through ParameterCopies, or without them copies made here by CastCopies; else the parameters."""
        tensors = self.parameter_list()
        if copies is None and self.casts_weights():  # applied once: its copies made here, in one Function
            count = self.cast_count()
            tensors[:count] = CastCopies.apply(torch.get_autocast_dtype(tensors[0].device.type), *tensors[:count])
        elif copies is not None:
            tensors[:len(copies)] = ParameterCopies.apply(len(copies), *tensors[:len(copies)], *copies)
        pairs = iter(tensors)
        return LayerWeights(*zip(pairs, pairs))  # (weight, bias) after (weight, bias), in LayerWeights' order

    def forward(self, x: torch.Tensor, where: torch.Tensor | Packing | None, rows: torch.Tensor | None = None,
                copies: list[torch.Tensor] | None = None) -> torch.Tensor:
        """`where` and `rows`: see SelfAttention.forward; the output has the rows of x, or `rows` only. `copies`:
        this forward's weight_copies(), shared by the layer's applications (made here when not given)."""
        w = self.weights(copies)
        attended, residual = self.attention(x, where, rows, w.qkv, w.output)
        x = self.attention_norm(attended, *w.attention_norm, residual=residual, dropout_prob=self.dropout_prob)
        fed = self.feed_forward(x, w.up, w.down)
        return self.output_norm(fed, *w.output_norm, residual=x, dropout_prob=self.dropout_prob)


def run_steps(steps: list[nn.Module], x: torch.Tensor, where: torch.Tensor | Packing | None, checkpointing: bool,
              rows: torch.Tensor | None) -> torch.Tensor:
    """Apply the encoder's layers in order, only the last one at `rows` (optionally checkpointed). A layer applied
    more than once (ALBERT's shared ones) has its half-precision copies made once, here, for all its applications
    and their recomputations; one applied once (BERT's) makes them in its forward, after any hook that gathers its
    parameters (a sharded layer's are only whole there)."""
    applications = collections.Counter(steps)
    copies = {layer: layer.weight_copies() for layer, count in applications.items() if count > 1}
    for i, layer in enumerate(steps):
        last_rows = rows if i == len(steps) - 1 else None
        if checkpointing and torch.is_grad_enabled():
            x = checkpoint(layer, x, where, last_rows, copies.get(layer), use_reentrant=False)
        else:
            x = layer(x, where, last_rows, copies.get(layer))
    return x


# Inductor checks each input's sizes and strides again at every call of a graph (963 a bert_large step on a CPU), where
# dynamo's guards and AOTAutograd already hold the inputs to what was compiled: 1.6-2.9 ms of host time a forward and
# backward of bert_large's 24 layers at width 16 (4-8%; 2-core AMD EPYC, medians of 21 alternated rounds), in a loop
# the host limits (the compiled bert_large loop, H200). vLLM's CPU models and DeepSpeed's compile backend skip them too.
INDUCTOR_OPTIONS = {"size_asserts": False}


def with_inductor_options(options: dict) -> dict:
    """torch.compile's keyword arguments `options` with INDUCTOR_OPTIONS under the caller's own inductor options, where
    the backend is inductor (the default); another backend gets none (the eager one warns that it ignores them)."""
    if options.get("backend", "inductor") != "inductor":
        return options
    return dict(options, options={**INDUCTOR_OPTIONS, **options.get("options", {})})


def compile_layers(model: nn.Module, **options) -> int:
    """torch.compile each encoder layer in place, as torchtitan compiles each block: a layer's inputs keep their
    kinds from step to step, whereas the whole forward takes each batch's counts and plan (host values) and compiled
    again for nearly every batch until torch gave up (H200, bert_base: 8 graphs, then eager). `options`: torch.compile's
    (with_inductor_options). Returns the count."""
    options = with_inductor_options(options)
    compiled = [module for module in model.modules() if isinstance(module, EncoderLayer)]
    for layer in compiled:  # a shared ALBERT layer is one module: compiled once
        layer.compile(**options)
    return len(compiled)


def attention_bias(attention_mask: torch.Tensor | None, padded: bool | None = None) -> torch.Tensor | None:
    """[B, T] 1/0 padding mask → [B, 1, 1, T] boolean SDPA mask (None when nothing is padded). `padded`:
    whether any position is padding, when the caller knows (else the mask is read back: a device sync)."""
    if attention_mask is None:
        return None
    if padded is None:
        padded = not bool(attention_mask.all())
    return attention_mask.bool()[:, None, None, :] if padded else None  # SDPA is faster without a mask


class MLMHead(nn.Module):
    """dense H→E, activation, LayerNorm, then the decoder tied to the word embeddings (passed in, so the tie cannot
    break: one tensor, one gradient) plus its own bias."""

    def __init__(self, hidden_size: int, embedding_size: int, vocab_size: int, act: str, layer_norm_eps: float,
                 float32_residual: bool = False):
        super().__init__()
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.act = activation(act)
        self.layer_norm = LayerNorm(embedding_size, layer_norm_eps, float32_residual)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """Logits [..., V]."""
        return F.linear(self.layer_norm(self.act(self.dense(x))), decoder_weight, self.bias)

    def loss(self, x: torch.Tensor, decoder_weight: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean cross-entropy, logits [N, V]) at the N predicted positions x [N, H]."""
        logits = self(x, decoder_weight)
        if targets.numel() == 0:  # nothing to predict: a zero that still reaches the graph
            return logits.float().sum() * 0.0, logits
        return F.cross_entropy(logits.float(), targets), logits


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialization: weights ~ N(0, std), biases 0, LayerNorm 1/0."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, MLMHead):
            nn.init.zeros_(m.bias)
