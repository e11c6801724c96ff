"""A small regression model trained with torch.optim.Muon (torch >= 2.9),
or, with `--muon muon_cpp`, the same program on muon-cpp's drop-in Muon.

Muon for the hidden weight matrices, AdamW for the biases, as torch's
documentation pairs them. The switch changes only which class `Muon` is:
the one import in muon_class (examples/python/README.md shows it); the
program that uses it is the same line for line.

    python3 examples/python/torch_muon_program.py [--muon torch|muon_cpp] [--steps 60] [--seed 0]

Prints one line per 10 steps and a final `RESULT {json}` line: the loss at
every step and the sum of every parameter.
"""
import argparse
import json
import sys

import torch


def muon_class(which):
    """torch.optim.Muon, or muon_cpp's drop-in for it: the one line that differs."""
    if which == "muon_cpp":
        from muon_cpp.compat.torch import Muon
        return Muon
    try:
        from torch.optim import Muon
    except ImportError:  # torch.optim.Muon is in torch >= 2.9
        print(f"torch {torch.__version__} has no torch.optim.Muon", file=sys.stderr)
        sys.exit(3)
    return Muon


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--muon", choices=["torch", "muon_cpp"], default="torch",
                        help="torch.optim.Muon (default) or muon_cpp.compat.torch.Muon")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    Muon = muon_class(args.muon)

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 1))
    inputs = torch.randn(256, 16)
    targets = torch.sin(inputs[:, :4].sum(dim=1, keepdim=True)) + 0.1 * inputs[:, 4:5]

    matrices = [p for p in model.parameters() if p.ndim == 2]
    vectors = [p for p in model.parameters() if p.ndim != 2]
    muon = Muon(matrices, lr=0.02, weight_decay=0.01, adjust_lr_fn="original")
    adamw = torch.optim.AdamW(vectors, lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(muon, T_max=args.steps)

    losses = []
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        muon.zero_grad()
        adamw.zero_grad()
        loss.backward()
        muon.step()
        adamw.step()
        schedule.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.5f}  muon lr {muon.param_groups[0]['lr']:.5f}")
    print("RESULT " + json.dumps({"losses": losses,
                                  "param_sums": [p.sum().item() for p in model.parameters()]}))


if __name__ == "__main__":
    main()
