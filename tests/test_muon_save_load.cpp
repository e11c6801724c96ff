// Tests of muon::Muon's save/load: bit-identical resumption, option round
// trips, rejected archives and state bytes.
#include <gtest/gtest.h>
#include <torch/serialize/archive.h>

#include <string>
#include <vector>

#include "archive_util.h"
#include "muon/compat.h"
#include "muon/optim/muon.h"
#include "muon_reference.h"

namespace muon::test {
namespace {

std::vector<torch::optim::OptimizerParamGroup> two_groups(const std::vector<at::Tensor>& p) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p[0], p[1]},
                      std::make_unique<MuonOptions>(MuonOptions(0.05).weight_decay(0.1)));
  groups.emplace_back(std::vector<at::Tensor>{p[2], p[3]},
                      std::make_unique<MuonOptions>(MuonOptions(0.02)
                                                        .momentum_style("classic")
                                                        .nesterov(false)
                                                        .ns_compute_dtype(at::kBFloat16)
                                                        .scale_mode("spectral")
                                                        .extra_scale_factor(0.2)));
  return groups;
}

TEST(MuonSaveLoad, ResumedRunIsBitIdentical) {
  const std::vector<std::vector<int64_t>> shapes = {{16, 8}, {8, 3, 3}, {8, 24}, {5, 5}};
  at::manual_seed(41);
  std::vector<at::Tensor> init;
  for (const auto& s : shapes) init.push_back(at::randn(s));
  std::vector<std::vector<at::Tensor>> grads(6);
  for (auto& step_grads : grads) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      // parameter 3 never gets a gradient: it must stay without state
      step_grads.push_back(i == 3 ? at::Tensor() : at::randn(shapes[i]));
    }
  }
  auto run = [&](std::vector<at::Tensor>& params, Muon& opt, int from, int to) {
    for (int k = from; k < to; ++k) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[k][i];
      opt.step();
    }
  };

  std::vector<at::Tensor> straight;
  for (const auto& v : init) straight.push_back(leaf(v));
  Muon opt_a(two_groups(straight));
  run(straight, opt_a, 0, 6);

  std::vector<at::Tensor> first;
  for (const auto& v : init) first.push_back(leaf(v));
  Muon opt_b(two_groups(first));
  run(first, opt_b, 0, 3);
  opt_b.param_groups()[0].options().set_lr(0.05);  // unchanged value, via the scheduler API
  const auto bytes = save_to_string(opt_b);

  // A fresh process: new tensors with the saved values, a fresh optimizer
  // with different options that the archive overrides.
  std::vector<at::Tensor> resumed;
  for (const auto& p : first) resumed.push_back(leaf(p));
  std::vector<torch::optim::OptimizerParamGroup> plain_groups;
  plain_groups.emplace_back(std::vector<at::Tensor>{resumed[0], resumed[1]});
  plain_groups.emplace_back(std::vector<at::Tensor>{resumed[2], resumed[3]});
  Muon opt_c(std::move(plain_groups), MuonOptions(1.0));
  load_from_string(opt_c, bytes);
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(static_cast<const MuonOptions&>(opt_c.param_groups()[g].options()),
              static_cast<const MuonOptions&>(opt_b.param_groups()[g].options()));
  }
  EXPECT_EQ(opt_c.state().count(muon::compat::state_key(resumed[3])), 0u);
  EXPECT_TRUE(state_of(opt_c, resumed[0]) == state_of(opt_b, first[0]));
  run(resumed, opt_c, 3, 6);

  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_TRUE(at::equal(resumed[i], straight[i])) << "parameter " << i;
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(state_of(opt_c, resumed[i]) == state_of(opt_a, straight[i])) << "state " << i;
  }
}

// The MuonOptions an archive holds, after a trip through bytes.
MuonOptions read_options(torch::serialize::OutputArchive& out) {
  torch::serialize::InputArchive in;
  read_back(out, in);
  MuonOptions back(0);
  back.serialize(in);
  return back;
}

// MuonOptions written to an archive and read back.
MuonOptions round_trip(const MuonOptions& o) {
  torch::serialize::OutputArchive out;
  o.serialize(out);
  return read_options(out);
}

TEST(MuonSaveLoad, OptionsRoundTripWithCustomCoefficients) {
  auto o = MuonOptions(0.03)
               .momentum(0.7)
               .weight_decay(0.2)
               .weight_decay_mode("independent")
               .scale_mode("unit_rms_norm")
               .stacked_experts(true)
               .split_sizes({2, 1, 1})
               .num_query_groups(2);
  o.ns().coefficients({{3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}}, muon::StepSchedule::kRepeatLast, 1.01);
  o.ns().steps(7).eps(1e-6).method("standard").symmetric(false);
  const auto back = round_trip(o);
  EXPECT_EQ(back, o);
  EXPECT_FALSE(back == MuonOptions(0.03));
}


TEST(MuonSaveLoad, EpsModeAndPalmDecayRoundTrip) {
  auto o = MuonOptions(0.03).weight_decay(0.5).weight_decay_mode("palm").ns_eps_mode("clamp");
  const auto back = round_trip(o);
  EXPECT_EQ(back.ns().eps_mode(), NsEpsMode::kClamp);
  EXPECT_EQ(back.weight_decay_mode(), WeightDecayMode::kPalm);
  EXPECT_EQ(back, o);
  EXPECT_FALSE(back == MuonOptions(0.03).weight_decay(0.5).weight_decay_mode("palm"));
}

