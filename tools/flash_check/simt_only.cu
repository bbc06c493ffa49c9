// Compile check (never linked): flash_attention.cuh under a vendor header without TileMma picks the SIMT policy
// for every dtype and its tensor-core launchers compile to `return false`.
#include "backends/gpu/flash_attention.cuh"

namespace infinitrain::gpu {

static_assert(!kHasTileMma, "built with tools/flash_check/vendor_no_tile_mma.h");
static_assert(DefaultFlashPolicy<bf16_t>() == FlashPolicy::kSimt, "no TileMma: 16-bit inputs take the SIMT policy");
static_assert(DefaultFlashPolicy<fp16_t>() == FlashPolicy::kSimt, "no TileMma: 16-bit inputs take the SIMT policy");

template <typename T>
bool InstantiateFlash(NativeStream_t s) {
    const T* c = nullptr;
    T* w = nullptr;
    float* f = nullptr;
    bool ok = LaunchFlashForward<T>(c, c, c, w, f, 1, 1, 1, 1, 1, 64, false, 0.125, s);
    ok &= LaunchFlashBackward<T>(c, c, c, c, c, f, w, w, w, f, 1, 1, 1, 1, 1, 64, false, 0.125, s);
    ok &= !LaunchFlashForward<T, FlashPolicy::kTileMma>(c, c, c, w, f, 1, 1, 1, 1, 1, 64, false, 0.125, s);
    return ok;
}

template bool InstantiateFlash<float>(NativeStream_t);
template bool InstantiateFlash<bf16_t>(NativeStream_t);
template bool InstantiateFlash<fp16_t>(NativeStream_t);

}  // namespace infinitrain::gpu
