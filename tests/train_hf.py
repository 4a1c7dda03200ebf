"""A Hugging Face ``Trainer`` script written as its users write one, on a tiny GPT-2 built
locally (a config, no hub download): ``TrainingArguments(output_dir=..., save_steps=...)``
writing ``checkpoint-N/`` folders, ``trainer.train(resume_from_checkpoint=...)`` to resume.
It knows nothing of hotspare.

    python train_hf.py --output-dir DIR [--resume FOLDER] [--max-steps N] [--save-steps K]

``params sha256 HEX`` at the end. Deterministic on CPU: the Trainer saves and restores its
RNG states and skips the batches already seen, so a resumed run ends where an uninterrupted
one does.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

VOCAB, LENGTH = 64, 16


class Tokens(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, LENGTH), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Say(TrainerCallback):
    """One line per step, as a user's logging callback would print it."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        print(f"step {state.global_step}", flush=True)
        if self.step_s:
            time.sleep(self.step_s)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=10)
    p.add_argument("--step-s", type=float, default=0.0)
    args = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_strategy="steps",
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        seed=0,
        data_seed=0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model, args=training, train_dataset=Tokens(64), callbacks=[Say(args.step_s)]
    )
    trainer.train(resume_from_checkpoint=args.resume or None)
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    print(f"params sha256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
