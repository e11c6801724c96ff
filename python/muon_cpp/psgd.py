"""PSGD-Pro as a torch.optim.Optimizer: Emerging-Optimizers' psgd_pro (the C++
class muon::PsgdPro, include/muon/optim/psgd_pro.h), with its keywords."""
from .optim import _OneOptimizer

__all__ = ["PSGDPro"]


class PSGDPro(_OneOptimizer):
    """PSGD-Pro (Emerging-Optimizers' PSGDPro, "psgd_pro"): the gradient's EMA
    preconditioned by Kronecker factors Q_L, Q_R fitted to the noisy momentum by
    Procrustes steps, u = Q_Lᵀ·Q_L·m·Q_Rᵀ·Q_R. Emerging-Optimizers' keywords and
    defaults: lr=3e-3, weight_decay=0.01, momentum=0.9,
    weight_decay_method="decoupled", beta_lip=0.9, precond_lr=0.1,
    precond_init_scale=1.0, damping_noise_scale=0.1, min_precond_lr=0.01,
    warmup_steps=10000, max_update_rms=0.0; ``seed`` seeds the random draws
    (drawn per matrix shape and step, so every layout draws alike). Parameters of
    3 or more dims are one matrix (dim 0 by the rest). State per parameter:
    step, exp_avg, Q_L, Q_R, lip_L, lip_R."""

    _kind = "psgd_pro"

    def __init__(self, params, lr=3e-3, weight_decay=0.01, momentum=0.9, *,
                 weight_decay_method="decoupled", beta_lip=0.9, precond_lr=0.1,
                 precond_init_scale=1.0, damping_noise_scale=0.1, min_precond_lr=0.01,
                 warmup_steps=10000, max_update_rms=0.0, layout=None, nonfinite="error", **options):
        options.update(momentum=momentum, weight_decay_method=weight_decay_method, beta_lip=beta_lip,
                       precond_lr=precond_lr, precond_init_scale=precond_init_scale,
                       damping_noise_scale=damping_noise_scale, min_precond_lr=min_precond_lr,
                       warmup_steps=warmup_steps, max_update_rms=max_update_rms)
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)
