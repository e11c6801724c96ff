// Tests of muon::KlSoap (kl_soap, kl_m_soap, rekls, rekls_v3, stacked_soap):
// values against an independent fp64 reference of Emerging-Optimizers'
// arithmetic, options and their errors, save/load, the registry entries,
// and the layouts (layer-wise and sharded owner-compute,
// muon::distributed::ShardedKlSoap, equal to one process bit for bit;
// checkpoints resharded across them; tensor_parallel and 2-D refused).
#include <gtest/gtest.h>

#include "archive_util.h"
#include "elementwise_cases.h"
#include "expect_util.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_model.h"
#include "layout_harness.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/sharded_kl_soap.h"
#include "muon/distributed/layouts/tensor_parallel_kl_soap.h"
#include "muon/optim/composite.h"
#include "muon/optim/kl_soap.h"
#include "muon/optim/laprop.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace ckpt = muon::test::checkpoint;

const std::vector<std::string> kKinds{"kl_soap", "kl_m_soap", "rekls", "tp_rekls", "rekls_v3", "stacked_soap"};

// ---- an fp64 reference of Emerging-Optimizers' arithmetic ------------------------

// One parameter's plain fp64 run of the family as Emerging-Optimizers writes
// it at fd77292: shampoo/soap_v3.py (SoapBase.step, KlSoapPreconditioner
// init_step/step, ReklsPreconditioner.step, KlSoapV3/KlMSoap._scalar_update),
// legacy_soap/soap.py (SOAP.step with use_kl_shampoo, use_eigh;
// update_kronecker_factors_kl_shampoo), legacy_soap/rekls.py,
// legacy_soap/stacked_soap.py (the 3-D view), utils/eig.py
// (eigh_with_fallback, orthogonal_iteration), calculate_adam_update and
// calculate_madam_update. It records the smallest gap between the
// eigenvalues above eps of a factor at an eigh or QR, relative to the
// largest: the eigenvectors are that sensitive to rounding.
struct RefKl {
  KlSoapOptions o;
  std::vector<int64_t> shape;
  at::Tensor p, m, v, L, R, QL, QR, wL, wR;
  int64_t s = 0;
  double min_gap = 1;

