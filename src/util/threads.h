// The BLAS library's own thread pool, kept no wider than LibTorch's.
#pragma once

namespace muon::detail {

/// Keeps the thread pool of the BLAS library loaded in this process
/// (OpenBLAS, MKL) no wider than LibTorch's intra-op thread count
/// (`at::get_num_threads()`).
///
/// OpenBLAS and MKL size their pools from the machine, not from LibTorch:
/// a rank given one intra-op thread still runs every GEMM on all cores, and
/// several ranks on one machine then oversubscribe it. This sets the BLAS
/// thread count to LibTorch's, through `openblas_set_num_threads` and
/// `mkl_set_num_threads` looked up at run time (no link dependency; a
/// library that is not loaded is skipped).
///
/// A count the user chose is never changed: OpenBLAS is left alone when
/// OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS is set, MKL
/// when MKL_NUM_THREADS or OMP_NUM_THREADS is set (the variables those
/// libraries read themselves), as seen at the first call.
///
/// Cheap and idempotent: it remembers the count it last set and calls the
/// BLAS only when LibTorch's count changed since, so the optimizers call it
/// at every step. Call it outside parallel regions (it does nothing inside
/// one). Returns the number of BLAS libraries it manages (0, 1 or 2).
int align_blas_threads();

}  // namespace muon::detail
