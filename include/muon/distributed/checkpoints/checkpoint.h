#pragma once

/// Checkpoints of a model and its optimizer, in any layout, loadable in any
/// other: crash-safe, verified, and plain data.
///
///     muon::distributed::CheckpointOptions opts;
///     opts.group(world).keep(3);
///     muon::distributed::save_checkpoint("ckpt", model->named_parameters(), *opt, step, layout, opts);
///     ...
///     auto info = muon::distributed::load_checkpoint("ckpt", model->named_parameters(), *opt, layout, opts);
///     step = info.step;
///
/// **What is stored.** Every tensor is stored as a logical tensor with its
/// global shape and dtype, cut into chunks, each with its offsets and sizes
/// in the global tensor: `model/<name>` for each parameter and
/// `optim/<name>/<field>` for each field of its optimizer state
/// (`momentum_buffer`, `exp_avg`, `step`, ...). Where a parameter is a row
/// shard or a tensor-parallel block (DistributedLayout::row_shards,
/// ::tensor_parallel), each rank's part is one chunk; a replicated tensor
/// (a whole parameter on every rank, or the state of a layer-wise owner) is
/// one chunk written by exactly one rank (the lowest that holds it). Loading
/// reads, for each rank's part, the overlapping pieces of the chunks that
/// cover it, so a checkpoint written at W ranks in one layout loads at W'
/// ranks in another (single process, layer-wise, sharded, tensor parallel,
/// 2-D). Optimizer state is created eagerly before saving (the zero state a
/// first step creates, for muon, adaptive_muon, lion, adam and adamw), so
/// every parameter's state is in the checkpoint whether or not it has
/// stepped; sgd's state (whose first step copies the gradient) is stored
/// when present.
///
/// **On disk.** `DIR/step-<8 digits>/` holds one data file per writing rank
/// (`rank-<5 digits>-<nonce>.bin`: a 64-byte header, then the raw bytes of
/// its chunks, each 64-byte aligned, little-endian, C order) and
/// `manifest.json`, which lists every logical tensor with its chunks (file,
/// byte offset, length, XXH3-64 checksum). The format is documented in
/// docs/checkpoints.md with a reader in a few lines of Python.
///
/// **Crash-safe.** Ranks write their files under temporary names, fsync them
/// and rename them; after every rank has finished, rank 0 writes the
/// manifest under a temporary name, fsyncs it and renames it into place (the
/// commit), then fsyncs the directory. A checkpoint exists only once its
/// manifest does; a process killed at any moment leaves the previous
/// complete checkpoint loadable. After a commit, rank 0 removes the files
/// the new manifest does not name and all but the newest `keep` complete
/// checkpoints (and unfinished ones older than the newest complete one).
///
/// **Verified.** Loading checks the manifest, each file's header (its step
/// and save), size, and each chunk's checksum, and the model's parameter
/// names, shapes and dtypes against the checkpoint (as strict
/// `load_state_dict` does). Every tensor is read and checked before anything
/// is changed; then the ranks agree, and only if every rank succeeded is
/// anything written into the parameters and the optimizer. A failure raises
/// the same c10::ValueError on every rank, naming the file and the
/// parameter (or tensor), and leaves model and optimizer untouched. (So a
/// load holds a second copy of this rank's part of the model and state
/// until it commits.)
///
/// **Not code.** Loading parses JSON and copies bytes; nothing in the files
/// is compiled or run.
///
/// Options of the param groups (learning rates, betas) are not stored: they
/// come from the program's config, and a schedule sets the learning rate
/// from the step the checkpoint returns.
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/runtime/group.h"