  RefKl(const KlSoapOptions& options, const at::Tensor& init) : o(options), shape(init.sizes().vec()) {
    p = init.to(at::kDouble).clone();
    const auto g = matrix(p);
    const int64_t rows = g.size(0), cols = g.size(1);
    m = at::zeros({rows, cols}, g.options());
    v = at::zeros_like(m);
    L = at::zeros({rows, rows}, g.options());
    R = at::zeros({cols, cols}, g.options());
    QL = at::eye(rows, g.options());
    QR = at::eye(cols, g.options());
    wL = at::zeros({rows}, g.options());
    wR = at::zeros({cols}, g.options());
  }
  // StackedSoap's 2-D view of a 3-D (b, m, n): (m, b·n) when n <= m, else (b·m, n).
  at::Tensor matrix(const at::Tensor& x) const {
    if (o.kind() == "stacked_soap" && shape.size() == 3) {
      const auto b = shape[0], rows = shape[1], cols = shape[2];
      return cols <= rows ? x.permute({1, 0, 2}).reshape({rows, b * cols}) : x.reshape({b * rows, cols});
    }
    return x.reshape({shape[0], -1});
  }
  at::Tensor unmatrix(const at::Tensor& x) const {
    if (o.kind() == "stacked_soap" && shape.size() == 3 && shape[2] <= shape[1]) {
      return x.reshape({shape[1], shape[0], shape[2]}).permute({1, 0, 2}).reshape(shape);
    }
    return x.reshape(shape);
  }
  void gap_of(const at::Tensor& w) {
    const auto big = std::get<0>(at::sort(w.masked_select(w > 1e-10 * w.abs().max())));
    if (big.size(0) < 2) return;
    min_gap = std::min(min_gap, (big.slice(0, 1) - big.slice(0, 0, -1)).min().item<double>() /
                                    big.abs().max().item<double>());
  }
  void refresh(const at::Tensor& k, at::Tensor& q, at::Tensor& w, bool eigh) {
    auto [vals, vecs] = at::linalg_eigh(k);
    gap_of(vals);
    if (eigh) {
      w = vals.flip({0});
      q = vecs.flip({1});
      return;
    }
    q = std::get<0>(at::linalg_qr(k.mm(q)));
    const auto d = (q.t().mm(k) * q.t()).sum(1);
    const auto order = at::argsort(d, 0, /*descending=*/true);
    w = d.index_select(0, order);
    q = q.index_select(1, order);
  }
  void step(const at::Tensor& grad) {
    const auto g = matrix(grad.to(at::kDouble));
    const double t = static_cast<double>(s + 1);
    const double bs = 1 - (1 - o.shampoo_beta()) / (1 - std::pow(o.shampoo_beta(), t));
    const auto corr = [&](const at::Tensor& q, const at::Tensor& w, double d) {
      return (q * (1.0 / d / w.clamp_min(o.eps())).unsqueeze(0)).mm(q.t());
    };
    const auto to_l = g.mm(corr(QR, wR, static_cast<double>(g.size(1)))).mm(g.t());
    const auto to_r = g.t().mm(corr(QL, wL, static_cast<double>(g.size(0)))).mm(g);
    L = bs * L + (1 - bs) * to_l;
    R = bs * R + (1 - bs) * to_r;
    const auto mom = QL.mm(m).mm(QR.t());
    const bool eigh = s == 0 || o.kind() == "rekls" || o.kind() == "tp_rekls" || o.kind() == "rekls_v3";
    refresh(L, QL, wL, eigh);
    refresh(R, QR, wR, eigh);
    m = QL.t().mm(mom).mm(QR);
    auto inner = g;
    const auto pm = matrix(p);
    if (o.weight_decay_method() == "l2") inner = g + o.weight_decay() * pm;
    const auto gp = QL.t().mm(inner).mm(QR);
    const double c1 = 1 - std::pow(o.beta1(), t);
    const double c2 = 1 - std::pow(o.beta2(), t);
    m = o.beta1() * m + (1 - o.beta1()) * gp;
    at::Tensor u;
    if (o.kind() == "kl_m_soap") {
      v = o.beta2() * v + (1 - o.beta2()) * (256.0 * gp).square();
      u = (m / c1) / (v / c2).sqrt() * 256.0;
      u.masked_fill_(m.eq(0), 0.0);
    } else {
      v = o.beta2() * v + (1 - o.beta2()) * gp.square();
      u = (m / c1) / ((v / c2).sqrt() + o.eps());
    }
    auto pn = pm;
    if (o.weight_decay_method() == "decoupled") pn = pm - o.lr() * o.weight_decay() * pm;
    if (o.weight_decay_method() == "independent") pn = pm - o.weight_decay() * pm;
    p = unmatrix(pn - o.lr() * QL.mm(u).mm(QR.t()));
    s += 1;
  }
};

const KlSoapParamState& state_of(const torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const KlSoapParamState&>(*opt.state().at(compat::state_key(p)));
}

// The reference takes `st` and `p` as its own (fp64), as after its step s.
void take_state(RefKl& ref, const KlSoapParamState& st, const at::Tensor& p) {
  ref.p = p.detach().to(at::kDouble).clone();
  ref.m = st.exp_avg().to(at::kDouble);
  ref.v = st.exp_avg_sq().to(at::kDouble);
  ref.L = st.L().to(at::kDouble);
  ref.R = st.R().to(at::kDouble);
  ref.QL = st.Q_L().to(at::kDouble);
  ref.QR = st.Q_R().to(at::kDouble);
  ref.wL = st.eigvals_L().to(at::kDouble);
  ref.wR = st.eigvals_R().to(at::kDouble);
  ref.s = st.step();
}

