//! The generated CUDA C, run on the CPU: every kernel is compiled *unchanged* by the host C++
//! compiler against `codegen/templates/host/cuda_host.h` (CUDA's built-ins, `__shared__` per block, a block's
//! threads as fibers that switch at `__syncthreads()`), loaded with `dlopen` and launched with the
//! same launch values the CUDA backend passes ([`CudaKernel::launch_values`]).
//!
//! * [`compile`] caches the shared objects in `$DMC_CACHE_DIR/emu` (else `~/.cache/dmc/emu`),
//!   keyed by SHA-256 of (header + kernel source, flags, compiler version); writes are atomic and
//!   an entry that does not load is rebuilt.
//! * [`EmuKernel::launch`] runs a grid: blocks spread over OS threads, each block's threads resumed
//!   in [`FiberOrder::Forward`] or [`FiberOrder::Reverse`] order between barriers, so a missing
//!   barrier or a write race changes the result between the two orders ([`check`] compares them).
//! * [`EmuBackend`] executes a whole plan through the emulated kernels on one host arena (poisoned
//!   with NaN), with the API of the other backends ([`HostArena`]).

pub mod check;

use std::ffi::{c_char, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use std::sync::Arc;

use dmc_codegen::{render_plan, ArgSource, CodegenOptions, CudaKernel, Phase, Scalars};
use dmc_plan::plan::{Plan, Store};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::arena::Arena;
use crate::comm::Collective;
pub use crate::error::EmuError;
use crate::error::RuntimeError;
use crate::host_arena::{run_steps, step_launch, HostArena, StepFlags, StepLauncher};
use crate::validate::validate;

/// The host header that makes g++ accept the generated CUDA C (embedded at build time, from the
/// code generator's templates).
pub use dmc_codegen::HOST_HEADER;

/// The C++ compiler: `$DMC_CXX`, else `g++`, with the version line that is part of the cache key.
struct Cxx {
    path: String,
    version: String,
}

fn cxx() -> Result<&'static Cxx, EmuError> {
    static CXX: OnceLock<Result<Cxx, (String, String)>> = OnceLock::new();
    let r = CXX.get_or_init(|| {
        let path = std::env::var("DMC_CXX").unwrap_or_else(|_| "g++".into());
        match Command::new(&path).arg("--version").output() {
            Ok(o) if o.status.success() => Ok(Cxx {
                version: String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
                path,
            }),
            Ok(o) => Err((path, format!("`--version` exited with {}", o.status))),
            Err(e) => Err((path, e.to_string())),
        }
    });
    r.as_ref().map_err(|(cxx, reason)| EmuError::NoCompiler {
        cxx: cxx.clone(),
        reason: reason.clone(),
    })
}

/// How a block's fibers switch at `__syncthreads()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// A few lines of x86-64 assembly (callee-saved registers + stack pointer); ucontext on other
    /// architectures.
    Fast,
    /// `swapcontext` (a signal-mask system call per switch), for comparison.
    Ucontext,
}

impl Switch {
    /// `DMC_EMU_SWITCH=ucontext` selects [`Switch::Ucontext`]; otherwise [`Switch::Fast`].
    pub fn from_env() -> Self {
        match std::env::var("DMC_EMU_SWITCH").as_deref() {
            Ok("ucontext") => Switch::Ucontext,
            _ => Switch::Fast,
        }
    }
}

/// The compiler flags: C++17, optimised, warnings are errors, contraction to FMA as NVRTC's
/// default `--fmad=true`, no errno (CUDA has none), no type-based alias analysis (the GEMM reads
/// rows of `float` shared memory as `float4` / `float2`, as CUDA C does); AVX2+FMA where the CPU
/// has them.
pub fn cxx_flags(switch: Switch) -> Vec<&'static str> {
    let mut f = vec![
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-pthread",
        "-Wall",
        "-Werror",
        "-Wno-unknown-pragmas",
        "-Wno-sign-compare",
        "-ffp-contract=fast",
        "-fno-math-errno",
        "-fno-strict-aliasing",
    ];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        f.extend(["-mavx2", "-mfma"]);
    }
    if switch == Switch::Ucontext {
        f.push("-DDMC_EMU_UCONTEXT");
    }
    f
}

