// Per-device kernel attributes: the kernels that use more than the default 48 KB of dynamic shared
// memory must be allowed to, and that permission belongs to a device's context, not to the process.
// CudaOps sets them for its device when it is created (a process may drive several GPUs, one CudaOps
// each), so the launch paths need no "configured yet" state of their own.
#pragma once

namespace beluga::cuda {

void configure_mla_decode_kernels();
void configure_mla_prefill_kernels();
// smem_optin: the device's largest dynamic shared memory per block (the expert GEMV's need depends on
// the model's widths, known only at launch).
void configure_moe_kernels(int smem_optin);
void configure_swap_kernels();
void configure_wgmma_kernels();
void configure_invariant_gemm_kernels();
void configure_v4_attention_kernels();
void configure_v4_indexer_kernels();

}  // namespace beluga::cuda
