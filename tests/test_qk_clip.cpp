// QK-clip (muon/qk_clip.h) against the published arithmetic (Kimi K2 §2.1;
// Megatron-Core's SelfAttention.clip_qk for grouped queries), written here
// in fp64: per head, the largest causal logit q_i·k_j/√d of fixed inputs,
// recomputed after the clip from the same inputs, is τ for the head that
// set its group's maximum and γ times its old value for the others; heads
// under τ keep their weights bit for bit; V rows never change. Fused
// (grouped, blocked) and separate weights, multi-head and grouped-query
// attention, row ranges that cut a head, and every invalid argument.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "muon/qk_clip.h"

namespace muon::test {
namespace {

constexpr int64_t kWidth = 16;
constexpr int64_t kTokens = 7;
constexpr int64_t kHeadDim = 8;

at::Tensor randn(const std::vector<int64_t>& shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions(at::kFloat));
}

// An attention of H query heads and G key/value heads: separate fp32
// weights, fixed inputs x (tokens × width).
struct Attention {
  int64_t heads;
  int64_t kv_heads;
  at::Tensor q;  // (H·d, width)
  at::Tensor k;  // (G·d, width)
  at::Tensor v;  // (G·d, width)
  at::Tensor x;  // (tokens, width)

  int64_t group_size() const { return heads / kv_heads; }
};

// Query heads `boosted` get their W_q rows scaled by 6, so that their
// logits are far above the others'.
Attention make_attention(int64_t heads, int64_t kv_heads, const std::vector<int64_t>& boosted) {
  Attention a{heads,
              kv_heads,
              randn({heads * kHeadDim, kWidth}, 1),
              randn({kv_heads * kHeadDim, kWidth}, 2),
              randn({kv_heads * kHeadDim, kWidth}, 3),
              randn({kTokens, kWidth}, 4)};
  for (const auto h : boosted) a.q.narrow(0, h * kHeadDim, kHeadDim).mul_(6.0f);
  return a;
}

// The reference, in fp64 from the fp32 weights: head h's logits
// q_i·k_j/√d over the causal pairs j <= i, with k of its key head h / r.
at::Tensor ref_logits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& x, int64_t h,
                      int64_t group_size) {
  const auto xd = x.to(at::kDouble);
  const auto qh = at::matmul(xd, q.narrow(0, h * kHeadDim, kHeadDim).to(at::kDouble).t());
  const auto kh =
      at::matmul(xd, k.narrow(0, (h / group_size) * kHeadDim, kHeadDim).to(at::kDouble).t());
  const auto s = at::matmul(qh, kh.t()) / std::sqrt(static_cast<double>(kHeadDim));
  const auto causal = at::ones({kTokens, kTokens}, at::kBool).tril();
  return s.masked_fill(causal.logical_not(), -INFINITY);
}

double ref_max(const at::Tensor& q, const at::Tensor& k, const at::Tensor& x, int64_t h,
               int64_t r) {
  return ref_logits(q, k, x, h, r).max().item<double>();
}

at::Tensor ref_max_logits(const Attention& a) {
  auto m = at::empty({a.heads}, at::kDouble);
  for (int64_t h = 0; h < a.heads; ++h) m[h] = ref_max(a.q, a.k, a.x, h, a.group_size());
  return m;
}

// The bound on |S' − γ·S| for every causal pair of head h after the clip,
// from the rounding of the scaled fp32 weights (see ClipsToTau below).
double ref_bound(const Attention& a, int64_t h, double gamma) {
  const double u = std::ldexp(1.0, -24);
  const double e = 2 * u + u * u;  // the factor's rounding to fp32, then the product's
  const auto ax = a.x.to(at::kDouble).abs();
  const auto A = at::matmul(ax, a.q.narrow(0, h * kHeadDim, kHeadDim).to(at::kDouble).abs().t());
  const auto B = at::matmul(
      ax, a.k.narrow(0, (h / a.group_size()) * kHeadDim, kHeadDim).to(at::kDouble).abs().t());
  const double worst = at::matmul(A, B.t()).max().item<double>() / std::sqrt(double(kHeadDim));
  // 1.01 and the last term cover the fp64 arithmetic of the reference.
  return 1.01 * gamma * ((1 + e) * (1 + e) - 1) * worst + 1e-12 * std::abs(worst);
}

