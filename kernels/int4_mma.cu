// W4A16 linear on the tensor cores for few rows (decode), and the dequantization of the same
// layout for many (prefill); compiled at run time by NVRTC (kernels/cuda_jit.py), no headers.
// The layout, the math and the launch are described in kernels/int4_mma.py. The variant is set
// by the macros the compiler is given:
//   KIND   1: bf16 activations and outputs, 2: fp16
//   SKIND  the scales' dtype, 1: bf16, 2: fp16
//   MT     8-row tiles of x (1: up to 8 rows, 2: up to 16)
//   WARPS  warps of a block; they cut K among them and add their sums in shared memory
//   UNROLL chunks (64 inputs) a warp loads ahead
//   ORDER  how a block's warps share K: 0 a contiguous range each, 1 units of UNROLL chunks in turn
//   PDL    1: programmatic dependent launch (sm_90+): the weights of a warp's first chunks are
//          loaded before waiting for the kernel before (which writes x), see kernels/pdl.py
//   GATED  1: the weight is a gate/up pair interleaved by 8 outputs (each 16-output tile: the
//          gate's outputs 8 nt .. 8 nt + 7, then the up's same outputs) and the GEMV writes
//          silu(gate) * up, N / 2 outputs a row (kernels/activation.py's SwiGLU, fused)

#ifndef GATED
#define GATED 0
#endif

typedef unsigned int u32;
typedef unsigned short u16;

#if KIND == 1
#define MAGIC 0x43004300u  // bf16 128.0 twice: 128 + q in each half
#define NEG_OFFSET 0xC300u  // bf16 -128.0: -(128 + z) is NEG_OFFSET | z
#else
#define MAGIC 0x64006400u  // fp16 1024.0 twice
#define NEG_OFFSET 0xE400u  // fp16 -1024.0
#endif