/// The translation unit g++ compiles: the host header, the kernel exactly as rendered for NVRTC,
/// then the host entry that unpacks the launch values into the kernel's parameters (one cast per
/// [`kernel_params`](dmc_codegen::kernel_params) entry, in order).
pub fn host_source(k: &CudaKernel) -> String {
    let args: Vec<String> = k
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| match p.source {
            ArgSource::Lr => format!("dmc_f64_bits(a[{i}])"),
            _ => format!("({})a[{i}]", p.ty),
        })
        .collect();
    // one body per distinct entry (a program-only kernel, a collective alone, exports its no-op
    // entry)
    let mut entries = k.entries();
    if entries.is_empty() {
        entries.push(k.entry.clone());
    }
    let mut s = format!(
        "{HOST_HEADER}\n#line 1 \"{name}.cu\"\n{src}\n\
         // host entries: the launch values, one per kernel parameter\n",
        name = k.name,
        src = k.source,
    );
    for (i, e) in entries.iter().enumerate() {
        s.push_str(&format!(
            "static void dmc_emu_body_{i}(const uint64_t* a) {{ {e}({}); }}\n",
            args.join(", ")
        ));
    }
    let bodies: Vec<String> = (0..entries.len())
        .map(|i| format!("dmc_emu_body_{i}"))
        .collect();
    s.push_str(&format!(
        "static const DmcBody dmc_emu_bodies[] = {{ {} }};\nDMC_EMU_EXPORT(dmc_emu_bodies, {})\n",
        bodies.join(", "),
        entries.len()
    ));
    s
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The emulator's cache directory.
pub fn cache_dir() -> PathBuf {
    crate::cuda::nvrtc::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("dmc-cache"))
        .join("emu")
}

type LaunchFn = unsafe extern "C" fn(
    which: i32,
    args: *const u64,
    grid: *const u32,
    block: *const u32,
    reverse: i32,
    threads: i32,
    err: *mut c_char,
    errlen: i32,
) -> i32;

/// The order in which a block's threads are resumed between two barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiberOrder {
    Forward,
    Reverse,
}

/// One kernel compiled for the host and loaded.
pub struct EmuKernel {
    pub kernel: CudaKernel,
    /// The shared object (in the cache).
    pub path: PathBuf,
    pub from_cache: bool,
    launch: LaunchFn,
    // keeps `launch` valid
    _lib: libloading::Library,
}

/// A cache file, atomically (the crate's one atomic writer; no fsync: entries are checksummed).
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::io::files::replace_file(path, crate::io::files::Durability::Cache, |w| {
        std::io::Write::write_all(w, bytes)
    })
}

/// Checks a cached shared object against its `.sha256` file (why not, as a phrase).
fn verify_entry(so: &Path, sum: &Path) -> Result<(), String> {
    let want = std::fs::read_to_string(sum).map_err(|e| format!("no checksum: {e}"))?;
    let bytes = std::fs::read(so).map_err(|e| format!("unreadable: {e}"))?;
    if hex(&Sha256::digest(&bytes)) != want.trim() {
        return Err(format!("checksum mismatch ({} bytes)", bytes.len()));
    }
    Ok(())
}

fn load(k: &CudaKernel, so: &Path) -> Result<(libloading::Library, LaunchFn), String> {
    // SAFETY: the library is one this module compiled from the host header and a generated
    // kernel; loading it runs no initialisers beyond the C runtime's.
    let lib = unsafe { libloading::Library::new(so) }.map_err(|e| e.to_string())?;
    // SAFETY: `dmc_emu_launch` is defined by DMC_EMU_EXPORT with exactly `LaunchFn`'s signature.
    let f: LaunchFn = unsafe { lib.get::<LaunchFn>(b"dmc_emu_launch\0") }
        .map(|s| *s)
        .map_err(|e| format!("{e} (in kernel `{}`)", k.name))?;
    Ok((lib, f))
}

/// Compiles `k` for the host (or takes it from the cache) and loads it.
pub fn compile(k: &CudaKernel) -> Result<EmuKernel, EmuError> {
    compile_with(k, &cache_dir(), Switch::from_env())
}