// The first step's bases are the singular vectors of G itself, so the
// projected gradient G' = Q_Lᵀ·G·Q_R is diagonal but for rounding, and the
// inner step turns each off-diagonal rounding error e into
// e / (|e| + eps): ±1 where e > eps (MAdam, which has no eps, always).
// That step is the published arithmetic and is as exact as the rounding
// allows only where eps is far above it. So the family is compared twice,
// with eps 1 (far above the rounding, and of the order of the factors'
// eigenvalues, so that the KL term's floor does not dwarf them):
//
// - from scratch, 5 steps in fp64 (the parameter fp64, so every state and
//   product is); MAdam (kl_m_soap) has no eps and is compared by the second
//   way only;
// - after the first step, 4 fp32 steps (the reference takes the first
//   step's state and parameter, in fp64).
//
// Tolerance, as tests/test_iso.cpp's: 5·d·u/gap, u = 2^-24 (fp32) or 2^-53
// (fp64), d the longest side, gap the smallest relative gap between a
// factor's eigenvalues at a refresh (asserted above 1e-3): each fp32 or
// fp64 eigenvector moves by about d·u·‖K‖/gap (first-order perturbation),
// the rest is O(10–100) operations per element on values of order 1
// (relative), and the inner step divides by √v + eps of the order of the
// projected gradient, not amplifying it; 5 steps.
//
// Both compare the parameter's change, L, R, v, λ_L and the bases (up to
// column signs, which the inner steps see only as sign flips that Q·U·Qᵀ
// undoes). A factor's numerically zero eigenvalues (the null space of the
// larger factor of a tall or wide matrix at the first steps) are one
// cluster: the KL term floors them all at eps, which sees only their span.
// From scratch, the orthogonal iteration of a tall or wide matrix's second
// step starts from the first step's basis of that null space, which any
// rounding rotates: only the kinds that rebuild the bases by eigh compare
// those shapes from scratch. And while the larger factor has a null space
// (the first ⌈m/n⌉ steps), the gradient has no component along it in exact
// arithmetic: MAdam's m/√v there is the sign of rounding, so kl_m_soap is
// compared on square matrices.
void expect_matches_reference(const std::vector<int64_t>& shape, const KlSoapOptions& o, uint64_t seed, bool fp64) {
  const auto data = gradient_run(seed, shape, 5);
  const auto dtype = fp64 ? at::kDouble : at::kFloat;
  auto p = leaf(data.init.to(dtype));
  KlSoap opt({p}, o);
  RefKl ref(o, data.init);
  for (int s = 0; s < 5; ++s) {
    if (fp64 || s > 0) ref.step(data.grads[static_cast<size_t>(s)]);
    p.mutable_grad() = data.grads[static_cast<size_t>(s)].to(dtype);
    opt.step();
    if (!fp64 && s == 0) take_state(ref, state_of(opt, p), p);
  }
  const auto what = o.kind() + " shape " + c10::str(c10::IntArrayRef(shape)) + " " + o.weight_decay_method() +
                    (fp64 ? " fp64" : " fp32");
  ASSERT_GT(ref.min_gap, 1e-3) << what;
  const double d = static_cast<double>(std::max(ref.L.size(0), ref.R.size(0)));
  const double tol = 5 * d * std::ldexp(1.0, fp64 ? -53 : -24) / ref.min_gap;
  const auto init = data.init.to(at::kDouble);
  EXPECT_LT(relative(p.detach().to(at::kDouble) - init, ref.p - init), tol) << what;
  const auto& st = state_of(opt, p);
  EXPECT_EQ(st.step(), 5) << what;
  EXPECT_LT(relative(st.L(), ref.L), tol) << what;
  EXPECT_LT(relative(st.R(), ref.R), tol) << what;
  EXPECT_LT(relative(st.exp_avg_sq(), ref.v), tol) << what;
  EXPECT_LT(relative(st.eigvals_L(), ref.wL), tol) << what;
  EXPECT_LT(relative(signs_aligned(st.Q_L(), ref.QL), ref.QL), tol) << what;
  EXPECT_LT(relative(signs_aligned(st.Q_R(), ref.QR), ref.QR), tol) << what;
}

