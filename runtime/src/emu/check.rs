//! Every kernel run in the emulator against the CPU backend, where the plan puts it: its arguments
//! at their planned offsets in an arena poisoned with NaN and framed by red zones, fresh random
//! inputs, once per [`FiberOrder`].
//!
//! A kernel passes when
//! * every written argument matches the CPU backend's (max relative error <= the tolerance; an
//!   element the kernel never wrote stays NaN and fails),
//! * both fiber orders give bit-identical written arguments (else a barrier is missing or threads
//!   race on a write),
//! * no byte outside its written arguments changed (inputs, other buffers, the red zones: an
//!   unguarded partial tile or a wrong index that writes elsewhere), and
//! * the emulator saw no divergent barrier or stack overflow.

use dmc_codegen::{render_kernel, render_plan, CodegenOptions, CudaKernel, Scalars};
use dmc_plan::op::{DType, Role};
use dmc_plan::plan::{Kernel, Mode, Plan, ALIGN};
use dmc_plan::update::UpdateRule;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{compile, compile_all, EmuError, EmuKernel, FiberOrder};
use crate::arena::Arena;
use crate::compare::{random_args_on, rel_err};
use crate::cpu::executor::run_single_kernel;
use crate::error::RuntimeError;

/// Bytes of poison before and after the arena (a multiple of the plan alignment).
pub const REDZONE: usize = 1 << 20;
/// What every byte the kernel must not touch holds (the red zones, other buffers' space): 32-bit
/// words alternating between NaN and -1e30, so even a formula that leaves NaN unchanged (relu in
/// place) changes the bytes it strays onto. Output slots hold NaN (all ones) instead, so an
/// element the kernel never writes stays NaN.
const GAP: [u8; 8] = {
    let nan = u32::MAX.to_ne_bytes();
    let neg = (-1.0e30f32).to_bits().to_ne_bytes();
    [
        nan[0], nan[1], nan[2], nan[3], neg[0], neg[1], neg[2], neg[3],
    ]
};

/// Fills `bytes[s..e]` with the gap pattern (aligned to the arena: byte `j` holds `GAP[j % 8]`).
fn fill_gap(bytes: &mut [u8], s: usize, e: usize) {
    let head = (s.next_multiple_of(8)).min(e);
    for j in s..head {
        bytes[j] = GAP[j % 8];
    }
    let mut c = bytes[head..e].chunks_exact_mut(8);
    for w in &mut c {
        w.copy_from_slice(&GAP);
    }
    for (i, b) in c.into_remainder().iter_mut().enumerate() {
        *b = GAP[i];
    }
}

/// The first byte of `bytes[s..e]` that does not hold the gap pattern.
fn gap_diff(bytes: &[u8], s: usize, e: usize) -> Option<usize> {
    let head = (s.next_multiple_of(8)).min(e);
    if let Some(j) = (s..head).find(|&j| bytes[j] != GAP[j % 8]) {
        return Some(j);
    }
    let c = bytes[head..e].chunks_exact(8);
    let tail = head + c.len() * 8;
    if let Some(w) = c.clone().position(|w| w != GAP) {
        let at = head + w * 8;
        return (at..at + 8).find(|&j| bytes[j] != GAP[j % 8]);
    }
    (tail..e).find(|&j| bytes[j] != GAP[j % 8])
}

/// An arena for checking kernels, with red zones; `clean` when every byte holds the gap pattern.
pub struct CheckArena {
    arena: Arena,
    clean: bool,
}

impl CheckArena {
    /// Room for an arena of `arena_bytes` plus the red zones.
    pub fn new(arena_bytes: u64) -> Result<Self, RuntimeError> {
        Ok(CheckArena {
            arena: Arena::new(arena_bytes + 2 * REDZONE as u64)?,
            clean: false,
        })
    }
}
/// The step counter the kernels run with (Adam's bias correction and dropout depend on it).
const STEP: u64 = 3;