/// [`compile`] with the cache in `dir` and the given fiber switch.
pub fn compile_with(k: &CudaKernel, dir: &Path, switch: Switch) -> Result<EmuKernel, EmuError> {
    let cxx = cxx()?;
    let flags = cxx_flags(switch);
    let src = host_source(k);
    let mut h = Sha256::new();
    h.update(b"dmc-emu-1\0");
    h.update(src.as_bytes());
    h.update(format!("\0{}\0{}", flags.join(" "), cxx.version).as_bytes());
    let key = hex(&h.finalize());
    let cache_err = |e: std::io::Error| EmuError::Cache {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(cache_err)?;
    let so = dir.join(format!("{key}.so"));
    let sum = dir.join(format!("{key}.so.sha256"));
    if so.is_file() {
        // `dlopen` of a damaged ELF can crash the process (SIGBUS/SIGSEGV), so an entry is loaded
        // only when its bytes match the checksum written with it.
        match verify_entry(&so, &sum) {
            Ok(()) => {
                if let Ok((lib, launch)) = load(k, &so) {
                    return Ok(EmuKernel {
                        kernel: k.clone(),
                        path: so,
                        from_cache: true,
                        launch,
                        _lib: lib,
                    });
                }
            }
            Err(why) => eprintln!(
                "warning: emulator cache entry {} is damaged ({why}): rebuilding it",
                so.display()
            ),
        }
    }
    let cpp = dir.join(format!("{key}.cpp"));
    write_atomic(&cpp, src.as_bytes()).map_err(cache_err)?;
    // The compiler's output goes to a scratch file (removed when `tmp` drops, on every path);
    // the entry is then written from its bytes by the one atomic writer.
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{key}.so.build."))
        .tempfile_in(dir)
        .map_err(cache_err)?
        .into_temp_path();
    let out = Command::new(&cxx.path)
        .args(&flags)
        .arg("-o")
        .arg(&tmp)
        .arg("-x")
        .arg("c++")
        .arg(&cpp)
        .output()
        .map_err(|e| EmuError::NoCompiler {
            cxx: cxx.path.clone(),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
        if log.len() > 8000 {
            let mut cut = 8000;
            while !log.is_char_boundary(cut) {
                cut -= 1;
            }
            log.truncate(cut);
            log.push_str("\n[...]");
        }
        return Err(EmuError::Compile {
            cxx: cxx.path.clone(),
            kernel: k.name.clone(),
            source_path: cpp.display().to_string(),
            log,
        });
    }
    // The checksum first: a crash between the two writes leaves a mismatch (a rebuild), never an
    // unchecked entry.
    let bytes = std::fs::read(&tmp).map_err(cache_err)?;
    write_atomic(&sum, hex(&Sha256::digest(&bytes)).as_bytes()).map_err(cache_err)?;
    write_atomic(&so, &bytes).map_err(cache_err)?;
    drop(tmp);
    let (lib, launch) = load(k, &so).map_err(|message| EmuError::Load {
        kernel: k.name.clone(),
        path: so.display().to_string(),
        message,
    })?;
    Ok(EmuKernel {
        kernel: k.clone(),
        path: so,
        from_cache: false,
        launch,
        _lib: lib,
    })
}

/// Compiles every kernel (g++ processes in parallel), in order.
pub fn compile_all(kernels: &[CudaKernel]) -> Result<Vec<EmuKernel>, EmuError> {
    let (dir, switch) = (cache_dir(), Switch::from_env());
    kernels
        .par_iter()
        .map(|k| compile_with(k, &dir, switch))
        .collect()
}

/// OS threads for a launch's blocks: the machine's parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl EmuKernel {
    /// Runs the kernel's grid with its pointer arguments `ptrs` (one per signature slot, in order):
    /// blocks over `threads` OS threads, each block's threads resumed in `order`. A failure the
    /// emulator detects (divergent `__syncthreads()`, fiber stack overflow) is
    /// [`EmuError::Kernel`].
    ///
    /// # Safety
    /// Every pointer must address host memory at least as large as the kernel's argument `i` (per
    /// its shapes), and written arguments must not overlap other arguments.
    pub unsafe fn launch(
        &self,
        ptrs: &[u64],
        scalars: &Scalars,
        order: FiberOrder,
        threads: usize,
    ) -> Result<(), EmuError> {
        for l in self.kernel.launches() {
            // SAFETY: per this function's contract.
            unsafe { self.launch_one(&l, ptrs, scalars, order, threads) }?;
        }
        Ok(())
    }

    /// Runs launch `l` (one of the kernel's [`CudaKernel::launches`]) with pointer arguments
    /// `ptrs`, as [`EmuKernel::launch`] runs each.
    ///
    /// # Safety
    /// As [`EmuKernel::launch`].
    pub unsafe fn launch_one(
        &self,
        l: &dmc_codegen::Launch,
        ptrs: &[u64],
        scalars: &Scalars,
        order: FiberOrder,
        threads: usize,
    ) -> Result<(), EmuError> {
        let vals = self.kernel.launch_values(ptrs, scalars, l.col0);
        let which = self
            .kernel
            .entries()
            .iter()
            .position(|e| *e == l.entry)
            .ok_or_else(|| EmuError::Kernel {
                kernel: self.kernel.name.clone(),
                message: format!("no entry `{}` in the translation unit", l.entry),
            })?;
        {
            let mut err = [0u8; 1024];
            // SAFETY: `vals` holds one value per parameter of the generated entries (built from the
            // same list); grid and block are 3 elements each; `which` indexes the entries the
            // translation unit exports (one per distinct entry, in this order); `err` is writable
            // for its length; the memory behind the pointers is valid per this function's contract.
            let rc = unsafe {
                (self.launch)(
                    which as i32,
                    vals.as_ptr(),
                    l.grid.as_ptr(),
                    l.block.as_ptr(),
                    i32::from(order == FiberOrder::Reverse),
                    threads.clamp(1, 256) as i32,
                    err.as_mut_ptr().cast(),
                    err.len() as i32,
                )
            };
            if rc != 0 {
                let message = CStr::from_bytes_until_nul(&err)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "unknown failure".into());
                return Err(EmuError::Kernel {
                    kernel: format!("{} ({})", self.kernel.name, l.entry),
                    message,
                });
            }
        }
        Ok(())
    }
}

