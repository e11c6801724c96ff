#!/usr/bin/python3
"""A small GPT in torch.nn trained with muon_cpp.MuonWithAdamW and with torch.optim.AdamW.

The Python twin of the C++ main job (examples/train_gpt, docs/train_gpt.md):
the same generated corpus (a port of examples/train_gpt/data.cpp: the same
splitmix64 stream, so the same text, vocabulary and batches), the same
GPT-2-shaped model and parameter names (wte, wpe, blocks.N.attn.qkv, lm_head,
so muon_cpp's default routing sends the embeddings, the head, the norm gains
and the biases to AdamW and the hidden matrices to Muon), the same presets
(Muon lr 0.02 with shape_scaling, AdamW 4e-3, beta2 0.95, no weight decay,
5% linear warmup then cosine decay to 10%) and the same table.

Data parallel over gloo, in one of two ways (--parallel):

* ddp (default): torch DDP (gradients averaged in backward); the Muon run's
  optimizer is layer-wise distributed (muon_cpp.distributed.Layerwise: each
  rank updates the parameters it owns and all-gathers them).
* fsdp2 (torch >= 2.6): every block and the root sharded with
  torch.distributed.fsdp.fully_shard; parameters and gradients are DTensors
  of this rank's rows, and muon_cpp runs the sharded owner-compute layout on
  them (each matrix orthogonalized whole by one owner rank). The AdamW run
  is torch.optim.AdamW on the same DTensors.

    PYTHONPATH=build/python python3 -m muon_cpp.torchrun --nproc_per_node 2 examples/python/train_gpt.py
    PYTHONPATH=build/python python3 -m muon_cpp.torchrun --nproc_per_node 2 examples/python/train_gpt.py --parallel fsdp2
    PYTHONPATH=build/python /usr/bin/python3 examples/python/train_gpt.py --steps 50   # one process

Checkpoints: --save DIR writes DIR/<run>/step-<N> every --save-every steps
and at the end, keeping the newest --keep: with ddp a file step-<N>.pt (the
model, the whole optimizer state gathered from the ranks that own it, the
schedule, the log so far), with fsdp2 a directory step-<N>/ of
torch.distributed.checkpoint (each rank's shards) and the same run state.
Each is written under a temporary name and renamed, so a checkpoint under
its own name is complete. --resume DIR continues each run from the newest
in DIR/<run>/, at any world size; --resume auto does so from --save's where
there is one and starts at step 0 where not, so that a job restarted by
torchrun --max-restarts continues by itself:

    PYTHONPATH=build/python python3 -m muon_cpp.torchrun --nnodes 1:2 --nproc_per_node 2 \
        --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
        examples/python/train_gpt.py --save ckpt --save-every 50 --resume auto

Rank 0 prints a progress line every 10% of a run, then the table (final
validation loss, ms per step, optimizer share of the step, steps each run
needs to reach the baseline's (AdamW's) final validation loss) and writes
<out>/<run>.csv (step,tokens,train_loss,valid_loss,seconds,optimizer_seconds,
the C++ job's format: examples/train_gpt/plot_runs.py plots them).
"""
import argparse
import math
import os
import re
import shutil
import sys
import time