__device__ __forceinline__ void mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if KIND == 1
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void pdl_wait() {  // x and y: the kernel before may still write / read them
#if PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if PDL
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {  // weights: read once, keep out of L1
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 load_cached(const uint4* p) {  // activations: every warp reads them
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// The chunks first .. first + UNROLL - 1 that lie before `end`, a warp's 16 bytes a lane each
// (the GEMV's and its read bound's one load schedule).
__device__ __forceinline__ void load_chunks(uint4 (&buf)[UNROLL], const uint4* wp, int first, int end) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        if (first + u < end) buf[u] = load_stream(wp + (size_t)(first + u) * 32);
}

// ORDER 0: warp `warp`'s contiguous range [c0, c1) of K's `kc` chunks.
__device__ __forceinline__ void warp_range(int kc, int warp, int& c0, int& c1) {
    const int per = (kc + WARPS - 1) / WARPS;
    c0 = min(kc, warp * per);
    c1 = min(kc, c0 + per);
}

template <int DTYPE>  // 1: bf16 bits, 2: fp16 bits
__device__ __forceinline__ float half_to_float(u16 v) {
    if (DTYPE == 1) return __uint_as_float(((u32)v) << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}

__device__ __forceinline__ float scale_to_float(u16 s) { return half_to_float<SKIND>(s); }

__device__ __forceinline__ float act_to_float(u16 v) { return half_to_float<KIND>(v); }

__device__ __forceinline__ u32 pack2(float lo, float hi) {  // two floats rounded into one x-dtype pair
    u32 r;
#if KIND == 1
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

__device__ __forceinline__ u16 to_act(float v) {
    return (u16)(pack2(v, 0.0f) & 0xFFFFu);
}

// The group parameters of a lane: -(offset + zero) of its rows g and g + 8 as operand pairs,
// and their scales in fp32.
struct GroupParams {
    u32 z0, z1;
    float s0, s1;
};

__device__ __forceinline__ GroupParams group_params(const u16* scales, const u32* qzeros, int grp, int N,
                                                    int n0, int g) {
    GroupParams p;
    const u32* zp = qzeros + (size_t)grp * (N >> 3) + (n0 >> 3);
    u32 zlo = NEG_OFFSET | ((zp[0] >> (4 * g)) & 0xFu);
    u32 zhi = NEG_OFFSET | ((zp[1] >> (4 * g)) & 0xFu);
    p.z0 = zlo | (zlo << 16);
    p.z1 = zhi | (zhi << 16);
    const u16* sp = scales + (size_t)grp * N + n0 + g;
    p.s0 = scale_to_float(sp[0]);
    p.s1 = scale_to_float(sp[8]);
    return p;
}

// One 64-input chunk of a lane: its 16-byte A word quad `w`, x's B fragments loaded here, 8 mmas
// per tile of x (the weights' and the zero tile's, each into its own accumulator).
__device__ __forceinline__ void chunk_mma(const uint4 w, const uint4* const (&xr)[MT], const bool (&xv)[MT], int c,
                                          const GroupParams& gp, float (&dw)[MT][4], float (&dz)[MT][4], u32 magic) {
    u32 xb[MT][8];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        uint4 lo = make_uint4(0, 0, 0, 0), hi = make_uint4(0, 0, 0, 0);
        if (xv[mt]) {
            lo = load_cached(xr[mt] + c * 8);
            hi = load_cached(xr[mt] + c * 8 + 1);
        }
        xb[mt][0] = lo.x; xb[mt][1] = lo.y; xb[mt][2] = lo.z; xb[mt][3] = lo.w;
        xb[mt][4] = hi.x; xb[mt][5] = hi.y; xb[mt][6] = hi.z; xb[mt][7] = hi.w;
    }
    const u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        u32 a0, a1, a2, a3;  // (q >> 4i) & 0x000F000F | MAGIC: one shift and one lop3 a register
        asm("{\n\t.reg .b32 t1, t2, t3;\n\t"
            "shr.b32 t1, %4, 4;\n\tshr.b32 t2, %4, 8;\n\tshr.b32 t3, %4, 12;\n\t"
            "lop3.b32 %0, %4, 0x000F000F, %5, 0xea;\n\tlop3.b32 %1, t1, 0x000F000F, %5, 0xea;\n\t"
            "lop3.b32 %2, t2, 0x000F000F, %5, 0xea;\n\tlop3.b32 %3, t3, 0x000F000F, %5, 0xea;\n\t}"
            : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(words[s]), "r"(magic));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma(dw[mt], a0, a1, a2, a3, xb[mt][2 * s], xb[mt][2 * s + 1]);
            mma(dz[mt], gp.z0, gp.z1, gp.z0, gp.z1, xb[mt][2 * s], xb[mt][2 * s + 1]);
        }
    }
}

// acc += s * (sum (offset + q) x - (offset + z) sum x) for the group just done; the sums restart.
__device__ __forceinline__ void flush_group(float (&acc)[MT][4], float (&dw)[MT][4], float (&dz)[MT][4],
                                            const GroupParams& gp) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        acc[mt][0] += gp.s0 * (dw[mt][0] + dz[mt][0]);
        acc[mt][1] += gp.s0 * (dw[mt][1] + dz[mt][1]);
        acc[mt][2] += gp.s1 * (dw[mt][2] + dz[mt][2]);
        acc[mt][3] += gp.s1 * (dw[mt][3] + dz[mt][3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) dw[mt][i] = dz[mt][i] = 0.0f;
    }
}

