"""The building blocks BERT and ALBERT share: embeddings, attention, feed-forward, encoder layer, heads.

Shapes: B batch, T sequence length, H hidden size, E embedding size (ALBERT; E = H for BERT),
I intermediate size, V vocabulary, N number of predicted (masked) positions.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


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


class Embeddings(nn.Module):
    """Word + learned absolute position + token type embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, size: int, max_positions: int, type_vocab_size: int,
                 layer_norm_eps: float, dropout_prob: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, size)
        self.position_embeddings = nn.Embedding(max_positions, size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, size)
        self.layer_norm = nn.LayerNorm(size, eps=layer_norm_eps)
        self.dropout_prob = dropout_prob

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, sparse_grad: bool = False) -> torch.Tensor:
        """sparse_grad: the word-embedding gradient as B*T rows instead of a dense [V, E] tensor. Only
        when the tied decoder also contributes a dense gradient (autograd then adds the rows into it
        in place, saving a full-vocabulary allocation and pass per step)."""
        T = input_ids.shape[1]
        self.check_length(T)
        return self.combine(input_ids, token_type_ids, self.position_embeddings.weight[:T], sparse_grad)  # [B, T, E]

    def check_length(self, length: int) -> None:
        """Refuse sequences longer than the position table."""
        if length > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                             f"({self.position_embeddings.num_embeddings})")

    def combine(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: torch.Tensor,
                sparse_grad: bool) -> torch.Tensor:
        """LayerNorm and dropout of word + token type + position embeddings (`positions`: vectors that
        broadcast to the ids' shape), summed in that order by the padded and the packed path alike."""
        x = F.embedding(input_ids, self.word_embeddings.weight, sparse=sparse_grad)
        x = x + self.token_type_embeddings(token_type_ids)
        x = x + positions
        return dropout(self.layer_norm(x), self.dropout_prob, self.training)


