// dmc's host emulation of CUDA C: g++ compiles the generated kernels *unchanged* against this header
// and runs them on the CPU, so every kernel is checked numerically without a GPU.
//
// * A block's threads are cooperative fibers on one OS thread; `__syncthreads()` switches back to
//   the block's scheduler, which resumes every live fiber once per round (forward or reversed
//   order), so a missing barrier or a write race changes the result between the two orders.
//   The switch is a few lines of x86-64 assembly (callee-saved registers + stack pointer);
//   elsewhere it falls back to ucontext (a system call per switch, slower but the same semantics).
// * Blocks are spread over OS threads (pthreads); one block runs at a time on a thread, so
//   `__shared__` (a function-local `static __thread`) is per block.
// * Checked while running: every live thread of a block reaches the same `__syncthreads()` (same
//   source line) or none does; no thread exits while others wait at a barrier; no fiber overflows
//   its stack (canary). The first failure stops the launch and is reported as text.
// * cp.async (`dmc_cp16`, `dmc_cp_commit`, `dmc_cp_wait<N>`, the GEMMs' staged tiles): a
//   copy is only recorded when issued and lands at its thread's wait for its group, as late as the
//   hardware may land it, so a kernel that reads a stage before waiting for it (or before the
//   barrier after the wait) reads stale data and fails the comparison; a misaligned 16-byte copy
//   fails the launch.
// * One warp collective, the TF32 tensor-core MMA (`dmc_mma_tf32`, PTX mma.sync m16n8k8): each of the
//   warp's 32 threads deposits its fragments and waits at a barrier (the whole block meets there, so
//   it is called in block-uniform control flow, as the GEMM template does); on resuming, each thread
//   computes its four outputs from the fragments of its warp, with inputs rounded to TF32 as
//   `cvt.rna.tf32.f32` does (`dmc_tf32`: 10 mantissa bits, to nearest, ties away from zero) and
//   the exact products added to its accumulator in k order. Any other warp intrinsic (`__shfl*`, ..)
//   is deliberately absent, so a kernel that starts using one fails to compile here and the emulator
//   must learn it first.
#ifndef DMC_CUDA_HOST_H
#define DMC_CUDA_HOST_H

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
// The fast switch on x86-64; ucontext elsewhere, or where DMC_EMU_UCONTEXT is defined (for comparison).
#if defined(__x86_64__) && !defined(DMC_EMU_UCONTEXT)
#define DMC_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static __thread

#define __align__(n) __attribute__((aligned(n)))

struct uint3 {
    unsigned x, y, z;
};
// The vector types the GEMM reads shared memory with (16- and 8-byte aligned, as on the GPU).
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
static __forceinline__ float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
typedef uint3 dim3;

static __thread uint3 threadIdx, blockIdx, blockDim, gridDim;

template <typename T> static __forceinline__ T min(T a, T b) { return b < a ? b : a; }
template <typename T> static __forceinline__ T max(T a, T b) { return a < b ? b : a; }

static __forceinline__ float __int_as_float(int v) {
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
}
static __forceinline__ int __float_as_int(float v) {
    int i;
    memcpy(&i, &v, sizeof i);
    return i;
}
static __forceinline__ double __longlong_as_double(long long v) {
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}
static __forceinline__ long long __double_as_longlong(double v) {
    long long i;
    memcpy(&i, &v, sizeof i);
    return i;
}

