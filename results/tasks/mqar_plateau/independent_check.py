"""MQAR's plateau checked outside posab's model (issue 58; results/tasks/README.md, the pilot's part 6).

A plain pre-LN decoder written apart from posab (torch.nn.MultiheadAttention, learned absolute positions, 4
layers, d = 128, 4 heads, a GELU MLP of 4d: the default small model's shape) trained with AdamW on posab's
own MQAR training batches (`TaskStream`, its loss mask: the values and EOS). `--init` picks the
initialisation: `pytorch` (torch's defaults, untied head), `gpt2` (posab's: normal std 0.02 on every matrix,
the residual projections 0.02 / sqrt(2 x layers), the head tied to the embedding), `gpt2_untied` (posab's
scales, untied head), `tied` (torch's defaults, tied head). Prints every 100 steps the step, the batch's
loss and its teacher-forced exact match (every scored target right), both before that step's update.
    python results/tasks/mqar_plateau/independent_check.py --init pytorch --seed 1 --steps 800
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posab.data.tasks.generators import task_named
from posab.data.tasks.stream import TaskStream

VOCAB, WIDTH, HEADS, LAYERS, BATCH = 64, 128, 4, 4, 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n1 = nn.LayerNorm(WIDTH)
        self.att = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.n2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = self.n1(x)  # (B, T, C)
        x = x + self.att(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class Decoder(nn.Module):
    def __init__(self, longest: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(longest, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.nf = nn.LayerNorm(WIDTH)
        self.out = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> logits (B, T, V)."""
        length = ids.shape[1]
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)  # (T, T): True where masked
        x = self.emb(ids) + self.pos(torch.arange(length))  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask)
        return self.out(self.nf(x))


def initialise(model: Decoder, init: str) -> None:
    """The head tied (`gpt2`, `tied`) and posab's GPT-2 scales (`gpt2`, `gpt2_untied`); `pytorch`: torch's."""
    if init in ("gpt2", "tied"):
        model.out.weight = model.emb.weight
    if init in ("gpt2", "gpt2_untied"):
        for name, param in model.named_parameters():
            if param.dim() == 2:
                residual = "out_proj" in name or "mlp.2" in name
                nn.init.normal_(param, std=0.02 / (2 * LAYERS) ** 0.5 if residual else 0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", choices=["pytorch", "gpt2", "gpt2_untied", "tied"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lengths", type=int, nargs=2, default=[2, 2], help="MQAR's pairs: low high")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    stream = TaskStream(task_named("mqar"), "train", tuple(args.lengths), 0, 100_000)
    model = Decoder(stream.longest)
    initialise(model, args.init)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    rng = np.random.default_rng(args.seed)
    for step in range(1, args.steps + 1):
        batch = stream.batch(rng.integers(0, len(stream), BATCH), stream.longest)
        logits = model(batch.inputs)  # (B, T, V)
        loss = F.cross_entropy(logits[batch.loss_mask], batch.targets[batch.loss_mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            right = (logits.argmax(-1) == batch.targets) | ~batch.loss_mask  # (B, T)
            exact = right.all(1).float().mean().item()
            print(step, round(loss.item(), 4), "exact(tf)", round(exact, 3), flush=True)


if __name__ == "__main__":
    main()