class SelfAttention(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention, then output projection.

    Query, key and value are one fused [3H, H] projection (one GEMM instead of three); hf.py splits
    it into transformers' query / key / value.
    """

    def __init__(self, hidden_size: int, num_heads: int, attention_dropout_prob: float):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)
        # > 0 forces SDPA's slower math path on CPU (the fused kernel has no dropout there).
        self.attention_dropout_prob = attention_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, queries: torch.Tensor | None = None) -> torch.Tensor:
        """queries [B, K, H]: attend from these rows only (keys and values still from all of x)."""
        B, T, H = x.shape
        heads, d = self.num_heads, H // self.num_heads
        p = self.attention_dropout_prob if self.training else 0.0
        if queries is None:
            q, k, v = self.qkv(x).view(B, T, 3, heads, d).permute(2, 0, 3, 1, 4)  # 3 × [B, heads, T, d]
        else:
            q = F.linear(queries, self.qkv.weight[:H], self.qkv.bias[:H]).view(B, -1, heads, d).transpose(1, 2)
            k, v = F.linear(x, self.qkv.weight[H:], self.qkv.bias[H:]).view(B, T, 2, heads, d).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # [B, heads, T or K, d]
        return self.output(y.transpose(1, 2).reshape(B, -1, H))


class FeedForward(nn.Module):
    """hidden → intermediate → activation → hidden."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.down = nn.Linear(intermediate_size, hidden_size)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class EncoderLayer(nn.Module):
    """Post-LayerNorm transformer layer (BERT): x = LN(x + drop(attn(x))); x = LN(x + drop(ffn(x)))."""

    def __init__(self, config):
        super().__init__()
        H = config.hidden_size
        self.attention = SelfAttention(H, config.num_attention_heads, config.attention_probs_dropout_prob)
        self.attention_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.feed_forward = FeedForward(H, config.intermediate_size, config.hidden_act)
        self.output_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout_prob = config.hidden_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """rows [B, K]: compute the output only at these positions → [B, K, H] (else [B, T, H])."""
        queries = None if rows is None else x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))  # [B, K, H]
        return self.after_attention(x if rows is None else queries, self.attention(x, mask, queries))

    def after_attention(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x = LN(residual + drop(attended)); LN(x + drop(ffn(x))): the layer after its attention output
        (shared by the padded and the packed path)."""
        x = self.attention_norm(residual + dropout(attended, self.dropout_prob, self.training))
        return self.output_norm(x + dropout(self.feed_forward(x), self.dropout_prob, self.training))


def run_layer(layer: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, checkpointing: bool,
              rows: torch.Tensor | None = None) -> torch.Tensor:
    """Apply a layer, recomputing its activations in backward when gradient checkpointing is on."""
    if checkpointing and torch.is_grad_enabled():
        return checkpoint(layer, x, mask, rows, use_reentrant=False)
    return layer(x, mask, rows)


def run_steps(steps: list[nn.Module], x: torch.Tensor, mask: torch.Tensor | None, checkpointing: bool,
              rows: torch.Tensor | None) -> torch.Tensor:
    """Apply the encoder's layers in order; only the last one runs at `rows`."""
    for i, layer in enumerate(steps):
        x = run_layer(layer, x, mask, checkpointing, rows if i == len(steps) - 1 else None)
    return x


def attention_bias(attention_mask: torch.Tensor | None, padded: bool | None = None) -> torch.Tensor | None:
    """[B, T] 1/0 padding mask → [B, 1, 1, T] boolean SDPA mask (None when nothing is padded). `padded`:
    whether any position is padding, when the caller knows (else the mask is read back: a device sync)."""
    if attention_mask is None:
        return None
    if padded is None:
        padded = not bool(attention_mask.all())
    return attention_mask.bool()[:, None, None, :] if padded else None  # SDPA is faster without a mask


class HeadBuffers:
    """Two [N, V] buffers kept between training steps for the decoder's logits and log-probabilities.

    A fresh full-vocabulary tensor per step costs more in page faults than the math on it (≈55 ms
    for 75 MB here), and the plain path makes four of them (logits, log-softmax, its gradient, the
    gradient of the logits). `generation` makes a second forward before backward fail loudly
    instead of silently reusing overwritten log-probabilities.
    """

    def __init__(self) -> None:
        self.storage: torch.Tensor | None = None
        self.generation = 0

    def take(self, rows: int, vocab: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        need = rows * vocab
        s = self.storage
        if s is None or s.shape[1] < need or s.dtype != like.dtype or s.device != like.device:
            self.storage = s = torch.empty(2, int(rows * 1.25 + 8) * vocab, dtype=like.dtype, device=like.device)
        self.generation += 1
        return s[0, :need].view(rows, vocab), s[1, :need].view(rows, vocab)

    def release(self) -> None:
        self.storage = None


class DecoderCrossEntropy(torch.autograd.Function):
    """(mean cross-entropy, logits) of logits = x W^T + b, computed in HeadBuffers.

    The logits come back non-differentiable and are overwritten by the next training forward;
    backward turns the stored log-probabilities into the gradient in place (softmax − one-hot).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, targets, buffers: HeadBuffers):
        logits, log_probs = buffers.take(x.shape[0], weight.shape[0], x)  # [N, V] each
        torch.addmm(bias, x, weight.t(), out=logits)
        torch.log_softmax(logits, dim=-1, out=log_probs)
        loss = -log_probs.gather(1, targets[:, None]).mean()
        ctx.save_for_backward(x, weight, targets)
        ctx.buffers, ctx.generation, ctx.log_probs = buffers, buffers.generation, log_probs
        ctx.mark_non_differentiable(logits)
        return loss, logits

    @staticmethod
    def backward(ctx, grad_loss, _grad_logits):
        x, weight, targets = ctx.saved_tensors
        if ctx.buffers.generation != ctx.generation:
            raise RuntimeError("The MLM head ran forward again (or backward twice) before this backward: its "
                               "buffers were overwritten. Call backward once after each training forward.")
        ctx.buffers.generation += 1
        scale = grad_loss / x.shape[0]
        # d loss / d logits = scale * (softmax - one-hot); the scale goes on the small [N, E] and [V]
        # results instead of another pass over [N, V].
        probs = ctx.log_probs.exp_()  # [N, V]
        probs[torch.arange(x.shape[0], device=x.device), targets] -= 1
        return (probs @ weight) * scale, probs.t() @ (x * scale), probs.sum(0) * scale, None, None


class MLMHead(nn.Module):
    """dense H→E, activation, LayerNorm, then the decoder tied to the word embeddings plus its own bias.

    The decoder weight is not a parameter here: the model passes the word-embedding matrix in,
    so the tie cannot break (one tensor, one gradient, one entry in the state dict).
    """

    reuse_buffers = True  # training path through DecoderCrossEntropy (False: plain F.linear + cross_entropy)

    def __init__(self, hidden_size: int, embedding_size: int, vocab_size: int, act: str, layer_norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.act = activation(act)
        self.layer_norm = nn.LayerNorm(embedding_size, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.buffers_ = HeadBuffers()

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(self.act(self.dense(x)))  # [..., E]

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] (fresh tensors; for inference and evaluation)."""
        return F.linear(self.transform(x), decoder_weight, self.bias)

    def loss(self, x: torch.Tensor, decoder_weight: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean cross-entropy, logits [N, V]) at the N predicted positions x [N, H]."""
        x = self.transform(x)
        reuse = (self.reuse_buffers and self.training and torch.is_grad_enabled() and targets.numel() > 0
                 and not torch.is_autocast_enabled(x.device.type) and x.dtype == decoder_weight.dtype
                 and not torch.compiler.is_compiling())  # buffers and a Python-side counter: eager only
        if reuse:
            return DecoderCrossEntropy.apply(x, decoder_weight, self.bias, targets, self.buffers_)
        logits = F.linear(x, decoder_weight, self.bias)
        if targets.numel() == 0:  # nothing to predict: a zero that still reaches the graph
            return logits.float().sum() * 0.0, logits
        return F.cross_entropy(logits.float(), targets), logits

    def train(self, mode: bool = True):
        if not mode:
            self.buffers_.release()  # evaluation and inference allocate per call
        return super().train(mode)


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
