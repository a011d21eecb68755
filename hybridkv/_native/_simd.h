/* Shared by the float kernels (_decode_attn.c, _norm_rope.c): one copy of each hot loop
 * per x86-64 level, picked at load time (the plain build targets the baseline ISA, where
 * 16-wide accumulators do not fill a register), and the number of accumulators a loop
 * keeps side by side. */
#ifndef HYBRIDKV_SIMD_H
#define HYBRIDKV_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define HKV_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HKV_CLONES
#endif

#define LANES 16

#endif