// The fused weights of `a`: grouped [q heads of g; k_g; v_g] per group g,
// and blocked [Q; K; V].
at::Tensor grouped(const Attention& a) {
  const int64_t r = a.group_size();
  std::vector<at::Tensor> rows;
  for (int64_t g = 0; g < a.kv_heads; ++g) {
    rows.push_back(a.q.narrow(0, g * r * kHeadDim, r * kHeadDim));
    rows.push_back(a.k.narrow(0, g * kHeadDim, kHeadDim));
    rows.push_back(a.v.narrow(0, g * kHeadDim, kHeadDim));
  }
  return at::cat(rows).contiguous();
}
Attention from_grouped(const Attention& like, const at::Tensor& w) {
  const int64_t r = like.group_size();
  std::vector<at::Tensor> q, k, v;
  for (int64_t g = 0; g < like.kv_heads; ++g) {
    const int64_t base = g * (r + 2) * kHeadDim;
    q.push_back(w.narrow(0, base, r * kHeadDim));
    k.push_back(w.narrow(0, base + r * kHeadDim, kHeadDim));
    v.push_back(w.narrow(0, base + (r + 1) * kHeadDim, kHeadDim));
  }
  return {like.heads, like.kv_heads, at::cat(q), at::cat(k), at::cat(v), like.x};
}
at::Tensor blocked(const Attention& a) { return at::cat({a.q, a.k, a.v}).contiguous(); }
Attention from_blocked(const Attention& like, const at::Tensor& w) {
  const int64_t hq = like.heads * kHeadDim;
  const int64_t hk = like.kv_heads * kHeadDim;
  return {
      like.heads, like.kv_heads, w.narrow(0, 0, hq), w.narrow(0, hq, hk), w.narrow(0, hq + hk, hk),
      like.x};
}

QkClipOptions options_of(const Attention& a, double tau, double alpha = 0.5) {
  return QkClipOptions(a.heads, kHeadDim).num_kv_heads(a.kv_heads).threshold(tau).alpha(alpha);
}

// τ: between the largest maximum of the heads not boosted and the smallest
// of the boosted ones.
double tau_between(const at::Tensor& maxima, const std::vector<int64_t>& boosted) {
  double quiet = -INFINITY;
  double loud = INFINITY;
  for (int64_t h = 0; h < maxima.numel(); ++h) {
    const double m = maxima[h].item<double>();
    const bool b = std::find(boosted.begin(), boosted.end(), h) != boosted.end();
    if (b)
      loud = std::min(loud, m);
    else
      quiet = std::max(quiet, m);
  }
  EXPECT_GT(loud, 1.5 * quiet) << "the boosted heads must stand out";
  const double tau = 0.5 * (loud + quiet);
  return tau > 0 ? tau : 0.5 * loud;
}

// The published rule, per query group: γ_g = τ / max over its heads when
// that exceeds τ, else 1.
std::vector<double> ref_gamma(const at::Tensor& maxima, int64_t heads, int64_t kv_heads,
                              double tau) {
  const int64_t r = heads / kv_heads;
  std::vector<double> gamma(static_cast<size_t>(heads), 1.0);
  for (int64_t g = 0; g < kv_heads; ++g) {
    double m = -INFINITY;
    for (int64_t i = 0; i < r; ++i) m = std::max(m, maxima[g * r + i].item<double>());
    for (int64_t i = 0; i < r; ++i) gamma[static_cast<size_t>(g * r + i)] = m > tau ? tau / m : 1.0;
  }
  return gamma;
}

