// Tests of muon::Lion: exact values against the paper's update written with
// plain tensor ops, options and their errors, convergence, and the tests of
// every element-wise optimizer (elementwise_cases.h: schedulers, save/load,
// the registry entry, checkpoints in every layout).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "elementwise_cases.h"
#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/laprop.h"
#include "muon/optim/lion.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

// One Lion step of the paper (Chen et al. 2023, Program 1), on plain tensors:
// u = sign(β1·m + (1 − β1)·g); p ← p·(1 − lr·wd) − lr·u; m ← β2·m + (1 − β2)·g.
void reference_step(at::Tensor& p, at::Tensor& m, const at::Tensor& g, double lr, double b1,
                    double b2, double wd) {
  const auto u = at::sign(b1 * m + (1 - b1) * g);
  p = p * (1 - lr * wd) - lr * u;
  m = b2 * m + (1 - b2) * g;
}

// Lion in the tests every element-wise optimizer passes (elementwise_cases.h).
struct LionCase : elementwise::CaseOf<Lion, LaProp> {
  static constexpr const char* kName = "lion";
  static Options resumed() { return LionOptions(0.01).weight_decay(0.1); }
  static Options replaced() { return LionOptions(0.5); }
  static void bad_edit(Options& o) { o.beta1(1.0); }
  static std::vector<std::string> bad_edit_words() { return {"[muon::Lion]", "beta1", "1"}; }
  static constexpr const char* kConfig = R"({"optimizer": "lion", "lr": 0.01, "lion_beta2": 0.98})";
  static void check_config(const Options& o) {
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.beta1(), 0.9);
    EXPECT_EQ(o.beta2(), 0.98);
    EXPECT_EQ(o.weight_decay(), 0.0);
  }
};

TEST(Lion, StepsEqualThePaperFormula) {
  at::manual_seed(0);
  const double lr = 0.01;
  const double b1 = 0.8;
  const double b2 = 0.95;
  const double wd = 0.3;
  auto p = leaf(at::randn({5, 7}, at::kDouble));
  auto q = leaf(at::randn({3}, at::kDouble));
  auto p_ref = p.detach().clone();
  auto q_ref = q.detach().clone();
  auto m_p = at::zeros_like(p_ref);
  auto m_q = at::zeros_like(q_ref);
  Lion opt({p, q}, LionOptions(lr).beta1(b1).beta2(b2).weight_decay(wd));
  for (int step = 0; step < 5; ++step) {
    const auto gp = at::randn({5, 7}, at::kDouble);
    const auto gq = at::randn({3}, at::kDouble);
    p.mutable_grad() = gp.clone();
    q.mutable_grad() = gq.clone();
    opt.step();
    reference_step(p_ref, m_p, gp, lr, b1, b2, wd);
    reference_step(q_ref, m_q, gq, lr, b1, b2, wd);
    // Same operations in fp64 (lerp vs. weighted sum differ by rounding only;
    // the sign never flips for random normal inputs): 1e-12 absolute.
    ASSERT_TRUE(at::allclose(p.detach(), p_ref, 0, 1e-12)) << "step " << step;
    ASSERT_TRUE(at::allclose(q.detach(), q_ref, 0, 1e-12)) << "step " << step;
  }
  const auto& st = static_cast<const LionParamState&>(
      *opt.state().at(muon::compat::state_key(p)));
  EXPECT_EQ(st.step(), 5);
  EXPECT_TRUE(at::allclose(st.exp_avg(), m_p, 0, 1e-12));
  EXPECT_EQ(opt.state_bytes(), (5 * 7 + 3) * 8);
}

TEST(Lion, EveryCoordinateMovesByLr) {
  auto p = leaf(at::zeros({4, 4}));
  Lion opt({p}, LionOptions(0.5));
  p.mutable_grad() = at::randn({4, 4});
  opt.step();
  EXPECT_TRUE(at::equal(p.detach().abs(), at::full({4, 4}, 0.5f)));
}

TEST(Lion, InvalidOptionsNameArgumentAndValue) {
  using O = LionOptions;
  elementwise::expect_invalid_options<LionCase>({{O().beta1(1.0), {"beta1", "[0, 1)", "1"}},
                                                 {O().beta2(-0.1), {"beta2", "-0.1"}},
                                                 {O().weight_decay(-2), {"weight_decay", "-2"}}});
}

TEST(Lion, LowersTheLossOfALeastSquaresProblem) {
  at::manual_seed(3);
  const auto a = at::randn({32, 8});
  const auto x_true = at::randn({8, 1});
  const auto y = a.mm(x_true);
  auto x = leaf(at::zeros({8, 1}));
  Lion opt({x}, LionOptions(0.02));
  auto loss_fn = [&] { return (a.mm(x) - y).pow(2).mean(); };
  const double initial = loss_fn().item<double>();
  for (int i = 0; i < 300; ++i) {
    opt.zero_grad();
    loss_fn().backward();
    opt.step();
  }
  // Sign steps of size lr hover within ~lr of the optimum: the loss ends far below its start.
  EXPECT_LT(loss_fn().item<double>(), 0.01 * initial);
}

MUON_ELEMENTWISE_CASES(Lion, LionCase)

}  // namespace
}  // namespace muon::test
