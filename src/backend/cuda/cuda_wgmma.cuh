// Hopper warpgroup MMA (wgmma, sm_90a) building blocks: shared-memory matrix descriptors for K-major
// tiles in the 128-byte swizzle, the m64nNk16 BF16 products with F32 accumulators, and the fences and
// group waits around them. A tile row is 64 BF16 (128 bytes); 8 rows form a 1024-byte swizzle atom in which
// the 16-byte chunk c of row r sits at chunk c ^ (r % 8). Tiles start 1024-byte aligned.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

// The accumulator operands of an m64nN product, d[0] .. d[N / 2 - 1], each its own "+f" register (the
// asm strings below still name them %0 .. %(N / 2 - 1)).
#define BELUGA_WGMMA_ACC8(i)                                                                  \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define BELUGA_WGMMA_ACC32(i) \
  BELUGA_WGMMA_ACC8(i), BELUGA_WGMMA_ACC8(i + 8), BELUGA_WGMMA_ACC8(i + 16), BELUGA_WGMMA_ACC8(i + 24)
#define BELUGA_WGMMA_D8 BELUGA_WGMMA_ACC8(0)
#define BELUGA_WGMMA_D16 BELUGA_WGMMA_ACC8(0), BELUGA_WGMMA_ACC8(8)
#define BELUGA_WGMMA_D32 BELUGA_WGMMA_ACC32(0)
#define BELUGA_WGMMA_D64 BELUGA_WGMMA_ACC32(0), BELUGA_WGMMA_ACC32(32)
#define BELUGA_WGMMA_D128 BELUGA_WGMMA_D64, BELUGA_WGMMA_ACC32(64), BELUGA_WGMMA_ACC32(96)

namespace beluga::cuda {

// A kernel's dynamic shared memory as two regions of swizzled tiles: the first at the first 1024-byte
// boundary (the swizzle atom), the second `first_bytes` after it, each as a shared-window address (for
// descriptors) and a generic pointer (for cp.async and plain accesses).
struct SwizzledRegions {
  uint32_t s0, s1;
  unsigned char *g0, *g1;
};
__device__ __forceinline__ SwizzledRegions swizzled_regions(unsigned char* smem_raw, uint32_t first_bytes) {
  const uint32_t raw = smem_addr(smem_raw), s0 = (raw + 1023) & ~1023u;
  unsigned char* const g0 = smem_raw + (s0 - raw);
  return {s0, s0 + first_bytes, g0, g0 + first_bytes};
}

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a 128-byte-swizzled K-major tile.
__device__ __forceinline__ uint32_t sw128_offset(int r, int c) {
  return uint32_t(r) * 128u + (uint32_t(c ^ (r & 7)) << 4);
}

// Descriptor of a K-major, 128-byte-swizzled tile at `smem` (shared address): leading byte offset unused
// (1), stride byte offset 1024 between 8-row groups, swizzle mode 1 (128 B) in bits 62-63. Advancing along
// K by 16 elements within the 128-byte row adds 32 bytes to the start address (encoded +2).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem) {
  return uint64_t((smem & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// Descriptor of an MN-major, 128-byte-swizzled tile at `smem`: rows of 64 N-contiguous elements (128
// bytes) along K, 8-row groups 1024 bytes apart (stride byte offset), the next 64 N elements `mn_stride`
// bytes on (leading byte offset). CUTLASS's canonical SW128 MN-major layout ((8,8,m),(8,k)) :
// ((1,8,LBO),(64,SBO)) in 16-byte units.
__device__ __forceinline__ uint64_t sw128_mn_desc(uint32_t smem, uint32_t mn_stride) {
  return uint64_t((smem & 0x3FFFF) >> 4) | (uint64_t(mn_stride >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// Shared-memory writes of this thread (st.shared, cp.async) become visible to wgmma's async proxy; every
// writing thread runs it before the barrier that precedes the wgmma.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// d[64 x 256] (+)= a[64 x 16] b[256 x 16]^T, both K-major in shared memory (descriptors), F32 in d with the
// accumulator layout of mma.sync m16n8 tiles: d[4j..4j+3] = rows (w16 + g, w16 + g + 8) x columns
// (8j + 2t, 8j + 2t + 1) for warp w of the warpgroup, g = lane / 4, t = lane % 4. accumulate = false
// overwrites d.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : BELUGA_WGMMA_D128
      : "l"(a), "l"(b), "r"(int(accumulate)));
}

// d[64 x 64] (+)= a[64 x 16] b[64 x 16]^T, both K-major in shared memory (d[32], the same layout).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : BELUGA_WGMMA_D32
      : "l"(a), "l"(b), "r"(int(accumulate)));
}

// d[64 x 128] += a[64 x 16] b[128 x 16]^T with a in registers (each warp's 16 rows in the mma.sync
// m16n8k16 A-fragment layout) and b MN-major in shared memory: 16 K rows of 128 N-contiguous elements,
// as sw128_mn_desc describes (d[64], the same accumulator layout).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : BELUGA_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// wgmma_ss(d, a, b): d[64 x N] += a[64 x 16] b[N x 16]^T with N = 4 x the length of d (16, 32, 128 or
// 256), both operands K-major in shared memory and the same accumulator layout: one name for kernels
// that pick the width of each product from its accumulator array.
__device__ __forceinline__ void wgmma_ss(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : BELUGA_WGMMA_D8
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : BELUGA_WGMMA_D16
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : BELUGA_WGMMA_D64
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[128], uint64_t a, uint64_t b) {
  wgmma_m64n256k16(d, a, b, true);
}

}  // namespace beluga::cuda

#undef BELUGA_WGMMA_ACC8
#undef BELUGA_WGMMA_ACC32
#undef BELUGA_WGMMA_D8
#undef BELUGA_WGMMA_D16
#undef BELUGA_WGMMA_D32
#undef BELUGA_WGMMA_D64
#undef BELUGA_WGMMA_D128
