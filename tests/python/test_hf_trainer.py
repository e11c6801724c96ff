"""Training through Hugging Face's transformers.Trainer, on CPU.

A GPT-2-shaped model of two layers built from a config (no downloaded
weights) learns sequences that count up by a fixed stride from a random
start. The optimizer reaches the Trainer both ways it takes one:

- built by the caller: ``optimizers=(muon_cpp.MuonWithAdamW(...), scheduler)``;
- as a factory: ``optimizer_cls_and_kwargs=(MuonWithAdamWFactory, kwargs)``
  (the Trainer calls it with the model and builds its own schedule).

Each trains 20 steps with a checkpoint at step 10; the loss falls, and a
second Trainer resumed from that checkpoint ends with the same loss and the
same parameters, bit for bit (no dropout: the run is deterministic, so any
difference is state the checkpoint lost).

The whole file skips (pytest exit 5) where transformers is not installed.
"""
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import muon_cpp  # noqa: E402
from muon_cpp.integrations import ConfigFactory, MuonWithAdamWFactory  # noqa: E402

VOCAB, LENGTH, SEQUENCES, BATCH = 48, 24, 80, 8  # 10 batches per epoch
STEPS, SAVE_AT = 20, 10


class Counting(torch.utils.data.Dataset):
    """Sequences x_t = (start + stride·t) mod VOCAB, stride in {1, 2, 3}."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, VOCAB, (SEQUENCES, 1), generator=g)
        stride = torch.randint(1, 4, (SEQUENCES, 1), generator=g)
        self.ids = (start + stride * torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return SEQUENCES

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def arguments(out, **kw):
    return transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH,
        save_strategy="steps", save_steps=SAVE_AT, logging_steps=1, report_to="none",
        use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True, **kw)


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def final_parameters(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def built_optimizer(m):
    opt = muon_cpp.MuonWithAdamW(m.named_parameters(), lr=0.05, adamw_lr=1e-2)
    # Linear warm-up over 4 steps, then cosine decay to a tenth.
    def factor(step):
        if step < 4:
            return (step + 1) / 4
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 4) / (STEPS - 4)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def train(tmp_path, name, make_trainer):
    """The whole run, then one resumed from its step-10 checkpoint."""
    first = make_trainer(tmp_path / name)
    first.train()
    resumed = make_trainer(tmp_path / f"{name}-resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / name / f"checkpoint-{SAVE_AT}"))
    return first, resumed


def optimizer_of(trainer):
    """Ours, inside accelerate's wrapper."""
    return getattr(trainer.optimizer, "optimizer", trainer.optimizer)


def check(first, resumed, kind):
    assert isinstance(optimizer_of(first), kind), type(optimizer_of(first))
    curve = losses(first)
    assert len(curve) == STEPS
    # Cross-entropy starts near ln 48 = 3.9; 20 steps take it below 70% of that.
    assert curve[0] > 3.5, curve
    assert sum(curve[-3:]) / 3 < 0.7 * curve[0], curve
    # The resumed run's history is the checkpoint's (steps 1-10) and its own
    # (11-20): the same losses, and then the same parameters.
    assert losses(resumed) == curve
    a, b = final_parameters(first), final_parameters(resumed)
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n


def test_trainer_with_a_built_optimizer_and_schedule(tmp_path):
    def make(out):
        m = model()
        return transformers.Trainer(model=m, args=arguments(out), train_dataset=Counting(),
                                    optimizers=built_optimizer(m))
    first, resumed = train(tmp_path, "built", make)
    check(first, resumed, muon_cpp.MuonWithAdamW)
    # The matrices went to Muon, the embeddings and norms to AdamW.
    kinds = {g["optimizer"] for g in optimizer_of(first).param_groups}
    assert kinds == {"muon", "adamw"}
    # The schedule ran: the Muon groups end at a tenth of the peak, nearly.
    muon_lr = [g["lr"] for g in optimizer_of(first).param_groups if g["optimizer"] == "muon"]
    assert all(0.005 <= lr < 0.00625 for lr in muon_lr), muon_lr


def test_trainer_builds_the_optimizer_from_a_factory(tmp_path):
    def make(out):
        return transformers.Trainer(
            model=model(), args=arguments(out, learning_rate=0.05, lr_scheduler_type="cosine",
                                          warmup_steps=4),
            train_dataset=Counting(),
            optimizer_cls_and_kwargs=(MuonWithAdamWFactory, dict(lr=0.05, adamw_lr=1e-2)))
    first, resumed = train(tmp_path, "factory", make)
    check(first, resumed, muon_cpp.MuonWithAdamW)


def test_trainer_takes_any_registered_optimizer_by_config(tmp_path):
    config = {"optimizer": "muon", "scalar_optimizer": "adamw", "lr": 0.05,
              "overrides": [{"match": {"optimizer": "adamw"}, "set": {"lr": 1e-2}}]}
    def make(out):
        return transformers.Trainer(
            model=model(), args=arguments(out), train_dataset=Counting(),
            optimizer_cls_and_kwargs=(ConfigFactory, dict(config=config)))
    first, resumed = train(tmp_path, "config", make)
    check(first, resumed, muon_cpp.Optimizer)


def test_a_factory_given_something_else_than_a_model_says_so():
    with pytest.raises(TypeError, match="the model .*got list"):
        MuonWithAdamWFactory()([torch.zeros(2, 2)])