/// The scalars a kernel is checked with: `seed`, `step`, and for an update three quarters of its
/// rule's learning rate, so that a backend that used the rule's own `lr` instead of the launch's
/// would disagree with the reference.
pub(crate) fn test_scalars(k: &Kernel, seed: u64, step: u64) -> Scalars {
    Scalars {
        seed,
        step,
        lr: UpdateRule::of(&k.op).map_or(0.0, |r| r.lr() * 0.75),
        rank: 0,
    }
}

/// Where a kernel's arguments live: one offset per signature slot inside an arena.
#[derive(Debug, Clone)]
pub struct KernelSite {
    pub offsets: Vec<u64>,
    pub arena_bytes: u64,
}

/// The offsets of the first step that launches plan kernel `kernel_id`.
pub fn site_in_plan(plan: &Plan, kernel_id: usize) -> Option<KernelSite> {
    let step = plan.steps.iter().find(|s| s.kernel == kernel_id)?;
    Some(KernelSite {
        offsets: step.args.iter().map(|&b| plan.buffers[b].offset).collect(),
        arena_bytes: plan.arena_bytes,
    })
}

fn slot_bytes(k: &Kernel) -> Vec<usize> {
    let sig = k.op.signature();
    sig.params
        .iter()
        .zip(&k.arg_shapes)
        .map(|(p, s)| s.iter().product::<usize>() * p.dtype.size())
        .collect()
}

/// The arguments of a kernel outside any plan, packed one after another at aligned offsets.
pub fn packed_site(k: &Kernel) -> KernelSite {
    let mut offsets = Vec::new();
    let mut total = 0u64;
    for n in slot_bytes(k) {
        offsets.push(total);
        total += (n as u64).div_ceil(ALIGN) * ALIGN;
    }
    KernelSite {
        offsets,
        arena_bytes: total,
    }
}

/// How to run a check: the seed of the random inputs and the OS threads of a launch.
#[derive(Debug, Clone, Copy)]
pub struct CheckRun {
    pub seed: u64,
    pub threads: usize,
    /// Inputs on a grid of this step (multiples of it in [-1, 1]) instead of any f32: with a
    /// power of two like 1/8, every value is exact in TF32 and every sum of products exact in
    /// fp32, so a TF32 GEMM must match the CPU's fp32 one bit for bit whatever the order.
    pub grid: Option<f32>,
}

impl Default for CheckRun {
    fn default() -> Self {
        CheckRun {
            seed: 7,
            threads: super::default_threads(),
            grid: None,
        }
    }
}

/// The verdict on one kernel.
#[derive(Debug, Clone)]
pub struct EmuCheck {
    pub kernel: String,
    pub kind: &'static str,
    /// Max relative error of the written arguments against the CPU backend (NaN: NaN-ness differs,
    /// e.g. an element never written).
    pub rel_err: f64,
    /// Where the two fiber orders disagree.
    pub race: Option<String>,
    /// The first byte written outside the kernel's written arguments.
    pub stray: Option<String>,
    /// What the emulator stopped the launch for.
    pub failure: Option<String>,
    /// Wall time of the emulated launches (both orders), seconds.
    pub seconds: f64,
}

impl EmuCheck {
    pub fn ok(&self, tol: f64) -> bool {
        self.failure.is_none() && self.race.is_none() && self.stray.is_none() && self.rel_err <= tol
    }

    /// One line: `ok` or what is wrong.
    pub fn verdict(&self, tol: f64) -> String {
        if self.ok(tol) {
            return format!("ok (max rel err {:.2e})", self.rel_err);
        }
        let mut v = Vec::new();
        if let Some(f) = &self.failure {
            v.push(format!("emulator: {f}"));
        }
        if let Some(r) = &self.race {
            v.push(format!("race: {r}"));
        }
        if let Some(s) = &self.stray {
            v.push(format!("stray write: {s}"));
        }
        if self.rel_err.is_nan() || self.rel_err > tol {
            v.push(format!(
                "differs from the CPU backend: max rel err {:.3e} > {tol:.0e}",
                self.rel_err
            ));
        }
        v.join("; ")
    }
}