TEST(KlSoap, StepsEqualEmergingOptimizersArithmetic) {
  for (const auto& kind : kKinds) {
    for (const bool fp64 : {true, false}) {
      if (fp64 && kind == "kl_m_soap") continue;  // no eps (see above)
      const auto o =
          KlSoapOptions(0.01).beta1(0.8).beta2(0.9).shampoo_beta(0.9).weight_decay(0.1).eps(1).kind(kind);
      expect_matches_reference({6, 6}, o, 1, fp64);  // 2-D
      // Tall and wide from scratch where the bases are rebuilt by eigh, and
      // not with MAdam (see above).
      if ((!fp64 && kind != "kl_m_soap") || kind == "rekls" || kind == "tp_rekls" || kind == "rekls_v3") {
        expect_matches_reference({9, 4}, o, 5, fp64);  // tall
        expect_matches_reference({4, 9}, o, 6, fp64);  // wide
      }
      if (kind == "stacked_soap") {
        expect_matches_reference({2, 6, 3}, o, 3, fp64);  // experts, n <= m: (6, 2·3)
        expect_matches_reference({2, 3, 6}, o, 4, fp64);  // experts, n > m: (2·3, 6)
      } else {
        expect_matches_reference({6, 3, 2}, o, 2, fp64);  // conv: one 6×6 matrix
      }
    }
  }
  // rekls' (and tp_rekls') other weight decay methods.
  for (const std::string kind : {"rekls", "tp_rekls"}) {
    for (const std::string method : {"l2", "independent"}) {
      const auto o = KlSoapOptions(0.01).weight_decay(0.2).eps(1).kind(kind).weight_decay_method(method);
      expect_matches_reference({6, 6}, o, 7, false);
      expect_matches_reference({6, 6}, o, 8, true);
    }
  }
}

TEST(KlSoap, DefaultsAreEmergingOptimizers) {
  // SoapBase.__init__ / REKLS.__init__ (lr required there; 3e-3 as muon::Soap's):
  // lr, beta1, beta2, shampoo_beta, eps, weight_decay, weight_decay_method, kind.
  elementwise::expect_fields(KlSoapOptions(), 3e-3, 0.9, 0.95, 0.95, 1e-8, 0.01, "decoupled", "kl_soap");
}

TEST(KlSoap, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({4, 3}));
  const auto bad = elementwise::refused_with<KlSoap, KlSoapOptions>({p});
  bad(KlSoapOptions(-1), {"[muon::KlSoap]", "lr", "-1"});
  bad(KlSoapOptions().beta1(1), {"beta1", "1"});
  bad(KlSoapOptions().shampoo_beta(-0.1), {"shampoo_beta", "-0.1"});
  bad(KlSoapOptions().eps(0), {"eps", "0"});
  bad(KlSoapOptions().kind("soap"), {"kind", "'soap'", "stacked_soap"});
  bad(KlSoapOptions().weight_decay_method("l2"), {"weight_decay_method", "'decoupled'", "kl_soap", "'l2'"});
  bad(KlSoapOptions().kind("rekls").weight_decay_method("palm"), {"weight_decay_method", "'palm'"});
  auto v = leaf(at::randn({5}));
  expect_value_error([&] { KlSoap opt({v}); }, {"[muon::KlSoap]", "1 dims", "matrices"});
  auto four = leaf(at::randn({2, 2, 2, 2}));
  KlSoap stacked({four}, KlSoapOptions().kind("stacked_soap"));
  four.mutable_grad() = at::ones_like(four);
  expect_value_error([&] { stacked.step(); }, {"[muon::KlSoap]", "4 dims", "stacked_soap"});
  EXPECT_TRUE(stacked.state().empty());
  // An edit between steps is checked by the step, which changes nothing.
  KlSoap opt({p}, KlSoapOptions(0.1));
  elementwise::expect_spoiled_step_changes_nothing<KlSoapParamState>(
      opt, p, at::randn({4, 3}), [&] { static_cast<KlSoapOptions&>(opt.param_groups()[0].options()).beta2(2); },
      {"beta2", "2"});
}

