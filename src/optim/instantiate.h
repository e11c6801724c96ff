#pragma once

// MUON_INSTANTIATE_LISTED(Base, Opt, Options, State), at namespace muon in
// the file that defines optimizer `Opt`: the explicit instantiations of its
// options (ListedOptions<Options>), its per-parameter state
// (ListedParamState<State, N>, N its kBuffers' count), of
// ListedOptimizer<Opt, Options, State> and of `Base<Opt, Options, State>`
// (WholeMatrixOptimizer or ElementwiseOptimizer), whose member definitions
// that file includes.
#include "muon/optim/listed_fields.h"

#define MUON_INSTANTIATE_LISTED(Base, Opt, Options, State)         \
  template struct ListedOptions<Options>;                          \
  template struct ListedParamState<State, State::kBuffers.size()>; \
  template class ListedOptimizer<Opt, Options, State>;             \
  template class Base<Opt, Options, State>
