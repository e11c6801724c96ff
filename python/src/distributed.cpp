// Bindings of <muon/distributed/runtime/*.h> and <muon/distributed/layouts/*.h>: a Group
// over a torch.distributed process group (c10d::ProcessGroup, whose
// pybind11 holder torch registers as c10::intrusive_ptr), the shard
// descriptions and the layout a muon_cpp optimizer is built with.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/agreement.h"
#include "muon/distributed/runtime/group.h"

namespace muon::python {

void bind_distributed(py::module_& m) {
  using distributed::Group;
  py::class_<Group>(m, "Group", "A muon::distributed::Group (here: over a torch.distributed process group).")
      .def_static(
          "wrap",
          [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, double timeout_s,
             std::vector<int> world_ranks, std::string name) {
            TORCH_CHECK_VALUE(timeout_s > 0, "timeout_s must be > 0, got ", timeout_s);
            const auto ms = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
            return Group::wrap(pg, distributed::GroupOptions().timeout(ms), std::move(world_ranks), std::move(name));
          },
          py::arg("process_group"), py::arg("timeout_s") = 300.0,
          py::arg("world_ranks") = std::vector<int>{}, py::arg("name") = "process_group",
          "A Group whose collectives run on `process_group` (a torch.distributed ProcessGroup).")
      .def_static("single", &Group::single, "The one-rank group.")
      .def_property_readonly("rank", &Group::rank)
      .def_property_readonly("size", &Group::size)
      .def_property_readonly("name", &Group::name)
      .def_property_readonly("world_ranks", &Group::world_ranks)
      .def_property_readonly("backend", &Group::backend_name)
      .def("bytes_sent", &Group::bytes_sent, "Bytes this rank sent through the group (ring model).")
      .def("reset_bytes_sent", &Group::reset_bytes_sent)
      .def(
          "all_reduce_",
          [](const Group& g, at::Tensor t) {
            py::gil_scoped_release release;
            g.all_reduce_(t);
          },
          py::arg("tensor"), "Sums `tensor` over the ranks, in place.")
      .def(
          "barrier",
          [](const Group& g) {
            py::gil_scoped_release release;
            g.barrier();
          })
      .def("__repr__", [](const Group& g) {
        return "muon_cpp.Group(name='" + g.name() + "', rank=" + std::to_string(g.rank()) +
               ", size=" + std::to_string(g.size()) + ", backend='" + g.backend_name() + "')";
      });

  py::class_<distributed::TensorParallelShard>(m, "TensorParallelShard",
                                        "This rank's block of a tensor-parallel parameter.")
      .def(py::init<std::vector<int64_t>, int64_t, Group>(), py::arg("global_shape"),
           py::arg("partition_dim"), py::arg("group"))
      .def_property_readonly("global_shape",
                             [](const distributed::TensorParallelShard& s) { return s.global_shape(); })
      .def_property_readonly("partition_dim",
                             [](const distributed::TensorParallelShard& s) { return s.partition_dim(); })
      .def_property_readonly("group", [](const distributed::TensorParallelShard& s) { return s.group(); });

  py::class_<distributed::RowShard>(m, "RowShard", "This rank's rows of a row-sharded (ZeRO/FSDP) parameter.")
      .def(py::init<std::vector<int64_t>, Group>(), py::arg("global_shape"), py::arg("group"))
      .def(
          "with_tensor_parallel",
          [](distributed::RowShard s, const distributed::TensorParallelShard& tp, const std::string& mode) {
            s.tensor_parallel(tp, distributed::parse_tensor_parallel_mode(mode));
            return s;
          },
          py::arg("tp"), py::arg("mode"),
          "A copy that is also a block of the larger tensor-parallel matrix `tp` (2-D layout).")
      .def_property_readonly("global_shape", [](const distributed::RowShard& s) { return s.global_shape(); })
      .def_property_readonly("group", [](const distributed::RowShard& s) { return s.group(); })
      .def_property_readonly("has_tensor_parallel", &distributed::RowShard::has_tensor_parallel);

  py::class_<distributed::DistributedLayout>(m, "DistributedLayout",
                                      "What a distributed layout needs beyond the config.")
      .def(py::init<>())
      .def_readwrite("group", &distributed::DistributedLayout::group)
      .def_readwrite("tensor_parallel", &distributed::DistributedLayout::tensor_parallel)
      .def_readwrite("row_shards", &distributed::DistributedLayout::row_shards);

  m.def(
      "broadcast_parameters",
      [](const std::vector<std::string>& names, const std::vector<at::Tensor>& params, const Group& g,
         int root) {
        const auto named = named_parameters(names, params);
        py::gil_scoped_release release;
        distributed::broadcast_parameters(named, g, root);
      },
      py::arg("names"), py::arg("params"), py::arg("group"), py::arg("root") = 0,
      "Copies rank `root`'s parameters to every rank (in place).");
  m.def(
      "all_reduce_gradients",
      [](const std::vector<at::Tensor>& params, const Group& g, int64_t bucket_bytes) {
        py::gil_scoped_release release;
        distributed::all_reduce_gradients(params, g, bucket_bytes);
      },
      py::arg("params"), py::arg("group"), py::arg("bucket_bytes") = int64_t{32} << 20,
      "Averages the gradients of `params` over the group (as DDP), in buckets.");
}

}  // namespace muon::python
