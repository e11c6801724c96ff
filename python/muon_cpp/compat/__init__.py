"""Drop-in signatures of other Muon implementations over the muon-cpp engine.

* ``muon_cpp.compat.torch.Muon``: torch.optim.Muon's arguments, defaults,
  param group keys and step.
* ``muon_cpp.compat.keller.MuonWithAuxAdam`` and ``SingleDeviceMuonWithAuxAdam``:
  Keller Jordan's (KellerJordan/Muon, muon.py).

A program written for one of them changes only its import. docs/python.md,
"Drop-in signatures", lists what each matches and where it differs.
"""