RUNS = ("adamw", "muon")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400, help="optimizer steps per run")
    p.add_argument("--runs", default="adamw,muon",
                   help="comma-separated runs (adamw, muon); the baseline of the table is adamw "
                        "when present, else the last run")
    p.add_argument("--lr-muon", type=float, default=0.02,
                   help="peak lr of the Muon matrices (the Muon run's AdamW half uses --lr-adamw)")
    p.add_argument("--lr-adamw", type=float, default=4e-3, help="peak lr of AdamW")
    p.add_argument("--seed", type=int, default=1, help="seed of the model and the batches")
    p.add_argument("--d-model", type=int, default=128, help="model width")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads (must divide --d-model)")
    p.add_argument("--seq", type=int, default=64, help="context length (characters)")
    p.add_argument("--batch", type=int, default=32,
                   help="sequences per step over all ranks (a multiple of the world size)")
    p.add_argument("--tie-head", action="store_true", help="tie the output head to the token embedding")
    p.add_argument("--eval-every", type=int, default=25, help="steps between evaluations")
    p.add_argument("--eval-windows", type=int, default=128, help="validation windows")
    p.add_argument("--chars", type=int, default=2_000_000, help="size of the generated corpus")
    p.add_argument("--threads", type=int, default=0,
                   help="torch and OpenBLAS threads per rank (0: the cores over the ranks on this "
                        "machine, at least 1)")
    p.add_argument("--out", default="train_gpt_py_out", help="directory of the CSV logs")
    p.add_argument("--parallel", default="ddp", choices=("ddp", "fsdp2"),
                   help="data parallelism with several ranks: DDP (the Muon run layer-wise) or "
                        "FSDP2's fully_shard (the Muon run sharded, owner-compute)")
    p.add_argument("--save", default="",
                   help="directory of checkpoints: DIR/<run>/step-<N>, every --save-every steps "
                        "and at the end")
    p.add_argument("--save-every", type=int, default=0,
                   help="steps between checkpoints (0: only at the end)")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept per run (the newest)")
    p.add_argument("--resume", default="",
                   help="directory of a --save: each run continues from its newest checkpoint (at "
                        "any world size); auto: from --save's newest where there is one, else "
                        "from step 0 (for torchrun --max-restarts)")
    args = p.parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    bad = [r for r in runs if r not in RUNS]
    if not runs or bad:
        p.error(f"--runs: unknown run {bad[0]!r} (choose from {', '.join(RUNS)})" if bad
                else "--runs names no run")
    if len(set(runs)) != len(runs):
        p.error(f"--runs names a run twice: {args.runs!r}")
    args.runs = runs
    for name in ("steps", "d_model", "layers", "heads", "seq", "batch", "eval_every",
                 "eval_windows", "chars"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.seq < 2:
        p.error(f"--seq must be >= 2, got {args.seq}")
    if args.d_model % args.heads:
        p.error(f"--heads {args.heads} must divide --d-model {args.d_model}")
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    if args.save_every < 0:
        p.error(f"--save-every must be >= 0, got {args.save_every}")
    if args.keep < 1:
        p.error(f"--keep must be >= 1, got {args.keep}")
    if args.resume == "auto" and not args.save:
        p.error("--resume auto continues from the checkpoints of --save; give --save DIR")
    return args


def threads_per_rank(requested=0):
    """torchrun's OMP_NUM_THREADS rule: the cores this process may use over the
    ranks on this machine (LOCAL_WORLD_SIZE), at least 1."""
    if requested > 0:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, (cores or 1) // max(1, local_world))


# Parsed and sized before torch is imported: OpenBLAS and OpenMP read their
# thread counts when the library loads.
ARGS = parse_args() if __name__ == "__main__" else None
THREADS = threads_per_rank(ARGS.threads if ARGS else 0)
if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    os.environ["OPENBLAS_NUM_THREADS"] = str(THREADS)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# ---- data: a port of examples/train_gpt/data.cpp ------------------------------------

_MASK = (1 << 64) - 1


class Rng:
    """splitmix64 (Steele, Lea, Flood 2014): the C++ job's stream, bit for bit."""

    __slots__ = ("state",)

    def __init__(self, seed):
        self.state = seed & _MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n

    def real(self):
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)

    def chance(self, p):
        return self.real() < p

    def zipf(self, n):
        # Index i with weight 1/(i+1); the same double arithmetic, in the same order, as C++.
        u = self.real() * _harmonic(n)
        for i in range(n):
            u -= 1.0 / (i + 1)
            if u <= 0:
                return i
        return n - 1


_HARMONIC = {}


def _harmonic(n):
    if n not in _HARMONIC:
        total = 0.0
        for i in range(n):
            total += 1.0 / (i + 1)
        _HARMONIC[n] = total
    return _HARMONIC[n]


