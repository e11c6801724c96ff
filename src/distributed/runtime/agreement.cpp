// "Do all ranks agree", naming the first difference: check_ranks_agree, the
// items the layouts compare, and broadcast_parameters.
#include "distributed/runtime/agreement.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <c10/util/Type.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "distributed/runtime/max_over.h"
#include "muon/config.h"

namespace muon::distributed {
namespace {

constexpr const char* kBroadcastWho = "[muon::distributed::broadcast_parameters] ";
constexpr int64_t kAbsent = -1;  // a position past a rank's last item (digests are >= 0)

std::string clip(const std::string& text) {
  if (text.size() <= kMaxAgreementText) return text;
  return text.substr(0, kMaxAgreementText - 3) + "...";
}

int64_t digest(const AgreementItem& item) {
  const auto h = detail::fnv1a(detail::fnv1a(detail::kFnvOffset, item.name), std::string(1, '\0'));
  return detail::signature_value(detail::fnv1a(h, item.value));
}

// An item as integers of one fixed length, to all-gather: [present, name
// length, name characters..., value length, value characters...], clipped.
constexpr size_t kTextSlots = kMaxAgreementText + 1;

std::vector<int64_t> encode(const AgreementItem* item) {
  std::vector<int64_t> out(1 + 2 * kTextSlots, 0);
  if (item == nullptr) return out;
  out[0] = 1;
  auto put = [&out](size_t at, const std::string& text) {
    const auto s = clip(text);
    out[at] = static_cast<int64_t>(s.size());
    for (const auto i : c10::irange(s.size())) out[at + 1 + i] = static_cast<unsigned char>(s[i]);
  };
  put(1, item->name);
  put(1 + kTextSlots, item->value);
  return out;
}

std::string decode_text(const std::vector<int64_t>& v, size_t at) {
  const auto n = std::min(static_cast<size_t>(std::max<int64_t>(v.at(at), 0)), kMaxAgreementText);
  std::string s(n, ' ');
  for (const auto i : c10::irange(n)) s[i] = static_cast<char>(v.at(at + 1 + i));
  return s;
}

// Doubles in the shortest text that reads back to the same value.
std::string shortest(double x) {
  for (int precision = 1; precision <= 17; ++precision) {
    std::ostringstream s;
    s << std::setprecision(precision) << x;
    if (std::strtod(s.str().c_str(), nullptr) == x) return s.str();
  }
  std::ostringstream s;
  s << std::setprecision(17) << x;
  return s.str();
}

std::string text_of(const c10::IValue& v) {
  if (v.isDouble()) return shortest(v.toDouble());
  if (v.isString()) return v.toStringRef();
  if (v.isDoubleList()) {
    std::string out = "[";
    for (const auto x : v.toDoubleVector()) out += (out.size() > 1 ? ", " : "") + shortest(x);
    return out + "]";
  }
  if (v.isTuple()) {
    std::string out = "(";
    for (const auto& e : v.toTupleRef().elements()) out += (out.size() > 1 ? ", " : "") + text_of(e);
    return out + ")";
  }
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

void check_ranks_agree(const Group& group, const std::vector<AgreementItem>& items,
                       const std::string& who, const std::string& hint) {
  TORCH_CHECK_VALUE(group.valid(), who, "the group is invalid (default-constructed)");
  if (group.size() == 1) return;
  std::vector<int64_t> digests;
  uint64_t all = detail::kFnvOffset;
  for (const auto& item : items) {
    digests.push_back(digest(item));
    all = detail::fnv1a(all, std::to_string(digests.back()) + ";");
  }
  const auto summary =
      group.all_gather_ints({static_cast<int64_t>(items.size()), detail::signature_value(all)});
  if (std::all_of(summary.begin(), summary.end(), [&](const auto& s) { return s == summary[0]; })) {
    return;
  }
  // Every rank sees the same gathered lists, so every rank picks the same
  // item and the same pair of ranks.
  int64_t longest = 0;
  for (const auto& s : summary) longest = std::max(longest, s[0]);
  digests.resize(static_cast<size_t>(longest), kAbsent);
  const auto each = group.all_gather_ints(digests);
  size_t k = 0;
  size_t other = 0;
  for (size_t i = 0; i < static_cast<size_t>(longest) && other == 0; ++i) {
    for (size_t r = 1; r < each.size() && other == 0; ++r) {
      if (each[r][i] != each[0][i]) {
        k = i;
        other = r;
      }
    }
  }
  TORCH_INTERNAL_ASSERT(other != 0, "the ranks' summaries differ but no item does");
  const auto texts = group.all_gather_ints(encode(k < items.size() ? &items[k] : nullptr));
  const auto& a = texts[other];
  const auto& b = texts[0];
  const auto name_a = decode_text(a, 1);
  const auto name_b = decode_text(b, 1);
  const auto value_a = decode_text(a, 1 + kTextSlots);
  const auto value_b = decode_text(b, 1 + kTextSlots);
  std::ostringstream what;
  if (a[0] == 0 || b[0] == 0) {
    const auto missing = a[0] == 0 ? other : 0;
    what << "rank " << other << " lists " << summary[other][0] << ", rank 0 lists "
         << summary[0][0] << "; the first missing on rank " << missing << " is "
         << (a[0] == 0 ? name_b : name_a) << " (" << (a[0] == 0 ? value_b : value_a) << ")";
  } else if (name_a == name_b) {
    what << name_a << " is " << value_a << " on rank " << other << ", " << value_b << " on rank 0";
  } else {
    what << "item " << k << " is " << name_a << " (" << value_a << ") on rank " << other << ", "
         << name_b << " (" << value_b << ") on rank 0";
  }
  TORCH_CHECK_VALUE(false, who, "the ranks of group '", group.name(), "' disagree: ", what.str(),
                    "; ", hint);
}

void broadcast_parameters(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                          const Group& group, int root) {
  TORCH_CHECK_VALUE(group.valid(), kBroadcastWho, "the group is invalid (default-constructed)");
  TORCH_CHECK_VALUE(root >= 0 && root < group.size(), kBroadcastWho, "root ", root,
                    " is not a rank of group '", group.name(), "' (size ", group.size(), ")");
  for (const auto& item : named_parameters) {
    TORCH_CHECK_VALUE(item.value().defined(), kBroadcastWho, "parameter '", clip(item.key()),
                      "' is undefined");
  }
  check_ranks_agree(group, detail::parameter_items(named_parameters), kBroadcastWho,
                    "every rank must build the same model (parameter names, shapes, dtypes, "
                    "order) before its parameters are broadcast");
  if (group.size() == 1) return;
  at::NoGradGuard no_grad;
  for (const auto& item : named_parameters) {
    auto t = item.value().detach();
    group.broadcast_(t, root);
  }
}

namespace detail {

void raise_together(const std::string& failure, const std::vector<const Group*>& peers,
                    const char* who, const std::string& where) {
  const auto [failed, rank] = max_over_groups(peers, failure.empty() ? 0 : 1);
  TORCH_CHECK_VALUE(failure.empty(), failure);
  TORCH_CHECK_VALUE(failed == 0, who, "the ranks disagree: rank ", rank, " of group '",
                    peers.front()->name(), "' found a difference in its ", where,
                    " (its message names it)");
}

std::vector<AgreementItem> parameter_items(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters) {
  std::vector<AgreementItem> out;
  out.reserve(named_parameters.size());
  for (const auto& item : named_parameters) {
    const auto& p = item.value();
    out.push_back({"parameter '" + item.key() + "'",
                   p.defined() ? c10::str("shape ", p.sizes(), ", ", p.scalar_type()) : "undefined"});
  }
  return out;
}

std::vector<AgreementItem> value_items(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters) {
  std::vector<AgreementItem> out;
  out.reserve(named_parameters.size());
  for (const auto& item : named_parameters) {
    const auto bytes = item.value().detach().to(at::kCPU).contiguous();
    const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
    const size_t n = bytes.nbytes();
    // FNV-1a over 8-byte words (each step a bijection of the hash, so one
    // differing word always changes it), then a 64-bit finalizer.
    uint64_t h = kFnvOffset;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word = 0;
      std::memcpy(&word, data + i, 8);
      h = (h ^ word) * 1099511628211ULL;
    }
    for (; i < n; ++i) h = (h ^ data[i]) * 1099511628211ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    std::ostringstream text;
    text << std::hex << std::setw(16) << std::setfill('0') << h;
    out.push_back({"the checksum of the values of parameter '" + item.key() + "'", text.str()});
  }
  return out;
}

void append_option_items(std::vector<AgreementItem>& out,
                         const torch::optim::OptimizerOptions& options, const std::string& where) {
  out.push_back({"optimizer of " + where, c10::demangle(typeid(options).name())});
  // The options' own archive lists every field they have; read it back to
  // name each one.
  torch::serialize::OutputArchive written;
  try {
    options.serialize(written);
  } catch (const c10::Error&) {
    // Options without an archive (LibTorch's base class raises): their type
    // is all there is to compare.
    return;
  }
  std::string bytes;
  written.save_to([&bytes](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::serialize::InputArchive read;
  read.load_from(bytes.data(), bytes.size());
  for (const auto& key : read.keys()) {
    c10::IValue value;
    if (!read.try_read(key, value)) continue;
    out.push_back({key + " of " + where, text_of(value)});
  }
}

std::vector<AgreementItem> optimizer_items(const torch::optim::Optimizer& optimizer) {
  std::vector<AgreementItem> out;
  const auto& groups = optimizer.param_groups();
  for (const auto g : c10::irange(groups.size())) {
    const auto where = c10::str("param group ", g);
    std::ostringstream shapes;
    shapes << groups[g].params().size() << " parameter(s)";
    for (const auto& p : groups[g].params()) shapes << " " << p.sizes();
    out.push_back({"parameters of " + where, shapes.str()});
    append_option_items(out, groups[g].options(), where);
  }
  return out;
}

std::vector<AgreementItem> config_items(const OptimizerConfig& config) {
  std::vector<AgreementItem> out;
  for (const auto& [name, value] : config.values()) {
    out.push_back({"config field '" + name + "'", muon::to_string(value)});
  }
  const auto& rules = config.overrides();
  out.push_back({"config override rules", c10::str(rules.size(), " rule(s)")});
  for (const auto i : c10::irange(rules.size())) {
    std::ostringstream text;
    text << "'" << rules[i].label << "': " << rules[i].match.describe() << " sets";
    for (const auto& [key, value] : rules[i].set_fields) text << " " << key << "=" << muon::to_string(value);
    out.push_back({c10::str("config override rule ", i), text.str()});
  }
  return out;
}

}  // namespace detail
}  // namespace muon::distributed