// atomics: blocks run concurrently on OS threads, so these are real atomics
static __forceinline__ int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static __forceinline__ unsigned atomicAdd(unsigned* p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static __forceinline__ unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static __forceinline__ float atomicAdd(float* p, float v) {
    unsigned* u = (unsigned*)p;
    unsigned old = __atomic_load_n(u, __ATOMIC_RELAXED), next;
    do {
        float f;
        memcpy(&f, &old, 4);
        f += v;
        memcpy(&next, &f, 4);
    } while (!__atomic_compare_exchange_n(u, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    float r;
    memcpy(&r, &old, 4);
    return r;
}

// ---- fibers --------------------------------------------------------------------------------------

#define DMC_STACK_BYTES (64 * 1024)
#define DMC_CANARY 0xdc5eedc0ffee1234ULL

struct DmcLaunch;
typedef void (*DmcBody)(const uint64_t* args);

// A launch value that holds a `double` parameter (the learning rate): its bits, as the CUDA driver
// copies them into the parameter.
static inline double dmc_f64_bits(uint64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

// One cp.async copy in flight: `n` floats from `src` (nullptr: zeros) to `dst`, in commit group `group`.
struct DmcCopy {
    float* dst;
    const float* src;
    unsigned n;
    unsigned group;
};
#define DMC_MAX_COPIES 256

struct DmcFiber {
    void* sp;  // saved stack pointer (x86-64) while suspended
    int done;  // returned from the kernel
    int line;  // source line of the barrier it waits at
    unsigned barriers;
    unsigned ncopies;  // cp.async copies in flight
    unsigned group;    // the open commit group (groups 0 .. group-1 are committed)
    unsigned mma_gen;  // TF32 MMAs this thread has issued (its exchange generation)
    DmcCopy copies[DMC_MAX_COPIES];
#if !defined(DMC_ASM_SWITCH)
    ucontext_t uc;
#endif
};

static __thread DmcFiber* dmc_cur;  // the running fiber
static __thread const struct DmcLaunch* dmc_launch;

#if defined(DMC_ASM_SWITCH)
static __thread void* dmc_sched_sp;  // the scheduler's saved stack pointer
// void dmc_emu_switch(void** save, void* to): saves the callee-saved registers on the current
// stack, stores the stack pointer in *save, switches to `to` and restores the registers saved there.
extern "C" void dmc_emu_switch(void** save, void* to);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl dmc_emu_switch\n"
        ".hidden dmc_emu_switch\n"
        ".type dmc_emu_switch,@function\n"
        "dmc_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size dmc_emu_switch, .-dmc_emu_switch\n");
#else
static __thread ucontext_t dmc_sched_uc;
#endif

struct DmcLaunch {
    DmcBody body;
    const uint64_t* args;
    uint3 grid, block;
    int reverse;
    unsigned long long nblocks;
    unsigned long long next;  // the next block to run (atomic)
    int failed;               // atomic: 1 once a failure is recorded
    char* err;
    int errlen;
};

static void dmc_fail(const DmcLaunch* L, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void dmc_fail(const DmcLaunch* L, const char* fmt, ...) {
    DmcLaunch* m = (DmcLaunch*)L;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&m->failed, &expected, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;  // the first failure wins
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, (size_t)m->errlen, fmt, ap);
    va_end(ap);
}

// ---- TF32 tensor-core MMA ----------------------------------------------------------------------

// x rounded to TF32 (cvt.rna.tf32.f32): the low 13 mantissa bits cleared, to nearest, ties away
// from zero; NaN and infinity pass unchanged.
__attribute__((unused)) static unsigned dmc_tf32(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;
    return u & 0xffffe000u;
}
static __attribute__((unused)) float dmc_tf32_val(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// The fragments one lane deposits for a warp's MMA.
struct DmcMmaFrag {
    unsigned a[4], b[2];
};
// Per block (one block runs at a time on an OS thread): two generations of every warp's fragments,
// so a thread that resumed from one MMA and deposits for the next never overwrites fragments a
// slower thread of its warp has still to read.
static __thread DmcMmaFrag dmc_mma_ex[2][32][32];
static void dmc_syncthreads(int line);

// d += A (16x8, row) * B (8x8, col) for the calling thread's warp (mma.sync.aligned.m16n8k8.row.col
// .f32.tf32.tf32.f32). Lane l = 4 g + t holds A(g, t), A(g+8, t), A(g, t+4), A(g+8, t+4) in a[0..4],
// B(t, g), B(t+4, g) in b[0..2], and D(g, 2t), D(g, 2t+1), D(g+8, 2t), D(g+8, 2t+1) in d[0..4].
__attribute__((unused)) static void dmc_mma_tf32_at(float* d, const unsigned* a, const unsigned* b, int line) {
    DmcFiber* f = dmc_cur;
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned w = tid / 32, l = tid % 32, gen = f->mma_gen++ & 1u;
    DmcMmaFrag* mine = &dmc_mma_ex[gen][w % 32][l];
    for (int i = 0; i < 4; ++i) mine->a[i] = a[i];
    for (int i = 0; i < 2; ++i) mine->b[i] = b[i];
    dmc_syncthreads(line);  // every lane of the warp has deposited
    const DmcMmaFrag* ex = dmc_mma_ex[gen][w % 32];
    const unsigned g = l / 4, t = l % 4;
    for (int r = 0; r < 4; ++r) {
        const unsigned row = g + 8 * (r / 2), col = 2 * t + (r % 2);
        float s = d[r];
        for (unsigned k = 0; k < 8; ++k) {
            const float av = dmc_tf32_val(ex[(row % 8) * 4 + k % 4].a[row / 8 + 2 * (k / 4)]);
            const float bv = dmc_tf32_val(ex[col * 4 + k % 4].b[k / 4]);
            s += av * bv;  // exact product (11-bit significands), added in k order
        }
        d[r] = s;
    }
}
#define dmc_mma_tf32(d, a, b) dmc_mma_tf32_at((d), (a), (b), __LINE__)

// ---- cp.async ------------------------------------------------------------------------------------

// Lands the copies of every committed group but the `keep` most recent ones.
static void dmc_cp_land(DmcFiber* f, unsigned keep) {
    unsigned j = 0;
    for (unsigned i = 0; i < f->ncopies; ++i) {
        const DmcCopy c = f->copies[i];
        if (c.group + keep < f->group) {
            if (c.src)
                memcpy(c.dst, c.src, (size_t)c.n * 4);
            else
                memset(c.dst, 0, (size_t)c.n * 4);
        } else {
            f->copies[j++] = c;
        }
    }
    f->ncopies = j;
}

static void dmc_cp(float* dst, const float* src, unsigned n) {
    DmcFiber* f = dmc_cur;
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) != 0) {
        dmc_fail(dmc_launch, "block (%u,%u,%u) thread %u: a 16-byte cp.async from %p to %p is not 16-byte aligned",
                 blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, (const void*)src, (void*)dst);
        return;
    }
    if (f->ncopies == DMC_MAX_COPIES) {
        dmc_fail(dmc_launch, "block (%u,%u,%u) thread %u: more than %d cp.async copies in flight", blockIdx.x,
                 blockIdx.y, blockIdx.z, threadIdx.x, DMC_MAX_COPIES);
        return;
    }
    f->copies[f->ncopies++] = DmcCopy{dst, src, n, f->group};
}
// 16 bytes from global `g` (nullptr: zero-fill) to shared `s`; `z` is the address the hardware is
// handed for a zero-fill (never read).
__attribute__((unused)) static void dmc_cp16(float* s, const float* g, const float*) { dmc_cp(s, g, 4); }
__attribute__((unused)) static void dmc_cp_commit() { dmc_cur->group++; }
// Waits until at most N committed groups are in flight: the older ones land now.
template <int N> __attribute__((unused)) static void dmc_cp_wait() { dmc_cp_land(dmc_cur, (unsigned)N); }

static void dmc_yield_to_scheduler(DmcFiber* f) {
#if defined(DMC_ASM_SWITCH)
    __asm__ __volatile__("" ::: "memory");
    dmc_emu_switch(&f->sp, dmc_sched_sp);
    __asm__ __volatile__("" ::: "memory");
#else
    swapcontext(&f->uc, &dmc_sched_uc);
#endif
}

static void dmc_fiber_main(void) {
    DmcFiber* f = dmc_cur;
    dmc_launch->body(dmc_launch->args);
    f->done = 1;
    dmc_yield_to_scheduler(f);
    __builtin_trap();  // a finished fiber is never resumed
}

// A barrier: this thread waits until every live thread of the block reaches it.
__attribute__((unused)) static void dmc_syncthreads(int line) {
    DmcFiber* f = dmc_cur;
    f->line = line;
    f->barriers++;
    dmc_yield_to_scheduler(f);
}
#define __syncthreads() dmc_syncthreads(__LINE__)

static void dmc_fiber_init(DmcFiber* f, char* stack) {
    f->done = 0;
    f->line = 0;
    f->barriers = 0;
    f->ncopies = 0;
    f->group = 0;
    f->mma_gen = 0;
    *(uint64_t*)stack = DMC_CANARY;  // the stack grows down towards this word
#if defined(DMC_ASM_SWITCH)
    // As if dmc_emu_switch had been called from dmc_fiber_main's caller: six zeroed registers,
    // then the return address; rsp % 16 == 8 at dmc_fiber_main's entry, as after a call.
    void** sp = (void**)(stack + DMC_STACK_BYTES);
    *--sp = 0;
    *--sp = (void*)&dmc_fiber_main;
    for (int r = 0; r < 6; ++r) *--sp = 0;
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = stack;
    f->uc.uc_stack.ss_size = DMC_STACK_BYTES;
    f->uc.uc_link = 0;
    makecontext(&f->uc, dmc_fiber_main, 0);
#endif
}

static void dmc_resume(DmcFiber* f) {
    dmc_cur = f;
#if defined(DMC_ASM_SWITCH)
    dmc_emu_switch(&dmc_sched_sp, f->sp);
#else
    swapcontext(&dmc_sched_uc, &f->uc);
#endif
}

// Runs one block to completion; 0 on success.
static int dmc_run_block(const DmcLaunch* L, DmcFiber* fib, char* stacks, unsigned nt) {
    const uint3 b = L->block;
    for (unsigned i = 0; i < nt; ++i) dmc_fiber_init(&fib[i], stacks + (size_t)i * DMC_STACK_BYTES);
    unsigned live = nt;
    unsigned exited = 0;
    for (;;) {
        unsigned waiting = 0, first_wait = 0, last_exit = 0;
        for (unsigned j = 0; j < nt; ++j) {
            const unsigned i = L->reverse ? nt - 1 - j : j;
            DmcFiber* f = &fib[i];
            if (f->done) continue;
            threadIdx.x = i % b.x;
            threadIdx.y = (i / b.x) % b.y;
            threadIdx.z = i / (b.x * b.y);
            dmc_resume(f);
            if (*(uint64_t*)(stacks + (size_t)i * DMC_STACK_BYTES) != DMC_CANARY) {
                dmc_fail(L, "block (%u,%u,%u) thread %u overflowed its %d-byte fiber stack", blockIdx.x,
                         blockIdx.y, blockIdx.z, i, DMC_STACK_BYTES);
                return 1;
            }
            if (f->done) {
                --live;
                ++exited;
                last_exit = i;
            } else {
                if (waiting > 0 && f->line != fib[first_wait].line) {
                    dmc_fail(L,
                             "divergent __syncthreads() in block (%u,%u,%u): thread %u waits at line %d, "
                             "thread %u at line %d",
                             blockIdx.x, blockIdx.y, blockIdx.z, first_wait, fib[first_wait].line, i, f->line);
                    return 1;
                }
                if (waiting++ == 0) first_wait = i;
            }
        }
        if (live == 0) return 0;
        if (exited > 0) {
            dmc_fail(L,
                     "divergent __syncthreads() in block (%u,%u,%u): thread %u returned while thread %u waits "
                     "at line %d (barrier %u)",
                     blockIdx.x, blockIdx.y, blockIdx.z, last_exit, first_wait, fib[first_wait].line,
                     fib[first_wait].barriers);
            return 1;
        }
    }
}

static void* dmc_worker(void* p) {
    DmcLaunch* L = (DmcLaunch*)p;
    const unsigned nt = L->block.x * L->block.y * L->block.z;
    char* stacks = (char*)malloc((size_t)nt * DMC_STACK_BYTES);
    DmcFiber* fib = (DmcFiber*)calloc(nt, sizeof(DmcFiber));
    if (!stacks || !fib) {
        dmc_fail(L, "out of memory for %u fiber stacks", nt);
        free(stacks);
        free(fib);
        return 0;
    }
    dmc_launch = L;
    blockDim = L->block;
    gridDim = L->grid;
    for (;;) {
        if (__atomic_load_n(&L->failed, __ATOMIC_ACQUIRE)) break;
        const unsigned long long b = __atomic_fetch_add(&L->next, 1ULL, __ATOMIC_RELAXED);
        if (b >= L->nblocks) break;
        blockIdx.x = (unsigned)(b % L->grid.x);
        blockIdx.y = (unsigned)((b / L->grid.x) % L->grid.y);
        blockIdx.z = (unsigned)(b / ((unsigned long long)L->grid.x * L->grid.y));
        if (dmc_run_block(L, fib, stacks, nt)) break;
    }
    free(stacks);
    free(fib);
    return 0;
}

// Runs the grid: blocks over `threads` OS threads (the calling one included). 0 on success, else
// 1 with the reason in `err`.
static int dmc_emu_run(DmcBody body, const uint64_t* args, const unsigned* grid, const unsigned* block,
                       int reverse, int threads, char* err, int errlen) {
    DmcLaunch L;
    memset(&L, 0, sizeof L);
    L.body = body;
    L.args = args;
    L.grid = uint3{grid[0], grid[1], grid[2]};
    L.block = uint3{block[0], block[1], block[2]};
    L.reverse = reverse;
    L.nblocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    L.err = err;
    L.errlen = errlen;
    if (errlen > 0) err[0] = 0;
    if (L.nblocks == 0 || block[0] * block[1] * block[2] == 0) return 0;
    if (threads < 1) threads = 1;
    if ((unsigned long long)threads > L.nblocks) threads = (int)L.nblocks;
    pthread_t tids[256];
    if (threads > 256) threads = 256;
    int started = 0;
    for (int t = 1; t < threads; ++t) {
        if (pthread_create(&tids[started], 0, dmc_worker, &L) == 0) ++started;
    }
    dmc_worker(&L);
    for (int t = 0; t < started; ++t) pthread_join(tids[t], 0);
    return L.failed ? 1 : 0;
}

// The exported entry point of one compiled translation unit: `which` picks the kernel entry (a
// split-K GEMM has two, launched in order). `bodies` is appended by the emulator after the kernel
// source: one function per entry that unpacks the launch values into the kernel's parameters.
#define DMC_EMU_EXPORT(bodies, count)                                                                   \
    extern "C" __attribute__((visibility("default"))) int dmc_emu_launch(                              \
        int which, const uint64_t* args, const unsigned* grid, const unsigned* block, int reverse,     \
        int threads, char* err, int errlen) {                                                          \
        if (which < 0 || which >= (count)) {                                                           \
            snprintf(err, (size_t)errlen, "no kernel entry %d (of %d)", which, (count));               \
            return 1;                                                                                  \
        }                                                                                              \
        return dmc_emu_run(bodies[which], args, grid, block, reverse, threads, err, errlen);           \
    }

#endif