// After the clip, from the same inputs: the head that set its group's
// maximum has τ (within the rounding bound), every other head of a clipped
// group γ·S; heads of unclipped groups keep their q and k rows bit for bit;
// every V row is unchanged.
void expect_clipped(const Attention& before, const Attention& after, const at::Tensor& maxima,
                    double tau, const at::Tensor& gamma, const std::string& what) {
  const auto expected = ref_gamma(maxima, before.heads, before.kv_heads, tau);
  ASSERT_EQ(gamma.numel(), before.heads);
  const int64_t r = before.group_size();
  for (int64_t h = 0; h < before.heads; ++h) {
    const double g = expected[static_cast<size_t>(h)];
    EXPECT_NEAR(gamma[h].item<double>(), g, 1e-15 * g) << what << " head " << h;
    const auto q_before = before.q.narrow(0, h * kHeadDim, kHeadDim);
    const auto q_after = after.q.narrow(0, h * kHeadDim, kHeadDim);
    const auto k_before = before.k.narrow(0, (h / r) * kHeadDim, kHeadDim);
    const auto k_after = after.k.narrow(0, (h / r) * kHeadDim, kHeadDim);
    if (g == 1.0) {
      EXPECT_TRUE(at::equal(q_before, q_after)) << what << " head " << h << " q changed";
      EXPECT_TRUE(at::equal(k_before, k_after)) << what << " head " << h << " k changed";
      continue;
    }
    const double s_after = ref_max(after.q, after.k, after.x, h, r);
    const double target = g * maxima[h].item<double>();  // τ for the group's largest
    EXPECT_NEAR(s_after, target, ref_bound(before, h, g)) << what << " head " << h;
    EXPECT_FALSE(at::equal(q_before, q_after) && at::equal(k_before, k_after))
        << what << " head " << h << " not clipped";
  }
  EXPECT_TRUE(at::equal(before.v, after.v)) << what << ": V rows changed";
  // The clipped heads' largest logit is τ: check it on the group maximum.
  for (int64_t g = 0; g < before.kv_heads; ++g) {
    double m_before = -INFINITY, m_after = -INFINITY, bound = 0;
    for (int64_t i = 0; i < r; ++i) {
      m_before = std::max(m_before, maxima[g * r + i].item<double>());
      m_after = std::max(m_after, ref_max(after.q, after.k, after.x, g * r + i, r));
    }
    if (m_before <= tau) continue;
    for (int64_t i = 0; i < r; ++i)
      bound = std::max(bound, ref_bound(before, g * r + i, tau / m_before));
    EXPECT_NEAR(m_after, tau, bound) << what << " group " << g;
    EXPECT_GT(bound, 0.0);
    EXPECT_LT(bound, 1e-5 * tau) << "the bound must be of fp32 rounding size";
  }
}

// Rounding: the test's logits are fp64 from fp32 weights, so the only
// error after the clip is the weights' own: each scaled weight is
// fl(w·fl(γ^α)) = w·γ^α·(1+δ), |δ| ≤ 2u + u² (u = 2⁻²⁴, round to nearest on
// any IEEE CPU), likewise for k; a logit Σ_c q_c·k_c/√d then differs from γ
// times the old one by at most ((1+e)²−1)·γ·Σ_c A_c·B_c/√d, A and B the
// sums of |x|·|w| of q and k (ref_bound). The maximum pair stays the
// maximum up to that bound.
TEST(QkClip, ClipsEachLayoutToTauMultiHead) {
  const std::vector<int64_t> boosted{0, 3};
  const auto a = make_attention(4, 4, boosted);
  const auto maxima = ref_max_logits(a);
  const double tau = tau_between(maxima, boosted);
  const auto o = options_of(a, tau);

  auto q = a.q.clone();
  auto k = a.k.clone();
  const auto gamma = qk_clip_(q, k, maxima, o);
  expect_clipped(a, {a.heads, a.kv_heads, q, k, a.v, a.x}, maxima, tau, gamma, "separate");

  auto fused = grouped(a);
  const auto gamma_g = qk_clip_({QkClipWeight(fused, QkvRows::kGrouped)}, maxima, o);
  const auto after_g = from_grouped(a, fused);
  expect_clipped(a, after_g, maxima, tau, gamma_g, "grouped");

  auto block = blocked(a);
  const auto gamma_b = qk_clip_({QkClipWeight(block, QkvRows::kBlocked)}, maxima, o);
  const auto after_b = from_blocked(a, block);
  expect_clipped(a, after_b, maxima, tau, gamma_b, "blocked");

  // The same rounded products in every layout: bit for bit.
  EXPECT_TRUE(at::equal(after_g.q, q) && at::equal(after_g.k, k));
  EXPECT_TRUE(at::equal(after_b.q, q) && at::equal(after_b.k, k));
}

