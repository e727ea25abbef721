// Device helpers shared by the .cu files: widening a weight element to f32, rounding f32 to a
// narrow float as the host does, KV slot addressing and warp/block reductions. Internal to
// kernels/cuda/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/dtype.h"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {

constexpr int kWarp = 32;

// Element i of a weight buffer in `dtype`, widened exactly to f32. The switch is uniform across
// a launch, so it does not diverge.
__device__ __forceinline__ float LoadF(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kI8:  // the integer value; the row's scale is applied by the caller
      return static_cast<float>(static_cast<const int8_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// An activation as a weight of dtype w sees it (kernels/op_table.h): bf16 and int8 weights meet
// x rounded to bf16 (nearest even), other dtypes x itself.
__device__ __forceinline__ float XFor(float x, DType w) {
  return w == DType::kBF16 || w == DType::kI8 ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

// f32 to f16 / bf16 bits, round to nearest even, bit for bit as common/dtype.h FloatToHalf and
// FloatToBF16 (the runtime's own conversions canonicalise NaNs differently).
__device__ __forceinline__ uint16_t FloatToHalfBits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u);
  }
  return __half_as_ushort(__float2half_rn(f));
}
__device__ __forceinline__ uint16_t FloatToBF16Bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Element i of a float buffer in `dtype` set to v (rounded as above).
__device__ __forceinline__ void StoreF(void* p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToHalfBits(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBF16Bits(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// Slot s of cache head h, in slots (KvSlotIndex in kernels/op_table.h).
__device__ __forceinline__ int64_t SlotIndex(const KvSlots& kv, int64_t h, int64_t s) {
  if (kv.blocks == nullptr) return h * kv.capacity + s;
  return static_cast<int64_t>(kv.blocks[s / kv.block_slots]) * kv.block_stride +
         h * kv.block_slots + s % kv.block_slots;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum or max over the block, returned to every thread. blockDim.x is a multiple of 32 (at most
// 1024); `scratch` holds 32 floats of shared memory and is reusable once this returns.
template <bool kMax>
__device__ float BlockReduce(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = kMax ? WarpMax(v) : WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.f);
    w = kMax ? WarpMax(w) : WarpSum(w);
    if (lane == 0) scratch[0] = w;
  }
  __syncthreads();
  float result = scratch[0];
  __syncthreads();  // everyone has read scratch[0] before the next reduction overwrites it
  return result;
}

__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  return BlockReduce<false>(v, scratch);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  return BlockReduce<true>(v, scratch);
}

// A grid of at most `max_blocks` blocks of `threads` covering n elements (grid-stride loops
// cover the rest).
inline unsigned GridFor(int64_t n, int threads, int64_t max_blocks = 4096) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks);
}

}  // namespace deja::kernels::cuda