// grid: (N / 16); block: WARPS warps. Block nt makes outputs n0 = 16 nt .. n0 + 15 of every row
// of x; its warps share K's 64-input chunks. ORDER 0: warp w takes one contiguous range of
// chunks; ORDER 1: units of UNROLL chunks are dealt to the warps in turn, so that at any moment
// a block's warps read neighbouring memory. y[m, n] for m < M; bias may be null.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
int4_mma_gemv(const uint4* __restrict__ qw, const u16* __restrict__ scales, const u32* __restrict__ qzeros,
              const u16* __restrict__ x, const u16* __restrict__ bias, u16* __restrict__ y,
              int M, int N, int K, int ldx, int ldy, int group) {
    __shared__ float red[WARPS][MT * 4 * 32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int nt = blockIdx.x;
    const int n0 = nt * 16;
    const int kc = K >> 6;  // chunks of 64 inputs
    const int gc = group >> 6;  // chunks a group
    const uint4* wp = qw + (size_t)nt * kc * 32 + lane;
    const u32 magic = MAGIC;

    const uint4* xr[MT];
    bool xv[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int b = mt * 8 + g;
        xv[mt] = b < M;
        xr[mt] = reinterpret_cast<const uint4*>(x + (size_t)(xv[mt] ? b : 0) * ldx + 16 * t);
    }

    float acc[MT][4], dw[MT][4], dz[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] = dw[mt][i] = dz[mt][i] = 0.0f;

    uint4 cur[UNROLL], nxt[UNROLL];
#if ORDER == 0
    int c0, c1;
    warp_range(kc, warp, c0, c1);
    load_chunks(cur, wp, c0, c1);

    int grp = c0 / gc;  // the group after the one in hand: counted, not divided for, in the loop
    int flush = (grp + 1) * gc;  // the first chunk of the next group
    GroupParams gp, gn;
    if (c0 < c1) gp = group_params(scales, qzeros, grp, N, n0, g);
    if (flush < c1) gn = group_params(scales, qzeros, grp + 1, N, n0, g);
    pdl_wait();
    pdl_launch_dependents();

    for (int base = c0; base < c1; base += UNROLL) {
        load_chunks(nxt, wp, base + UNROLL, c1);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = base + u;
            if (c < c1) {
                chunk_mma(cur[u], xr, xv, c, gp, dw, dz, magic);
                if (c + 1 == flush || c + 1 == c1) {
                    flush_group(acc, dw, dz, gp);
                    if (c + 1 == flush && flush < c1) {
                        gp = gn;
                        flush += gc;
                        ++grp;
                        if (flush < c1) gn = group_params(scales, qzeros, grp + 1, N, n0, g);
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
    }
#else
    const int units = (kc + UNROLL - 1) / UNROLL;
    GroupParams gp_cur, gp_nxt;
    int unit = warp;
    if (unit < units) {
        load_chunks(cur, wp, unit * UNROLL, kc);
        gp_cur = group_params(scales, qzeros, unit * UNROLL / gc, N, n0, g);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (; unit < units; unit += WARPS) {
        const int next = unit + WARPS;
        if (next < units) {
            load_chunks(nxt, wp, next * UNROLL, kc);
            gp_nxt = group_params(scales, qzeros, next * UNROLL / gc, N, n0, g);
        }
        GroupParams gp = gp_cur;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = unit * UNROLL + u;
            if (c < kc) {
                if (u > 0 && c % gc == 0) {  // a unit longer than a group: the next group starts here
                    flush_group(acc, dw, dz, gp);
                    gp = group_params(scales, qzeros, c / gc, N, n0, g);
                }
                chunk_mma(cur[u], xr, xv, c, gp, dw, dz, magic);
            }
        }
        flush_group(acc, dw, dz, gp);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
        gp_cur = gp_nxt;
    }
#endif

#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][(mt * 4 + i) * 32 + lane] = acc[mt][i];
    __syncthreads();
#if GATED
    // red[.][(mt * 4 + i) * 32 + l] is row (l >> 2) + 8 (i >= 2) of the tile, x row mt * 8 +
    // 2 (l & 3) + (i & 1): the gate of output 8 nt + (l >> 2) at i = 0, 1 and its up at i + 2
    for (int idx = threadIdx.x; idx < MT * 64; idx += WARPS * 32) {
        const int mt = idx >> 6, i = (idx >> 5) & 1, l = idx & 31;
        const int src = (mt * 4 + i) * 32 + l;
        float gate = 0.0f, up = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            gate += red[w][src];
            up += red[w][src + 64];
        }
        const int b = mt * 8 + 2 * (l & 3) + i;
        if (b < M) {
            // rounded as the unfused path rounds the GEMV's outputs, then SiLU(gate) * up in fp32
            gate = act_to_float(to_act(gate));
            up = act_to_float(to_act(up));
            y[(size_t)b * ldy + nt * 8 + (l >> 2)] = to_act(gate / (1.0f + __expf(-gate)) * up);
        }
    }
#else
    for (int idx = threadIdx.x; idx < MT * 128; idx += WARPS * 32) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) v += red[w][idx];
        const int mt = idx >> 7, i = (idx >> 5) & 3, l = idx & 31;
        const int row = (l >> 2) + (i >= 2 ? 8 : 0);
        const int b = mt * 8 + 2 * (l & 3) + (i & 1);
        if (b < M) {
            const int n = n0 + row;
            if (bias != nullptr) v += act_to_float(bias[n]);
            y[(size_t)b * ldy + n] = to_act(v);
        }
    }
#endif
}

// grid: (N / 16, K / 64 / 4); block: 4 warps, a warp one (16-output tile, 64-input chunk).
// wt[n, k] = ((offset + q) - (offset + z)) * s in x's dtype (the transposed weight, K contiguous).
extern "C" __global__ void __launch_bounds__(128)
int4_mma_dequant(const uint4* __restrict__ qw, const u16* __restrict__ scales, const u32* __restrict__ qzeros,
                 u16* __restrict__ wt, int N, int K, int group) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int kc = K >> 6;
    const int c = min((int)(blockIdx.y * 4 + (threadIdx.x >> 5)), kc - 1);  // every warp waits (PDL); a spare one
    // repeats the last chunk, writing the same values
    const int nt = blockIdx.x;
    const int n0 = nt * 16;
    const uint4 w = load_stream(qw + ((size_t)nt * kc + c) * 32 + lane);
    const GroupParams p = group_params(scales, qzeros, (c * 64) / group, N, n0, g);
    pdl_wait();
    pdl_launch_dependents();
    const float zlo = (float)(p.z0 & 0xFu), zhi = (float)(p.z1 & 0xFu);  // the zeros of rows g, g + 8
    const u32 words[4] = {w.x, w.y, w.z, w.w};
    u32 row0[8], row1[8];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const u32 q = words[s];
        // nibbles: bits 0/16 row g inputs 4s, 4s+1; 4/20 row g+8 the same; 8/24 row g inputs
        // 4s+2, 4s+3; 12/28 row g+8 the same (of the lane's 16 inputs 64c + 16t ..)
        const float q00 = (float)(q & 0xFu), q01 = (float)((q >> 16) & 0xFu);
        const float q10 = (float)((q >> 4) & 0xFu), q11 = (float)((q >> 20) & 0xFu);
        const float q02 = (float)((q >> 8) & 0xFu), q03 = (float)((q >> 24) & 0xFu);
        const float q12 = (float)((q >> 12) & 0xFu), q13 = (float)((q >> 28) & 0xFu);
        row0[2 * s] = pack2((q00 - zlo) * p.s0, (q01 - zlo) * p.s0);
        row0[2 * s + 1] = pack2((q02 - zlo) * p.s0, (q03 - zlo) * p.s0);
        row1[2 * s] = pack2((q10 - zhi) * p.s1, (q11 - zhi) * p.s1);
        row1[2 * s + 1] = pack2((q12 - zhi) * p.s1, (q13 - zhi) * p.s1);
    }
    uint4* out0 = reinterpret_cast<uint4*>(wt + (size_t)(n0 + g) * K + c * 64 + 16 * t);
    uint4* out1 = reinterpret_cast<uint4*>(wt + (size_t)(n0 + g + 8) * K + c * 64 + 16 * t);
    out0[0] = make_uint4(row0[0], row0[1], row0[2], row0[3]);
    out0[1] = make_uint4(row0[4], row0[5], row0[6], row0[7]);
    out1[0] = make_uint4(row1[0], row1[1], row1[2], row1[3]);
    out1[1] = make_uint4(row1[4], row1[5], row1[6], row1[7]);
}