TEST(QkClip, GroupedQueriesTakeTheGroupsLargestMaximum) {
  // 6 query heads, 3 key heads (r = 2): head 1 (group 0) and head 4 (group 2) boosted.
  const std::vector<int64_t> boosted{1, 4};
  const auto a = make_attention(6, 3, boosted);
  const auto maxima = ref_max_logits(a);
  const double tau = tau_between(maxima, boosted);
  for (const double alpha : {0.5, 0.25, 0.0, 1.0}) {
    const auto o = options_of(a, tau, alpha);
    auto q = a.q.clone();
    auto k = a.k.clone();
    const auto gamma = qk_clip_(q, k, maxima, o);
    const std::string what = "alpha " + std::to_string(alpha);
    expect_clipped(a, {a.heads, a.kv_heads, q, k, a.v, a.x}, maxima, tau, gamma, what);
    // Both heads of group 0 share γ: head 0 (not boosted) is clipped too.
    EXPECT_EQ(gamma[0].item<double>(), gamma[1].item<double>());
    EXPECT_LT(gamma[0].item<double>(), 1.0);
    EXPECT_EQ(gamma[2].item<double>(), 1.0);
    // q rows scaled by fl(γ^α), k rows by fl(γ^(1−α)), each product rounded once.
    const double g0 = gamma[0].item<double>();
    EXPECT_TRUE(at::equal(q.narrow(0, 0, 2 * kHeadDim),
                          a.q.narrow(0, 0, 2 * kHeadDim) * static_cast<float>(std::pow(g0, alpha))))
        << what;
    EXPECT_TRUE(at::equal(k.narrow(0, 0, kHeadDim),
                          a.k.narrow(0, 0, kHeadDim) * static_cast<float>(std::pow(g0, 1 - alpha))))
        << what;

    auto fused = grouped(a);
    qk_clip_({QkClipWeight(fused, QkvRows::kGrouped)}, maxima, o);
    const auto after = from_grouped(a, fused);
    EXPECT_TRUE(at::equal(after.q, q) && at::equal(after.k, k) && at::equal(after.v, a.v)) << what;
    auto block = blocked(a);
    qk_clip_({QkClipWeight(block, QkvRows::kBlocked)}, maxima, o);
    const auto after_b = from_blocked(a, block);
    EXPECT_TRUE(at::equal(after_b.q, q) && at::equal(after_b.k, k) && at::equal(after_b.v, a.v))
        << what;
  }
}

// A process holding rows [begin, end) of the weight (a row shard whose
// edges cut heads, or a tensor-parallel rank's groups) scales exactly those
// rows as the whole weight's clip does.
TEST(QkClip, RowRangesScaleTheirRowsAsTheWhole) {
  const std::vector<int64_t> boosted{1, 4};
  const auto a = make_attention(6, 3, boosted);
  const auto maxima = ref_max_logits(a);
  const auto o = options_of(a, tau_between(maxima, boosted));
  auto whole = grouped(a);
  qk_clip_({QkClipWeight(whole, QkvRows::kGrouped)}, maxima, o);
  const auto original = grouped(a);
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{13, 45}, {5, 6, 7, 31, 90}, {32, 64}}) {
    std::vector<at::Tensor> parts;
    int64_t begin = 0;
    auto bounds = cuts;
    bounds.push_back(original.size(0));
    for (const auto end : bounds) {
      auto part = original.narrow(0, begin, end - begin).clone();
      qk_clip_({QkClipWeight(part, QkvRows::kGrouped, begin)}, maxima, o);
      parts.push_back(part);
      begin = end;
    }
    EXPECT_TRUE(at::equal(at::cat(parts), whole)) << "cuts at " << cuts[0];
  }
  // Separate q rows cut inside head 1 (rows 8–15).
  auto q = a.q.clone();
  auto k = a.k.clone();
  qk_clip_(q, k, maxima, o);
  auto q0 = a.q.narrow(0, 0, 11).clone();
  auto q1 = a.q.narrow(0, 11, a.q.size(0) - 11).clone();
  qk_clip_({QkClipWeight(q0, QkvRows::kQuery), QkClipWeight(q1, QkvRows::kQuery, 11)}, maxima, o);
  EXPECT_TRUE(at::equal(at::cat({q0, q1}), q));
}

TEST(QkClip, NothingAboveTauChangesNothing) {
  const auto a = make_attention(4, 2, {});
  const auto maxima = ref_max_logits(a);
  const double tau = maxima.max().item<double>() * 1.01;
  auto fused = grouped(a);
  const auto gamma = qk_clip_({QkClipWeight(fused, QkvRows::kGrouped)}, maxima, options_of(a, tau));
  EXPECT_TRUE(at::equal(gamma, at::ones({4}, at::kDouble)));
  EXPECT_TRUE(at::equal(fused, grouped(a)));
  // A negative maximum (every logit of the head below zero) needs no clip: γ = 1.
  const auto negative = at::tensor({-3.0, 0.5, -0.1, 2.0}, at::kDouble);
  EXPECT_TRUE(at::equal(qk_clip_gamma(negative, options_of(a, 1.0)),
                        at::tensor({1.0, 1.0, 0.5, 0.5}, at::kDouble)));
}

