"""A small character-level transformer language model: the built-in ``charlm`` workload.

Small by default (a test job finishes in seconds); ``n_layer``/``n_embd`` scale it up to
checkpoints of hundreds of MB. Batches are a pure function of (seed, data position).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from executors.kinds.torch.workload import Workload, WorkloadContext
from executors.kinds.torch.workloads.corpus import make_corpus
from protocol.errors import ConfigError
from protocol.workloads import CharLMConfig, convert_config


class Block(nn.Module):
    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharTransformer(nn.Module):
    def __init__(self, cfg: CharLMConfig, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class CharLM(Workload):
    def __init__(self, cfg: CharLMConfig, ctx: WorkloadContext) -> None:
        self.cfg = cfg
        self.ctx = ctx
        text = (
            make_corpus(cfg.corpus_chars) if cfg.corpus == "builtin" else _read_corpus(cfg.corpus)
        )
        chars = sorted(set(text))
        lookup = {ch: i for i, ch in enumerate(chars)}
        self.data = torch.tensor([lookup[ch] for ch in text], dtype=torch.long)
        if len(self.data) <= cfg.block_size + 1:
            raise ConfigError(
                f"config.corpus: {len(self.data)} characters, fewer than block_size + 2"
            )
        self.model = CharTransformer(cfg, len(chars)).to(ctx.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95)
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.global_batch = cfg.global_batch
        self.micro_batch = cfg.micro_batch or cfg.global_batch
        self.grad_clip = cfg.grad_clip

    def _lr_factor(self, step: int) -> float:
        c = self.cfg
        if step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        progress = min(1.0, (step - c.warmup_steps) / max(1, c.decay_steps))
        return c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def batch(self, index: int) -> Sequence[torch.Tensor]:
        g = torch.Generator().manual_seed(
            (self.ctx.seed * 1_000_003 + index) & 0x7FFF_FFFF_FFFF_FFFF
        )
        starts = torch.randint(
            len(self.data) - self.cfg.block_size - 1, (self.global_batch,), generator=g
        )
        offsets = torch.arange(self.cfg.block_size + 1)
        window = self.data[starts[:, None] + offsets]
        return window[:, :-1].to(self.ctx.device), window[:, 1:].to(self.ctx.device)

    def loss(self, micro: Sequence[torch.Tensor]) -> torch.Tensor:
        x, y = micro
        logits = self.model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _read_corpus(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config.corpus: cannot read {path}: {e}") from None


def build(config: dict, ctx: WorkloadContext) -> CharLM:
    """The workload, its ``[config]`` checked against the schema the console checks too."""
    return CharLM(convert_config(config, CharLMConfig), ctx)
