// muon-train-gpt: trains the small GPT with Muon and with AdamW and compares.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <memory>

#include "data.h"
#include "gpt.h"
#include "muon/optim/hybrid.h"
#include "report.h"
#include "trainer.h"

int main(int argc, char** argv) {
  CLI::App app("train a small GPT");
  train_gpt::TrainOptions t;
  int64_t threads = 2, chars = 2000000;
  double lr = 3e-3, muon_lr = 0.02, wd = 0.0;
  std::string runs = "muon,adamw";
  app.add_option("--steps", t.steps);
  app.add_option("--batch", t.global_batch);
  app.add_option("--eval-every", t.eval_every);
  app.add_option("--threads", threads);
  app.add_option("--chars", chars);
  app.add_option("--lr", lr);
  app.add_option("--muon-lr", muon_lr);
  app.add_option("--wd", wd);
  app.add_option("--runs", runs);
  app.add_option("--layers", t.model.layers);
  app.add_option("--width", t.model.width);
  app.add_option("--heads", t.model.heads);
  app.add_option("--context", t.model.context);
  app.add_option("--out", t.out_dir);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(static_cast<int>(threads));

  const auto data = train_gpt::make_dataset(train_gpt::generate_corpus(chars));
  std::vector<train_gpt::RunLog> logs;
  std::stringstream names(runs);
  std::string name;
  while (std::getline(names, name, ',')) {
    t.name = name;
    auto factory = [&](train_gpt::Gpt& model) -> std::unique_ptr<torch::optim::Optimizer> {
      if (name == "muon") {
        muon::MuonWithAdamWOptions o;
        o.muon(muon::MuonOptions(muon_lr).weight_decay(wd));
        o.adamw(torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(wd));
        return std::make_unique<muon::MuonWithAdamW>(model->named_parameters(), o);
      }
      return std::make_unique<torch::optim::AdamW>(
          model->parameters(), torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(wd));
    };
    logs.push_back(train_gpt::train(data, t, factory, {}));
  }
  std::printf("%s", train_gpt::comparison_table(logs, logs.size() - 1).c_str());
}