/// A plan executed through the emulated CUDA kernels on one host arena. The arena starts filled
/// with NaN, so a kernel that reads a buffer nothing wrote poisons the loss.
pub struct EmuBackend {
    plan: Plan,
    arena: Arena,
    /// The host store of the streamed tensors (`plan.host_bytes`; empty without streaming).
    host: Arena,
    kernels: Vec<Option<usize>>,
    compiled: Vec<EmuKernel>,
    order: FiberOrder,
    threads: usize,
    flags: StepFlags,
    /// The ranks a data-parallel plan runs with (`set_collective`; `None`: this process alone):
    /// a sharded kernel's collectives run with the host collectives (`comm::host`).
    comm: Option<Arc<dyn Collective>>,
}

impl EmuBackend {
    /// Renders and compiles the plan's kernels and allocates the arena.
    pub fn new(plan: Plan) -> Result<Self, RuntimeError> {
        Self::with_codegen(plan, &CodegenOptions::default())
    }

    /// [`EmuBackend::new`], rendering the kernels with `codegen`.
    pub fn with_codegen(plan: Plan, codegen: &CodegenOptions) -> Result<Self, RuntimeError> {
        validate(&plan)?;
        let rendered = render_plan(&plan, codegen).map_err(EmuError::from)?;
        let compiled = compile_all(&rendered)?;
        let mut kernels = vec![None; plan.kernels.len()];
        for (i, k) in rendered.iter().enumerate() {
            kernels[k.id] = Some(i);
        }
        let mut arena = Arena::new(plan.arena_bytes)?;
        arena.bytes_mut().fill(0xFF);
        let host = Arena::new(plan.host_bytes)?;
        let flags = StepFlags::new(&plan);
        Ok(EmuBackend {
            plan,
            arena,
            host,
            kernels,
            compiled,
            order: FiberOrder::Forward,
            threads: default_threads(),
            flags,
            comm: None,
        })
    }

    /// Poison mode, as the CPU backend's: dead buffers are filled with NaN after each step.
    pub fn set_poison(&mut self, on: bool) {
        self.flags.set_poison(&self.plan, on);
    }

    /// Stop right after the loss when it is not finite (no backward, no update).
    pub fn set_halt_on_nonfinite_loss(&mut self, on: bool) {
        self.flags.halt = on;
    }

    /// The order of a block's threads between barriers (default forward).
    pub fn set_fiber_order(&mut self, order: FiberOrder) {
        self.order = order;
    }

    /// OS threads per launch (default: the machine's parallelism).
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// Runs every step in plan order and returns the loss.
    pub fn run(&mut self, step_counter: u64, seed: u64) -> Result<f32, RuntimeError> {
        run_steps(self, step_counter, seed)
    }