// Each invalid argument raises c10::ValueError naming it and its value, and
// leaves every weight as it was.
TEST(QkClip, InvalidArgumentsAreNamedAndChangeNothing) {
  const std::vector<int64_t> boosted{0};
  const auto a = make_attention(4, 2, boosted);
  const auto maxima = ref_max_logits(a);
  const auto good = options_of(a, 1.0);
  auto expect_error = [&](const std::vector<QkClipWeight>& weights, const at::Tensor& m,
                          const QkClipOptions& o, const std::string& needle) {
    std::vector<at::Tensor> before;
    for (const auto& w : weights) before.push_back(w.weight().clone());
    try {
      qk_clip_(weights, m, o);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const c10::ValueError& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      EXPECT_NE(msg.find("[muon::qk_clip_]"), std::string::npos) << msg;
      EXPECT_LT(msg.size(), 400u) << msg;
    }
    for (size_t i = 0; i < weights.size(); ++i) {
      EXPECT_TRUE(at::equal(weights[i].weight(), before[i])) << needle;
    }
  };
  auto fused = grouped(a);
  const std::vector<QkClipWeight> w{QkClipWeight(fused, QkvRows::kGrouped)};
  expect_error(w, maxima, QkClipOptions(good).threshold(0),
               "threshold must be finite and > 0, got 0");
  expect_error(w, maxima, QkClipOptions(good).threshold(-2),
               "threshold must be finite and > 0, got -2");
  expect_error(w, maxima, QkClipOptions(good).threshold(INFINITY),
               "threshold must be finite and > 0, got inf");
  expect_error(w, maxima, QkClipOptions(good).threshold(NAN),
               "threshold must be finite and > 0, got nan");
  expect_error(w, maxima, QkClipOptions(good).alpha(-0.1), "alpha must be in [0, 1], got -0.1");
  expect_error(w, maxima, QkClipOptions(good).alpha(1.5), "alpha must be in [0, 1], got 1.5");
  expect_error(w, maxima, QkClipOptions(good).num_kv_heads(3),
               "num_kv_heads must divide num_heads = 4");
  expect_error(w, maxima, QkClipOptions(good).num_heads(0), "num_heads must be >= 1, got 0");
  expect_error(w, maxima, QkClipOptions(good).head_dim(-1), "head_dim must be >= 1, got -1");
  expect_error(w, maxima.narrow(0, 0, 3), good,
               "max_logits must be 1-D with num_heads = 4 elements, got shape [3]");
  auto bad = maxima.clone();
  bad[2] = NAN;
  expect_error(w, bad, good, "max_logits[2] must be finite, got nan");
  bad[2] = INFINITY;
  expect_error(w, bad, good, "max_logits[2] must be finite, got inf");
  expect_error(w, maxima.to(at::kLong), good, "max_logits must be floating");
  // A row range outside the weight: the first weight valid, the second not;
  // neither changes.
  auto part = fused.narrow(0, 0, 10).clone();
  expect_error({QkClipWeight(fused, QkvRows::kGrouped), QkClipWeight(part, QkvRows::kGrouped, 60)},
               maxima, good, "weights[1] holds rows [60, 70) of a grouped weight of 64 rows");
  auto ints = at::ones({8, 4}, at::kInt);
  expect_error({QkClipWeight(fused, QkvRows::kGrouped), QkClipWeight(ints, QkvRows::kKey)}, maxima,
               good, "weights[1] must be floating");
  EXPECT_THROW(parse_qkv_rows("fused"), c10::ValueError);
  EXPECT_EQ(parse_qkv_rows("blocked"), QkvRows::kBlocked);
  EXPECT_EQ(to_string(QkvRows::kGrouped), "grouped");
}

