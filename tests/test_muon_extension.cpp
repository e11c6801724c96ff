// Tests of muon::Muon's extension points: an orthogonalization strategy that
// replaces the orthogonalized update, held by a Muon with its own archive kind.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "archive_util.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalizer.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

// The update is the plain sign of the momentum (no Newton–Schulz).
class SignOrthogonalizer : public muon::Orthogonalizer {
 public:
  int calls = 0;
  std::string name() const override { return "sign"; }
  void orthogonalize(std::vector<muon::OrthogonalizeItem>& items) override {
    for (auto& item : items) {
      ++calls;
      EXPECT_GE(item.state->step(), 1);  // counted before the strategy runs
      item.alpha = 0.5;
      item.orth = item.update.sign();
    }
  }
};

// A variant through the extension points: Muon holding the sign strategy,
// with its own archive kind.
class SignMuon : public Muon {
 public:
  explicit SignMuon(std::vector<at::Tensor> params, MuonOptions options = {})
      : SignMuon(std::move(params), std::move(options), std::make_shared<SignOrthogonalizer>()) {}
  int& calls;

 protected:
  std::string archive_kind() const override { return "test::SignMuon"; }

 private:
  SignMuon(std::vector<at::Tensor> params, MuonOptions options,
           const std::shared_ptr<SignOrthogonalizer>& strategy)
      : Muon({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(options), strategy),
        calls(strategy->calls) {}
};

TEST(MuonExtension, SubclassReplacesTheOrthogonalUpdate) {
  auto p = leaf(at::randn({4, 6}, at::kDouble));
  const auto p0 = p.detach().clone();
  const auto g = at::randn({4, 6}, at::kDouble);
  SignMuon opt({p}, MuonOptions(0.1).nesterov(false).momentum(0.5));
  p.mutable_grad() = g.clone();
  opt.step();
  EXPECT_EQ(opt.calls, 1);
  // ema momentum from zero: buf = 0.5·g; update = sign(buf) scaled by alpha 0.5.
  EXPECT_TRUE(at::equal(p.detach(), p0 - 0.1 * 0.5 * g.sign()));
  // Archives of different kinds do not load into each other.
  const auto bytes = save_to_string(opt);
  auto q = leaf(at::randn({4, 6}, at::kDouble));
  Muon plain({q});
  EXPECT_THROW(load_from_string(plain, bytes), c10::ValueError);
  SignMuon same({q});
  load_from_string(same, bytes);
  EXPECT_EQ(same.state_bytes(), 4 * 6 * 8);
}

}  // namespace
}  // namespace muon::test
