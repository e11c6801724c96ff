// Bindings of <muon/qk_clip.h>.
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "muon/qk_clip.h"

namespace muon::python {

void bind_qk_clip(py::module_& m) {
  m.def(
      "qk_clip_gamma",
      [](const at::Tensor& max_logits, int64_t num_heads, int64_t head_dim, int64_t num_kv_heads,
         double threshold, double alpha) {
        return qk_clip_gamma(max_logits, QkClipOptions(num_heads, head_dim)
                                             .num_kv_heads(num_kv_heads)
                                             .threshold(threshold)
                                             .alpha(alpha));
      },
      py::arg("max_logits"), py::arg("num_heads"), py::arg("head_dim"), py::arg("num_kv_heads") = 0,
      py::arg("threshold") = 100.0, py::arg("alpha") = 0.5,
      "gamma per query head (float64): per query group, threshold over its largest maximum "
      "when that exceeds the threshold, else 1 (muon::qk_clip_gamma).");
  m.def(
      "qk_clip_",
      [](const std::vector<at::Tensor>& weights, const std::vector<std::string>& rows,
         const std::vector<int64_t>& row_begins, const at::Tensor& max_logits, int64_t num_heads,
         int64_t head_dim, int64_t num_kv_heads, double threshold, double alpha) {
        TORCH_CHECK_VALUE(rows.size() == weights.size() && row_begins.size() == weights.size(),
                          "[muon::qk_clip_] rows and row_begins must have one entry per weight (",
                          weights.size(), "), got ", rows.size(), " and ", row_begins.size());
        std::vector<QkClipWeight> targets;
        for (size_t i = 0; i < weights.size(); ++i) {
          targets.emplace_back(weights[i], parse_qkv_rows(rows[i]), row_begins[i]);
        }
        const auto options = QkClipOptions(num_heads, head_dim)
                                 .num_kv_heads(num_kv_heads)
                                 .threshold(threshold)
                                 .alpha(alpha);
        py::gil_scoped_release release;
        return qk_clip_(targets, max_logits, options);
      },
      py::arg("weights"), py::arg("rows"), py::arg("row_begins"), py::arg("max_logits"),
      py::arg("num_heads"), py::arg("head_dim"), py::arg("num_kv_heads") = 0,
      py::arg("threshold") = 100.0, py::arg("alpha") = 0.5,
      "Scales the query and key rows of each weight in place (muon::qk_clip_); returns gamma.");
}

}  // namespace muon::python