namespace muon::distributed {

/// How checkpoints are saved and loaded.
struct CheckpointOptions {
  /// Every rank that holds part of the model (the world). Invalid (the
  /// default): `DistributedLayout::group` when valid, else a single process.
  TORCH_ARG(Group, group);
  /// Complete checkpoints kept in the directory after a save (>= 1).
  TORCH_ARG(int64_t, keep) = 2;
  /// fsync files and directories (turn off only for throwaway runs).
  TORCH_ARG(bool, fsync) = true;
};

/// What a checkpoint says about itself (from its manifest).
struct CheckpointInfo {
  /// The step given to save_checkpoint.
  int64_t step = 0;
  /// The checkpoint's directory (`DIR/step-<N>`).
  std::string path;
  /// Ranks that saved it.
  int64_t world_size = 0;
  /// The text given to save_checkpoint as `extra`.
  std::string extra;
  /// Bytes of its data files.
  int64_t bytes = 0;
};

/// Saves `named_parameters` (this rank's tensors: whole, row shards or TP
/// blocks as `layout` says) and the state of `optimizer` (any optimizer
/// muon::distributed::make_optimizer or muon::make_optimizer builds, or LibTorch's
/// Adam, AdamW and SGD) as checkpoint `step` in `dir` (created if missing),
/// with `extra` (any text, e.g. JSON of the run) in the manifest. Every rank
/// passes the same `dir` (on a file system the ranks share) and `step`. Collective
/// over the options' group and the layout's shard groups. Returns the
/// checkpoint's directory. Raises c10::ValueError on every rank, leaving the
/// previous checkpoints as they were, when a file cannot be written (naming
/// it and the system's reason), for a negative step, or when the parameters'
/// chunks do not tile their global shapes.
std::string save_checkpoint(const std::string& dir,
                            const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                            torch::optim::Optimizer& optimizer, int64_t step,
                            const DistributedLayout& layout = {}, const std::string& extra = "",
                            const CheckpointOptions& options = {});

/// Loads a checkpoint into `named_parameters` and `optimizer` laid out as
/// `layout` says (which need not be the layout or world size that saved
/// it). `path` is a directory of checkpoints (the newest complete one is
/// loaded) or one checkpoint's `step-<N>` directory. Collective as
/// save_checkpoint. Raises c10::ValueError on every rank, changing nothing,
/// for a missing or damaged checkpoint (naming the file and the tensor), a
/// parameter missing from either side or of another shape or dtype (naming
/// the first), or state of another optimizer kind than the parameter's.
CheckpointInfo load_checkpoint(const std::string& path,
                               const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                               torch::optim::Optimizer& optimizer,
                               const DistributedLayout& layout = {},
                               const CheckpointOptions& options = {});

/// save_checkpoint of a Layout: its checkpoint_parameters() and optimizer
/// in its checkpoint_layout(), over `options.group()` or, when that is
/// invalid, the layout's world. Collective as save_checkpoint.
std::string save_checkpoint(const std::string& dir, Layout& layout, int64_t step,
                            const std::string& extra = "", const CheckpointOptions& options = {});

/// load_checkpoint into a Layout (any layout and world size wrote it), then
/// Layout::parameters_loaded() (the sharded layout gathers its rows into
/// the parameters). Collective as load_checkpoint.
CheckpointInfo load_checkpoint(const std::string& path, Layout& layout,
                               const CheckpointOptions& options = {});

/// The newest complete checkpoint in directory `dir` (its manifest read, no
/// tensor), or nullopt when there is none; when `dir` is one checkpoint's
/// `step-<N>` directory, that checkpoint. Raises c10::ValueError for a
/// damaged manifest. Not collective.
std::optional<CheckpointInfo> latest_checkpoint(const std::string& dir);

/// Reads checkpoint `path` whole without loading it: a `step-<N>` directory,
/// or a directory of checkpoints whose newest complete one is read. Checks
/// the manifest's checksum and entries, every data file's header, size and
/// save, and every chunk's checksum, as load_checkpoint does. Returns what
/// the checkpoint says about itself; raises c10::ValueError naming the file
/// (and the tensor) that is damaged. Not collective.
CheckpointInfo verify_checkpoint(const std::string& path);

/// A complete checkpoint that latest_verified_checkpoint passed over.
struct SkippedCheckpoint {
  /// Its `step-<N>` directory.
  std::string path;
  /// verify_checkpoint's message (one line).
  std::string reason;
};

/// The newest complete checkpoint in directory `dir` that verify_checkpoint
/// accepts, or nullopt when none does (or there is none). Each newer
/// complete checkpoint that does not verify is appended to `skipped`
/// (newest first) with its reason. Reads every byte of each checkpoint it
/// tries. Not collective.
std::optional<CheckpointInfo> latest_verified_checkpoint(const std::string& dir,
                                                         std::vector<SkippedCheckpoint>* skipped = nullptr);

/// Raises c10::ValueError naming `dir` and the system's reason unless `dir`
/// is (or can be created as) a directory where files can be created,
/// written, fsynced and renamed; a training program calls it before its
/// first step so that an unwritable save path is found before training.
/// Leaves no file behind. Not collective.
void check_checkpoint_dir(const std::string& dir);

}  // namespace muon::distributed
