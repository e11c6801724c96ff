// Orthogonalizes a random matrix with the installed library and checks that
// the result is close to orthogonal: the smallest working use of muon-cpp.
#include <muon/muon.h>

#include <iostream>

int main() {
  at::manual_seed(0);
  const auto g = at::randn({64, 256});
  const auto x = muon::newton_schulz(
      g, muon::NewtonSchulzOptions().coefficients("polar_express").method("auto"));
  const auto gram = at::mm(x, x.t());
  const double err = (gram - at::eye(64)).abs().max().item<double>();
  std::cout << "muon " << muon::kVersionString << ": max |X·Xᵀ - I| = " << err << "\n";
  return err < 0.05 ? 0 : 1;
}