    /// The learning rate of the next `run`s (the plan's optimizer's until set).
    pub fn set_learning_rate(&mut self, lr: f32) {
        self.flags.lr = lr;
    }

    /// Which steps the next `run`s execute (see `Backend::set_run_pass`).
    pub fn set_run_pass(&mut self, pass: dmc_plan::plan::RunPass) {
        self.flags.pass = pass;
    }

    /// The group of processes a data-parallel plan ([`Plan::ranks`]) runs with: this process is
    /// `c.rank()` of `c.world()`, which must be the plan's ranks (checked by each run).
    pub fn set_collective(&mut self, c: Arc<dyn Collective>) {
        self.comm = Some(c);
    }

    fn group(&self) -> &dyn Collective {
        self.comm.as_deref().unwrap_or(&crate::comm::Solo)
    }
}

impl StepLauncher for EmuBackend {
    fn flags(&self) -> &StepFlags {
        &self.flags
    }

    fn flags_mut(&mut self) -> &mut StepFlags {
        &mut self.flags
    }

    fn launch_step(&mut self, si: usize, scalars: &Scalars) -> Result<(), RuntimeError> {
        if let Some(op) = self.plan.transfer_op(si) {
            // a copy between the host store and a window: memcpy, as the CPU backend does
            let s = &self.plan.steps[si];
            let (src, dst) = (&self.plan.buffers[s.args[0]], &self.plan.buffers[s.args[1]]);
            let (from, to) = (src.offset as usize, dst.offset as usize);
            let n = src.bytes as usize;
            let (h, a) = (self.host.bytes_mut(), self.arena.bytes_mut());
            let (src, dst): (&[u8], &mut [u8]) = match op {
                dmc_plan::op::TransferOp::HostToDevice => (&h[from..from + n], &mut a[to..to + n]),
                dmc_plan::op::TransferOp::DeviceToHost => (&a[from..from + n], &mut h[to..to + n]),
            };
            dst.copy_from_slice(src);
            return Ok(());
        }
        let base = self.arena.ptr.as_ptr() as u64;
        let Some((ki, ptrs)) = step_launch(&self.plan, &self.kernels, si, base) else {
            return Ok(()); // leaves and reshapes: no kernel
        };
        let k = &self.compiled[ki];
        for phase in k.kernel.phases() {
            match phase {
                Phase::Launch(l) => {
                    // SAFETY: `validate` (in `new`) checked that every argument lies inside the
                    // arena, which `&mut self` holds exclusively, with its slot's size, and that
                    // written arguments do not overlap others.
                    unsafe { k.launch_one(&l, &ptrs, scalars, self.order, self.threads) }?
                }
                Phase::Collective(c) => {
                    // SAFETY: as above; the collective's regions were sized from the same shapes.
                    unsafe { crate::comm::host::run(self.group(), &c, &ptrs) }?
                }
            }
        }
        Ok(())
    }

    fn ranks(&self) -> (usize, usize) {
        let c = self.group();
        (c.world(), c.rank())
    }

    fn sum_loss(&mut self) -> Result<(), RuntimeError> {
        let mut l = [self.loss()?];
        crate::comm::all_reduce_sum(self.group(), &mut l)?;
        let id = self.plan.loss;
        self.write_buffer(id, &l[0].to_ne_bytes())
    }

    fn fill_poison(&mut self, offset: u64, bytes: u64) -> Result<(), RuntimeError> {
        let r = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(bytes).ok())
            .and_then(|(o, n)| self.arena.bytes_mut().get_mut(o..o.checked_add(n)?))
            .ok_or_else(|| {
                RuntimeError::BadPlan(format!("poison outside the arena at {offset}"))
            })?;
        r.fill(0xFF);
        Ok(())
    }
}

impl HostArena for EmuBackend {
    fn shard_rank(&self) -> usize {
        self.comm.as_ref().map_or(0, |c| c.rank())
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn write_bytes(&mut self, store: Store, offset: u64, bytes: &[u8]) -> Result<(), RuntimeError> {
        let mem = match store {
            Store::Arena => &mut self.arena,
            Store::Host => &mut self.host,
        };
        let dst = usize::try_from(offset)
            .ok()
            .and_then(|o| mem.bytes_mut().get_mut(o..o.checked_add(bytes.len())?))
            .ok_or_else(|| RuntimeError::BadPlan(format!("write outside the arena at {offset}")))?;
        dst.copy_from_slice(bytes);
        Ok(())
    }

    fn read_bytes(&self, store: Store, offset: u64, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let mem = match store {
            Store::Arena => &self.arena,
            Store::Host => &self.host,
        };
        usize::try_from(offset)
            .ok()
            .and_then(|o| mem.bytes().get(o..o.checked_add(len)?))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| RuntimeError::BadPlan(format!("read outside the arena at {offset}")))
    }
}