// The options an archive written before `ns_eps_mode` existed holds, with a
// coefficient set stored as `name` and `tuples` (every key that version wrote,
// with MuonOptions' defaults but lr 0.03).
MuonOptions read_archive_without_eps_mode(const std::string& name,
                                          const std::vector<NsCoefficients>& tuples,
                                          double safety, int64_t default_steps) {
  torch::serialize::OutputArchive out;
  std::vector<double> flat;
  for (const auto& k : tuples) flat.insert(flat.end(), {k.a, k.b, k.c});
  out.write("lr", c10::IValue(0.03));
  out.write("momentum", c10::IValue(0.95));
  out.write("nesterov", c10::IValue(true));
  out.write("momentum_style", c10::IValue(std::string("ema")));
  out.write("weight_decay", c10::IValue(0.0));
  out.write("weight_decay_mode", c10::IValue(std::string("decoupled")));
  out.write("ns_set_name", c10::IValue(name));
  out.write("ns_set_coefficients", c10::IValue(flat));
  out.write("ns_set_schedule", c10::IValue(std::string("repeat_last")));
  out.write("ns_set_safety_factor", c10::IValue(safety));
  out.write("ns_set_default_steps", c10::IValue(default_steps));
  out.write("ns_set_description", c10::IValue(std::string("as written then")));
  out.write("ns_steps", c10::IValue(int64_t{0}));
  out.write("ns_eps", c10::IValue(1e-7));
  out.write("ns_compute_dtype", c10::IValue(std::string("Float")));
  out.write("ns_method", c10::IValue(std::string("auto")));
  out.write("ns_symmetric", c10::IValue(true));
  out.write("scale_mode", c10::IValue(std::string("shape_scaling")));
  out.write("extra_scale_factor", c10::IValue(1.0));
  out.write("stacked_experts", c10::IValue(false));
  out.write("split_sizes", c10::IValue(std::vector<int64_t>{}));
  out.write("num_query_groups", c10::IValue(int64_t{1}));
  return read_options(out);
}

TEST(MuonSaveLoad, OldArchiveKeepsItsNumbersUnderTodaysNames) {
  // `polar_express` used to name the 5-step set (safety 1.02); such an
  // archive loads with its coefficients, reported as polar_express_5, and
  // normalizes by adding eps as it did.
  const auto& five = coefficient_set("polar_express_5");
  const auto old = read_archive_without_eps_mode("polar_express", five.coefficients, 1.02, 5);
  EXPECT_EQ(old.ns().coefficients().name, "polar_express_5");
  EXPECT_EQ(old.ns().steps(), 5);
  EXPECT_DOUBLE_EQ(old.ns().coefficients().safety_factor, 1.02);
  EXPECT_EQ(old.ns().eps_mode(), NsEpsMode::kAdd);
  EXPECT_EQ(old, MuonOptions(0.03).ns_coefficients("polar_express_5"));
  // Stored under the alias of the 8-step set, or under its name: polar_express.
  const auto& eight = coefficient_set("polar_express");
  for (const char* name : {"polar_express_8", "polar_express"}) {
    const auto o = read_archive_without_eps_mode(name, eight.coefficients, 1.0, 8);
    EXPECT_EQ(o, MuonOptions(0.03).ns_coefficients("polar_express")) << name;
  }
  // Coefficients no built-in set holds keep the stored name and values.
  const std::vector<NsCoefficients> own = {{3.0, -3.2, 1.2}};
  const auto custom = read_archive_without_eps_mode("polar_express", own, 1.0, 1);
  EXPECT_EQ(custom.ns().coefficients().name, "polar_express");
  EXPECT_DOUBLE_EQ(custom.ns().schedule()[0].a, 3.0);
}

TEST(MuonSaveLoad, MismatchedOptimizerIsRejected) {
  auto p = leaf(at::randn({4, 4}));
  Muon opt({p});
  p.mutable_grad() = at::randn({4, 4});
  opt.step();
  const auto bytes = save_to_string(opt);
  auto a = leaf(at::randn({4, 4}));
  auto b = leaf(at::randn({4, 4}));
  Muon two({a, b});
  EXPECT_THROW(load_from_string(two, bytes), c10::ValueError);
  auto c = leaf(at::randn({4, 5}));
  Muon other_shape({c});
  EXPECT_THROW(load_from_string(other_shape, bytes), c10::ValueError);
}

TEST(MuonSaveLoad, StateBytesCountMomentumBuffers) {
  auto p = leaf(at::randn({16, 8}));
  auto q = leaf(at::randn({8, 8}).to(at::kBFloat16));
  Muon opt({p, q});
  EXPECT_EQ(opt.state_bytes(), 0);
  p.mutable_grad() = at::randn({16, 8});
  q.mutable_grad() = at::randn({8, 8}).to(at::kBFloat16);
  opt.step();
  EXPECT_EQ(opt.state_bytes(), 16 * 8 * 4 + 8 * 8 * 2);
}

}  // namespace
}  // namespace muon::test
