// Elementwise maps over contiguous tensors of equal size: y[i] = f(x[i]) and
// y[i] = f(a[i], b[i]). The functor works on storage values (it loads to its
// compute type and rounds on return). When every pointer is aligned, each
// thread moves 16 bytes of the widest operand per access; otherwise one element.
// An output may alias an input (in-place ops): each element is read before it
// is written by the same thread.
#pragma once

#include <cstdint>

#include "backends/gpu/common.cuh"

namespace infinitrain::gpu {

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

template <int kVec, typename In, typename Out, typename F>
__global__ void Map1Kernel(const In* x, Out* y, int64_t n, F f) {
    const int64_t nv = n / kVec;
    GPU_KERNEL_LOOP(i, nv) {
        const Pack<In, kVec> a = reinterpret_cast<const Pack<In, kVec>*>(x)[i];
        Pack<Out, kVec> r;
#pragma unroll
        for (int k = 0; k < kVec; ++k) r.v[k] = f(a.v[k]);
        reinterpret_cast<Pack<Out, kVec>*>(y)[i] = r;
    }
    GPU_KERNEL_LOOP(j, n - nv * kVec) { y[nv * kVec + j] = f(x[nv * kVec + j]); }
}

template <int kVec, typename In, typename Out, typename F>
__global__ void Map2Kernel(const In* a, const In* b, Out* y, int64_t n, F f) {
    const int64_t nv = n / kVec;
    GPU_KERNEL_LOOP(i, nv) {
        const Pack<In, kVec> pa = reinterpret_cast<const Pack<In, kVec>*>(a)[i];
        const Pack<In, kVec> pb = reinterpret_cast<const Pack<In, kVec>*>(b)[i];
        Pack<Out, kVec> r;
#pragma unroll
        for (int k = 0; k < kVec; ++k) r.v[k] = f(pa.v[k], pb.v[k]);
        reinterpret_cast<Pack<Out, kVec>*>(y)[i] = r;
    }
    GPU_KERNEL_LOOP(j, n - nv * kVec) { y[nv * kVec + j] = f(a[nv * kVec + j], b[nv * kVec + j]); }
}

template <typename In, typename Out>
constexpr int VecWidth() {
    return static_cast<int>(16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out)));
}

inline bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// y[i] = f(x[i]) for i < n.
template <typename In, typename Out, typename F>
void Map1(const In* x, Out* y, int64_t n, F f, NativeStream_t s, const char* op) {
    if (n <= 0) return;
    constexpr int kVec = VecWidth<In, Out>();
    if (kVec > 1 && Aligned(x, sizeof(In) * kVec) && Aligned(y, sizeof(Out) * kVec)) {
        Map1Kernel<kVec><<<Blocks((n + kVec - 1) / kVec), kThreads, 0, s>>>(x, y, n, f);
    } else {
        Map1Kernel<1><<<Blocks(n), kThreads, 0, s>>>(x, y, n, f);
    }
    GPU_CHECK_LAUNCH(op);
}

// y[i] = f(a[i], b[i]) for i < n.
template <typename In, typename Out, typename F>
void Map2(const In* a, const In* b, Out* y, int64_t n, F f, NativeStream_t s, const char* op) {
    if (n <= 0) return;
    constexpr int kVec = VecWidth<In, Out>();
    if (kVec > 1 && Aligned(a, sizeof(In) * kVec) && Aligned(b, sizeof(In) * kVec) && Aligned(y, sizeof(Out) * kVec)) {
        Map2Kernel<kVec><<<Blocks((n + kVec - 1) / kVec), kThreads, 0, s>>>(a, b, y, n, f);
    } else {
        Map2Kernel<1><<<Blocks(n), kThreads, 0, s>>>(a, b, y, n, f);
    }
    GPU_CHECK_LAUNCH(op);
}

}  // namespace infinitrain::gpu
