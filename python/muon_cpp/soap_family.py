"""The KL-Shampoo SOAP family as torch.optim.Optimizers: Emerging-Optimizers'
kl_soap, kl_m_soap, rekls, rekls_v3 and stacked_soap (one C++ class,
muon::KlSoap, include/muon/optim/kl_soap.h), with Emerging-Optimizers' keywords.
"""
from .optim import _OneOptimizer

__all__ = ["KlSoap", "KlMSoap", "REKLS", "TpRekls", "ReklsV3", "StackedSoap"]


class _KlSoapFamily(_OneOptimizer):
    """SoapBase's keywords: lr (3e-3 here; Emerging-Optimizers requires it),
    betas=(0.9, 0.95), shampoo_beta=0.95, eps=1e-8 (the eigenvalues' floor in the
    KL factor update and Adam's eps), weight_decay=0.01 (decoupled). Parameters of
    3 or more dims are one matrix (dim 0 by the rest). State per parameter: step,
    exp_avg, exp_avg_sq, L, R, Q_L, Q_R, eigvals_L, eigvals_R."""

    def __init__(self, params, lr=3e-3, betas=(0.9, 0.95), shampoo_beta=0.95, eps=1e-8,
                 weight_decay=0.01, *, layout=None, nonfinite="error", **options):
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}"[:200])
        options.update(beta1=betas[0], beta2=betas[1], shampoo_beta=shampoo_beta, eps=eps)
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class KlSoap(_KlSoapFamily):
    """KL-SOAP (Emerging-Optimizers' KlSoapV3, "kl_soap"): Adam in the eigenbasis
    of KL-Shampoo's Kronecker factors, refreshed by one orthogonal iteration a step
    (eigh at the first)."""

    _kind = "kl_soap"


class KlMSoap(_KlSoapFamily):
    """KL-M-SOAP ("kl_m_soap"): KlSoap with MAdam (no eps; the second moment
    stored scaled by 2**16) inside."""

    _kind = "kl_m_soap"


class ReklsV3(_KlSoapFamily):
    """REKLS v3 ("rekls_v3"): KlSoap with the eigenbases rebuilt by eigh every step."""

    _kind = "rekls_v3"


class REKLS(_KlSoapFamily):
    """REKLS (Emerging-Optimizers' legacy REKLS, "rekls"): as ReklsV3, with
    ``weight_decay_method`` "decoupled" (default), "independent" or "l2"."""

    _kind = "rekls"

    def __init__(self, params, lr=3e-3, betas=(0.9, 0.95), shampoo_beta=0.95, eps=1e-8,
                 weight_decay=0.01, *, weight_decay_method="decoupled", layout=None,
                 nonfinite="error", **options):
        options["weight_decay_method"] = weight_decay_method
        super().__init__(params, lr, betas, shampoo_beta, eps, weight_decay, layout=layout,
                         nonfinite=nonfinite, **options)


class TpRekls(REKLS):
    """REKLS for the tensor-parallel layout ("tp_rekls", Emerging-Optimizers'
    TpRekls): REKLS's arithmetic; in ``muon_cpp.distributed``'s tensor_parallel
    layout each step gathers a block's whole gradient, steps the whole matrix
    with state every rank of the group keeps alike, and keeps its block
    (REKLS and the other KL-SOAP entries but StackedSoap run there too).
    Emerging-Optimizers' ``tp_group`` and ``partition_dim`` are the layout's
    tensor-parallel shards here."""

    _kind = "tp_rekls"


class StackedSoap(_KlSoapFamily):
    """Stacked SOAP ("stacked_soap"): KlSoap on 2-D parameters and on 3-D stacks
    (b, m, n) seen as one (m, b·n) matrix when n <= m, else (b·m, n)."""

    _kind = "stacked_soap"