TEST(KlSoap, AGradientBeyondTheFactorsRangeChangesNothing) {
  auto p = leaf(at::randn({4, 6}));
  KlSoap opt({p}, KlSoapOptions(0.1));
  elementwise::expect_spoiled_step_changes_nothing<KlSoapParamState>(
      opt, p, at::randn({4, 6}), [&] { p.mutable_grad() = at::full({4, 6}, 1e30); },
      {"[muon::KlSoap]", "Kronecker factor", "not finite"});
}

TEST(KlSoap, ResumedRunIsBitIdentical) {
  for (const auto& kind : kKinds) {
    const auto o = KlSoapOptions(0.01).kind(kind);
    expect_resumed_run_bit_identical<KlSoap>(gradient_run(1, {6, 4}, 7), 3, o, KlSoapOptions(0.5).kind(kind),
                                             state_of, kind);
  }
  expect_resumed_run_bit_identical<KlSoap>(gradient_run(2, {2, 3, 5}, 7), 3, KlSoapOptions(0.01).kind("stacked_soap"),
                                           KlSoapOptions(0.5).kind("stacked_soap"), state_of, "stacked 3-D");
}

TEST(KlSoap, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  expect_refuses_archive_of<KlSoap, LaProp>(KlSoapOptions(0.2), "[muon::KlSoap]", "muon::LaProp");
}

TEST(KlSoap, EachEntryIsBuiltFromAConfigWithItsFieldsAndExplained) {
  for (const auto& kind : kKinds) {
    ckpt::BuiltFromConfig<KlSoap, KlSoapOptions> built(
        kind, R"({"optimizer": ")" + kind + R"(", "lr": 0.01, ")" + kind + R"(_beta1": 0.5, ")" + kind +
                  R"(_shampoo_beta": 0.8, ")" + kind + R"(_eps": 1e-6})");
    ASSERT_NE(built.part, nullptr) << kind;
    // Every field: the config's, the common weight_decay's 0, the rest the family's defaults.
    elementwise::expect_fields(built.options(), 0.01, 0.5, 0.95, 0.8, 1e-6, 0.0, "decoupled", kind);
    const auto text = built.step_and_explain();
    // w 8×4: exp_avg, exp_avg_sq 8×4, L, Q_L 8×8, R, Q_R 4×4, eigvals 8 and 4; fp32.
    EXPECT_EQ(built.part->state_bytes(), 4 * (2 * 32 + 2 * 64 + 2 * 16 + 8 + 4)) << kind;
    EXPECT_NE(text.find("state of " + kind + ": step [counter], exp_avg ["), std::string::npos) << text;
  }
  const ckpt::BuiltFromConfig<KlSoap, KlSoapOptions> rekls(
      "rekls", R"({"optimizer": "rekls", "rekls_weight_decay_method": "l2"})");
  ASSERT_NE(rekls.part, nullptr);
  EXPECT_EQ(rekls.options().weight_decay_method(), "l2");
}

// ---- layouts ---------------------------------------------------------------------

TEST(KlSoap, LayerwiseAndShardedEqualOneProcessThroughMakeOptimizer) {
  for (const std::string kind : {"kl_soap", "rekls"}) {
    ckpt::expect_owner_compute_layouts<distributed::ShardedKlSoap>(
        kind, 3, {{"layerwise", 2}, {"sharded", 2}, {"sharded", 3}, {"padded", 3}});
  }
}