_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_TOPICS, _TOPIC_NOUNS, _TOPIC_VERBS = 6, 20, 10


def _word(rng, lo, hi):
    word = []
    for _ in range(lo + rng.below(hi - lo + 1)):
        word.append(_CONSONANTS[rng.below(14)])
        word.append(_VOWELS[rng.below(5)])
        if rng.chance(0.25):
            word.append(_CONSONANTS[rng.below(14)])
    return "".join(word)


def _lexicon(rng, count, lo, hi):
    words, seen = [], set()
    while len(words) < count:
        w = _word(rng, lo, hi)
        if w[-1] == "s" or w in seen:  # 's' marks plurals and agreement
            continue
        seen.add(w)
        words.append(w)
    return words


class _Grammar:
    def __init__(self, rng):
        self.nouns = _lexicon(rng, 160, 1, 3)
        self.verbs = _lexicon(rng, 80, 1, 2)
        self.adjectives = _lexicon(rng, 50, 2, 3)
        self.names = [n[0].upper() + n[1:] for n in _lexicon(rng, 60, 2, 3)]
        self.preps = ["in", "on", "near", "under", "with", "over"]
        self.topic_nouns = [[rng.below(160) for _ in range(_TOPIC_NOUNS)] for _ in range(_TOPICS)]
        self.topic_verbs = [[rng.below(80) for _ in range(_TOPIC_VERBS)] for _ in range(_TOPICS)]


def _noun_phrase(rng, g, topic, plural):
    if plural:
        out = "the " if rng.chance(0.5) else "some "
    else:
        d = rng.below(3)
        out = "the " if d == 0 else "a " if d == 1 else "every "
    if rng.chance(0.35):
        out += g.adjectives[rng.zipf(50)] + " "
    if rng.chance(0.8):
        noun = g.topic_nouns[topic][rng.zipf(_TOPIC_NOUNS)]
    else:
        noun = rng.below(len(g.nouns))
    return out + g.nouns[noun] + ("s" if plural else "")


def _verb(rng, g, topic, singular_subject):
    if rng.chance(0.8):
        v = g.topic_verbs[topic][rng.zipf(_TOPIC_VERBS)]
    else:
        v = rng.below(len(g.verbs))
    return g.verbs[v] + ("s" if singular_subject else "")


def _verb_object(rng, g, topic, singular):
    # verb(...) + " " + noun_phrase(..., rng.chance(0.4)) in C++: GCC evaluates
    # the operands of the + chain right to left, so the object is drawn first
    # (checked against the C++ build's corpus, byte for byte).
    obj = _noun_phrase(rng, g, topic, rng.chance(0.4))
    return _verb(rng, g, topic, singular) + " " + obj


def _sentence(rng, g, topic, entity, p_entity):
    singular = True
    if rng.chance(p_entity):
        s = entity
    else:
        singular = not rng.chance(0.4)
        s = _noun_phrase(rng, g, topic, not singular)
        if rng.chance(0.25):  # relative clause: agreement spans it
            s += " that " + _verb_object(rng, g, topic, singular)
    s += " " + _verb_object(rng, g, topic, singular)
    if rng.chance(0.3):
        obj = _noun_phrase(rng, g, topic, rng.chance(0.4))  # right to left, as above
        s += " " + g.preps[rng.below(6)] + " " + obj
    return s[0].upper() + s[1:] + "."


def _document(rng, g):
    topic = rng.below(_TOPICS)
    entity = g.names[rng.below(len(g.names))]
    doc = [entity + " is " + _noun_phrase(rng, g, topic, False) + "."]
    for _ in range(3 + rng.below(6)):
        doc.append(" " + _sentence(rng, g, topic, entity, 0.3))
    if rng.chance(0.4):  # a numbered list
        for i in range(1, 2 + rng.below(4) + 1):
            doc.append(f"\n{i}. " + _sentence(rng, g, topic, entity, 0.2))
    doc.append("\n\n")
    return "".join(doc)