// Head counts and a head_dim whose fused row count (H + 2G)·d does not fit
// int64 (it wrapped to 4 rows: a 4-row weight passed the row check and the
// row factors were written past their tensor) are refused by name; a row
// range whose end does not fit int64 likewise. Nothing changes.
TEST(QkClip, RowCountsThatOverflowInt64AreRefused) {
  const int64_t d = 3689348814741910324;  // (3 + 2·1)·d = 4 (mod 2^64)
  auto w = at::ones({4, 3}, at::kFloat);
  const auto before = w.clone();
  const auto maxima = at::full({3}, 50.0, at::kDouble);
  const auto o = QkClipOptions(3, d).num_kv_heads(1).threshold(1.0);
  for (const auto rows : {QkvRows::kGrouped, QkvRows::kBlocked, QkvRows::kQuery}) {
    try {
      qk_clip_({QkClipWeight(w, rows)}, maxima, o);
      ADD_FAILURE() << "no error for " << to_string(rows);
    } catch (const c10::ValueError& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("[muon::qk_clip_] num_heads 3, num_kv_heads 1 and head_dim "
                         "3689348814741910324: a fused weight's (num_heads + 2 * num_kv_heads) "
                         "* head_dim rows exceed int64"),
                std::string::npos)
          << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(qk_clip_global_rows(QkvRows::kBlocked, o), c10::ValueError);
  EXPECT_THROW(qk_clip_row_factors(at::ones({3}, at::kDouble), QkvRows::kKey, o), c10::ValueError);
  EXPECT_THROW(qk_clip_gamma(maxima, QkClipOptions(3, INT64_MAX).threshold(1.0)), c10::ValueError);
  EXPECT_TRUE(at::equal(w, before));

  // A valid head_dim of 2^40: the rows fit, and a 4-row shard's rows are
  // computed without the 5·2^40 global ones.
  const int64_t big = int64_t{1} << 40;
  const auto ok = QkClipOptions(3, big).num_kv_heads(1).threshold(12.5);
  EXPECT_EQ(qk_clip_global_rows(QkvRows::kGrouped, ok), 5 * big);
  const auto gamma = qk_clip_({QkClipWeight(w, QkvRows::kGrouped, 3 * big - 2)}, maxima, ok);
  EXPECT_TRUE(at::equal(gamma, at::full({3}, 0.25, at::kDouble)));
  // Rows 3·2^40 − 2, −1 are query rows (γ^½ = 0.5), the next two key rows.
  EXPECT_TRUE(at::equal(w, at::full({4, 3}, 0.5f)));

  // row_begin + rows past int64: refused by name, not wrapped.
  auto v = at::ones({4, 3}, at::kFloat);
  try {
    qk_clip_({QkClipWeight(v, QkvRows::kQuery, INT64_MAX - 1)}, maxima,
             QkClipOptions(3, 4).threshold(1.0));
    ADD_FAILURE() << "no error for a row range past int64";
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("weights[0] holds rows [9223372036854775806, 9223372036854775806 + 4) of "
                       "a query weight of 12 rows"),
              std::string::npos)
        << msg;
  }
  EXPECT_TRUE(at::equal(v, at::ones({4, 3}, at::kFloat)));
}

// The factors of a row range are the whole weight's factors of those rows.
TEST(QkClip, RowFactorsOfARangeAreTheWholesRows) {
  const auto gamma = at::tensor({0.25, 0.25, 1.0, 1.0, 0.04, 0.04}, at::kDouble);
  const auto o = QkClipOptions(6, 3).num_kv_heads(3).alpha(0.5);
  for (const auto rows : {QkvRows::kQuery, QkvRows::kKey, QkvRows::kGrouped, QkvRows::kBlocked}) {
    const auto whole = qk_clip_row_factors(gamma, rows, o);
    ASSERT_EQ(whole.numel(), qk_clip_global_rows(rows, o));
    for (int64_t begin = 0; begin <= whole.numel(); begin += 5) {
      const int64_t n = std::min<int64_t>(7, whole.numel() - begin);
      EXPECT_TRUE(
          at::equal(qk_clip_row_factors(gamma, rows, o, begin, n), whole.narrow(0, begin, n)))
          << to_string(rows) << " " << begin;
    }
    EXPECT_THROW(qk_clip_row_factors(gamma, rows, o, 1, whole.numel()), c10::ValueError);
    EXPECT_THROW(qk_clip_row_factors(gamma, rows, o, -1, 1), c10::ValueError);
  }
  // Grouped (r = 2): per group [q q k v], 3 rows each.
  const auto grouped_rows = qk_clip_row_factors(gamma, QkvRows::kGrouped, o);
  std::vector<double> expected;
  for (const double f : {0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2, 0.2, 1.0}) {
    for (int i = 0; i < 3; ++i) expected.push_back(f);
  }
  EXPECT_TRUE(at::allclose(grouped_rows, at::tensor(expected, at::kDouble), 1e-15, 0));
}

}  // namespace
}  // namespace muon::test