crate::host_arena::impl_backend_over_host_arena!(
    EmuBackend,
    measured_arena_bytes: |b| b.arena.measured_bytes(),
    extra: {
        fn set_collective(
            &mut self,
            c: Arc<dyn Collective>,
        ) -> Result<(), crate::error::RuntimeError> {
            EmuBackend::set_collective(self, c);
            Ok(())
        }

        fn collective(&self) -> Option<&dyn Collective> {
            self.comm.as_deref()
        }
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use dmc_codegen::{render_kernel, zoo::zoo};
    use dmc_plan::plan::Mode;

    fn relu() -> CudaKernel {
        let k = zoo()
            .into_iter()
            .find(|k| k.op.kind_name() == "relu")
            .expect("a relu in the zoo");
        render_kernel(&k, Mode::Train, &CodegenOptions::default())
            .expect("render")
            .expect("kernel")
    }

    #[test]
    fn the_host_entry_passes_every_kernel_parameter_in_order() {
        let k = relu();
        let src = host_source(&k);
        let n = k.params.len();
        assert!(
            src.contains(&format!("{}((const float*)a[0], ", k.entry)),
            "{src}"
        );
        // the seed and step as u64, the learning rate's bits as a double, last
        assert!(src.contains(&format!("(const u64)a[{}]", n - 2)), "{src}");
        assert!(
            src.contains(&format!("dmc_f64_bits(a[{}])); }}", n - 1)),
            "{src}"
        );
        assert!(src.contains("DMC_EMU_EXPORT(dmc_emu_bodies, 1)"), "{src}");
        assert!(src.starts_with(HOST_HEADER));
    }

    #[test]
    #[cfg_attr(not(dmc_has_gxx), ignore = "needs g++ (set DMC_CXX or install g++)")]
    fn a_corrupt_cache_entry_is_rebuilt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let k = relu();
        let first = compile_with(&k, dir.path(), Switch::Fast).expect("compile");
        assert!(!first.from_cache);
        let so = first.path.clone();
        drop(first);
        assert!(
            compile_with(&k, dir.path(), Switch::Fast)
                .expect("again")
                .from_cache
        );
        // Damage that `dlopen` would crash on (a truncated ELF, overwritten pages) or merely reject:
        // each is detected by the checksum and rebuilt.
        let good = std::fs::read(&so).expect("read");
        let mut overwritten = good.clone();
        let end = overwritten.len().min(4096 + 8192);
        overwritten[4096.min(end)..end].fill(0xAB);
        for damaged in [
            good[..4096.min(good.len())].to_vec(),
            good[..good.len() / 2].to_vec(),
            overwritten,
            b"not an ELF file".to_vec(),
        ] {
            std::fs::write(&so, &damaged).expect("corrupt");
            let again = compile_with(&k, dir.path(), Switch::Fast).expect("rebuilt");
            assert!(!again.from_cache, "a damaged entry was loaded");
        }
        // A missing checksum is a rebuild too (an entry from before checksums, or a crash).
        std::fs::remove_file(so.with_extension("so.sha256")).expect("rm");
        let again = compile_with(&k, dir.path(), Switch::Fast).expect("rebuilt");
        assert!(!again.from_cache);
        let x = [1.0f32, -2.0, 3.0];
        let mut buf = vec![0f32; 51 * 2];
        buf[..3].copy_from_slice(&x);
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: x and y (51 floats each, the zoo relu's shape) lie inside `buf`, disjoint.
        unsafe {
            again.launch(
                &[p, p + 51 * 4],
                &Scalars {
                    seed: 0,
                    step: 1,
                    lr: 0.0,
                    rank: 0,
                },
                FiberOrder::Forward,
                1,
            )
        }
        .expect("launch");
        assert_eq!(&buf[51..54], &[1.0, 0.0, 3.0]);
    }
}
