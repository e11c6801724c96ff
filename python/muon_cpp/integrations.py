"""The training tools' own ways of taking an optimizer.

Hugging Face ``transformers.Trainer`` takes an optimizer three ways: a built
one (``optimizers=(opt, scheduler)``), or a class and its keyword arguments
(``optimizer_cls_and_kwargs=(cls, kwargs)``), where a class that is not a
``torch.optim.Optimizer`` is a factory: the Trainer calls ``cls()(model,
**kwargs)`` with the whole model, which is what routing by parameter name
needs. The factories below are such classes::

    from muon_cpp.integrations import MuonWithAdamWFactory, ConfigFactory
    Trainer(model, args, train_dataset=ds,
            optimizer_cls_and_kwargs=(MuonWithAdamWFactory, dict(lr=0.02, adamw_lr=3e-4)))
    Trainer(..., optimizer_cls_and_kwargs=(ConfigFactory, dict(config={"optimizer": "muon"})))

The Trainer then builds its learning-rate schedule over the optimizer (its
``lr_scheduler_type``), saves and loads it with its checkpoints. Lightning
needs nothing of this module: ``configure_optimizers`` returns a muon_cpp
optimizer.
"""
from .optim import MuonWithAdamW, make_optimizer

__all__ = ["MuonWithAdamWFactory", "ConfigFactory"]


def _trainable(model):
    """model.named_parameters() that train (requires_grad), or a TypeError
    naming what was given."""
    named = getattr(model, "named_parameters", None)
    if not callable(named):
        raise TypeError("the optimizer factory is called with the model (a torch.nn.Module), "
                        f"got {type(model).__name__}")
    return [(n, p) for n, p in named() if p.requires_grad]


class MuonWithAdamWFactory:
    """``MuonWithAdamWFactory()(model, **kwargs)`` is ``MuonWithAdamW`` over the
    model's trainable parameters, with ``kwargs`` (lr, adamw_lr, ...)."""

    def __call__(self, model, **kwargs):
        return MuonWithAdamW(_trainable(model), **kwargs)


class ConfigFactory:
    """``ConfigFactory()(model, config=..., layout=None)`` is
    ``make_optimizer`` over the model's trainable parameters: any registered
    optimizer, its per-parameter override rules included."""

    def __call__(self, model, config, layout=None):
        return make_optimizer(_trainable(model), config, layout)