def generate_corpus(chars, seed=1234):
    """The C++ job's generated corpus (train_gpt::generate_corpus): the same text."""
    rng = Rng(seed)
    grammar = _Grammar(rng)
    parts, n = [], 0
    while n < chars:
        d = _document(rng, grammar)
        parts.append(d)
        n += len(d)
    return "".join(parts)[:chars]


def make_dataset(text, valid_fraction=0.1):
    """Character vocabulary (the text's distinct bytes, sorted), train and validation tokens."""
    data = text.encode("latin-1")
    symbols = sorted(set(data))
    index = torch.full((256,), -1, dtype=torch.long)
    index[torch.tensor(symbols)] = torch.arange(len(symbols))
    tokens = index[torch.frombuffer(bytearray(data), dtype=torch.uint8).long()]
    n_train = int(len(data) * (1 - valid_fraction))
    return bytes(symbols), tokens[:n_train], tokens[n_train:]


def train_batch(tokens, step, global_batch, context, rank, world, seed):
    """Rank `rank`'s rows of global batch `step` (train_gpt::train_batch): the same
    windows for every world size."""
    span = context + 1
    rng = Rng(seed * 0x9E3779B97F4A7C15 + step + 1)
    local = global_batch // world
    starts = [rng.below(tokens.numel() - span + 1) for _ in range(global_batch)]
    mine = torch.tensor(starts[rank * local:(rank + 1) * local])
    return tokens[mine[:, None] + torch.arange(span)]


def valid_windows(tokens, count, context):
    """`count` windows of context + 1 tokens evenly spaced over `tokens`."""
    span = context + 1
    windows = min(count, tokens.numel() // span)
    stride = (tokens.numel() - span) // max(windows - 1, 1)
    return tokens[(torch.arange(windows) * stride)[:, None] + torch.arange(span)]


# ---- model: examples/train_gpt/gpt.h in torch.nn -------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.register_buffer("mask", torch.full((context, context), float("-inf")).triu(1),
                             persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + self.mask[:t, :t]
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)) (4x GELU MLP)."""

    def __init__(self, width, heads, context):
        super().__init__()
        self.norm1 = RMSNorm(width)
        self.attn = CausalSelfAttention(width, heads, context)
        self.norm2 = RMSNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, width, layers, heads, context, tie_head=False):
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, context) for _ in range(layers))
        self.norm_f = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        if tie_head:
            self.lm_head.weight = self.wte.weight
        # GPT-2 initialization: N(0, 0.02) matrices, zero biases, unit norm gains,
        # residual output projections at 0.02 / sqrt(2 * layers).
        residual_std = 0.02 / math.sqrt(2.0 * layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() < 2:
                    if "norm" not in name:
                        p.zero_()
                    continue
                residual = "attn.proj" in name or "fc2" in name
                p.normal_(0.0, residual_std if residual else 0.02)

    def forward(self, tokens):
        t = tokens.size(1)
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


def lm_loss(model, tokens):
    """Mean next-token cross-entropy of `tokens` (batch x (time + 1))."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


# ---- optimizers and the schedule ------------------------------------------------------

