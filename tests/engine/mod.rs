//! Tests of the engine: each op's gradient, each layer end to end, the
//! fast kernels against their twins, optimisers, files and checkpoints.

mod architecture;
mod checkpoint;
mod f32_vs_f64;
mod fast_paths;
mod fused_head;
mod fused_head_grouped_sum;
mod fused_head_sum;
mod gemm_kernel;
mod grad_hand;
mod grad_layers;
mod grad_ops;
mod grad_vocabulary;
mod half_fused;
mod half_params;
mod half_storage;
mod io_atomic;
mod io_index;
mod io_npz;
mod optim;
mod spec_errors;