/// Checks `emu` (the compiled form of plan kernel `k`, possibly edited) at `site` in `arena`
/// (`site.arena_bytes + 2 * REDZONE` bytes, reused between kernels).
fn check_in(
    arena: &mut CheckArena,
    k: &Kernel,
    mode: Mode,
    emu: &EmuKernel,
    site: &KernelSite,
    run: CheckRun,
) -> Result<EmuCheck, RuntimeError> {
    let CheckRun {
        seed,
        threads,
        grid,
    } = run;
    let sig = k.op.signature();
    let lens = slot_bytes(k);
    if site.offsets.len() != lens.len() {
        return Err(RuntimeError::BadPlan(format!(
            "kernel `{}`: {} offsets for {} arguments",
            k.name,
            site.offsets.len(),
            lens.len()
        )));
    }
    let total = site.arena_bytes as usize + 2 * REDZONE;
    if arena.arena.bytes().len() < total {
        return Err(RuntimeError::BadPlan(format!(
            "kernel `{}`: the check arena is too small",
            k.name
        )));
    }
    if !arena.clean {
        let n = arena.arena.bytes().len();
        fill_gap(arena.arena.bytes_mut(), 0, n);
        arena.clean = true;
    }
    let bytes = &mut arena.arena.bytes_mut()[..total];
    // absolute byte ranges of the slots
    let ranges: Vec<(usize, usize)> = site
        .offsets
        .iter()
        .zip(&lens)
        .map(|(&o, &n)| (REDZONE + o as usize, REDZONE + o as usize + n))
        .collect();
    if ranges.iter().any(|&(_, e)| e > total - REDZONE) {
        return Err(RuntimeError::BadPlan(format!(
            "kernel `{}`: an argument lies outside the arena",
            k.name
        )));
    }
    let written: Vec<bool> = sig
        .params
        .iter()
        .map(|p| matches!(p.role, Role::Out | Role::InOut | Role::Workspace))
        .collect();

    // Poison, then the inputs; `init` is every slot as the kernel will find it (aliases resolved).
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (k.id as u64).wrapping_mul(0x9e37));
    let args = random_args_on(k, &mut rng, grid);
    // the slots: the rest already holds the gap pattern
    let fill = |bytes: &mut [u8]| {
        for (i, p) in sig.params.iter().enumerate() {
            let r = &mut bytes[ranges[i].0..ranges[i].1];
            match p.role {
                Role::In | Role::InOut => r.copy_from_slice(&args[i]),
                Role::Out | Role::Workspace => r.fill(0xFF),
            }
        }
    };
    fill(bytes);
    let init: Vec<Vec<u8>> = ranges.iter().map(|&(s, e)| bytes[s..e].to_vec()).collect();

    let mut cpu = init.clone();
    let scalars = test_scalars(k, seed, STEP);
    run_single_kernel(k, mode, &scalars, &mut cpu)?;

    let base = bytes.as_mut_ptr() as u64 + REDZONE as u64;
    let ptrs: Vec<u64> = site.offsets.iter().map(|&o| base + o).collect();
    let mut check = EmuCheck {
        kernel: k.name.clone(),
        kind: k.op.kind_name(),
        rel_err: 0.0,
        race: None,
        stray: None,
        failure: None,
        seconds: 0.0,
    };
    let mut first: Option<Vec<Vec<u8>>> = None;
    for order in [FiberOrder::Forward, FiberOrder::Reverse] {
        if first.is_some() {
            // restore what the first run changed
            if check.stray.is_some() {
                fill_gap(bytes, 0, total);
                fill(bytes);
            } else {
                for (i, &(s, e)) in ranges.iter().enumerate() {
                    if written[i] {
                        bytes[s..e].copy_from_slice(&init[i]);
                    }
                }
            }
        }
        let t = std::time::Instant::now();
        // SAFETY: every slot lies inside `bytes` (checked above); the plan (or the packed layout)
        // keeps written slots disjoint from the others; the red zones absorb stray writes.
        let r = unsafe { emu.launch(&ptrs, &scalars, order, threads) };
        check.seconds += t.elapsed().as_secs_f64();
        if let Err(e) = r {
            arena.clean = false;
            return match e {
                EmuError::Kernel { message, .. } => {
                    check.failure = Some(format!("{message} ({order:?} order)"));
                    Ok(check)
                }
                e => Err(e.into()),
            };
        }
        if check.stray.is_none() {
            check.stray = find_stray(bytes, &ranges, &written, &init, &sig, site);
        }
        let out: Vec<Vec<u8>> = ranges
            .iter()
            .enumerate()
            .map(|(i, &(s, e))| {
                if written[i] {
                    bytes[s..e].to_vec()
                } else {
                    Vec::new()
                }
            })
            .collect();
        match &first {
            None => first = Some(out),
            Some(f) => check.race = first_difference(f, &out, &sig, k),
        }
    }
    // leave the arena clean for the next kernel
    if check.stray.is_some() {
        arena.clean = false;
    } else {
        for &(s, e) in &ranges {
            fill_gap(bytes, s, e);
        }
    }
    let got = first.unwrap_or_default();
    for (i, p) in sig.params.iter().enumerate() {
        if matches!(p.role, Role::Out | Role::InOut) {
            let e = rel_err(&got[i], &cpu[i], p.dtype);
            if e.is_nan() || e > check.rel_err {
                check.rel_err = e;
                if e.is_nan() {
                    break;
                }
            }
        }
    }
    Ok(check)
}