def lr_factor(step, steps):
    """The C++ presets' schedule over the peak: 5% linear warmup from 0, then
    cosine decay to 10% of the peak at the last step (muon::lr_at)."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return step / warmup
    if step >= steps:
        return 0.1
    r = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * (1 + math.cos(math.pi * r)) / 2


def make_optimizer(run, model, args, world):
    if run == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=args.lr_adamw, betas=(0.9, 0.95),
                                 eps=1e-8, weight_decay=0.0)
    try:
        import muon_cpp
        from muon_cpp import distributed as mdist
    except ImportError as e:
        raise SystemExit(f"train_gpt.py: the muon run needs muon_cpp ({e}); build it and set "
                         "PYTHONPATH=<build>/python") from e
    # DDP: layer-wise over the replicas. FSDP2: no layout to give; the
    # DTensor parameters make it the sharded layout.
    layout = mdist.Layerwise(dist.group.WORLD) if world > 1 and args.parallel == "ddp" else None
    # Matrices to Muon; embeddings, head, norm gains and biases to AdamW.
    return muon_cpp.MuonWithAdamW(model.named_parameters(), lr=args.lr_muon, weight_decay=0.0,
                                  adamw_lr=args.lr_adamw, adamw_betas=(0.9, 0.95), adamw_eps=1e-8,
                                  adamw_weight_decay=0.0, layout=layout,
                                  scale_mode="shape_scaling")


# ---- checkpoints -----------------------------------------------------------------------

CHECKPOINT_FORMAT = "muon_cpp examples/python/train_gpt.py checkpoint 1"
# What a checkpoint must share with the run that loads it: the model's shape,
# the batches and the schedule.
CHECKPOINT_ARGS = ("d_model", "layers", "heads", "seq", "tie_head", "steps", "batch", "seed",
                   "chars", "lr_muon", "lr_adamw")


def checkpoints(directory):
    """The complete checkpoints in ``directory`` as (step, path), newest
    first: files step-<N>.pt (ddp) and directories step-<N> (fsdp2). One
    under its own name is complete: it is written under a temporary name
    and renamed."""
    found = []
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            m = re.fullmatch(r"step-(\d+)(\.pt)?", name)
            if m:
                found.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(found, reverse=True)


def _remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _owned(opt):
    """The indices (torch.optim's state_dict numbering) of the parameters whose
    state this rank holds: all of them, except in muon_cpp's layer-wise
    layout, where each rank holds those it owns."""
    steps_here = getattr(opt, "steps_here", None)
    params = [p for g in opt.param_groups for p in g["params"]]
    return {i for i, p in enumerate(params) if steps_here is None or steps_here(p)}


def _fsdp2_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def _run_state(step, world, args, sched, progress):
    return {"format": CHECKPOINT_FORMAT, "step": step, "world": world, "parallel": args.parallel,
            "args": {k: getattr(args, k) for k in CHECKPOINT_ARGS},
            "scheduler": sched.state_dict(), "progress": progress}


def _write(blob, path):
    with open(path, "wb") as f:
        torch.save(blob, f)
        f.flush()
        os.fsync(f.fileno())


def _commit(tmp, final, keep):
    """Rank 0: the complete checkpoint ``tmp`` becomes ``final`` (one rename,
    made durable), and only the newest ``keep`` stay."""
    directory = os.path.dirname(final)
    if os.path.exists(final):
        _remove(final)
    os.replace(tmp, final)
    _fsync_dir(directory)
    for _, old in checkpoints(directory)[keep:]:
        _remove(old)


def save_fsdp2_checkpoint(directory, step, model, opt, sched, progress, args, rank, world):
    """Collective: ``directory/step-<step>/``, torch.distributed.checkpoint's
    files of every rank's shards (loadable at any world size) and run.pt,
    written in a temporary directory that rank 0 renames when every rank is
    done."""
    import torch.distributed.checkpoint as dcp

    tmp = os.path.join(directory, f".step-{step}.tmp")
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(tmp):
            shutil.rmtree(tmp)  # a save a killed job left
    dist.barrier()
    dcp.save(_fsdp2_state(model, opt), checkpoint_id=tmp)
    dist.barrier()
    if rank == 0:
        _write(_run_state(step, world, args, sched, progress), os.path.join(tmp, "run.pt"))
        _commit(tmp, os.path.join(directory, f"step-{step}"), args.keep)
    dist.barrier()


def save_checkpoint(directory, step, model, opt, sched, progress, args, rank, world):
    """Collective. FSDP2: save_fsdp2_checkpoint. Otherwise every rank gives
    the state it holds and rank 0 writes ``directory/step-<step>.pt`` (the
    whole optimizer state, so that any world size loads it)."""
    if args.parallel == "fsdp2" and world > 1:
        save_fsdp2_checkpoint(directory, step, model, opt, sched, progress, args, rank, world)
        return
    sd = opt.state_dict()
    state = sd["state"]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, state)
        state = {}
        for part in parts:
            state.update(part)
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        blob = _run_state(step, world, args, sched, progress)
        blob["model"] = model.state_dict()
        blob["optimizer"] = {"state": state, "param_groups": sd["param_groups"]}
        tmp = os.path.join(directory, f".step-{step}.pt.tmp-{os.getpid()}")
        _write(blob, tmp)
        _commit(tmp, os.path.join(directory, f"step-{step}.pt"), args.keep)
    if world > 1:
        dist.barrier()


def find_resume(run, args, rank, world):
    """The checkpoint this run continues from (a path), or None; rank 0's
    choice, given to every rank."""
    if not args.resume:
        return None
    directory = os.path.join(args.save if args.resume == "auto" else args.resume, run)
    choice = [None]
    if rank == 0:
        found = checkpoints(directory)
        if found:
            step, choice[0] = found[0]
            how = "--resume auto: continuing" if args.resume == "auto" else "resuming"
            print(f"run {run!r}: {how} from step {step} ({choice[0]})", flush=True)
        elif args.resume == "auto":
            print(f"run {run!r}: --resume auto: no checkpoint in {directory} yet, starting at "
                  "step 0", flush=True)
        else:
            choice[0] = ""  # an error on every rank, below
    if world > 1:
        dist.broadcast_object_list(choice, src=0)
    if choice[0] == "":
        raise SystemExit(f"train_gpt.py: --resume {args.resume!r}: no checkpoint of run {run!r} "
                         f"in {directory!r}")
    return choice[0]


def load_checkpoint(path, run, model, opt, sched, args, rank, world):
    """Loads ``path`` into this rank's model, optimizer and schedule; returns
    the progress dict it saved. The ranks of another world size take their
    part of the optimizer state."""
    sharded = os.path.isdir(path)
    blob = torch.load(os.path.join(path, "run.pt") if sharded else path, map_location="cpu")
    if not isinstance(blob, dict) or blob.get("format") != CHECKPOINT_FORMAT:
        raise SystemExit(f"train_gpt.py: {path!r} is not a checkpoint of this example")
    fsdp2 = args.parallel == "fsdp2" and world > 1
    if sharded != fsdp2:
        raise SystemExit(f"train_gpt.py: run {run!r}: {path!r} was written with --parallel "
                         f"{blob.get('parallel')} at {blob['world']} rank(s); this run "
                         f"({args.parallel}, {world} rank(s)) loads "
                         f"{'sharded' if fsdp2 else 'whole'} checkpoints only")
    for k, v in blob["args"].items():
        if getattr(args, k) != v:
            raise SystemExit(f"train_gpt.py: run {run!r}: {path!r} was written with "
                             f"--{k.replace('_', '-')} {v}, this run has {getattr(args, k)}")
    if blob["step"] > args.steps:
        raise SystemExit(f"train_gpt.py: {path!r} is at step {blob['step']}, past --steps {args.steps}")
    if fsdp2:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        state = _fsdp2_state(model, opt)
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
    else:
        model.load_state_dict(blob["model"])
        owned = _owned(opt)
        saved = blob["optimizer"]
        opt.load_state_dict({"state": {i: s for i, s in saved["state"].items() if i in owned},
                             "param_groups": saved["param_groups"]})
    sched.load_state_dict(blob["scheduler"])
    if rank == 0:
        print(f"run {run!r}: resumed from step {blob['step']} of {path} (written by "
              f"{blob['world']} rank(s); this run: {world})", flush=True)
    return blob["progress"]


# ---- one run --------------------------------------------------------------------------

def fully_shard_gpt(model, world):
    """FSDP2: each block, then the root (embeddings, final norm, head), sharded
    by rows over a 1-D CPU mesh of the ranks. Every rank built the same model
    from the same seed, so the shards are of one model."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError as e:
        raise SystemExit(f"train_gpt.py: --parallel fsdp2 needs torch >= 2.6 (fully_shard); this "
                         f"torch is {torch.__version__}") from e
    from muon_cpp import distributed as mdist

    mdist.enable_fsdp2_on_cpu()  # torch 2.6's CPU streams (a no-op from 2.7)
    mesh = init_device_mesh("cpu", (world,))
    # reshard_after_forward=False: on CPU, torch 2.6 cannot re-gather in backward.
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=False)
    return fully_shard(model, mesh=mesh, reshard_after_forward=False)