// The bound the GEMV is held to: the same blocks and warps read the same chunks with the same
// loads, and do nothing else (an xor of the words, written only if it is 0x9e3779b9 so that the
// loads stay). grid: (N / 16); block: WARPS warps.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
int4_mma_read_bound(const uint4* __restrict__ qw, u32* __restrict__ sink, int N, int K) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int kc = K >> 6;
    const uint4* wp = qw + (size_t)blockIdx.x * kc * 32 + lane;
    uint4 cur[UNROLL], nxt[UNROLL];
    u32 h = 0;
#if ORDER == 0
    int c0, c1;
    warp_range(kc, warp, c0, c1);
    load_chunks(cur, wp, c0, c1);
    pdl_wait();
    pdl_launch_dependents();
    for (int base = c0; base < c1; base += UNROLL) {
        load_chunks(nxt, wp, base + UNROLL, c1);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u < c1) h ^= cur[u].x ^ cur[u].y ^ cur[u].z ^ cur[u].w;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
    }
#else
    const int units = (kc + UNROLL - 1) / UNROLL;
    int unit = warp;
    if (unit < units) {
        load_chunks(cur, wp, unit * UNROLL, kc);
    }
    pdl_wait();
    pdl_launch_dependents();
    for (; unit < units; unit += WARPS) {
        const int next = unit + WARPS;
        if (next < units) {
            load_chunks(nxt, wp, next * UNROLL, kc);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (unit * UNROLL + u < kc) h ^= cur[u].x ^ cur[u].y ^ cur[u].z ^ cur[u].w;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) cur[u] = nxt[u];
    }
#endif
    if (h == 0x9e3779b9u) sink[0] = h;
}
