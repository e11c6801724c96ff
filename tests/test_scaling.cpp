// Scale factors against their formulas (Keller Jordan's Muon, Megatron-Core,
// Moonlight; see muon/scaling.h), and validation.
#include <gtest/gtest.h>

#include <muon/scaling.h>

#include <cmath>
#include <limits>
#include <string>

namespace {

using muon::ScaleMode;

TEST(Scaling, Formulas) {
  for (auto [r, c] : {std::pair<int64_t, int64_t>{1536, 512}, {512, 2048}, {64, 64}, {1, 9}}) {
    const double rd = static_cast<double>(r), cd = static_cast<double>(c);
    EXPECT_DOUBLE_EQ(muon::scale_factor(r, c, ScaleMode::kShapeScaling),
                     std::sqrt(std::max(1.0, rd / cd)));
    EXPECT_DOUBLE_EQ(muon::scale_factor(r, c, ScaleMode::kSpectral), std::sqrt(std::max(rd, cd)));
    EXPECT_DOUBLE_EQ(muon::scale_factor(r, c, ScaleMode::kUnitRmsNorm), std::sqrt(rd / cd));
    EXPECT_DOUBLE_EQ(muon::scale_factor(r, c, ScaleMode::kMatchRmsAdamW),
                     0.2 * std::sqrt(std::max(rd, cd)));
    EXPECT_DOUBLE_EQ(muon::scale_factor(r, c, ScaleMode::kSpectral, 0.5),
                     0.5 * std::sqrt(std::max(rd, cd)));
  }
}

TEST(Scaling, ConvWeightsUseFlattenedShape) {
  // (out, in, kh, kw) → (out, in·kh·kw): not kh/kw.
  auto [rows, cols] = muon::matrix_dims({64, 32, 3, 3});
  EXPECT_EQ(rows, 64);
  EXPECT_EQ(cols, 288);
  EXPECT_DOUBLE_EQ(muon::scale_factor(rows, cols, ScaleMode::kShapeScaling), 1.0);
  EXPECT_THROW(muon::matrix_dims({5}), c10::ValueError);
}

TEST(Scaling, NamesRoundTripAndErrors) {
  for (const auto& name : muon::scale_mode_names()) {
    EXPECT_EQ(muon::to_string(muon::parse_scale_mode(name)), name);
  }
  try {
    muon::parse_scale_mode("spectal");
    FAIL();
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("'spectal'"), std::string::npos);
    EXPECT_NE(msg.find("spectral"), std::string::npos);
  }
  try {
    muon::scale_factor(0, 5, ScaleMode::kUnitRmsNorm);
    FAIL();
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("rows must be >= 1, got 0"),
              std::string::npos);
  }
  EXPECT_THROW(muon::scale_factor(5, 0, ScaleMode::kUnitRmsNorm), c10::ValueError);
  EXPECT_THROW(muon::scale_factor(5, -1, ScaleMode::kSpectral), c10::ValueError);
  // extra_scale_factor must be a positive finite number: 0 would zero every
  // update, a negative one would ascend.
  for (double bad : {0.0, -1.0, -0.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      muon::scale_factor(48, 12, ScaleMode::kShapeScaling, bad);
      FAIL() << bad;
    } catch (const c10::ValueError& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("extra_scale_factor must be finite and > 0, got"), std::string::npos)
          << msg;
      EXPECT_LT(msg.size(), 200u) << msg;
    }
  }
}

}  // namespace
