// What an optimizer archive holds, in words.
#include "optim/archive_kind.h"

#include <c10/util/StringUtil.h>

#include <vector>

#include "util/names.h"

namespace muon::detail {
namespace {

bool read(torch::serialize::InputArchive& archive, const std::string& key, c10::IValue& value) {
  try {
    return archive.try_read(key, value);
  } catch (const std::exception&) {
    return false;  // present with another type: not the key this code wrote
  }
}

}  // namespace

std::string describe_archive(torch::serialize::InputArchive& archive) {
  c10::IValue v;
  if (read(archive, "layerwise_format", v)) {
    c10::IValue rank;
    c10::IValue world;
    if (read(archive, "rank", rank) && read(archive, "world", world) && rank.isInt() &&
        world.isInt()) {
      return c10::str("the state of muon::distributed::LayerwiseOptimizer written by rank ",
                      rank.toInt(), " of ", world.toInt(), " ranks");
    }
    return "the state of muon::distributed::LayerwiseOptimizer";
  }
  if (read(archive, "composite_format", v)) {
    std::vector<std::string> names;
    c10::IValue size;
    if (read(archive, "parts/size", size) && size.isInt()) {
      for (int64_t i = 0; i < size.toInt() && i < 16; ++i) {
        c10::IValue name;
        if (read(archive, "parts/" + std::to_string(i) + "/name", name) && name.isString()) {
          names.push_back("'" + name.toStringRef() + "'");
        }
      }
    }
    return c10::str("the state of a muon::CompositeOptimizer of ", names.size(), " part",
                    names.size() == 1 ? "" : "s", " (", join(names), ")");
  }
  if (read(archive, "muon_format", v)) {
    c10::IValue kind;
    c10::IValue layout;
    const std::string k = read(archive, "muon_kind", kind) && kind.isString()
                              ? kind.toStringRef()
                              : std::string("muon::Muon");
    const std::string l = read(archive, "muon_layout", layout) && layout.isString()
                              ? layout.toStringRef()
                              : std::string("local");
    return c10::str("the state of ", k, " (layout '", l, "')");
  }
  if (read(archive, "elementwise_kind", v) && v.isString()) return "the state of " + v.toStringRef();
  if (read(archive, "lion_groups", v)) return "the state of muon::Lion";  // written before elementwise_kind
  if (read(archive, "pytorch_version", v)) return "the state of a LibTorch optimizer (e.g. AdamW)";
  return "no optimizer state this library writes";
}

}  // namespace muon::detail