def all_reduce_sum(values, world):
    t = torch.tensor(values, dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t)
    return t.tolist()


def train(run, args, vocab_size, train_tokens, windows, rank, world):
    """Trains a fresh model with `run`; returns its log: rows of
    (step, tokens, train_loss, valid_loss, seconds, optimizer_seconds)."""
    torch.manual_seed(args.seed)
    model = GPT(vocab_size, args.d_model, args.layers, args.heads, args.seq, args.tie_head)
    if world > 1 and args.parallel == "fsdp2":
        net = model = fully_shard_gpt(model, world)
    elif world > 1:
        # DDP broadcasts rank 0's parameters and averages the gradients in backward.
        net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    else:
        net = model
    opt = make_optimizer(run, model, args, world)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.steps))
    local_windows = windows[rank::world]

    def evaluate():
        model.eval()
        with torch.no_grad():
            # Under FSDP2 every rank runs the forward (its all-gathers are collective).
            s = (lm_loss(model, local_windows).item() * len(local_windows)
                 if len(local_windows) else 0.0)
        model.train()
        return all_reduce_sum([s], world)[0] / len(windows)

    tokens_per_step = args.batch * args.seq
    start = 0
    seconds = opt_seconds = 0.0
    train_sum, train_count = 0.0, 0
    resume_from = find_resume(run, args, rank, world)
    if resume_from:
        progress = load_checkpoint(resume_from, run, model, opt, sched, args, rank, world)
        start, log = progress["step"], [tuple(row) for row in progress["log"]]
        seconds, opt_seconds = progress["seconds"], progress["opt_seconds"]
        # The training losses since the last evaluation: each rank goes on
        # from their mean over the ranks that saved them (at any world size,
        # the interval's mean is then each step's mean over the ranks).
        train_sum, train_count = progress["train_sum"], progress["train_count"]
    else:
        log = [(0, 0, float("nan"), evaluate(), 0.0, 0.0)]

    def save(done):
        mean = all_reduce_sum([train_sum], world)[0] / world
        progress = {"step": done, "log": log, "seconds": seconds, "opt_seconds": opt_seconds,
                    "train_sum": mean, "train_count": train_count}
        save_checkpoint(os.path.join(args.save, run), done, model, opt, sched, progress, args,
                        rank, world)

    report_every = max(1, args.steps // 10)
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        batch = train_batch(train_tokens, step, args.batch, args.seq, rank, world, args.seed)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(net, batch)
        loss.backward()
        t_opt = time.perf_counter()
        opt.step()
        opt_seconds += time.perf_counter() - t_opt
        sched.step()
        seconds += time.perf_counter() - t0
        value = loss.item()
        if not math.isfinite(value):
            raise SystemExit(f"train_gpt.py: run {run!r}: the training loss is {value} at step {step}")
        train_sum += value
        train_count += 1
        done = step + 1
        if done % args.eval_every == 0 or done == args.steps:
            total, count = all_reduce_sum([train_sum, train_count], world)
            log.append((done, done * tokens_per_step, total / count, evaluate(), seconds, opt_seconds))
            train_sum, train_count = 0.0, 0
        if args.save and (done == args.steps or (args.save_every and done % args.save_every == 0)):
            save(done)
        if rank == 0 and (done % report_every == 0 or done == args.steps):
            print(f"{run:<6} step {done:>5}/{args.steps} loss {value:.4f} "
                  f"{done * tokens_per_step / seconds:8.0f} tok/s", flush=True)
    return log


# ---- the table ------------------------------------------------------------------------

def steps_to_reach(log, target):
    """Steps at which the validation curve first reaches `target`, linearly
    interpolated between evaluations (-1: never)."""
    for i, row in enumerate(log):
        if row[3] > target:
            continue
        if i == 0:
            return float(row[0])
        a, b = log[i - 1], row
        f = (a[3] - target) / (a[3] - b[3])
        return a[0] + f * (b[0] - a[0])
    return -1.0


def comparison_table(logs, baseline):
    """The C++ job's table (train_gpt::comparison_table)."""
    target = logs[baseline][-1][3]
    base_steps = steps_to_reach(logs[baseline], target)
    lines = ["%-10s %10s %12s %10s %26s" % ("run", "val loss", "ms/step", "opt share",
                                            f"steps to {baseline}'s loss")]
    for name, log in logs.items():
        last = log[-1]
        s = steps_to_reach(log, target)
        reach = "not reached" if s < 0 else "%.0f (%.2fx)" % (s, s / base_steps if base_steps > 0 else 0.0)
        ms = 1000 * last[4] / last[0] if last[0] > 0 else 0.0
        share = last[5] / last[4] if last[4] > 0 else 0.0
        lines.append("%-10s %10.4f %12.1f %9.1f%% %26s" % (name, last[3], ms, 100 * share, reach))
    return "\n".join(lines)


def write_csv(log, path):
    with open(path, "w") as f:
        f.write("step,tokens,train_loss,valid_loss,seconds,optimizer_seconds\n")
        for row in log:
            f.write("%d,%d,%.9g,%.9g,%.9g,%.9g\n" % row)


def main(args):
    torch.set_num_threads(THREADS)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    if world > 1 and args.parallel == "fsdp2" and args.eval_windows < world:
        raise SystemExit(f"train_gpt.py: --parallel fsdp2 needs --eval-windows >= the world size "
                         f"{world} (every rank evaluates), got {args.eval_windows}")
    if args.batch % world:
        raise SystemExit(f"train_gpt.py: --batch {args.batch} must be a multiple of the world size {world}")
    vocab, train_tokens, valid_tokens = make_dataset(generate_corpus(args.chars))
    if train_tokens.numel() <= args.seq + 1 or valid_tokens.numel() < args.seq + 1:
        raise SystemExit(f"train_gpt.py: --chars {args.chars} is too small for --seq {args.seq}")
    windows = valid_windows(valid_tokens, args.eval_windows, args.seq)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.manual_seed(0)
        n = sum(p.numel() for p in GPT(len(vocab), args.d_model, args.layers, args.heads, args.seq,
                                       args.tie_head).parameters())
        mode = f" ({args.parallel})" if world > 1 else ""
        print(f"train_gpt.py: {world} rank(s){mode}, {THREADS} thread(s) each, {n} parameters, "
              f"vocab {len(vocab)}, {train_tokens.numel()} train / {valid_tokens.numel()} valid tokens",
              flush=True)
    logs = {}
    for run in args.runs:
        logs[run] = train(run, args, len(vocab), train_tokens, windows, rank, world)
        if rank == 0:
            write_csv(logs[run], os.path.join(args.out, run + ".csv"))
    if rank == 0:
        baseline = "adamw" if "adamw" in logs else args.runs[-1]
        print()
        print(comparison_table(logs, baseline))
        print(f"CSV logs: {args.out}/<run>.csv", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return world


if __name__ == "__main__":
    if main(ARGS) > 1:
        # A multi-rank run leaves without finalizing the interpreter: torch
        # 2.11's gloo worker thread may still be releasing the last
        # collective's tensors when finalization starts, and that aborts the
        # process ("terminate called without an active exception";
        # pytorch/pytorch#117762). Everything is written and flushed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