// Why bit for bit: the owner receives the whole gradient (and under l2 the
// whole parameter) as one process has them and runs
// muon::detail::kl_soap_update, the function one process runs; each rank
// applies weight decay and its rows of the update with the same
// element-wise operations. Wide, tall, a 2-row matrix (empty shards at 3
// and 4 ranks) and two 3-D parameters (one matrix dim 0 × the rest, or
// stacked_soap's stack of experts, (m, b·n) and (b·m, n)).
const layouts::SeededMatrices kSharded{{{7, 12}, {13, 5}, {6, 4, 3}, {2, 9}, {4, 2, 5}}, 110, 700};

TEST(ShardedKlSoap, OwnerComputeEqualsOneProcessBitForBit) {
  for (const auto& o : {KlSoapOptions(0.02).kind("kl_m_soap"), KlSoapOptions(0.02).kind("stacked_soap"),
                        KlSoapOptions(0.02).kind("rekls").weight_decay_method("l2").weight_decay(0.1)}) {
    layouts::owner_compute_bit_for_bit<KlSoap, distributed::ShardedKlSoap>(
        kSharded, 4, o, o.kind(), state_of,
        [](const KlSoapParamState& st, const KlSoapParamState& want) {
          return at::equal(st.L(), want.L()) && at::equal(st.Q_R(), want.Q_R()) && at::equal(st.exp_avg(), want.exp_avg());
        },
        [](const KlSoapParamState& st) { return !st.L().defined(); });
  }
}

TEST(ShardedKlSoap, CheckpointsReshardBitIdentically) { ckpt::owner_compute_reshard_chain("kl_soap"); }

// Why bit for bit: every rank of the group gathers the whole gradient, as
// one process has it, and runs muon::detail::kl_soap_update on it with the
// state one process has; each rank keeps its block of that update. The
// model's qkv and fc1 are split by rows, fc2 by columns (uneven at 3 ranks);
// the rest, replicated, steps as one process.
TEST(TensorParallelKlSoap, TensorParallelEqualsOneProcessBitForBit) {
  for (const std::string kind : {"tp_rekls", "rekls", "kl_soap", "kl_m_soap", "rekls_v3"}) {
    const auto single = ckpt::one_process_after(kind, {3}).at(3);
    ckpt::expect_layouts_equal(kind, 3, single, {{"tp", 2}, {"tp", 3}}, kind, [&](ckpt::Rank& r, const std::string&) {
      auto* composite = dynamic_cast<CompositeOptimizer*>(r.opt.get());
      ASSERT_NE(composite, nullptr);
      EXPECT_NE(dynamic_cast<distributed::TensorParallelKlSoap*>(composite->find_part(kind)), nullptr) << kind;
    });
  }
}

// The whole-matrix state every rank of a tensor-parallel group keeps is
// stored once and loads into every layout.
TEST(TensorParallelKlSoap, CheckpointsReshardBitIdentically) {
  ckpt::reshard_chain("tp_rekls", "tp_rekls_chain",
                      {{"tp", 2, 2, "tp_rekls tp W=2"},
                       {"none", 1, 3, "tp_rekls single from tp W=2"},
                       {"tp", 3, 4, "tp_rekls tp W=3 from single"},
                       {"sharded", 2, 5, "tp_rekls sharded W=2 from tp W=3"},
                       {"tp", 2, 6, "tp_rekls tp W=2 from sharded W=2"}},
                      ckpt::one_process_after("tp_rekls", {2, 3, 4, 5, 6}));
}

// stacked_soap (3-D stacks) is the family's one entry tensor_parallel refuses.
TEST(ShardedKlSoap, SplittingLayoutsAreRefusedNamingTheOptimizer) {
  ckpt::expect_splitting_layouts_refused<distributed::ShardedKlSoap>(
      "stacked_soap", "[muon::distributed::ShardedKlSoap]", KlSoapOptions().kind("rekls"), "rekls");
}

}  // namespace
}  // namespace muon::test
