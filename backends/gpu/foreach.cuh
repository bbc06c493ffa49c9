// Multi-tensor ("foreach") kernels: foreach_sum_squares, foreach_mul_ and foreach_adamw_ over many tensors in a
// few launches instead of one (or two) per tensor.
//
// Layout: every tensor is cut into chunks of kForeachChunk elements (its last chunk shorter, an empty tensor
// none), one block per chunk. The host packs the chunks, tensor after tensor, into launches: a launch's kernel
// parameter (ForeachBatch, passed by value, at most 2 KB) holds up to kSlots pieces, each a run of whole chunks
// of one tensor given by its pointers (offset to the run's first element), its element count and its first block.
// Block b of a launch works on the piece s with first[s] <= b < first[s + 1], on that piece's chunk
// b - first[s]. A launch takes at most kMaxBlocks blocks; a tensor with more chunks than fit is continued in
// the next launch. Pieces are cut at chunk boundaries, so a chunk is the same elements however the tensors fall
// into launches.
//
// foreach_sum_squares: each block writes the double sum of its chunk's squares to partial[base + b], base being
// the number of blocks of the earlier launches, so the partials lie in (tensor, chunk) order whatever the launch
// split; one block then sums them in a fixed order (SumPartialsKernel). The chunking depends on the shapes
// alone: the result is deterministic.
// foreach_mul_: x = x * scale in the compute type (float; double for float64 x), rounded once to x's dtype;
// scale (0-d, any float dtype) is read on the device and converted to the compute type first.
// foreach_adamw_: AdamWStep (optim.cuh) on every element, adamw_'s own arithmetic, so the results equal adamw_'s
// bit for bit.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "backends/gpu/common.cuh"
#include "backends/gpu/optim.cuh"
#include "backends/gpu/reduce.cuh"

namespace infinitrain::gpu {

constexpr int64_t kForeachChunk = 1 << 14;  // elements per block

// One launch's pieces: kPtrs pointers per piece (foreach_adamw_: param, grad, m, v), up to kSlots pieces.
template <int kPtrs, int kSlots>
struct ForeachBatch {
    void* ptr[kPtrs][kSlots];
    int64_t numel[kSlots];      // elements of the piece
    int32_t first[kSlots + 1];  // first block of each piece; first[count]: the launch's block count
    int32_t count;              // pieces in this launch
};

using ForeachBatch1 = ForeachBatch<1, 64>;
using ForeachBatch4 = ForeachBatch<4, 32>;
static_assert(sizeof(ForeachBatch1) <= 2048 && sizeof(ForeachBatch4) <= 2048, "kernel parameters well under 4 KB");

// Host: packs n.size() tensors (tensor t: the kPtrs arrays ptrs[t], of n[t] elements of bytes[k] bytes each) into
// launches and calls launch(batch, blocks, base) for each, in order: `blocks` the launch's block count, `base`
// the blocks of the launches before it.
template <int kPtrs, int kSlots, typename Launch>
void ForEachBatch(const std::vector<std::array<void*, kPtrs>>& ptrs, const std::vector<int64_t>& n,
                  const std::array<int64_t, kPtrs>& bytes, Launch&& launch) {
    ForeachBatch<kPtrs, kSlots> batch{};
    int64_t base = 0, blocks = 0;  // blocks: of the launch being filled
    auto flush = [&] {
        if (batch.count == 0) return;
        batch.first[batch.count] = static_cast<int32_t>(blocks);
        launch(batch, blocks, base);
        base += blocks;
        blocks = 0;
        batch = ForeachBatch<kPtrs, kSlots>{};
    };
    for (size_t t = 0; t < n.size(); ++t) {
        const int64_t chunks = (n[t] + kForeachChunk - 1) / kForeachChunk;
        for (int64_t done = 0; done < chunks;) {
            if (batch.count == kSlots || blocks == kMaxBlocks) flush();
            const int64_t take = std::min(chunks - done, kMaxBlocks - blocks);
            const int s = batch.count++;
            const int64_t start = done * kForeachChunk;
            for (int k = 0; k < kPtrs; ++k) batch.ptr[k][s] = static_cast<char*>(ptrs[t][k]) + start * bytes[k];
            batch.numel[s] = std::min(n[t] - start, take * kForeachChunk);
            batch.first[s] = static_cast<int32_t>(blocks);
            blocks += take;
            done += take;
        }
    }
    flush();
}

// Blocks all launches of ForEachBatch over tensors of n[t] elements take together.
inline int64_t ForeachBlocks(const std::vector<int64_t>& n) {
    int64_t blocks = 0;
    for (int64_t e : n) blocks += (e + kForeachChunk - 1) / kForeachChunk;
    return blocks;
}

// Block b's piece s of a launch and the elements [begin, end) of that piece its chunk covers (host code checks the
// layout with it: tools/foreach_check).
template <int kPtrs, int kSlots>
__host__ __device__ __forceinline__ int ForeachChunkOf(const ForeachBatch<kPtrs, kSlots>& batch, int32_t b,
                                                       int64_t& begin, int64_t& end) {
    int s = 0;
    while (s + 1 < batch.count && batch.first[s + 1] <= b) ++s;
    begin = static_cast<int64_t>(b - batch.first[s]) * kForeachChunk;
    end = begin + kForeachChunk < batch.numel[s] ? begin + kForeachChunk : batch.numel[s];
    return s;
}

// Batch: the launches' ForeachBatch (other slot counts than the adapters' only in tools/foreach_check).
template <typename T, typename Batch = ForeachBatch1>
__global__ void ForeachSumSquaresKernel(Batch batch, double* __restrict__ partial, int64_t base) {
    int64_t begin, end;
    const int s = ForeachChunkOf(batch, static_cast<int32_t>(blockIdx.x), begin, end);
    const T* x = static_cast<const T*>(batch.ptr[0][s]);
    double acc = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double v = LoadDouble(x + i);
        acc += v * v;
    }
    acc = BlockReduce(acc, SumOp(), 0.0);
    if (threadIdx.x == 0) partial[base + blockIdx.x] = acc;
}

// S: the scale's storage type.
template <typename T, typename S, typename Batch = ForeachBatch1>
__global__ void ForeachMulKernel(Batch batch, const S* __restrict__ scale) {
    int64_t begin, end;
    const int s = ForeachChunkOf(batch, static_cast<int32_t>(blockIdx.x), begin, end);
    T* x = static_cast<T*>(batch.ptr[0][s]);
    const Acc<T> c = static_cast<Acc<T>>(ToAcc(*scale));
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] = FromAcc<T>(ToAcc(x[i]) * c);
}

template <typename T, typename Batch = ForeachBatch4>
__global__ void ForeachAdamWKernel(Batch batch, AdamWParams h) {
    int64_t begin, end;
    const int s = ForeachChunkOf(batch, static_cast<int32_t>(blockIdx.x), begin, end);
    T* p = static_cast<T*>(batch.ptr[0][s]);
    const T* g = static_cast<const T*>(batch.ptr[1][s]);
    Acc<T>* m = static_cast<Acc<T>*>(batch.ptr[2][s]);
    Acc<T>* v = static_cast<Acc<T>*>(batch.ptr[3][s]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) AdamWStep(p, g, m, v, i, h);
}

}  // namespace infinitrain::gpu
