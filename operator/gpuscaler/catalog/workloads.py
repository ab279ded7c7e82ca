"""Workload profiles derived from a transformer's shape, or from parameters and FLOPs.

Used by the catalog loader (named transformer rows give their shape, not hand-typed FLOPs) and by
the planner for custom workloads. The arithmetic is written out here so it can be checked:

FLOPs (forward, per sequence of ``s`` tokens; Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters", eq. 3 without recomputation):
    2 * N * s               matmuls with the N non-embedding weights
  + 4 * L * s^2 * h         attention scores and the weighted sum
  + 2 * s * h * V * f_head  output head over the vocabulary, on the fraction f_head of tokens
                            (1 for a causal LM, 0.15 for BERT's masked LM, 0 for fine-tuning heads)
Training = 3 x forward (backward is twice the forward).

Activation memory per sequence at 16-bit: the tensors autograd keeps for the backward pass,
itemised as Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", sec. 4.1, no parallelism) do, with the feed-forward size ``f`` and the dropout kept
general (their 34 sbh + 5 as^2b is the case f = 4h, dropout on, standard attention)::

    per layer and token   4h            the two layer norms' inputs
                        + 10h           attention: QKV input 2h, Q K V 6h, the attention output 2h
                                        (the output projection's input; flash attention keeps the same)
                        + 2h + 4f       feed-forward: its input 2h, the activation's input and output
                        | 2h + 8f       gated (SwiGLU): gate and up outputs, the activation's output,
                                        their product
                        + 2h            dropout masks after attention and after the feed-forward (if any)
                        + (2 + 3 d) a s standard attention only: softmax output 2 (+ dropout mask 1 and
                                        output 2 with dropout d); flash attention keeps no s^2 matrix
  + s * V * f_head * (6 | 2)            logits in 16-bit plus their fp32 softmax for the loss, or the
                                        16-bit logits alone under a fused cross-entropy kernel (which
                                        writes the gradient into the logits' buffer)
"""

from __future__ import annotations

from dataclasses import dataclass

HEAD_FRACTION = {"lm": 1.0, "mlm": 0.15, "none": 0.0}
"""Fraction of tokens whose output-vocabulary logits are computed, by head type."""


@dataclass(frozen=True, slots=True)
class TransformerShape:
    """The shape of a dense transformer, enough to derive its parameters, FLOPs and activations."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn: int | None = None
    """Feed-forward inner size; 4 x hidden when not given."""
    gated: bool = False
    """SwiGLU-style gated FFN (three matrices instead of two)."""
    head: str = "lm"
    """lm (causal LM), mlm (masked LM on 15% of tokens) or none (classification/QA head)."""
    flash_attention: bool = False
    """Memory-efficient attention: no s^2 attention matrices kept for backward."""
    dropout: bool = True
    """The model trains with dropout (BERT, GPT-2); False where it has none (LLaMA, MPT, nanoGPT)."""
    fused_loss: bool = False
    """The cross-entropy runs as one fused kernel that keeps no fp32 copy of the logits (llm-foundry's
    ``fused_crossentropy``); False for PyTorch's ``cross_entropy`` on autocast logits."""

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def layer_params(self) -> float:
        h = self.hidden
        ffn_mats = 3 if self.gated else 2
        return 4.0 * h * h + ffn_mats * h * self.ffn_size

    @property
    def nonembedding_params(self) -> float:
        return self.layers * self.layer_params

    @property
    def params(self) -> float:
        """All trainable parameters: layers plus input embeddings (output head tied for MLM/none)."""
        embeddings = self.vocab * self.hidden
        untied_head = self.vocab * self.hidden if self.head == "lm" and self.gated else 0
        return self.nonembedding_params + embeddings + untied_head

    def forward_flops_per_sequence(self) -> float:
        s, h, layers = self.seq_len, self.hidden, self.layers
        f_head = HEAD_FRACTION[self.head]
        return (
            2.0 * self.nonembedding_params * s + 4.0 * layers * s * s * h + 2.0 * s * h * self.vocab * f_head
        )

    def train_flops_per_sequence(self) -> float:
        return 3.0 * self.forward_flops_per_sequence()

    def layer_activation_bytes(self) -> float:
        """16-bit activation bytes of one layer for one sequence (what recomputation re-creates)."""
        s, h, a, f = self.seq_len, self.hidden, self.heads, self.ffn_size
        ffn = 2.0 * h + (8.0 if self.gated else 4.0) * f
        per_token = 4.0 * h + 10.0 * h + ffn + (2.0 * h if self.dropout else 0.0)
        if not self.flash_attention:
            per_token += (2.0 + (3.0 if self.dropout else 0.0)) * a * s
        return s * per_token

    def head_activation_bytes(self) -> float:
        """Bytes of the output head's logits and loss for one sequence (0 without a vocabulary head)."""
        per_logit = 2.0 if self.fused_loss else 6.0
        return self.seq_len * self.vocab * per_logit * HEAD_FRACTION[self.head]

    def activation_bytes_per_sequence(self) -> float:
        return self.layers * self.layer_activation_bytes() + self.head_activation_bytes()

    def checkpointed_activation_bytes_per_sequence(self) -> float:
        """Full activation checkpointing: keep each layer's 16-bit input, recompute one layer at a time."""
        kept = self.layers * 2.0 * self.seq_len * self.hidden
        return kept + self.layer_activation_bytes() + self.head_activation_bytes()