/// The first byte outside the written slots that differs from how the kernel found it.
fn find_stray(
    bytes: &[u8],
    ranges: &[(usize, usize)],
    written: &[bool],
    init: &[Vec<u8>],
    sig: &dmc_plan::op::Signature,
    site: &KernelSite,
) -> Option<String> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i]);
    let describe = |at: usize| -> String {
        let arena_end = REDZONE + site.arena_bytes as usize;
        if at < REDZONE {
            format!("{} bytes before the arena (red zone)", REDZONE - at)
        } else if at >= arena_end {
            format!("{} bytes after the arena's end (red zone)", at - arena_end)
        } else if let Some(i) = (0..ranges.len()).find(|&i| ranges[i].0 <= at && at < ranges[i].1) {
            format!(
                "arena offset {} inside the input `{}`",
                at - REDZONE,
                sig.params[i].name
            )
        } else {
            format!("arena offset {} (no argument of this kernel)", at - REDZONE)
        }
    };
    let poison_diff = |s: usize, e: usize| gap_diff(bytes, s, e);
    let mut cursor = 0usize;
    for &i in &order {
        let (s, e) = ranges[i];
        if s > cursor {
            if let Some(at) = poison_diff(cursor, s) {
                return Some(describe(at));
            }
        }
        if !written[i] && e > cursor.max(s) {
            let from = cursor.max(s);
            if let Some(p) = bytes[from..e]
                .iter()
                .zip(&init[i][from - s..])
                .position(|(a, b)| a != b)
            {
                return Some(describe(from + p));
            }
        }
        cursor = cursor.max(e);
    }
    poison_diff(cursor, bytes.len()).map(describe)
}

