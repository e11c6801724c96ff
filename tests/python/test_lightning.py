"""Training through Lightning, on CPU.

``configure_optimizers`` returns ``muon_cpp.MuonWithAdamW`` (alone, and with
a scheduler in Lightning's dict form); ``Trainer(max_steps=20)`` trains a
small language model built here, Lightning calling ``step(closure)`` with
its own closure (forward, backward) and ``zero_grad``. A checkpoint of
``ModelCheckpoint`` at step 10 (the end of the first epoch: the data order
of the second epoch is the same in both runs) resumes with ``fit(ckpt_path=...)``
to the same losses and the same parameters, bit for bit.

The whole file skips (pytest exit 5) where Lightning is not installed.
"""
import pytest
import torch

L = pytest.importorskip("lightning")

import muon_cpp  # noqa: E402

VOCAB, LENGTH, SEQUENCES, BATCH = 32, 16, 80, 8  # 10 batches per epoch
STEPS, SAVE_AT = 20, 10


def data():
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, VOCAB, (SEQUENCES, 1), generator=g)
    stride = torch.randint(1, 4, (SEQUENCES, 1), generator=g)
    ids = (start + stride * torch.arange(LENGTH + 1)) % VOCAB
    ds = torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:])
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=False)


class Model(L.LightningModule):
    """Embedding, two residual MLP blocks that also see the previous token,
    a norm and an output head."""

    def __init__(self, with_schedule):
        super().__init__()
        torch.manual_seed(0)
        self.with_schedule = with_schedule
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
            for _ in range(2))
        self.norm = torch.nn.LayerNorm(32)
        self.head = torch.nn.Linear(32, VOCAB)
        self.losses = []

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            prev = torch.nn.functional.pad(h, (0, 0, 1, 0))[:, :-1]
            h = h + block(torch.cat([h, prev], dim=-1))
        return self.head(self.norm(h))

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        opt = muon_cpp.MuonWithAdamW(self.named_parameters(), lr=0.05, adamw_lr=1e-2)
        if not self.with_schedule:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def trainer(out, callbacks=()):
    return L.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(out), callbacks=list(callbacks))


@pytest.mark.parametrize("with_schedule", [False, True])
def test_lightning_trains_checkpoints_and_resumes(tmp_path, with_schedule):
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"),
                                               every_n_train_steps=SAVE_AT, save_top_k=-1)
    first = Model(with_schedule)
    trainer(tmp_path / "a", [ckpt]).fit(first, data())
    assert len(first.losses) == STEPS
    opt = first.optimizers()  # Lightning's wrapper of ours
    assert isinstance(opt.optimizer, muon_cpp.MuonWithAdamW)
    # Cross-entropy starts near ln 32 = 3.5; 20 steps take it below 70% of that.
    assert first.losses[0] > 3.0, first.losses
    assert sum(first.losses[-3:]) / 3 < 0.7 * first.losses[0], first.losses
    saved = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    at = [p for p in saved if f"step={SAVE_AT}" in p.name]
    assert len(at) == 1, saved

    resumed = Model(with_schedule)
    trainer(tmp_path / "b").fit(resumed, data(), ckpt_path=str(at[0]))
    assert resumed.losses == first.losses[SAVE_AT:]
    for (n, a), (_, b) in zip(first.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), n
    if with_schedule:
        muon_lr = [g["lr"] for g in resumed.optimizers().optimizer.param_groups
                   if g["optimizer"] == "muon"]
        assert muon_lr and all(abs(lr - 0.05 * 0.7 ** 4) < 1e-12 for lr in muon_lr), muon_lr