/// Where two runs' written slots first differ.
fn first_difference(
    a: &[Vec<u8>],
    b: &[Vec<u8>],
    sig: &dmc_plan::op::Signature,
    k: &Kernel,
) -> Option<String> {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if let Some(p) = x.iter().zip(y).position(|(u, v)| u != v) {
            let sz = sig.params[i].dtype.size();
            let e = p / sz;
            let val = |s: &[u8]| match sig.params[i].dtype {
                DType::F32 => format!("{}", f32::from_ne_bytes(s.try_into().unwrap_or([0; 4]))),
                DType::I32 => format!("{}", i32::from_ne_bytes(s.try_into().unwrap_or([0; 4]))),
                DType::U8 => format!("{}", s[0]),
            };
            let count = x
                .chunks(sz)
                .zip(y.chunks(sz))
                .filter(|(u, v)| u != v)
                .count();
            return Some(format!(
                "`{}` element {e} of shape {:?} is {} in forward and {} in reverse thread order \
                 ({count} elements differ): a missing __syncthreads() or threads writing the same place",
                sig.params[i].name,
                k.arg_shapes[i],
                val(&x[e * sz..e * sz + sz]),
                val(&y[e * sz..e * sz + sz]),
            ));
        }
    }
    None
}

/// Checks one kernel (compiled from `ck`, which may be an edited rendering of `k`) at `site`.
pub fn check_kernel(
    k: &Kernel,
    mode: Mode,
    ck: &CudaKernel,
    site: &KernelSite,
    run: CheckRun,
) -> Result<EmuCheck, RuntimeError> {
    let emu = compile(ck)?;
    check_compiled(k, mode, &emu, site, run)
}

/// Checks an already compiled kernel at `site`.
pub fn check_compiled(
    k: &Kernel,
    mode: Mode,
    emu: &EmuKernel,
    site: &KernelSite,
    run: CheckRun,
) -> Result<EmuCheck, RuntimeError> {
    let mut arena = CheckArena::new(site.arena_bytes)?;
    check_in(&mut arena, k, mode, emu, site, run)
}

/// Checks kernels outside any plan (the op zoo), each with its arguments packed.
pub fn check_kernels(
    kernels: &[Kernel],
    mode: Mode,
    run: CheckRun,
) -> Result<Vec<EmuCheck>, RuntimeError> {
    check_kernels_with(kernels, mode, run, &CodegenOptions::default())
}

/// [`check_kernels`] with the kernels rendered as `codegen` says (e.g. every GEMM with one tile).
pub fn check_kernels_with(
    kernels: &[Kernel],
    mode: Mode,
    run: CheckRun,
    codegen: &CodegenOptions,
) -> Result<Vec<EmuCheck>, RuntimeError> {
    let mut pairs = Vec::new();
    for k in kernels {
        if let Some(ck) = render_kernel(k, mode, codegen).map_err(EmuError::from)? {
            pairs.push((k, ck));
        }
    }
    let cks: Vec<CudaKernel> = pairs.iter().map(|(_, c)| c.clone()).collect();
    let emus = compile_all(&cks)?;
    pairs
        .iter()
        .zip(&emus)
        .map(|((k, _), emu)| {
            let site = packed_site(k);
            let mut arena = CheckArena::new(site.arena_bytes)?;
            check_in(&mut arena, k, mode, emu, &site, run)
        })
        .collect()
}

/// Checks every kernel of `plan` at its planned offsets (one arena, reused).
pub fn check_plan(plan: &Plan, run: CheckRun) -> Result<Vec<EmuCheck>, RuntimeError> {
    let cks = render_plan(plan, &CodegenOptions::default()).map_err(EmuError::from)?;
    let emus = compile_all(&cks)?;
    let mut arena = CheckArena::new(plan.arena_bytes)?;
    let mut out = Vec::new();
    for emu in &emus {
        let k = &plan.kernels[emu.kernel.id];
        let site = site_in_plan(plan, k.id).unwrap_or_else(|| packed_site(k));
        let mut own;
        let a = if site.arena_bytes == plan.arena_bytes {
            &mut arena
        } else {
            own = CheckArena::new(site.arena_bytes)?;
            &mut own
        };
        out.push(check_in(a, k, plan.mode, emu, &site, run)?);
    }
    Ok(out)
}
